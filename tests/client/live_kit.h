/* Helpers of the live-key tests (test_live.c, test_live_versions.c,
 * test_gpu_live.c): a live put of one tensor named "w", one update of it
 * from a tensor, and waiting for a get of a key to stop succeeding. */
#ifndef STT_LIVE_KIT_H
#define STT_LIVE_KIT_H

#include <st/client.h>
#include <stdio.h>
#include <unistd.h>

#include "fixture.h"

/* Puts {w: t} under key as a live key with `policy`. */
static inline int lk_put_live(st_client_t *c, const char *key, const st_tensor_t *t, int policy,
                              uint64_t *version) {
  st_args_t *a = st_args_new();
  char err[256];
  int rc = st_args_tensor(a, "w", t, err, sizeof err);
  if (rc == ST_OK) rc = st_client_put(c, key, a, policy, ST_PUT_LIVE, version);
  else fprintf(stderr, "   args: %s\n", err);
  if (rc != ST_OK) fprintf(stderr, "   put %s: %s\n", key, st_client_error(c));
  st_args_free(a);
  return rc;
}

/* One update (st_key_update) of the key's w from tensor 0 of src, which
 * it frees. */
static inline int lk_update(st_key_t *k, st_result_t *src) {
  if (!src) return -1;
  st_tensor_t t = *st_result_tensor(src, 0);
  t.name = "w";
  const st_tensor_t *list[1] = {&t};
  int rc = st_key_update(k, list, 1);
  if (rc != ST_OK) fprintf(stderr, "   update: %s\n", st_key_error(k));
  st_result_free(src);
  return rc;
}

/* Gets `key` every 2 ms until a get fails (the server noticed what a
 * test did to it) or 10 s passed. The last get's status. */
static inline int lk_get_until_refused(st_client_t *c, const char *key) {
  st_result_t *g = NULL;
  int rc;
  double t0 = stt_now_ms();
  while ((rc = st_client_get(c, key, 0, 0, &g, NULL)) == ST_OK && stt_now_ms() - t0 < 10000) {
    st_result_free(g);
    g = NULL;
    usleep(2000);
  }
  return rc;
}

#endif
