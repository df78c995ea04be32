/* src/server: the defaults of the connection limits (config.h,
 * st__config_connection_limits; docs/operations.md, "Limits").
 *
 * Descriptors: a quarter of RLIMIT_NOFILE may be held for connections in
 * all (the rest is for the connections' sockets, the objects' arenas, the
 * listeners, Lua files and loads), one eighth of that by one connection,
 * within 16..4096. Bytes: undelivered replies may pin half of the host's
 * memory (physical, or its cgroup's limit: st__ledger_host_memory) in all,
 * one connection a thirty-second of it within 64 MiB..4 GiB.
 */
#include <stdint.h>
#include <sys/resource.h>
#include <unistd.h>

#include "mem/ledger.h"
#include "server/config.h"

#define NOFILE_CAP (1u << 20)       /* an "unlimited" RLIMIT_NOFILE counts as this */
#define MIB (UINT64_C(1) << 20)

static uint64_t clamp_u64(uint64_t v, uint64_t lo, uint64_t hi) {
  return v < lo ? lo : v > hi ? hi : v;
}

/* RLIMIT_NOFILE's soft limit (1024 when it cannot be read). */
static uint64_t nofile(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > NOFILE_CAP) return NOFILE_CAP;
  return (uint64_t)rl.rlim_cur;
}

/* See config.h. Any thread (getrlimit, sysconf). */
void st__config_connection_limits(st__config_t *c) {
  uint64_t all_fds = nofile() / 4;
  if (all_fds < 16) all_fds = 16;
  uint64_t one_fds = clamp_u64(all_fds / 8, 16, 4096);
  if (one_fds > all_fds) one_fds = all_fds;
  c->max_fds_all_connections = (int)all_fds;
  c->max_fds_per_connection = (int)one_fds;
  uint64_t mem = st__ledger_host_memory(NULL, 0);
  if (!mem) mem = UINT64_C(4) << 30;   /* sysconf could not tell */
  uint64_t all_bytes = mem / 2;
  uint64_t one_bytes = clamp_u64(mem / 32, 64 * MIB, 4096 * MIB);
  if (one_bytes > all_bytes) one_bytes = all_bytes;
  c->max_queued_bytes_all_connections = all_bytes;
  c->max_queued_bytes_per_connection = one_bytes;
}
