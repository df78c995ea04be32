/* bench/soak: live keys. A publisher puts {w = float32 [SK_LIVE_NUMEL]}
 * live under one of SK_LIVE_KEYS names (a put into a live key another
 * connection publishes takes it over), keeps the handle and updates w in
 * place, every element to one value, an element at a time (a reader that
 * races it sees a mix unless the seqlock says so). A bound reader keeps a
 * read-only handle, waits for the next version, and reads w between
 * read_begin and read_end: a read reported consistent must hold one
 * value. A publisher SIGKILLed mid-update leaves its key torn
 * (STALE_HANDLE) until the next live put completes an update. */
#include <stdio.h>

#include "worker.h"

void sk_close_live(th_t *t) {
  st_key_close(t->live_pub);
  st_key_close(t->live_rd);
  t->live_pub = t->live_rd = NULL;
}

static void live_name(th_t *t, char *out, size_t len) {
  snprintf(out, len, "soak.live.%d", sk_name_index(t, SK_LIVE_KEYS));
}

/* Puts a live key (new, or taken over) and opens it as its publisher. */
static void live_put(th_t *t) {
  char name[32], err[256];
  live_name(t, name, sizeof name);
  int64_t n = SK_LIVE_NUMEL;
  st_result_t *mem = NULL;
  if (st_tensor_alloc("cpu", ST_DTYPE_FLOAT32, 1, &n, &mem, err, sizeof err) != ST_OK) {
    sk_wrong(t, err);
    return;
  }
  const st_tensor_t *x = st_result_tensor(mem, 0);
  for (int i = 0; i < SK_LIVE_NUMEL; i++) ((float *)x->data)[i] = t->live_next;
  t->live_next += 1;
  st_args_t *a = st_args_new();
  int rc = st_args_tensor(a, "w", x, err, sizeof err);
  if (rc != ST_OK) sk_wrong(t, err);
  else rc = REQ(t, st_client_put(t->c, name, a, ST_KEY_PINNED, ST_PUT_LIVE, NULL));
  st_args_free(a);
  st_result_free(mem);
  if (rc != ST_OK || REQ(t, st_key_open(t->c, name, 0, &t->live_pub)) != ST_OK) return;
  /* Another connection may have put it live in between: then this one
   * is a reader now, and lets go. */
  if (!st_key_is_publisher(t->live_pub)) {
    st_key_close(t->live_pub);
    t->live_pub = NULL;
  }
}

void sk_op_live_pub(th_t *t) {
  if (!t->live_pub) {
    live_put(t);
    return;
  }
  sk_local(t);
  int rc = st_key_begin_update(t->live_pub);
  if (rc != ST_OK) {
    /* Taken over by another connection's put (STALE_HANDLE). */
    if (rc != ST_ERR_STALE_HANDLE) sk_wrong(t, st_key_error(t->live_pub));
    st_key_close(t->live_pub);
    t->live_pub = NULL;
    return;
  }
  const st_tensor_t *w = st_result_find(st_key_result(t->live_pub), "w");
  volatile float *p = w ? (float *)w->data : NULL;
  for (int i = 0; p && i < SK_LIVE_NUMEL; i++) p[i] = t->live_next;
  t->live_next += 1;
  if (st_key_end_update(t->live_pub, NULL) != ST_OK) sk_wrong(t, st_key_error(t->live_pub));
  if (!w) sk_wrong(t, "live: no tensor 'w'");
  if (sk_chance(t, 16)) {   /* let go of the handle; the next op puts again */
    st_key_close(t->live_pub);
    t->live_pub = NULL;
  }
}

void sk_op_live_read(th_t *t) {
  if (!t->live_rd) {
    char name[32];
    live_name(t, name, sizeof name);
    /* NOT_FOUND (not put yet), STALE_HANDLE (torn) are answers. */
    if (REQ(t, st_key_open(t->c, name, ST_GET_READONLY, &t->live_rd)) != ST_OK) t->live_rd = NULL;
    if (!t->live_rd) return;
  }
  st_key_t *k = t->live_rd;
  uint64_t got = 0;
  sk_local(t);
  int rc = st_key_wait_version(k, st_key_version(k) + 1, SK_WAIT_MS, &got);
  for (int tries = 0; (rc == ST_OK || rc == ST_ERR_TIMEOUT) && tries < 8; tries++) {
    uint64_t seq = 0;
    int consistent = 0;
    sk_local(t);
    if ((rc = st_key_read_begin(k, SK_WAIT_MS, &seq)) != ST_OK) break;
    const st_tensor_t *w = st_result_find(st_key_result(k), "w");
    float copy[SK_LIVE_NUMEL];
    for (int i = 0; w && i < SK_LIVE_NUMEL; i++) copy[i] = ((volatile float *)w->data)[i];
    if ((rc = st_key_read_end(k, seq, NULL, &consistent)) != ST_OK || !consistent) continue;
    for (int i = 1; w && i < SK_LIVE_NUMEL; i++)
      if (copy[i] != copy[0]) {
        sk_wrong(t, "live: a read reported consistent holds two versions");
        break;
      }
    if (!w) sk_wrong(t, "live: no tensor 'w'");
    break;
  }
  /* Torn (STALE_HANDLE) or deleted (NOT_FOUND): open again later; and
   * now and then a reader moves to another key. */
  if ((rc != ST_OK && rc != ST_ERR_TIMEOUT) || sk_chance(t, 16)) {
    st_key_close(t->live_rd);
    t->live_rd = NULL;
  }
}
