/* src/cuda/kernels.cu: construction kernels (see kernels.h).
 *
 * One thread per element in a grid-stride loop; the dtype is a kernel
 * argument and the switch in st__dev_store is uniform across a warp, so the
 * kernels stay memory bound without one instantiation per dtype. Built with
 * --fmad=false, and arange uses explicit _rn intrinsics as well, so that no
 * multiply-add is fused where the CPU rounds twice. The generators
 * (arange, rand, randn, ...) are the formulas of src/common/generators.h,
 * one kernel each, expanded from its list.
 */
#include "cuda/kernels.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>

extern "C" {
#include "common/fail.h"
}
#include "cuda/dtype_dev.h"
#include "st/wire.h"

namespace {

const int kThreads = 256;
const int64_t kMaxBlocks = 65536;

/* A grid-stride loop: thread by thread over i = 0 .. n-1. */
#define GRID_STRIDE(i, n)                                                  \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (int64_t)gridDim.x * blockDim.x)

/* One value of T at each of the n elements. */
template <typename T>
__global__ void k_fill(T *dst, int64_t n, T v) {
  GRID_STRIDE(i, n) dst[i] = v;
}

/* One kernel per generator of src/common/generators.h: element i gets
 * the generator's own formula, the one the CPU backend runs. */
#define ST__GEN_KERNEL(K, name)                                                            \
  __global__ void k_gen_##name(void *dst, st_dtype_t dtype, int64_t n, st__gen_t g) {      \
    GRID_STRIDE(i, n) st__dev_store(dtype, dst, i, st__gen_##name(&g, (uint64_t)i));       \
  }
ST__GENERATORS(ST__GEN_KERNEL)
#undef ST__GEN_KERNEL

__global__ void k_cast(void *dst, st_dtype_t ddt, const void *src, st_dtype_t sdt, int64_t n) {
  GRID_STRIDE(i, n)
    st__dev_store(ddt, dst, i, st__dev_load(sdt, src, i));
}

/* Shape and strides of a strided copy, passed by value (well under the
 * 4 KiB kernel parameter limit). */
struct Geom {
  int ndim;
  int64_t shape[ST_MAX_NDIM];
  int64_t dst[ST_MAX_NDIM];
  int64_t src[ST_MAX_NDIM];
};

/* Element offsets of linear index i (row-major over g.shape). */
__device__ inline void offsets(const Geom &g, int64_t i, int64_t *doff, int64_t *soff) {
  int64_t d = 0, s = 0;
  for (int k = g.ndim - 1; k >= 0; k--) {
    int64_t n = g.shape[k];
    int64_t q = i / n;
    int64_t idx = i - q * n;
    i = q;
    d += idx * g.dst[k];
    s += idx * g.src[k];
  }
  *doff = d;
  *soff = s;
}

/* Same dtype: the element's bytes move as one word of `es` bytes. */
__global__ void k_strided_bytes(uint8_t *dst, const uint8_t *src, Geom g, int64_t n, int es) {
  GRID_STRIDE(i, n) {
    int64_t d, s;
    offsets(g, i, &d, &s);
    switch (es) {
    case 1: dst[d] = src[s]; break;
    case 2: ((uint16_t *)dst)[d] = ((const uint16_t *)src)[s]; break;
    case 4: ((uint32_t *)dst)[d] = ((const uint32_t *)src)[s]; break;
    default: ((uint64_t *)dst)[d] = ((const uint64_t *)src)[s]; break;
    }
  }
}

__global__ void k_strided_cast(void *dst, st_dtype_t ddt, const void *src, st_dtype_t sdt, Geom g,
                               int64_t n) {
  GRID_STRIDE(i, n) {
    int64_t d, s;
    offsets(g, i, &d, &s);
    st__dev_store(ddt, dst, d, st__dev_load(sdt, src, s));
  }
}

/* x * mul + add in place at every strided element (g.src unused). */
__global__ void k_strided_affine(void *dst, st_dtype_t dt, Geom g, int64_t n, double mul,
                                 double add) {
  GRID_STRIDE(i, n) {
    int64_t d, s;
    offsets(g, i, &d, &s);
    st__dev_store(dt, dst, d, __dadd_rn(__dmul_rn(st__dev_load(dt, dst, d), mul), add));
  }
}

/* Fill: the `es` bytes of `pat` at every strided element (g.src unused). */
__global__ void k_strided_fill(uint8_t *dst, Geom g, int64_t n, int es, uint64_t pat) {
  GRID_STRIDE(i, n) {
    int64_t d, s;
    offsets(g, i, &d, &s);
    switch (es) {
    case 1: dst[d] = (uint8_t)pat; break;
    case 2: ((uint16_t *)dst)[d] = (uint16_t)pat; break;
    case 4: ((uint32_t *)dst)[d] = (uint32_t)pat; break;
    default: ((uint64_t *)dst)[d] = pat; break;
    }
  }
}

bool valid_dtype(st_dtype_t d) { return d > ST_DTYPE_INVALID && d < ST_DTYPE_COUNT; }

/* Checks the common arguments; ST_OK when a launch is due, 1 when n == 0. */
int check_args(const char *fn, const void *dst, st_dtype_t dtype, int64_t n, char *err,
               size_t errlen) {
  if (!valid_dtype(dtype))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "%s: invalid dtype %d", fn, (int)dtype);
  if (n < 0)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "%s: negative element count %lld", fn, (long long)n);
  if ((uint64_t)n > (uint64_t)INT64_MAX / st_dtype_size(dtype))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "%s: %lld elements overflow", fn, (long long)n);
  if (n == 0) return 1;
  if (!dst) return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "%s: null buffer", fn);
  return ST_OK;
}

unsigned blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return (unsigned)(b < kMaxBlocks ? b : kMaxBlocks);
}


/* Reports a failed launch (bad configuration, no context, sticky error). */
int launched(const char *fn, char *err, size_t errlen) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return ST_OK;
  if (err && errlen)
    snprintf(err, errlen, "%s: kernel launch failed: %s (%s)", fn, cudaGetErrorString(e),
             cudaGetErrorName(e));
  return ST_ERR_INTERNAL;
}

}  // namespace

/* See kernels.h. The element's bytes are computed once on the host with
 * st_dtype_store itself, so fill matches the CPU backend by construction. */
extern "C" int st__cuda_fill(void *dst, st_dtype_t dtype, int64_t n, double value,
                             CUstream stream, char *err, size_t errlen) {
  int rc = check_args("fill", dst, dtype, n, err, errlen);
  if (rc != ST_OK) return rc > 0 ? ST_OK : rc;
  unsigned char pat[8] = {0};
  st_dtype_store(dtype, pat, 0, value);
  unsigned blocks = blocks_for(n);
  cudaStream_t s = (cudaStream_t)stream;
  switch (st_dtype_size(dtype)) {
  case 1: k_fill<<<blocks, kThreads, 0, s>>>((uint8_t *)dst, n, pat[0]); break;
  case 2: { uint16_t v; memcpy(&v, pat, 2); k_fill<<<blocks, kThreads, 0, s>>>((uint16_t *)dst, n, v); break; }
  case 4: { uint32_t v; memcpy(&v, pat, 4); k_fill<<<blocks, kThreads, 0, s>>>((uint32_t *)dst, n, v); break; }
  default: { uint64_t v; memcpy(&v, pat, 8); k_fill<<<blocks, kThreads, 0, s>>>((uint64_t *)dst, n, v); break; }
  }
  return launched("fill", err, errlen);
}

/* See kernels.h. The generator's kind picks its kernel once per launch. */
extern "C" int st__cuda_generate(void *dst, st_dtype_t dtype, int64_t n, const st__gen_t *g,
                                 CUstream stream, char *err, size_t errlen) {
  int rc = check_args("generate", dst, dtype, n, err, errlen);
  if (rc != ST_OK) return rc > 0 ? ST_OK : rc;
  cudaStream_t s = (cudaStream_t)stream;
  switch (g->kind) {
#define ST__GEN_LAUNCH(K, name)                                                            \
  case ST__GEN_##K:                                                                        \
    k_gen_##name<<<blocks_for(n), kThreads, 0, s>>>(dst, dtype, n, *g);                    \
    return launched(#name, err, errlen);
    ST__GENERATORS(ST__GEN_LAUNCH)
#undef ST__GEN_LAUNCH
  case ST__GEN_COUNT: break;
  }
  return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "generate: unknown generator %d",
                  (int)g->kind);
}

/* See kernels.h. */
extern "C" int st__cuda_cast(void *dst, st_dtype_t dst_dtype, const void *src,
                             st_dtype_t src_dtype, int64_t n, CUstream stream, char *err,
                             size_t errlen) {
  int rc = check_args("cast", dst, dst_dtype, n, err, errlen);
  if (rc == ST_OK) rc = check_args("cast", src, src_dtype, n, err, errlen);
  if (rc != ST_OK) return rc > 0 ? ST_OK : rc;
  if (dst_dtype == src_dtype) {
    cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)n * st_dtype_size(dst_dtype),
                                    cudaMemcpyDeviceToDevice, (cudaStream_t)stream);
    if (e != cudaSuccess)
      return st__fail(ST_ERR_INTERNAL, err, errlen, "cast: cudaMemcpyAsync failed: %s",
                  cudaGetErrorString(e));
    return ST_OK;
  }
  k_cast<<<blocks_for(n), kThreads, 0, (cudaStream_t)stream>>>(dst, dst_dtype, src, src_dtype, n);
  return launched("cast", err, errlen);
}

namespace {

/* Fills g from the arguments; ST_OK, 1 when there is nothing to copy, or
 * an error. *n gets the element count. */
int make_geom(const char *fn, Geom *g, int ndim, const int64_t *shape, const int64_t *dst_strides,
              const int64_t *src_strides, int64_t *n, char *err, size_t errlen) {
  if (ndim < 0 || ndim > ST_MAX_NDIM)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "%s: %d dimensions (at most %d)", fn, ndim,
                ST_MAX_NDIM);
  memset(g, 0, sizeof *g);
  g->ndim = ndim;
  int64_t count = 1;
  for (int k = 0; k < ndim; k++) {
    if (shape[k] < 0 || dst_strides[k] < 0 || (src_strides && src_strides[k] < 0))
      return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "%s: negative size or stride", fn);
    if (shape[k] == 0) {
      *n = 0;
      return 1;
    }
    if (count > INT64_MAX / shape[k])
      return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "%s: too many elements", fn);
    count *= shape[k];
    g->shape[k] = shape[k];
    g->dst[k] = dst_strides[k];
    g->src[k] = src_strides ? src_strides[k] : 0;
  }
  *n = count;
  return ST_OK;
}

}  // namespace

/* See kernels.h. */
extern "C" int st__cuda_copy_strided(void *dst, st_dtype_t dst_dtype, const int64_t *dst_strides,
                                     const void *src, st_dtype_t src_dtype,
                                     const int64_t *src_strides, int ndim, const int64_t *shape,
                                     CUstream stream, char *err, size_t errlen) {
  if (!valid_dtype(dst_dtype) || !valid_dtype(src_dtype))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "copy: invalid dtype");
  Geom g;
  int64_t n = 0;
  int rc = make_geom("copy", &g, ndim, shape, dst_strides, src_strides, &n, err, errlen);
  if (rc != ST_OK) return rc > 0 ? ST_OK : rc;
  if (!dst || !src) return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "copy: null buffer");
  cudaStream_t s = (cudaStream_t)stream;
  if (dst_dtype == src_dtype)
    k_strided_bytes<<<blocks_for(n), kThreads, 0, s>>>((uint8_t *)dst, (const uint8_t *)src, g, n,
                                                       (int)st_dtype_size(dst_dtype));
  else
    k_strided_cast<<<blocks_for(n), kThreads, 0, s>>>(dst, dst_dtype, src, src_dtype, g, n);
  return launched("copy", err, errlen);
}

/* See kernels.h. */
extern "C" int st__cuda_fill_strided(void *dst, st_dtype_t dtype, const int64_t *strides,
                                     int ndim, const int64_t *shape, double value,
                                     CUstream stream, char *err, size_t errlen) {
  if (!valid_dtype(dtype)) return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "fill: invalid dtype");
  Geom g;
  int64_t n = 0;
  int rc = make_geom("fill", &g, ndim, shape, strides, NULL, &n, err, errlen);
  if (rc != ST_OK) return rc > 0 ? ST_OK : rc;
  if (!dst) return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "fill: null buffer");
  unsigned char pat[8] = {0};
  st_dtype_store(dtype, pat, 0, value);
  uint64_t word = 0;
  memcpy(&word, pat, st_dtype_size(dtype));   /* little-endian: the low bytes */
  k_strided_fill<<<blocks_for(n), kThreads, 0, (cudaStream_t)stream>>>(
      (uint8_t *)dst, g, n, (int)st_dtype_size(dtype), word);
  return launched("fill", err, errlen);
}

/* See kernels.h. */
extern "C" int st__cuda_affine_strided(void *dst, st_dtype_t dtype, const int64_t *strides,
                                       int ndim, const int64_t *shape, double mul, double add,
                                       CUstream stream, char *err, size_t errlen) {
  if (!valid_dtype(dtype))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "affine: invalid dtype");
  Geom g;
  int64_t n = 0;
  int rc = make_geom("affine", &g, ndim, shape, strides, NULL, &n, err, errlen);
  if (rc != ST_OK) return rc > 0 ? ST_OK : rc;
  if (!dst) return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "affine: null buffer");
  k_strided_affine<<<blocks_for(n), kThreads, 0, (cudaStream_t)stream>>>(dst, dtype, g, n, mul,
                                                                         add);
  return launched("affine", err, errlen);
}

/* See kernels.h. */
extern "C" int st__cuda_memcpy(void *dst, const void *src, uint64_t bytes, CUstream stream,
                               char *err, size_t errlen) {
  if (bytes == 0) return ST_OK;
  if (!dst || !src) return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "memcpy: null buffer");
  cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDefault, (cudaStream_t)stream);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return st__fail(ST_ERR_INTERNAL, err, errlen, "cudaMemcpyAsync of %llu bytes failed: %s (%s)",
                (unsigned long long)bytes, cudaGetErrorString(e), cudaGetErrorName(e));
  }
  return ST_OK;
}
