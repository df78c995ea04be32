/* What the fault-injection tests share: a real stserver run under the
 * LD_PRELOAD shim of tests/fault/shim.c ($ST_FAULT_LIB), with its faults
 * armed only around the request under test, and the checks that follow
 * every injected failure: the server still answers ping and a normal
 * call, and its descriptors, arenas and objects are back where they were.
 *
 *   fk_t k;
 *   fk_start(&k, "memfd_create:0:1:EMFILE", endpoints, NULL);  // server + monitor
 *   ... warm up with a client of your own, close it ...
 *   fk_baseline(&k);
 *   fk_arm(&k); ...the request that hits the fault...; fk_disarm(&k);
 *   fk_check_fired(&k, "memfd_create");
 *   fk_finish(&k, "endpoint_to_invalidate");  // back to baseline, stop
 *
 * Header-only (static functions); a failed check returns from the test.
 */
#ifndef ST_FAULT_KIT_H
#define ST_FAULT_KIT_H

#include <dirent.h>
#include <st/client.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "client_kit.h"
#include "fixture.h"
#include "proc.h"

typedef struct fk {
  stt_server_t srv;
  st_client_t *mon;          /* the monitor connection: info, invalidate */
  char arm[320];             /* exists while faults are armed */
  int base_fds;
  uint64_t base_arenas, base_objects;
  int64_t base_dev_free;     /* info memory["cuda:0"].free_bytes, or -1 */
  int check_device;          /* compare device memory too (GPU cases only:
                                other tests' servers use the device) */
} fk_t;

/* Device memory may differ from its baseline by this much (one granule
 * of the driver's allocations, and some slack for its own bookkeeping). */
#define FK_DEVICE_SLACK (4 << 20)

/* info's `section`.`key` as an integer (-1 when missing). */
static inline int64_t fk_info(st_client_t *c, const char *section, const char *key) {
  st_result_t *r = NULL;
  if (st_client_info(c, &r) != ST_OK) return -1;
  const st_value_t *v = st_value_get(st_result_value(r), section);
  if (key) v = v ? st_value_get(v, key) : NULL;
  int64_t n = v && v->kind == ST_VALUE_INT ? v->as.integer : -1;
  st_result_free(r);
  return n;
}

/* info's memory["cuda:0"].free_bytes: device 0's free memory as the
 * server sees it, or -1 (no CUDA device, or no context yet). */
static inline int64_t fk_dev_free(st_client_t *c) {
  st_result_t *r = NULL;
  if (st_client_info(c, &r) != ST_OK) return -1;
  const st_value_t *v = st_value_get(st_result_value(r), "memory");
  v = v ? st_value_get(v, "cuda:0") : NULL;
  v = v ? st_value_get(v, "free_bytes") : NULL;
  int64_t n = v && v->kind == ST_VALUE_INT ? v->as.integer : -1;
  st_result_free(r);
  return n;
}

/* Starts a server (config: a 16 MiB CPU budget plus `config`, may be
 * NULL) under the shim with rule `rule` (tests/fault/shim.c), serving
 * `eps`, and opens the monitor. Skips the test program (77) when the shim
 * was not built. */
static inline int fk_start(fk_t *k, const char *rule, const stt_endpoint_t *eps,
                           const char *config) {
  const char *lib = getenv("ST_FAULT_LIB");
  if (!lib || access(lib, R_OK) != 0) stt_skip("ST_FAULT_LIB is not set (run through ctest)");
  memset(k, 0, sizeof *k);
  stt_server_init(&k->srv);
  stt_server_config(&k->srv, config ? config : "memory_budget = { cpu = 16 * 1024 * 1024 },");
  stt_write_endpoints(&k->srv, eps);
  snprintf(k->arm, sizeof k->arm, "%s/armed", k->srv.dir);
  setenv("LD_PRELOAD", lib, 1);
  setenv("ST_FAULT", rule, 1);
  setenv("ST_FAULT_ARM", k->arm, 1);
  int rc = stt_server_start(&k->srv);
  unsetenv("LD_PRELOAD");
  unsetenv("ST_FAULT");
  unsetenv("ST_FAULT_ARM");
  if (rc != 0) return -1;
  k->mon = stt_client_open(k->srv.socket);
  return k->mon ? 0 : -1;
}

/* Waits (5 s) until the monitor is the only connection, then records the
 * server's descriptors, arenas and objects. 0, or -1 at the deadline. */
static inline int fk_baseline(fk_t *k) {
  double end = stt_now_ms() + 5000;
  while (fk_info(k->mon, "connections", NULL) != 1 || fk_info(k->mon, "inflight", NULL) != 0) {
    if (stt_now_ms() > end) return -1;
    stt_sleep_ms(5);
  }
  k->base_fds = stt_proc_fd_count(k->srv.pid);
  k->base_arenas = (uint64_t)fk_info(k->mon, "arenas", "count");
  k->base_objects = (uint64_t)fk_info(k->mon, "objects", "count");
  k->base_dev_free = k->check_device ? fk_dev_free(k->mon) : -1;
  return 0;
}

static inline void fk_arm(fk_t *k) { stt_write_file(k->arm, "1\n"); }
static inline void fk_disarm(fk_t *k) { unlink(k->arm); }

/* 1 when the server log says the shim failed `call`. */
static inline int fk_fired(const fk_t *k, const char *call) {
  char *log = stt_server_log(&k->srv);
  char want[96];
  snprintf(want, sizeof want, "st_fault: injected %s ", call);
  int yes = log && strstr(log, want) != NULL;
  free(log);
  return yes;
}

/* Drops the cache of `endpoint` (NULL: none), then waits (5 s) until only
 * the monitor is connected and the descriptors, arenas and objects are
 * back at the baseline (device memory within FK_DEVICE_SLACK). 0, or -1 with what differs on stderr. */
static inline int fk_back_to_baseline(fk_t *k, const char *endpoint) {
  if (endpoint && st_client_invalidate_endpoint(k->mon, endpoint, NULL) != ST_OK) return -1;
  double end = stt_now_ms() + 5000;
  for (;;) {
    int fds = stt_proc_fd_count(k->srv.pid);
    int64_t arenas = fk_info(k->mon, "arenas", "count");
    int64_t objects = fk_info(k->mon, "objects", "count");
    int64_t conns = fk_info(k->mon, "connections", NULL);
    int64_t dev = fk_dev_free(k->mon);
    int dev_ok = k->base_dev_free < 0 || dev + FK_DEVICE_SLACK >= k->base_dev_free;
    if (fds == k->base_fds && arenas == (int64_t)k->base_arenas &&
        objects == (int64_t)k->base_objects && conns == 1 && dev_ok)
      return 0;
    if (stt_now_ms() > end) {
      fprintf(stderr, "not back to baseline: fds %d (was %d), arenas %lld (was %llu), "
              "objects %lld (was %llu), connections %lld, device free %lld (was %lld)\n",
              fds, k->base_fds, (long long)arenas, (unsigned long long)k->base_arenas,
              (long long)objects, (unsigned long long)k->base_objects, (long long)conns,
              (long long)dev, (long long)k->base_dev_free);
      return -1;
    }
    stt_sleep_ms(10);
  }
}

/* Closes the monitor, stops the server (0: clean exit) and removes its
 * directory. */
static inline int fk_stop(fk_t *k) {
  st_client_close(k->mon);
  k->mon = NULL;
  int rc = stt_server_stop(&k->srv);
  stt_server_cleanup(&k->srv);
  return rc;
}

#endif
