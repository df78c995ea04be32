/* src/cuda/kernels.h: C-callable tensor construction kernels (built only
 * when ST_HAVE_CUDA; library st_cuda).
 *
 * Every kernel writes the same bytes the CPU backend writes for the same
 * arguments (src/tensor/cpu.c with st_dtype_store): fill stores one
 * value; generate the generator's value (arange: start + i*step, a double
 * product and sum, no fused multiply-add; rand and randn: st__rng_uniform /
 * st__rng_normal of src/common/philox.h for element i of `seed`); cast stores
 * st_dtype_load(src) in the destination dtype (a plain copy when the dtypes
 * are equal). rand and fill are bit-identical to the CPU; randn agrees up to
 * the last-place differences between the device's and libm's double log
 * and cos (see docs/cuda.md for the measured bound).
 *
 * Arguments: `dst` / `src` are device addresses valid in the current
 * context (an arena base plus an offset aligned for the dtype), `n` the
 * element count (0 launches nothing). Work is queued on `stream` and not
 * waited for: the caller synchronizes the stream before it publishes the
 * tensor (docs/design.md, section 3,
 * decision 5). Returns ST_OK, ST_ERR_INVALID_ARGUMENT
 * (bad dtype, n < 0, an unknown generator) or ST_ERR_INTERNAL
 * (launch failure), with a reason in err (may be NULL). Call from a thread
 * whose current context is the device's (st__cuda_ctx_enter).
 */
#ifndef ST_CUDA_KERNELS_H
#define ST_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "st/dtype.h"
#include "st/errors.h"
#include "common/generators.h"

#ifdef __cplusplus
extern "C" {
#endif

int st__cuda_fill(void *dst, st_dtype_t dtype, int64_t n, double value, CUstream stream,
                  char *err, size_t errlen);

/* Element i := the generator's value (src/common/generators.h: the formula
 * the CPU backend runs too), for every i < n; one kernel per generator,
 * picked once. */
int st__cuda_generate(void *dst, st_dtype_t dtype, int64_t n, const st__gen_t *g,
                      CUstream stream, char *err, size_t errlen);

/* dst[i] = src[i] converted; the buffers must not overlap. */
int st__cuda_cast(void *dst, st_dtype_t dst_dtype, const void *src, st_dtype_t src_dtype,
                  int64_t n, CUstream stream, char *err, size_t errlen);

/* Strided copy over `shape` (ndim <= ST_MAX_NDIM dims, row-major order of
 * the multi-index): the element of `src` at sum(idx[d] * src_strides[d])
 * (strides in elements, >= 0) goes to the element of `dst` at
 * sum(idx[d] * dst_strides[d]). Equal dtypes copy the element's bytes (so
 * int64 and NaN payloads stay exact); different dtypes convert as
 * st__cuda_cast does. Gathers a strided view into a contiguous buffer,
 * scatters into a strided destination, or both. The caller makes sure
 * the destination elements do not overlap the source ones. */
int st__cuda_copy_strided(void *dst, st_dtype_t dst_dtype, const int64_t *dst_strides,
                          const void *src, st_dtype_t src_dtype, const int64_t *src_strides,
                          int ndim, const int64_t *shape, CUstream stream, char *err,
                          size_t errlen);

/* Stores `value` (as st_dtype_store would) in every element of a strided
 * view over `shape` (the strided counterpart of st__cuda_fill). */
int st__cuda_fill_strided(void *dst, st_dtype_t dtype, const int64_t *strides, int ndim,
                          const int64_t *shape, double value, CUstream stream, char *err,
                          size_t errlen);

/* In place over a strided view: every element x becomes x * mul + add,
 * computed in double (a product then a sum, no fused multiply-add, as the
 * CPU does) and stored back as st_dtype_store would. */
int st__cuda_affine_strided(void *dst, st_dtype_t dtype, const int64_t *strides, int ndim,
                            const int64_t *shape, double mul, double add, CUstream stream,
                            char *err, size_t errlen);
/* Copies `bytes` between any two addresses this process can name (host
 * memory or device addresses of the current context; direction from the
 * unified address space), queued on `stream`. A copy to or from pageable
 * host memory may return before or after it completes: synchronize the
 * stream before reading the destination on the host. */
int st__cuda_memcpy(void *dst, const void *src, uint64_t bytes, CUstream stream, char *err,
                    size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
