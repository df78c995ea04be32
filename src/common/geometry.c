/* src/common/geometry.c: see geometry.h. Pure arithmetic: no allocation,
 * no state, any thread. */
#include "common/geometry.h"

#include <string.h>

#include "common/fail.h"

/* Elements and bytes a geometry may describe at most. */
#define MAX_SPAN ((uint64_t)1 << 62)

/* ---------------------------------------------------------- on raw arrays */

int64_t st__geom_numel_of(int ndim, const int64_t *shape) {
  if (ndim < 0 || ndim > ST_MAX_NDIM) return -1;
  for (int k = 0; k < ndim; k++)
    if (shape[k] == 0) return 0;
  int64_t n = 1;
  for (int k = 0; k < ndim; k++)
    if (shape[k] < 0 || __builtin_mul_overflow(n, shape[k], &n)) return -1;
  return n;
}

int st__geom_contiguous_of(int ndim, const int64_t *shape, const int64_t *strides) {
  for (int k = 0; k < ndim; k++)
    if (shape[k] == 0) return 1;
  int64_t want = 1;
  for (int k = ndim - 1; k >= 0; k--) {
    if (shape[k] == 1) continue;
    if (strides[k] != want) return 0;
    want *= shape[k];
  }
  return 1;
}

void st__geom_row_major(int ndim, const int64_t *shape, int64_t *strides) {
  int64_t s = 1;
  for (int k = ndim - 1; k >= 0; k--) {
    strides[k] = s;
    s *= shape[k] ? shape[k] : 1;
  }
}

int st__geom_extent_of(st_dtype_t dtype, uint64_t offset, int ndim, const int64_t *shape,
                       const int64_t *strides, uint64_t *lo, uint64_t *hi) {
  uint64_t es = st_dtype_size(dtype);
  if (es == 0 || ndim < 0 || ndim > ST_MAX_NDIM) return ST_ERR_INVALID_ARGUMENT;
  for (int k = 0; k < ndim; k++)
    if (shape[k] < 0 || strides[k] < 0) return ST_ERR_INVALID_ARGUMENT;
  int64_t numel = st__geom_numel_of(ndim, shape), nbytes;
  if (numel < 0 || __builtin_mul_overflow(numel, (int64_t)es, &nbytes))
    return ST_ERR_INVALID_ARGUMENT;
  if (numel == 0) {
    if (offset > (uint64_t)INT64_MAX) return ST_ERR_INVALID_ARGUMENT;   /* hi is the offset */
    *lo = *hi = offset;
    return ST_OK;
  }
  uint64_t span = 0, term, end;
  for (int k = 0; k < ndim; k++) {
    if (__builtin_mul_overflow((uint64_t)(shape[k] - 1), (uint64_t)strides[k], &term) ||
        __builtin_add_overflow(span, term, &span))
      return ST_ERR_INVALID_ARGUMENT;
  }
  if (__builtin_add_overflow(span, (uint64_t)1, &span) ||
      __builtin_mul_overflow(span, es, &span) || __builtin_add_overflow(offset, span, &end) ||
      end > (uint64_t)INT64_MAX)
    return ST_ERR_INVALID_ARGUMENT;
  *lo = offset;
  *hi = end;
  return ST_OK;
}

/* ---------------------------------------------------------- on a geometry */

int64_t st__geom_numel(const st__geom_t *g) {
  int64_t n = 1;
  for (int k = 0; k < g->ndim; k++) n *= g->shape[k];
  return n;
}

uint64_t st__geom_nbytes(const st__geom_t *g) {
  return (uint64_t)st__geom_numel(g) * st_dtype_size(g->dtype);
}

int st__geom_is_contiguous(const st__geom_t *g) {
  return st__geom_contiguous_of(g->ndim, g->shape, g->strides);
}

void st__geom_set_contiguous(st__geom_t *g) {
  st__geom_row_major(g->ndim, g->shape, g->strides);
}

int st__geom_init(st__geom_t *g, st_dtype_t dtype, int ndim, const int64_t *shape, char *err,
                  size_t errlen) {
  if (ndim < 0 || ndim > ST_MAX_NDIM)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "a tensor has at most %d dimensions, got %d", ST_MAX_NDIM, ndim);
  uint64_t n = 1;
  for (int k = 0; k < ndim; k++) {
    if (shape[k] < 0)
      return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "size %lld of dim %d is negative", (long long)shape[k], k);
    if (shape[k] && n > MAX_SPAN / (uint64_t)shape[k])
      return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "tensor shape is too large");
    n *= (uint64_t)shape[k];
  }
  size_t es = st_dtype_size(dtype);
  if (es == 0) return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "invalid dtype %d", (int)dtype);
  if (n > MAX_SPAN / es) return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "tensor shape is too large");
  memset(g, 0, sizeof *g);
  g->dtype = dtype;
  g->ndim = ndim;
  memcpy(g->shape, shape, (size_t)ndim * sizeof *shape);
  st__geom_set_contiguous(g);
  return ST_OK;
}

int st__geom_dim(const st__geom_t *g, int64_t dim, int *out, char *err, size_t errlen) {
  int64_t n = g->ndim;
  if (dim < -n || dim >= n || n == 0)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "dim %lld is out of range for a tensor of %d dims", (long long)dim,
                g->ndim);
  *out = (int)(dim < 0 ? dim + n : dim);
  return ST_OK;
}

int st__geom_narrow(st__geom_t *g, int64_t dim, int64_t start, int64_t length, char *err,
                    size_t errlen) {
  int d = 0;
  int rc = st__geom_dim(g, dim, &d, err, errlen);
  if (rc != ST_OK) return rc;
  int64_t size = g->shape[d], first = start < 0 ? start + size : start;
  if (first < 0 || first > size)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "start %lld is out of range for dim %d of size %lld",
                (long long)start, d, (long long)size);
  if (length < 0) return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "length %lld is negative", (long long)length);
  if (length > size - first)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "start %lld + length %lld exceeds size %lld of dim %d",
                (long long)first, (long long)length, (long long)size, d);
  g->offset += (uint64_t)(first * g->strides[d]) * st_dtype_size(g->dtype);
  g->shape[d] = length;
  return ST_OK;
}

int st__geom_slice(st__geom_t *g, int64_t dim, int64_t start, int64_t stop, int64_t step,
                   char *err, size_t errlen) {
  int d = 0;
  int rc = st__geom_dim(g, dim, &d, err, errlen);
  if (rc != ST_OK) return rc;
  if (step <= 0) return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "step must be positive, got %lld", (long long)step);
  int64_t size = g->shape[d];
  if (start < 0) start += size;
  if (stop < 0) stop += size;
  start = start < 0 ? 0 : start > size ? size : start;
  stop = stop < start ? start : stop > size ? size : stop;
  g->offset += (uint64_t)(start * g->strides[d]) * st_dtype_size(g->dtype);
  g->shape[d] = (stop - start + step - 1) / step;
  g->strides[d] *= step;
  return ST_OK;
}

int st__geom_permute(st__geom_t *g, int n, const int64_t *dims, char *err, size_t errlen) {
  if (n != g->ndim)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "expected %d dims, got %d", g->ndim, n);
  int seen[ST_MAX_NDIM] = {0}, idx[ST_MAX_NDIM];
  for (int i = 0; i < n; i++) {
    int rc = st__geom_dim(g, dims[i], &idx[i], err, errlen);
    if (rc != ST_OK) return rc;
    if (seen[idx[i]]++) return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "dim %lld is repeated", (long long)dims[i]);
  }
  int64_t shape[ST_MAX_NDIM], strides[ST_MAX_NDIM];
  for (int i = 0; i < n; i++) {
    shape[i] = g->shape[idx[i]];
    strides[i] = g->strides[idx[i]];
  }
  memcpy(g->shape, shape, (size_t)n * sizeof *shape);
  memcpy(g->strides, strides, (size_t)n * sizeof *strides);
  return ST_OK;
}

int st__geom_transpose(st__geom_t *g, int64_t d0, int64_t d1, char *err, size_t errlen) {
  int a = 0, b = 0;
  int rc = st__geom_dim(g, d0, &a, err, errlen);
  if (rc == ST_OK) rc = st__geom_dim(g, d1, &b, err, errlen);
  if (rc != ST_OK) return rc;
  int64_t s = g->shape[a], t = g->strides[a];
  g->shape[a] = g->shape[b];
  g->strides[a] = g->strides[b];
  g->shape[b] = s;
  g->strides[b] = t;
  return ST_OK;
}

int st__geom_infer_shape(int64_t numel, int n, int64_t *shape, char *err, size_t errlen) {
  if (n < 0 || n > ST_MAX_NDIM) return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "at most %d dimensions", ST_MAX_NDIM);
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < n; i++) {
    if (shape[i] == -1) {
      if (infer >= 0) return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "only one size may be -1");
      infer = i;
    } else if (shape[i] < 0) {
      return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "invalid size %lld", (long long)shape[i]);
    } else {
      if (shape[i] > 0 && known > ((int64_t)1 << 62) / shape[i])
        return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "shape is too large");
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel % known)
      return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "cannot infer size -1 for %lld elements", (long long)numel);
    shape[infer] = numel / known;
    known = numel;
  }
  if (known != numel)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "shape of %lld elements does not fit a tensor of %lld elements",
                (long long)known, (long long)numel);
  return ST_OK;
}

int st__geom_view(st__geom_t *g, int n, const int64_t *shape, char *err, size_t errlen) {
  if (!st__geom_is_contiguous(g))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "the tensor is not contiguous (use reshape, which copies)");
  int64_t s[ST_MAX_NDIM];
  if (n < 0 || n > ST_MAX_NDIM) return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "at most %d dimensions", ST_MAX_NDIM);
  memcpy(s, shape, (size_t)n * sizeof *s);
  int rc = st__geom_infer_shape(st__geom_numel(g), n, s, err, errlen);
  if (rc != ST_OK) return rc;
  g->ndim = n;
  memcpy(g->shape, s, (size_t)n * sizeof *s);
  st__geom_set_contiguous(g);
  return ST_OK;
}
