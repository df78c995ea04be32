/* Helpers of the import-cache tests (test_argcache.c, test_gpu_argcache.c):
 * info figures and the call of the "add" endpoint they both serve. */
#ifndef STT_ARGCACHE_KIT_H
#define STT_ARGCACHE_KIT_H

#include <st/client.h>
#include <stdio.h>

#include "client_kit.h"

/* info's integer at <section>.<key> on c, or -1. */
static inline int64_t ak_info_int(st_client_t *c, const char *section, const char *key) {
  st_result_t *info = NULL;
  if (st_client_info(c, &info) != ST_OK) return -1;
  const st_value_t *v = st_value_get(st_value_get(st_result_value(info), section), key);
  int64_t n = v && v->kind == ST_VALUE_INT ? v->as.integer : -1;
  st_result_free(info);
  return n;
}

/* Calls add(x = tensor 0 of t, k) on c: the value the endpoint read
 * (x[0] before it added k), or -1e30 (the failure printed). */
static inline double ak_add(st_client_t *c, st_result_t *t, int k) {
  st_args_t *a = st_args_new();
  char err[256];
  st_result_t *r = NULL;
  double v = -1e30;
  if (st_args_tensor(a, "x", st_result_tensor(t, 0), err, sizeof err) != ST_OK) {
    fprintf(stderr, "   st_args_tensor: %s\n", err);
  } else if (st_args_int(a, "k", k) == ST_OK &&
             stt_client_report(c, "add", st_client_call(c, "add", a, &r)) == ST_OK) {
    const st_value_t *val = st_result_value(r);
    v = val->kind == ST_VALUE_FLOAT ? val->as.number : (double)val->as.integer;
  }
  st_result_free(r);
  st_args_free(a);
  return v;
}

#endif
