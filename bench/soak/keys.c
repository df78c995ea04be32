/* bench/soak: published keys. A put publishes {w = float32 [4, 16], k}
 * under one of SK_PUT_KEYS names (w[i] = k + i: every version is
 * checkable on its own); a get maps the latest version through a view
 * (a window, a column shard, a transpose, or a contiguous copy of the
 * shard, which the server keeps as a derived object of the version). One
 * put in eight deletes a key instead. NOT_FOUND (a key not put yet, or
 * deleted meanwhile) is an answer like any other. */
#include <stdio.h>

#include "worker.h"

static void key_name(th_t *t, char *out, size_t len) {
  snprintf(out, len, "soak.key.%d", sk_name_index(t, SK_PUT_KEYS));
}

void sk_op_put(th_t *t) {
  char name[32], err[256];
  key_name(t, name, sizeof name);
  if (sk_chance(t, 8)) {
    REQ(t, st_client_delete(t->c, name));
    return;
  }
  int64_t shape[2] = {4, 16}, k = sk_rnd(t, 1000);
  st_result_t *mem = NULL;
  if (st_tensor_alloc("cpu", ST_DTYPE_FLOAT32, 2, shape, &mem, err, sizeof err) != ST_OK) {
    sk_wrong(t, err);
    return;
  }
  const st_tensor_t *x = st_result_tensor(mem, 0);
  for (int i = 0; i < 64; i++) ((float *)x->data)[i] = (float)(k + i);
  st_args_t *a = st_args_new();
  st_args_int(a, "k", k);
  uint64_t version = 0;
  if (st_args_tensor(a, "w", x, err, sizeof err) != ST_OK) sk_wrong(t, err);
  else if (REQ(t, st_client_put(t->c, name, a, sk_rnd(t, 4) ? ST_KEY_PINNED : ST_KEY_EVICTABLE,
                                0, &version)) == ST_OK && version < 1)
    sk_wrong(t, "put: version 0");
  st_args_free(a);
  st_result_free(mem);   /* the server keeps its own reference */
}

/* The views a get picks from, and element (r, c) of each in terms of the
 * put's w (4 x 16, row-major): what the reply must hold. */
static const struct {
  const char *spec;
  int rows, cols;
} views[] = {
    {"w:slice(0,1,3)", 2, 16},
    {"w:shard(1,1,4)", 4, 4},
    {"w:transpose(0,1)", 16, 4},
    {"w:shard(1,1,4)|contiguous", 4, 4},
};

static int at_view(int v, int r, int c) {
  switch (v) {
  case 0: return (r + 1) * 16 + c;
  case 1: case 3: return r * 16 + 4 + c;
  default: return c * 16 + r;
  }
}

void sk_op_get(th_t *t) {
  char name[32];
  key_name(t, name, sizeof name);
  int v = sk_rnd(t, 4), flags = sk_rnd(t, 2) ? ST_GET_READONLY : 0;
  st_result_t *r = NULL;
  uint64_t got = 0;
  if (REQ(t, st_client_get_view(t->c, name, 0, flags, views[v].spec, &r, &got)) != ST_OK) return;
  const st_value_t *kv = st_value_get(st_result_value(r), "k");
  const st_tensor_t *w = st_result_find(r, "w");
  if (!kv || kv->kind != ST_VALUE_INT || !w || w->ndim != 2 || w->shape[0] != views[v].rows ||
      w->shape[1] != views[v].cols || got < 1) {
    sk_wrong(t, "get: shape or value");
  } else {
    int64_t k = kv->as.integer;
    for (int i = 0; i < views[v].rows * views[v].cols; i++)
      if (st_tensor_get(w, i) != (double)(k + at_view(v, i / views[v].cols, i % views[v].cols))) {
        sk_wrong(t, views[v].spec);
        break;
      }
  }
  st_result_free(r);
}
