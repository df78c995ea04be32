/* src/tensor/tensor.c: contexts, failures, tensors and their views, wire
 * descriptors (see tensor.h for every contract). Calls no other file of
 * the core. Runs on the thread that owns the context. */
#include "tensor/tensor.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>


/* ------------------------------------------------------------ errors */

int st__tensor_fail_call(st__tensor_ctx_t *c, int rc, char *err, size_t errlen,
                         const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err_msg, sizeof c->err_msg, fmt, ap);
  va_end(ap);
  if (err && errlen) {
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  c->err_code = rc;
  return rc;
}

/* ------------------------------------------------------------ contexts */

void st__tensor_ctx_init(st__tensor_ctx_t *c) {
  memset(c, 0, sizeof *c);
  c->device = ST__DEV_CPU;
  c->cuda_device = 0;              /* "cuda" outside a server call: cuda:0 */
}

void st__tensor_ctx_clear_error(st__tensor_ctx_t *c) {
  c->err_code = 0;
  c->err_msg[0] = '\0';
}

/* ------------------------------------------------------------ tensors */

void st__tensor_share(st__tensor_t *out, const st__tensor_t *t, const st__geom_t *g) {
  st__arena_ref(t->arena);
  out->arena = t->arena;
  out->geom = *g;
}

int st__tensor_device(const st__tensor_t *t) {
  return st__arena_device(t->arena);
}

char *st__tensor_data(const st__tensor_t *t) {
  return (char *)st__arena_base(t->arena) + t->geom.offset;
}

/* ------------------------------------------------------------ views */

/* Shares t into out when rc (the geometry's verdict on g) is ST_OK. */
static int shared(int rc, st__tensor_t *out, const st__tensor_t *t, const st__geom_t *g) {
  if (rc == ST_OK) st__tensor_share(out, t, g);
  return rc;
}

int st__tensor_narrow(st__tensor_t *out, const st__tensor_t *t, int64_t dim, int64_t start,
                      int64_t length, char *err, size_t errlen) {
  st__geom_t g = t->geom;
  return shared(st__geom_narrow(&g, dim, start, length, err, errlen), out, t, &g);
}

int st__tensor_slice(st__tensor_t *out, const st__tensor_t *t, int64_t dim, int64_t start,
                     int64_t stop, int64_t step, char *err, size_t errlen) {
  st__geom_t g = t->geom;
  return shared(st__geom_slice(&g, dim, start, stop, step, err, errlen), out, t, &g);
}

int st__tensor_permute(st__tensor_t *out, const st__tensor_t *t, int n, const int64_t *dims,
                       char *err, size_t errlen) {
  st__geom_t g = t->geom;
  return shared(st__geom_permute(&g, n, dims, err, errlen), out, t, &g);
}

int st__tensor_transpose(st__tensor_t *out, const st__tensor_t *t, int64_t d0, int64_t d1,
                         char *err, size_t errlen) {
  st__geom_t g = t->geom;
  return shared(st__geom_transpose(&g, d0, d1, err, errlen), out, t, &g);
}

int st__tensor_view(st__tensor_t *out, const st__tensor_t *t, int ndim, const int64_t *shape,
                    char *err, size_t errlen) {
  st__geom_t g = t->geom;
  return shared(st__geom_view(&g, ndim, shape, err, errlen), out, t, &g);
}

/* ------------------------------------------------------------ descriptors */

int st__tensor_from_desc(st__tensor_t *out, st__arena_t *a, const st__tensor_desc_t *d,
                         char *err, size_t errlen) {
  uint64_t lo, hi;
  if (!a ||
      st__geom_extent_of(d->dtype, d->offset, d->ndim, d->shape, d->strides, &lo, &hi) !=
          ST_OK ||
      hi > st__arena_bytes(a))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                           "tensor on arena %u does not fit what was mapped", (unsigned)d->arena);
  int rc = st__arena_map(a, NULL, err, errlen);
  if (rc != ST_OK) return rc;
  st__geom_t g;
  memset(&g, 0, sizeof g);
  g.dtype = d->dtype;
  g.offset = d->offset;
  g.ndim = d->ndim;
  memcpy(g.shape, d->shape, (size_t)d->ndim * sizeof *d->shape);
  memcpy(g.strides, d->strides, (size_t)d->ndim * sizeof *d->strides);
  st__arena_ref(a);
  out->arena = a;
  out->geom = g;
  return ST_OK;
}

void st__tensor_describe(const st__tensor_t *t, uint32_t arena, st__tensor_desc_t *d) {
  memset(d, 0, sizeof *d);
  d->arena = arena;
  d->offset = t->geom.offset;
  d->dtype = t->geom.dtype;
  d->ndim = t->geom.ndim;
  memcpy(d->shape, t->geom.shape, sizeof d->shape);
  memcpy(d->strides, t->geom.strides, sizeof d->strides);
}
