/* src/tensor/constructors.c: the constructors of constructors.h. zeros
 * makes a zero-filled tensor and empty one of unspecified contents
 * (st__tensor_new; ST__INIT_ANY: a recycled pool region keeps its
 * connection's earlier bytes); the others make one they write whole
 * (ST__INIT_WRITTEN: a recycled pool region is not zero-filled first)
 * with one operation of ops.h (fill, or a generator).
 * Runs on the thread that owns the context. */
#include "tensor/constructors.h"
#include "common/generators.h"

#include <math.h>

#include "tensor/ops.h"

int st__tensor_empty(st__tensor_ctx_t *c, st__tensor_t *out, int device, st_dtype_t dtype,
                     int ndim, const int64_t *shape, char *err, size_t errlen) {
  return st__tensor_new(c, out, device, dtype, ndim, shape, ST__INIT_ANY, err, errlen);
}

int st__tensor_zeros(st__tensor_ctx_t *c, st__tensor_t *out, int device, st_dtype_t dtype,
                     int ndim, const int64_t *shape, char *err, size_t errlen) {
  return st__tensor_new(c, out, device, dtype, ndim, shape, ST__INIT_ZEROS, err, errlen);
}

/* A new tensor, then `fill` over it: one generator, or a value when g is
 * NULL. Releases the tensor when filling fails. */
static int made(st__tensor_ctx_t *c, st__tensor_t *out, int device, st_dtype_t dtype, int ndim,
                const int64_t *shape, const st__gen_t *g, double value, const char *what,
                char *err, size_t errlen) {
  int rc = st__tensor_new(c, out, device, dtype, ndim, shape, ST__INIT_WRITTEN, err, errlen);
  if (rc != ST_OK) return rc;
  rc = g ? st__tensor_generate(c, out, g, what, err, errlen)
         : st__tensor_fill(c, out, value, what, err, errlen);
  if (rc != ST_OK) st__tensor_release(out);
  return rc;
}

int st__tensor_ones(st__tensor_ctx_t *c, st__tensor_t *out, int device, st_dtype_t dtype,
                    int ndim, const int64_t *shape, char *err, size_t errlen) {
  return made(c, out, device, dtype, ndim, shape, NULL, 1.0, "ones", err, errlen);
}

int st__tensor_full(st__tensor_ctx_t *c, st__tensor_t *out, int device, st_dtype_t dtype,
                    int ndim, const int64_t *shape, double value, char *err, size_t errlen) {
  return made(c, out, device, dtype, ndim, shape, NULL, value, "full", err, errlen);
}

/* Nonzero when d is integral (and fits int64). */
static int integral(double d) {
  return d >= -9223372036854775808.0 && d < 9223372036854775808.0 && floor(d) == d;
}

int st__tensor_arange(st__tensor_ctx_t *c, st__tensor_t *out, int device, st_dtype_t dtype,
                      double start, double stop, double step, char *err, size_t errlen) {
  out->arena = NULL;
  if (step == 0 || !isfinite(start) || !isfinite(stop) || !isfinite(step))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                           "arange: start, stop and step must be finite and step nonzero");
  double count = ceil((stop - start) / step);
  if (count < 0) count = 0;
  if (count > 9.0e15)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "arange: too many elements");
  if (dtype == ST_DTYPE_INVALID)
    dtype = integral(start) && integral(stop) && integral(step) ? ST_DTYPE_INT64
                                                                : ST_DTYPE_FLOAT32;
  int64_t n = (int64_t)count;
  st__gen_t g = {.kind = ST__GEN_ARANGE, .a = start, .b = step};
  return made(c, out, device, dtype, 1, &n, &g, 0, "arange", err, errlen);
}

/* rand and randn: a floating dtype, element i from Philox of seed. */
static int random_of(st__tensor_ctx_t *c, st__tensor_t *out, int device, st_dtype_t dtype,
                     int ndim, const int64_t *shape, const st__gen_t *g, const char *what,
                     char *err, size_t errlen) {
  out->arena = NULL;
  if (!st_dtype_is_float(dtype))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                           "%s: dtype must be a floating type, got %s", what,
                           st_dtype_name(dtype));
  return made(c, out, device, dtype, ndim, shape, g, 0, what, err, errlen);
}

int st__tensor_rand(st__tensor_ctx_t *c, st__tensor_t *out, int device, st_dtype_t dtype,
                    int ndim, const int64_t *shape, uint64_t seed, char *err, size_t errlen) {
  st__gen_t g = {.kind = ST__GEN_RAND, .seed = seed, .wide = dtype == ST_DTYPE_FLOAT64};
  return random_of(c, out, device, dtype, ndim, shape, &g, "rand", err, errlen);
}

int st__tensor_randn(st__tensor_ctx_t *c, st__tensor_t *out, int device, st_dtype_t dtype,
                     int ndim, const int64_t *shape, uint64_t seed, char *err, size_t errlen) {
  st__gen_t g = {.kind = ST__GEN_RANDN, .seed = seed};
  return random_of(c, out, device, dtype, ndim, shape, &g, "randn", err, errlen);
}
