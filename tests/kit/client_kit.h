/* Client-side checks and connections for the tests of libstclient and
 * stcli (they link the public library; the rest of the kit does not):
 *
 *   OPEN_CLIENT(c, S.socket);        // or: st_client_t *c = stt_client_open(...)
 *   CHECK_RC(st_client_call(c, "e", NULL, &r), ST_OK, c);
 *
 * A failing CHECK_RC names both errors and quotes st_client_error(c).
 * Header-only (static functions).
 */
#ifndef STT_CLIENT_KIT_H
#define STT_CLIENT_KIT_H

#include <st/client.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "fixture.h"

#define CHECK_RC(expr, want, c) CHECK_ERR_MSG(expr, want, st_client_error(c))

/* A client connected to the socket at path, or NULL (the reason printed). */
static inline st_client_t *stt_client_open(const char *path) {
  st_client_t *c = NULL;
  char err[256];
  if (st_client_connect(path, &c, err, sizeof err) != ST_OK)
    fprintf(stderr, "connect %s: %s\n", path, err);
  return c;
}

/* In a test: declares `st_client_t *c` connected to the socket at path,
 * and fails the test when it cannot connect. */
#define OPEN_CLIENT(c, path)                                         \
  st_client_t *c = stt_client_open(path);                            \
  CHECK(c)


/* A server of one worker with `eps` (stt_server_setup) and a client of
 * it with a 60 s timeout for each reply, as the GPU tests start (NULL
 * when it cannot connect). */
static inline st_client_t *stt_one_worker_client(stt_server_t *s, const stt_endpoint_t *eps) {
  stt_server_setup(s, "workers = 1,", eps);
  st_client_t *c = stt_client_open(s->socket);
  if (c) st_client_set_timeout(c, 60000);
  return c;
}
/* A server with `config` and `eps` (stt_server_setup) and a client of
 * it, for a test's main: exits with status 1 (the reason printed) when it
 * cannot connect. */
static inline st_client_t *stt_serve_client(stt_server_t *s, const char *config,
                                            const stt_endpoint_t *eps) {
  stt_server_setup(s, config, eps);
  st_client_t *c = stt_client_open(s->socket);
  if (!c) exit(1);
  return c;
}

/* The end of a test's main: closes c, then stt_server_finish(s); returns
 * the exit status. */
static inline int stt_client_finish(st_client_t *c, stt_server_t *s) {
  st_client_close(c);
  return stt_server_finish(s);
}

/* A tensor of n elements of `dtype` on `device` from st_tensor_alloc,
 * or NULL (the library's message printed). */
static inline st_result_t *stt_tensor_alloc_1d(const char *device, st_dtype_t dtype, int64_t n) {
  st_result_t *r = NULL;
  char err[256];
  if (st_tensor_alloc(device, dtype, 1, &n, &r, err, sizeof err) != ST_OK) {
    fprintf(stderr, "   st_tensor_alloc: %s\n", err);
    return NULL;
  }
  return r;
}

/* A CPU float32 tensor of n elements of st_tensor_alloc, every one
 * `value`, or NULL (said). */
static inline st_result_t *stt_tensor_filled(int64_t n, float value) {
  st_result_t *r = stt_tensor_alloc_1d("cpu", ST_DTYPE_FLOAT32, n);
  if (!r) return NULL;
  float *p = st_result_tensor(r, 0)->data;
  for (int64_t i = 0; i < n; i++) p[i] = value;
  return r;
}

/* Waits until the server c talks to has finished the teardowns it queued
 * (arenas let go on a loop thread are released by its releaser thread):
 * `info` waits for that queue. Call it before reading a baseline of
 * device or host memory that the server's releases would still raise.
 * 1 on success. */
static inline int stt_client_settle(st_client_t *c) {
  st_result_t *r = NULL;
  int rc = st_client_info(c, &r);
  st_result_free(r);
  return rc == ST_OK;
}

/* info's integer at a.b[.c] on c (a boolean as 1 or 0), or -1. */
static inline int64_t stt_info_int(st_client_t *c, const char *a, const char *b, const char *d) {
  st_result_t *info = NULL;
  if (st_client_info(c, &info) != ST_OK) return -1;
  const st_value_t *v = st_value_get(st_value_get(st_result_value(info), a), b);
  if (d) v = st_value_get(v, d);
  int64_t n = !v                         ? -1
              : v->kind == ST_VALUE_INT  ? v->as.integer
              : v->kind == ST_VALUE_BOOL ? v->as.boolean
                                         : -1;
  st_result_free(info);
  return n;
}

/* Prints "what: NAME: message" of c's last failure when rc is one;
 * returns rc. */
static inline int stt_client_report(st_client_t *c, const char *what, int rc) {
  if (rc != ST_OK)
    fprintf(stderr, "%s: %s: %s\n", what, st_client_error_name(c), st_client_error(c));
  return rc;
}

/* Calls `endpoint` on c with n integer arguments keys[i] = vals[i]; the
 * result, or NULL with the client's error printed. */
static inline st_result_t *stt_call_ints(st_client_t *c, const char *endpoint,
                                         const char *const *keys, const int64_t *vals, int n) {
  st_args_t *a = st_args_new();
  for (int i = 0; i < n; i++) st_args_int(a, keys[i], vals[i]);
  st_result_t *r = NULL;
  int rc = st_client_call(c, endpoint, a, &r);
  st_args_free(a);
  if (rc != ST_OK) fprintf(stderr, "   %s: %s\n", endpoint, st_client_error(c));
  return rc == ST_OK ? r : NULL;
}

#endif
