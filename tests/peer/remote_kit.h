/* What the client-side tests of pull and replicate share (tests/client,
 * tests/cli): two stservers on loopback that are peers, "alpha" (which
 * listens) and "beta" (which dials it and takes alpha's pushes,
 * rk_push_uid), one cluster key, both exporting the keys under w/, the bytes
 * over UCX on lo (UCX_TLS=tcp, UCX_NET_DEVICES=lo); keys put through the
 * public client API with a byte pattern, and the check of those bytes on
 * a server. Built on peer_kit.h. Each function is static inline: a test
 * program includes it once. */
#ifndef ST_TESTS_PEER_REMOTE_KIT_H
#define ST_TESTS_PEER_REMOTE_KIT_H

#include <dlfcn.h>
#include <inttypes.h>
#include <signal.h>
#include <st/client.h>

#include "check.h"
#include "fixture.h"
#include "peer_kit.h"

#define RK_MIB (1024u * 1024u)

/* The test's three tensors: t0, t1, t2 of these sizes (uint8). */
static const size_t RK_SIZES[3] = {4096, RK_MIB + 13, 8 * RK_MIB};

static stt_server_t ALPHA, BETA;

/* Byte i of tensor k of the test's keys, `salt` telling versions apart. */
static inline uint8_t rk_pattern(size_t i, int k, int salt) {
  return (uint8_t)(i * 131u + (unsigned)k * 7u + (i >> 12) + (unsigned)salt * 29u);
}

/* The start of a test's main: skips (exit 77) where the servers cannot be
 * peers (no ST_SERVER_BIN; no OpenSSL 3 to load, as the server loads it),
 * sets UCX to TCP on loopback and ignores SIGPIPE. */
static inline void rk_require(void) {
  if (!getenv("ST_SERVER_BIN")) stt_skip("ST_SERVER_BIN is not set");
  void *crypto = dlopen("libcrypto.so.3", RTLD_NOW | RTLD_LOCAL);
  void *ssl = crypto ? dlopen("libssl.so.3", RTLD_NOW | RTLD_LOCAL) : NULL;
  if (!ssl) stt_skip("no OpenSSL 3 (libssl.so.3): servers cannot be peers here");
  dlclose(ssl);
  dlclose(crypto);
  setenv("UCX_TLS", "tcp", 1);
  setenv("UCX_NET_DEVICES", "lo", 1);
  signal(SIGPIPE, SIG_IGN);
}

/* Whether the ucx engine is usable on beta's link to alpha: 1, 0 (why
 * filled), -1 when peers could not be read. */
static inline int rk_ucx_usable(char *why, size_t len) {
  st_client_t *c;
  char err[256];
  if (st_client_connect(BETA.socket, &c, err, sizeof err) != ST_OK) return -1;
  st_result_t *r = NULL;
  int usable = -1;
  if (st_client_peers(c, &r) == ST_OK) {
    const st_value_t *v = st_result_value(r);
    usable = 0;
    snprintf(why, len, "peer alpha lists no ucx engine");
    for (size_t i = 0; v->kind == ST_VALUE_ARRAY && i < v->as.array.len; i++) {
      const st_value_t *engines = st_value_get(&v->as.array.items[i], "engines");
      for (size_t k = 0; engines && engines->kind == ST_VALUE_ARRAY && k < engines->as.array.len;
           k++) {
        const st_value_t *e = &engines->as.array.items[k];
        const st_value_t *name = st_value_get(e, "name"), *ok = st_value_get(e, "usable");
        if (!name || name->kind != ST_VALUE_STRING || strcmp(name->as.str.ptr, "ucx")) continue;
        if (ok && ok->kind == ST_VALUE_BOOL && ok->as.boolean) {
          usable = 1;
        } else {
          const st_value_t *w = st_value_get(e, "why");
          snprintf(why, len, "ucx is not usable: %s",
                   w && w->kind == ST_VALUE_STRING ? w->as.str.ptr : "no reason given");
        }
      }
    }
  }
  st_result_free(r);
  st_client_close(c);
  return usable;
}

/* The uid beta takes alpha's pushes as: this process's, or nobody's
 * (65534) for root, which as_uid may not name (root reads either). */
static inline unsigned rk_push_uid(void) { return getuid() ? (unsigned)getuid() : 65534u; }

/* Starts alpha and beta (memory budgets of `budget` bytes each), both
 * exporting the keys under w/, and waits for their link. 0, or -1 (said). Skips
 * (exit 77, both stopped) when UCX is not usable between them. */
static inline int rk_start_with(uint64_t budget, const char *more) {
  static char key[400];
  stt_server_init(&ALPHA);
  stt_server_init(&BETA);
  make_key(ALPHA.dir, "cluster.key", key, sizeof key);
  peer_config(&ALPHA, "memory_budget = { cpu = %llu }, peer = { id = 'alpha', "
              "listen = '127.0.0.1:0', secret = '%s', peers = { beta = {} }, "
              "export = { 'w/*' }, transfer_timeout_s = 60%s },",
              (unsigned long long)budget, key, more);
  if (stt_server_start(&ALPHA) != 0) return -1;
  char addr[128];
  listen_addr(&ALPHA, addr, sizeof addr);
  if (!addr[0]) return -1;
  /* beta takes pushes from alpha as this uid; alpha takes none. */
  peer_config(&BETA, "memory_budget = { cpu = %llu }, peer = { id = 'beta', secret = '%s', "
              "peers = { alpha = { addr = '%s', as_uid = %u } }, export = { 'w/*' }, "
              "transfer_timeout_s = 60%s },",
              (unsigned long long)budget, key, addr, rk_push_uid(), more);
  if (stt_server_start(&BETA) != 0) return -1;
  if (!wait_peer(&BETA, "alpha", "up", NULL) || !wait_peer(&ALPHA, "beta", "up", NULL)) return -1;
  /* The engines come with the hello once each helper probed them. */
  char why[300] = "";
  int usable = 0;
  for (double end = stt_now_ms() + 10000; stt_now_ms() < end; stt_sleep_ms(50))
    if ((usable = rk_ucx_usable(why, sizeof why)) == 1 || strstr(why, "not usable")) break;
  if (usable < 0) return -1;
  if (usable == 0) {
    stt_server_stop(&BETA);
    stt_server_stop(&ALPHA);
    stt_server_cleanup(&BETA);
    stt_server_cleanup(&ALPHA);
    stt_skip(why);
  }
  return 0;
}

static inline int rk_start(uint64_t budget) { return rk_start_with(budget, ""); }

/* Stops both; 0 when both exited cleanly. */
static inline int rk_stop(void) {
  int b = stt_server_stop(&BETA), a = stt_server_stop(&ALPHA);
  stt_server_cleanup(&BETA);
  stt_server_cleanup(&ALPHA);
  return a == 0 && b == 0 ? 0 : -1;
}

/* After a test killed alpha: stops beta and cleans both up; 0 when beta
 * exited cleanly, else -1 (said). */
static inline int rk_stop_beta(void) {
  int b = stt_server_stop(&BETA);
  stt_server_cleanup(&BETA);
  stt_server_cleanup(&ALPHA);
  if (b == 0) return 0;
  fprintf(stderr, "beta did not exit cleanly\n");
  return -1;
}

/* A test program's start: both servers with budgets of 512 MiB (and
 * `more` fields in both peer tables: ", nccl_library = '...'"), or the
 * program exits 1 (saying why). */
static inline void rk_main_start_with(const char *more) {
  rk_require();
  if (rk_start_with(512ull * RK_MIB, more) == 0) return;
  rk_stop();
  fprintf(stderr, "the two servers did not start or link\n");
  exit(1);
}

static inline void rk_main_start(void) { rk_main_start_with(""); }

/* A test program's end: both stopped; its exit status (1 when a server
 * did not exit cleanly, else the tests' summary). */
static inline int rk_main_end(void) {
  if (rk_stop() != 0) {
    fprintf(stderr, "a server did not exit cleanly\n");
    return 1;
  }
  return stt_summary();
}

/* Fills tensor k of a test key (CPU memory) with rk_pattern(., k, salt). */
static inline int rk_fill_cpu(const st_tensor_t *t, int k, int salt) {
  uint8_t *p = t->data;
  for (size_t i = 0; i < RK_SIZES[k]; i++) p[i] = rk_pattern(i, k, salt);
  return 0;
}

/* Puts key `name` on the server at socket: tensors t0..t2 of RK_SIZES,
 * memory of st_tensor_alloc on `device` ("cpu", "cuda") that fill(t, k,
 * salt) writes with rk_pattern(., k, salt) (0: done). The new version, or
 * 0 (said). */
static inline uint64_t rk_put_on(const char *socket, const char *name, int salt,
                                 const char *device, int (*fill)(const st_tensor_t *, int, int)) {
  st_client_t *c;
  char err[256];
  if (st_client_connect(socket, &c, err, sizeof err) != ST_OK) {
    fprintf(stderr, "   connect %s: %s\n", socket, err);
    return 0;
  }
  st_args_t *a = st_args_new();
  st_result_t *mem[3] = {NULL, NULL, NULL};
  int ok = a != NULL;
  for (int k = 0; ok && k < 3; k++) {
    int64_t shape[1] = {(int64_t)RK_SIZES[k]};
    ok = st_tensor_alloc(device, ST_DTYPE_UINT8, 1, shape, &mem[k], err, sizeof err) == ST_OK;
    if (!ok) {
      fprintf(stderr, "   st_tensor_alloc on %s: %s\n", device, err);
      break;
    }
    const st_tensor_t *t = st_result_tensor(mem[k], 0);
    ok = fill(t, k, salt) == 0;
    char tn[8];
    snprintf(tn, sizeof tn, "t%d", k);
    ok = ok && st_args_tensor(a, tn, t, err, sizeof err) == ST_OK;
  }
  uint64_t version = 0;
  if (ok && st_client_put(c, name, a, ST_KEY_PINNED, 0, &version) != ST_OK) {
    fprintf(stderr, "   put %s: %s\n", name, st_client_error(c));
    version = 0;
  }
  st_args_free(a);
  for (int k = 0; k < 3; k++) st_result_free(mem[k]);
  st_client_close(c);
  return version;
}

/* rk_put_on the CPU. */
static inline uint64_t rk_put(const char *socket, const char *name, int salt) {
  return rk_put_on(socket, name, salt, "cpu", rk_fill_cpu);
}

/* Whether version `version` (0: the latest) of key `name` on the server
 * at socket holds t0..t2 with rk_pattern(., k, salt), on `device`
 * (ST_DEVICE_CPU, ST_DEVICE_CUDA; -1: any): 1, or 0 (said). */
static inline int rk_holds_on(const char *socket, const char *name, uint64_t version, int salt,
                              int device) {
  st_client_t *c;
  char err[256];
  if (st_client_connect(socket, &c, err, sizeof err) != ST_OK) return 0;
  st_result_t *r = NULL;
  int ok = st_client_get(c, name, version, ST_GET_READONLY, &r, NULL) == ST_OK;
  if (!ok) fprintf(stderr, "   get %s on %s: %s\n", name, socket, st_client_error(c));
  for (int k = 0; ok && k < 3; k++) {
    char tn[8];
    snprintf(tn, sizeof tn, "t%d", k);
    const st_tensor_t *t = st_result_find(r, tn);
    ok = t && t->ndim == 1 && t->shape[0] == (int64_t)RK_SIZES[k] && t->dtype == ST_DTYPE_UINT8 &&
         (device < 0 || (int)t->device == device);
    if (!ok) {
      fprintf(stderr, "   %s on %s: no tensor %s of %zu bytes%s\n", name, socket, tn, RK_SIZES[k],
              device < 0 ? "" : " on the device asked");
      break;
    }
    uint8_t *p = malloc(RK_SIZES[k]);
    ok = p && st_tensor_copy_to_host(t, p, RK_SIZES[k]) == ST_OK;
    for (size_t i = 0; ok && i < RK_SIZES[k]; i++)
      if (p[i] != rk_pattern(i, k, salt)) {
        fprintf(stderr, "   %s on %s: %s byte %zu is %u, not %u\n", name, socket, tn, i, p[i],
                rk_pattern(i, k, salt));
        ok = 0;
      }
    free(p);
  }
  st_result_free(r);
  st_client_close(c);
  return ok;
}

/* rk_holds_on whatever the device. */
static inline int rk_holds(const char *socket, const char *name, uint64_t version, int salt) {
  return rk_holds_on(socket, name, version, salt, -1);
}

/* Waits for task id on c to end (60 s at most): its status, "" when the
 * wait failed (said). */
static inline const char *rk_wait_end(st_client_t *c, uint64_t id, char *status, size_t len) {
  status[0] = '\0';
  double end = stt_now_ms() + 60000;
  while (stt_now_ms() < end) {
    st_result_t *info = NULL;
    if (st_client_task_wait(c, id, 5, &info) != ST_OK) {
      fprintf(stderr, "   wait %" PRIu64 ": %s\n", id, st_client_error(c));
      return status;
    }
    const st_value_t *s = st_value_get(st_result_value(info), "status");
    snprintf(status, len, "%s", s && s->kind == ST_VALUE_STRING ? s->as.str.ptr : "?");
    st_result_free(info);
    if (strcmp(status, "running") && strcmp(status, "pending")) return status;
  }
  return status;
}

#endif
