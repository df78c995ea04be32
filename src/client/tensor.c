/* src/client: reading a tensor's elements, on the CPU or on a CUDA device.
 *
 * CPU tensors are read in place. CUDA tensors are copied to the host
 * first with a synchronous device-to-host copy (device.c): the whole
 * spanned byte range when a strided tensor is gathered, one element for
 * st_tensor_get. Every tensor was checked against its arena when the
 * result was decoded, so the spanned range is always inside the mapping.
 *
 * Threads: any, while the tensor's result lives.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_internal.h"
#include "common/geometry.h"

/* Element offset of row-major element `linear`, following the strides. */
static int64_t element_offset(const st_tensor_t *t, int64_t linear) {
  int64_t off = 0;
  for (int i = t->ndim - 1; i >= 0; i--) {
    int64_t dim = t->shape[i];
    off += (linear % dim) * t->strides[i];
    linear /= dim;
  }
  return off;
}

/* See client.h: the geometry's own test (src/common/geometry.h). */
ST_API int st_tensor_is_contiguous(const st_tensor_t *t) {
  if (!t || t->ndim < 0 || t->ndim > ST_MAX_NDIM || (t->ndim && (!t->shape || !t->strides)))
    return 0;
  return st__geom_contiguous_of(t->ndim, t->shape, t->strides);
}

/* Copies the elements of t, laid out from `src` as t's strides say, to dst
 * in row-major order. An index per dimension is stepped like an odometer,
 * so no element needs a division. */
static void gather(const st_tensor_t *t, const unsigned char *src, unsigned char *dst,
                   size_t esize) {
  int64_t idx[ST_MAX_NDIM];
  memset(idx, 0, sizeof idx);
  int64_t off = 0;
  int last = t->ndim - 1;
  for (int64_t n = 0; n < t->numel; n++) {
    memcpy(dst + (size_t)n * esize, src + (size_t)off * esize, esize);
    for (int i = last; i >= 0; i--) {
      if (++idx[i] < t->shape[i]) {
        off += t->strides[i];
        break;
      }
      off -= (idx[i] - 1) * t->strides[i];
      idx[i] = 0;
    }
  }
}

/* Copies every element to dst in row-major order; see client.h. */
ST_API int st_tensor_copy_to_host(const st_tensor_t *t, void *dst, size_t len) {
  if (!t || (!dst && t->nbytes) || len < t->nbytes || t->ndim > ST_MAX_NDIM)
    return ST_ERR_INVALID_ARGUMENT;
  if (t->numel == 0 || t->nbytes == 0) return ST_OK;
  if (!t->data) return ST_ERR_INVALID_ARGUMENT;
  size_t esize = st_dtype_size(t->dtype);
  int contiguous = st_tensor_is_contiguous(t);
  if (t->device == ST_DEVICE_CPU) {
    if (contiguous)
      memcpy(dst, t->data, t->nbytes);
    else
      gather(t, t->data, dst, esize);
    return ST_OK;
  }
  if (t->device != ST_DEVICE_CUDA) return ST_ERR_INVALID_ARGUMENT;
  if (contiguous) return st__client_cuda_to_host(dst, t->data, t->nbytes, t->device_index);
  /* Strided: one copy of the spanned range, then a gather on the host. A
   * broadcast (stride 0) spans less than it holds; a sliced view more. */
  uint64_t lo, hi;
  if (st__geom_extent_of(t->dtype, 0, t->ndim, t->shape, t->strides, &lo, &hi) != ST_OK)
    return ST_ERR_INVALID_ARGUMENT;
  size_t span = (size_t)hi;
  unsigned char *tmp = malloc(span);
  if (!tmp) return ST_ERR_OUT_OF_MEMORY;
  int rc = st__client_cuda_to_host(tmp, t->data, span, t->device_index);
  if (rc == ST_OK) gather(t, tmp, dst, esize);
  free(tmp);
  return rc;
}

/* Element `linear` in row-major order, following the strides; a one-element
 * device-to-host copy for CUDA tensors. NaN for an index outside
 * [0, numel) or a failed copy. Any thread. */
ST_API double st_tensor_get(const st_tensor_t *t, int64_t linear) {
  if (!t || !t->data || linear < 0 || linear >= t->numel) return NAN;
  int64_t off = element_offset(t, linear);
  if (t->device == ST_DEVICE_CPU) return st_dtype_load(t->dtype, t->data, (size_t)off);
  if (t->device != ST_DEVICE_CUDA) return NAN;
  size_t esize = st_dtype_size(t->dtype);
  _Alignas(16) unsigned char buf[16];
  if (esize == 0 || esize > sizeof buf) return NAN;
  const unsigned char *p = (const unsigned char *)t->data + (size_t)off * esize;
  if (st__client_cuda_to_host(buf, p, esize, t->device_index) != ST_OK) return NAN;
  return st_dtype_load(t->dtype, buf, 0);
}
