/* src/server: the server's configuration (config.lua, docs/operations.md).
 * Plain data, filled by st__config_defaults, then st__config_load (which
 * reads config.lua through the rows of config.c's settings table), then
 * command-line flags. Owned by main(); read-only once the loop runs.
 */
#ifndef ST_SERVER_CONFIG_H
#define ST_SERVER_CONFIG_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <sys/types.h>

/* The smallest limits.lua_memory_bytes: room for a state and its files. */
#define ST__CONFIG_MIN_LUA_MEMORY (4 << 20)

/* Worker threads at most, from config.lua and from --workers alike. */
#define ST__CONFIG_MAX_WORKERS 256

/* Loop threads at most (loop_threads). */
#define ST__CONFIG_MAX_LOOP_THREADS 64

#include "common/log.h"
#include "common/settings.h"
#include "engine/generation.h"
#include "mem/uidq.h"
#include "peer/peer.h"

#define ST_MAX_DEVICES 16
#define ST_MAX_ALLOW   64
#define ST_MAX_BUDGETS (1 + ST_MAX_DEVICES)   /* "cpu" and "cuda:N" entries */
#define ST_MAX_DATA_DIRS 16

typedef struct st__config {
  char *path;                   /* owned: the config file ("" if none)      */
  char *base_path;              /* owned; NULL: st__sockdir_choose picks     */
  int ndevices;
  int devices[ST_MAX_DEVICES];  /* socket indices served                    */
  int workers;                  /* worker threads                           */
  int spin_us;                  /* how long the loop and a worker that just
                                   finished poll for the next completion or
                                   job before they sleep; 0: never (default
                                   derived in config.c)                     */
  char *endpoints_dir;          /* owned; relative paths are resolved
                                   against the config file's directory     */
  st__log_level_t log_level;
  unsigned socket_mode;         /* default 0600                             */
  char *socket_group;           /* owned, may be NULL: group of the socket  */
  int nallow_uids;
  uid_t allow_uids[ST_MAX_ALLOW];
  int nallow_gids;
  gid_t allow_gids[ST_MAX_ALLOW];
  /* limits */
  size_t max_message_bytes;
  int max_connections;
  int max_inflight;
  int frame_timeout_ms;
  uint64_t max_object_bytes;     /* 0: the device's budget bounds an arena */
  uint64_t lua_memory_bytes;    /* Lua heap of one worker's state (1 GiB) */
  double default_timeout_s;     /* timeout of an endpoint without one (300) */
  uint64_t max_arena_fds;        /* 0: half of RLIMIT_NOFILE (reclaim.h)     */
  /* What connections may hold (limits.c): descriptors (unclaimed ones a
   * client sent, and those of replies not yet received) and the arena
   * bytes their undelivered replies pin, per connection and in all. */
  int max_fds_per_connection;
  int max_fds_all_connections;
  uint64_t max_queued_bytes_per_connection;
  uint64_t max_queued_bytes_all_connections;
  /* Tensor arguments a connection's argument cache keeps (docs/pool.md,
   * section 4); 0: none are kept. */
  int max_cached_arguments;
  /* Hand-offs (docs/pool.md, section 5): how many one connection may
   * create or open, and the most chunks of one. */
  int max_handoffs_per_connection;
  uint64_t max_handoff_chunks;
  uint64_t max_buffers;          /* live buffers, unlinked ones still open too */
  uint64_t max_buffer_bytes;     /* one buffer's slots; 0: a quarter of its
                                    device's memory budget */
  int max_buffer_handles_per_connection;
  /* Published keys (docs/keys.md): keys.max_keys, keys.max_bytes (0: the
   * budgets alone), keys.max_versions kept per key. */
  int keys_max_keys;
  uint64_t keys_max_bytes;
  int keys_max_versions;
  /* Result pools of connections that ask for them (docs/pool.md):
   * pool.slab_bytes (the largest slab), max_bytes_per_connection,
   * max_result_bytes (0: derived), max_regions (0: no
   * pools). */
  uint64_t pool_slab_bytes;
  uint64_t pool_max_bytes;
  uint64_t pool_max_result_bytes;
  int pool_max_regions;
  /* CUDA slabs: pool.cuda_slab_bytes, cuda_max_bytes_per_connection (per
   * device, at most a quarter of its budget). */
  uint64_t pool_cuda_slab_bytes;
  uint64_t pool_cuda_max_bytes;
  /* pool.idle_s: a slab with no live region this long is retired (0:
   * never). */
  double pool_idle_s;
  double shutdown_grace_s;      /* in-flight work gets this long on SIGTERM */
  /* tasks (docs/protocol.md, "submit" ... "tasks") */
  double task_ttl_s;            /* finished tasks are kept this long (600) */
  int task_capacity;            /* at most this many tasks are kept (10000) */
  /* quotas (mem/uidq.h; docs/operations.md, "Quotas"): what one uid may
   * hold of each kind, indexed by st__uidq_kind_t; 0: derived from the
   * kind's global limit (st__config_quotas). */
  uint64_t quotas[ST__UIDQ_NKINDS];
  /* memory_budget: bytes the server holds per device (every arena it
   * allocated, mem/ledger.h); 0 = none. Entry 0 is always "cpu" (default:
   * half of the host memory, st__config_default_cpu_budget). */
  int nbudgets;
  struct {
    char device[16];            /* "cpu" or "cuda:N" */
    uint64_t bytes;
  } budgets[ST_MAX_BUDGETS];
  /* Where tensors are built when neither the endpoint (`device`) nor the
   * constructor names a device: "socket" (default: socket N builds on
   * cuda:N when the server has that CUDA device, else on the CPU) or "cpu". */
  char *default_device;         /* owned */
  /* Directories that files loaded by endpoints (st.load_safetensors) must
   * lie in, after resolving symlinks. Default: the config file's directory
   * (the working directory when there is no config file). */
  int ndata_dirs;
  char *data_dirs[ST_MAX_DATA_DIRS];   /* owned */
  /* safetensors loading: reader threads, and the pinned host staging pool
   * (allocated once at start when the CUDA backend has a device). */
  int loader_threads;           /* default 4 */
  uint64_t staging_bytes;       /* default 256 MiB */
  /* Reloads (server/reload.c): how long a file's top level may run while
   * it is loaded (also at start), and the uids whose `reload` requests are
   * served (default: root and the server's own uid; SIGHUP is not
   * affected). */
  double endpoint_load_timeout_s;       /* default 10 s */
  int nreload_uids;
  uid_t reload_uids[ST_MAX_ALLOW];
  /* Event loops that serve connections (server/loops.c): 1 = the one loop
   * thread; N > 1: N threads, each connection on one of them. */
  int loop_threads;             /* derived in config.c: 1 */
  /* The server-to-server channel (src/peer; docs/operations.md, "Peers"):
   * off unless peer.listen or peer.peers is set. peer.id defaults to the
   * host name. */
  st__peer_conf_t peer;
} st__config_t;

/* Runs the config file at `path` (sandboxed, no st module) and fills *cfg
 * over its current values (call st__config_defaults first). Unknown keys,
 * wrong types and bad values are reported in errs as "path: key: message"
 * (or "path:line: message" for a Lua error). On success cfg->path is
 * `path` and a data_dirs left at its default is the file's directory.
 * Returns ST_OK or ST_ERR_CONFIGURATION. Loop thread, at start. */
int st__config_load(const char *path, st__config_t *cfg, st__errlist_t *errs);

/* Fills every field with its default (ST_DEFAULT_* of include/st/wire.h,
 * workers = 4, endpoints "endpoints", log "info", base path from
 * $SHARED_TENSOR_BASE_PATH or NULL (st__sockdir_choose), devices {0}, tasks
 * ttl 600 s and capacity 10000, cpu budget half of the host memory
 * (st__config_default_cpu_budget), reload_uids root and the effective uid
 * of this process). */
void st__config_defaults(st__config_t *c);
void st__config_free(st__config_t *c);

/* --check: one line "<table>: name=value ..." for each table of config.lua
 * (limits, pool, keys, tasks), every integer and seconds key of it as cfg
 * holds it, with what a 0 stands for. Reads the settings rows only, so a
 * new key is listed without a line here. */
void st__config_print_tables(const st__config_t *cfg, FILE *out);

/* Sets the four connection limits to their defaults, derived from this
 * process's RLIMIT_NOFILE (soft) and the host memory (limits.c). */
void st__config_connection_limits(st__config_t *c);

/* The quota of every kind (mem/uidq.h) that cfg makes: a `quotas` entry
 * when set, else derived from the kind's global limit (a quarter of it;
 * docs/operations.md, "Quotas"); a set one that is not below its global
 * limit is lowered to three quarters of it (so one uid never exhausts
 * it), and *lowered (may be NULL) counts those. `fd_cap`: the arenas'
 * descriptor cap in force (reclaim.h). Any thread. */
void st__config_quotas(const st__config_t *cfg, uint64_t fd_cap, uint64_t out[ST__UIDQ_NKINDS],
                       int *lowered);

/* The default cpu budget: half of the physical memory or of the memory
 * limit of the process's cgroup, whichever is lower
 * (st__ledger_host_memory). Any thread. */
uint64_t st__config_default_cpu_budget(void);

#endif
