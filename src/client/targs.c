/* src/client: tensor arguments (docs/protocol.md, "Tensor arguments").
 *
 * st_tensor_alloc makes memory this process can pass to endpoints without a
 * copy: an own allocation of map.c (a sealed memfd, or an exported VMM
 * allocation on a GPU) wrapped in a one-tensor result, so that it is read,
 * written, freed and exported through DLPack like any result.
 * st_args_tensor adds a tensor that lives in such an allocation (the whole
 * tensor or any view of it) to an argument map: the map keeps the
 * allocation, and the call sends its descriptor with the request. A
 * result that is one of those allocations comes back named {arg: i}
 * (arg_results.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_internal.h"
#include "client/result.h"
#include "common/fail.h"

/* "cpu" -> -1, "cuda" -> 0, "cuda:N" -> N; -2 when malformed. */
static int parse_device(const char *s) {
  if (!s || strcmp(s, "cpu") == 0) return -1;
  if (strcmp(s, "cuda") == 0) return 0;
  if (strncmp(s, "cuda:", 5) != 0 || !s[5]) return -2;
  char *end;
  long v = strtol(s + 5, &end, 10);
  return *end || v < 0 || v > 1023 ? -2 : (int)v;
}

/* See client.h. Any thread. */
ST_API int st_tensor_alloc(const char *device, st_dtype_t dtype, int ndim, const int64_t *shape,
                           st_result_t **out, char *err, size_t errlen) {
  if (out) *out = NULL;
  if (!out) return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "out is NULL");
  int ordinal = parse_device(device);
  if (ordinal == -2)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "device '%s': use \"cpu\", \"cuda\" or \"cuda:N\"", device);
  size_t esize = st_dtype_size(dtype);
  if (esize == 0) return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "unknown dtype %d", dtype);
  if (ndim < 0 || ndim > ST_MAX_NDIM || (ndim > 0 && !shape))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "ndim must be 0..%d with a shape",
                    ST_MAX_NDIM);
  int64_t numel = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0 || (shape[i] && numel > INT64_MAX / shape[i] / (int64_t)esize))
      return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "bad or too large shape");
    numel *= shape[i];
  }
  uint64_t nbytes = (uint64_t)numel * esize;
  st__mapping_t *m = NULL;
  int rc = st__client_own_alloc(ordinal, nbytes, &m, err, errlen);
  if (rc != ST_OK) return rc;

  st_result_t *r = calloc(1, sizeof *r);
  if (r) {
    r->maps = malloc(sizeof *r->maps);
    r->tensors = malloc(sizeof *r->tensors);
  }
  st_tensor_t *t = r ? st__client_result_alloc(r, sizeof *t) : NULL;
  int64_t *dims = r ? st__client_result_alloc(r, sizeof(int64_t) * 2 * (size_t)(ndim ? ndim : 1))
                    : NULL;
  st_value_t *v = r ? st__client_result_alloc(r, sizeof *v) : NULL;
  char *uuid = NULL;
  st__arena_desc_t d;
  st__client_own_describe(m, &d);
  if (r && d.cuda) {
    uuid = st__client_result_alloc(r, sizeof d.uuid);
    if (uuid) memcpy(uuid, d.uuid, sizeof d.uuid);
  }
  if (!r || !r->maps || !r->tensors || !t || !dims || !v || (d.cuda && !uuid)) {
    if (r) st_result_free(r);
    st__client_mapping_release(m);
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  }
  r->maps[0] = m;
  r->nmaps = 1;
  int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    dims[i] = shape[i];
    dims[ndim + i] = stride;
    stride *= shape[i] ? shape[i] : 1;
  }
  t->name = "";
  t->data = st__client_mapping_base(m);
  t->dtype = dtype;
  t->ndim = ndim;
  t->shape = dims;
  t->strides = dims + ndim;
  t->numel = numel;
  t->nbytes = (size_t)nbytes;
  t->device = d.cuda ? ST_DEVICE_CUDA : ST_DEVICE_CPU;
  t->device_index = st__client_mapping_ordinal(m);
  t->device_uuid = d.cuda ? uuid : "";
  r->tensors[0] = t;
  r->ntensors = 1;
  r->tensors_cap = 1;
  v->kind = ST_VALUE_TENSOR;
  v->as.tensor = t;
  r->value = v;
  *out = r;
  return ST_OK;
}

/* See client.h. Thread of the argument map. */
ST_API int st_args_tensor(st_args_t *a, const char *key, const st_tensor_t *t, char *err,
                          size_t errlen) {
  if (!a || !key || !*key || !t)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "NULL argument map, key or tensor");
  if (st__client_args_open(a))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "argument '%s': a tensor goes as an argument of its own, not inside a list "
                    "or map", key);
  if (t->ndim < 0 || t->ndim > ST_MAX_NDIM || (t->ndim && (!t->shape || !t->strides)))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "argument '%s': not a valid tensor (dtype, ndim 0..%d, shape and strides)",
                    key, ST_MAX_NDIM);
  st__tensor_desc_t d;
  memset(&d, 0, sizeof d);
  d.dtype = t->dtype;
  d.ndim = t->ndim;
  for (int i = 0; i < t->ndim; i++) {
    d.shape[i] = t->shape[i];
    d.strides[i] = t->strides[i];
  }
  uint64_t lo, hi;   /* the bytes it reaches from its first element */
  if (st__tensor_extent(&d, &lo, &hi) != ST_OK)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "argument '%s': unknown dtype, or negative or overflowing shape or strides",
                    key);
  int ordinal = t->device == ST_DEVICE_CUDA ? t->device_index : -1;
  if (t->device == ST_DEVICE_CUDA && ordinal < 0)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "argument '%s': a CUDA tensor needs its device_index", key);
  st__mapping_t *m = NULL;
  if (st__client_own_find(t->data, hi, ordinal, &m, &d.offset) != ST_OK)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "argument '%s': the tensor's memory (%s) was not allocated with "
                    "st_tensor_alloc; only such memory passes without a copy (copy the data "
                    "into a tensor from st_tensor_alloc)",
                    key, ordinal < 0 ? "cpu" : "cuda");
  long idx = st__client_args_arena_index(a, m);
  if (idx < 0) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  d.arena = (uint32_t)idx;
  st__cbuf_t b;
  st__client_cbuf_init(&b);
  st__pack_tensor(&b.pk, &d);
  int rc = b.oom ? ST_ERR_OUT_OF_MEMORY
                 : st__client_args_set_raw(a, key, strlen(key), b.sb.data, b.sb.size);
  st__client_cbuf_destroy(&b);
  if (rc != ST_OK) return st__fail(rc, err, errlen, "argument '%s': out of memory", key);
  return ST_OK;
}

/* See client.h. Any thread. */
ST_API int st_tensor_is_shareable(const st_tensor_t *t) {
  if (!t || !t->data || (t->device == ST_DEVICE_CUDA && t->device_index < 0)) return 0;
  st__mapping_t *m = NULL;
  uint64_t offset;
  int ordinal = t->device == ST_DEVICE_CUDA ? t->device_index : -1;
  if (st__client_own_find(t->data, 0, ordinal, &m, &offset) != ST_OK) return 0;
  st__client_mapping_release(m);
  return 1;
}
