/* src/tensor/cpu.c: the CPU backend (backend.h): loops over host memory,
 * synchronous, never failing. Same dtypes copy bytes (exact for int64 and
 * NaN payloads); different dtypes go through st_dtype_load/store (a
 * double), which the CUDA kernels mirror byte for byte. */
#include <string.h>

#include "tensor/backend.h"

/* Copies element by element over `shape`, row-major. Contiguous rows of
 * one dtype are one memcpy. */
static void strided_copy(char *dbase, st_dtype_t dd, const int64_t *dstr, const char *sbase,
                         st_dtype_t sd, const int64_t *sstr, int ndim, const int64_t *shape) {
  size_t des = st_dtype_size(dd), ses = st_dtype_size(sd);
  int64_t idx[ST_MAX_NDIM] = {0};
  for (int i = 0; i < ndim; i++)
    if (shape[i] == 0) return;
  int inner = ndim - 1;
  int64_t rows = 1;
  for (int i = 0; i < inner; i++) rows *= shape[i];
  int64_t len = ndim ? shape[inner] : 1;
  int64_t ds = ndim ? dstr[inner] : 0, ss = ndim ? sstr[inner] : 0;
  for (int64_t r = 0; r < rows; r++) {
    int64_t doff = 0, soff = 0;
    for (int i = 0; i < inner; i++) {
      doff += idx[i] * dstr[i];
      soff += idx[i] * sstr[i];
    }
    if (dd == sd && ds == 1 && ss == 1) {
      memcpy(dbase + doff * (int64_t)des, sbase + soff * (int64_t)ses, (size_t)len * des);
    } else if (dd == sd) {
      for (int64_t j = 0; j < len; j++)
        memcpy(dbase + (doff + j * ds) * (int64_t)des, sbase + (soff + j * ss) * (int64_t)ses,
               des);
    } else {
      for (int64_t j = 0; j < len; j++)
        st_dtype_store(dd, dbase, (size_t)(doff + j * ds),
                       st_dtype_load(sd, sbase, (size_t)(soff + j * ss)));
    }
    for (int i = inner - 1; i >= 0; i--) {    /* odometer over outer dims */
      if (++idx[i] < shape[i]) break;
      idx[i] = 0;
    }
  }
}

static int cpu_copy(st__tensor_ctx_t *c, const st__tensor_t *dst, const st__tensor_t *src,
                    const char *what, char *err, size_t errlen) {
  strided_copy(st__tensor_data(dst), dst->geom.dtype, dst->geom.strides, st__tensor_data(src),
               src->geom.dtype, src->geom.strides, dst->geom.ndim, dst->geom.shape);
  return ST_OK;
}

static int cpu_fill(st__tensor_ctx_t *c, const st__tensor_t *t, double v, const char *what,
                    char *err, size_t errlen) {
  unsigned char pat[8];
  const st__geom_t *g = &t->geom;
  st_dtype_store(g->dtype, pat, 0, v);
  int64_t n = st__geom_numel(g);
  if (n == 0) return ST_OK;
  if (st__geom_is_contiguous(g)) {
    size_t es = st_dtype_size(g->dtype);
    /* Doubling copies of the pattern up to one block, then copies of that
     * block, which stays in the L1 cache: the fill reads nothing back
     * from memory (a doubling copy of the whole tensor read half of it). */
    enum { BLOCK = 4096 };
    char *d = st__tensor_data(t);
    memcpy(d, pat, es);
    size_t have = es, total = (size_t)n * es;
    while (have < total) {
      size_t k = have < BLOCK ? have : BLOCK;
      if (k > total - have) k = total - have;
      memcpy(d + have, d, k);
      have += k;
    }
  } else {
    int64_t zero[ST_MAX_NDIM] = {0};
    strided_copy(st__tensor_data(t), g->dtype, g->strides, (char *)pat, g->dtype, zero, g->ndim,
                 g->shape);
  }
  return ST_OK;
}

static int cpu_affine(st__tensor_ctx_t *c, const st__tensor_t *t, double mul, double add,
                      const char *what, char *err, size_t errlen) {
  const st__geom_t *g = &t->geom;
  int64_t idx[ST_MAX_NDIM] = {0};
  int64_t n = st__geom_numel(g);
  char *base = st__tensor_data(t);
  for (int64_t k = 0; k < n; k++) {
    int64_t off = 0;
    for (int i = 0; i < g->ndim; i++) off += idx[i] * g->strides[i];
    volatile double prod = st_dtype_load(g->dtype, base, (size_t)off) * mul;  /* no FMA */
    st_dtype_store(g->dtype, base, (size_t)off, prod + add);
    for (int i = g->ndim - 1; i >= 0; i--) {  /* odometer */
      if (++idx[i] < g->shape[i]) break;
      idx[i] = 0;
    }
  }
  return ST_OK;
}

static int cpu_generate(st__tensor_ctx_t *c, const st__tensor_t *t, const st__gen_t *g,
                        const char *what, char *err, size_t errlen) {
  int64_t n = st__geom_numel(&t->geom);
  char *d = st__tensor_data(t);
  st_dtype_t dt = t->geom.dtype;
  switch (g->kind) {
#define ST__GEN_LOOP(K, name)                                                              \
  case ST__GEN_##K:                                                                        \
    for (int64_t i = 0; i < n; i++) st_dtype_store(dt, d, (size_t)i, st__gen_##name(g, (uint64_t)i)); \
    return ST_OK;
    ST__GENERATORS(ST__GEN_LOOP)
#undef ST__GEN_LOOP
  case ST__GEN_COUNT: break;
  }
  return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "%s: unknown generator %d", what,
                         (int)g->kind);
}

static int cpu_copy_bytes(st__tensor_ctx_t *c, int device, void *dst, const void *src,
                          uint64_t bytes, const char *what, char *err, size_t errlen) {
  memcpy(dst, src, (size_t)bytes);
  return ST_OK;
}

static int cpu_sync(st__tensor_ctx_t *c, int device, const char *what, char *err,
                    size_t errlen) {
  return ST_OK;
}

static void cpu_quiesce(int device) {}

const st__tensor_backend_t st__tensor_cpu_backend = ST__TENSOR_BACKEND(cpu);
