/* src/tensor/constructors.h: the tensor constructors (empty, zeros, ones,
 * full, arange, rand, randn) of constructors.c. The per-element formulas
 * of the generators they use are src/common/generators.h.
 *
 * The constructors name the core's types by their struct tags (tensor.h),
 * so this header includes no other header of the core.
 */
#ifndef ST_TENSOR_CONSTRUCTORS_H
#define ST_TENSOR_CONSTRUCTORS_H

#include <stddef.h>
#include <stdint.h>

#include "st/dtype.h"

struct st__tensor;
struct st__tensor_ctx;

/* Constructors (constructors.c). Each makes a new contiguous tensor in its
 * own arena on `device` (ST__DEV_CPU or a CUDA ordinal; a C caller passes
 * c->device for the call's default) into *out, the caller owning its
 * reference; on failure out->arena is NULL and nothing leaks. Errors as
 * st__tensor_new, plus the constructor's own argument checks and the
 * failures of the work that fills it (messages prefixed with the
 * constructor's name, e.g. "rand: dtype must be a floating type"). Work
 * on a CUDA device is queued on the thread's stream (st__tensor_sync_used
 * waits for it). */

/* empty: contents unspecified (a new arena reads zeros; a recycled region
 * of the connection's result pool keeps that connection's earlier bytes).
 * zeros: zero-filled. */
int st__tensor_empty(struct st__tensor_ctx *c, struct st__tensor *out, int device,
                     st_dtype_t dtype, int ndim, const int64_t *shape, char *err, size_t errlen);
int st__tensor_zeros(struct st__tensor_ctx *c, struct st__tensor *out, int device,
                     st_dtype_t dtype, int ndim, const int64_t *shape, char *err, size_t errlen);

/* Every element 1 / `value` (stored as st_dtype_store does). */
int st__tensor_ones(struct st__tensor_ctx *c, struct st__tensor *out, int device,
                    st_dtype_t dtype, int ndim, const int64_t *shape, char *err, size_t errlen);
int st__tensor_full(struct st__tensor_ctx *c, struct st__tensor *out, int device,
                    st_dtype_t dtype, int ndim, const int64_t *shape, double value, char *err,
                    size_t errlen);

/* start, start+step, ... below stop (above it for a negative step): a
 * 1-d tensor of ceil((stop-start)/step) elements (0 when negative).
 * dtype ST_DTYPE_INVALID picks int64 when the three bounds are integral,
 * else float32. The bounds must be finite and step nonzero. */
int st__tensor_arange(struct st__tensor_ctx *c, struct st__tensor *out, int device,
                      st_dtype_t dtype, double start, double stop, double step, char *err,
                      size_t errlen);

/* Uniform in [0, 1) / standard normal, element i from Philox4x32-10 of
 * `seed` (common/philox.h): the same bytes on every backend and host.
 * dtype must be a floating type. */
int st__tensor_rand(struct st__tensor_ctx *c, struct st__tensor *out, int device,
                    st_dtype_t dtype, int ndim, const int64_t *shape, uint64_t seed, char *err,
                    size_t errlen);
int st__tensor_randn(struct st__tensor_ctx *c, struct st__tensor *out, int device,
                     st_dtype_t dtype, int ndim, const int64_t *shape, uint64_t seed, char *err,
                     size_t errlen);

#endif
