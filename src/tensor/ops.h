/* src/tensor/ops.h: operations on elements, on whichever device a tensor
 * lives (ops.c; each dispatched once through the backend table of
 * backend.h). Errors, context and `what` as tensor.h says. CUDA work is
 * queued on the calling thread's stream for the device and is complete
 * once st__tensor_sync_used returns; operations that end in host memory
 * wait for it themselves. Temporaries an operation needs (contiguous
 * buffers for a cross-device or overlapping copy) are made and released
 * inside it.
 */
#ifndef ST_TENSOR_OPS_H
#define ST_TENSOR_OPS_H

#include "common/generators.h"
#include "tensor/tensor.h"

/* Stores v in every element of t (any strides), as st_dtype_store does. */
int st__tensor_fill(st__tensor_ctx_t *c, const st__tensor_t *t, double v, const char *what,
                    char *err, size_t errlen);

/* Every element x of t becomes x * mul + add (in double, a product then a
 * sum, then stored as st_dtype_store does), in place. */
int st__tensor_affine(st__tensor_ctx_t *c, const st__tensor_t *t, double mul, double add,
                      const char *what, char *err, size_t errlen);

/* Copies src into dst element by element, casting to dst's dtype, any
 * strides, on whichever devices they live: same device directly (through
 * a private contiguous copy when both share an arena, so that overlapping
 * views copy as if through a temporary), another device by moving one
 * contiguous buffer (gathered on the source's side, cast and scattered on
 * the destination's; CUDA to CUDA through host memory). Shapes must be
 * equal: INVALID_ARGUMENT "what: source and destination shapes differ". */
int st__tensor_copy(st__tensor_ctx_t *c, const st__tensor_t *dst, const st__tensor_t *src,
                    const char *what, char *err, size_t errlen);

/* A new contiguous tensor on `device` with `dtype` holding t's elements
 * (st__tensor_new, then st__tensor_copy) into *out (owned by the caller;
 * out->arena NULL on failure). */
int st__tensor_to(st__tensor_ctx_t *c, st__tensor_t *out, const st__tensor_t *t, int device,
                  st_dtype_t dtype, const char *what, char *err, size_t errlen);

/* Like st__tensor_view (tensor.h) when t is contiguous; otherwise a contiguous copy
 * of t (a new arena on t's device) with the new shape. */
int st__tensor_reshape(st__tensor_ctx_t *c, st__tensor_t *out, const st__tensor_t *t, int ndim,
                       const int64_t *shape, const char *what, char *err, size_t errlen);

/* Runs generator g over every element of the contiguous tensor t. */
int st__tensor_generate(st__tensor_ctx_t *c, const st__tensor_t *t, const st__gen_t *g,
                        const char *what, char *err, size_t errlen);

/* Element `off` (in elements from element 0, as the strides give it) of t
 * as a double (*v), or stores v there; a small synchronous copy for a
 * CUDA tensor. */
int st__tensor_get(st__tensor_ctx_t *c, const st__tensor_t *t, int64_t off, double *v,
                   const char *what, char *err, size_t errlen);
int st__tensor_set(st__tensor_ctx_t *c, const st__tensor_t *t, int64_t off, double v,
                   const char *what, char *err, size_t errlen);

#endif
