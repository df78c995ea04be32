/* src/tensor/construct.h: tensor constructors (empty, zeros, ones, full,
 * arange, rand, randn) and the generators behind them.
 *
 * A generator computes element i of a new contiguous tensor from a few
 * parameters (st__gen_t). Its formula is defined once, below, as an inline
 * function that both the CPU backend (src/tensor/cpu.c) and the CUDA
 * kernels (src/cuda/kernels.cu) compile (ST_HD: __host__ __device__ under
 * nvcc), so that both store the same bytes: the value is computed in
 * double and stored as st_dtype_store does. ST__GENERATORS lists them;
 * each backend expands the list into one loop or kernel per generator, so
 * a generator missing on a backend cannot compile, and the choice is made
 * once per tensor, never per element.
 *
 * Adding a constructor (docs/architecture.md, "Adding a tensor
 * constructor"): a row in ST__GENERATORS with its formula and the
 * constructor's prototype here, the constructor in construct.c, its Lua
 * binding in src/lua/construct.c.
 *
 * This header needs no CUDA and no other header of the core: the
 * constructors name the core's types by their struct tags (tensor.h).
 */
#ifndef ST_TENSOR_CONSTRUCT_H
#define ST_TENSOR_CONSTRUCT_H

#include <stddef.h>
#include <stdint.h>

#include "common/philox.h"
#include "st/dtype.h"

/* X(KIND, name): generator ST__GEN_KIND computes st__gen_name(g, i). */
#define ST__GENERATORS(X) \
  X(ARANGE, arange)       \
  X(RAND, rand)           \
  X(RANDN, randn)

typedef enum {
#define ST__GEN_ENUM(K, name) ST__GEN_##K,
  ST__GENERATORS(ST__GEN_ENUM)
#undef ST__GEN_ENUM
  ST__GEN_COUNT
} st__gen_kind_t;

typedef struct st__gen {
  st__gen_kind_t kind;
  double a, b;                     /* arange: start, step */
  uint64_t seed;                   /* rand, randn: the Philox key */
  int wide;                        /* rand: 53 random bits (float64), else 24 */
} st__gen_t;

/* start + i*step: a double product, then a sum (never a fused
 * multiply-add: nvcc builds with --fmad=false and the _rn intrinsics
 * round each step). */
static inline ST_HD double st__gen_arange(const st__gen_t *g, uint64_t i) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(g->a, __dmul_rn((double)i, g->b));
#else
  return g->a + (double)i * g->b;
#endif
}

/* Uniform in [0, 1) of element i of seed (common/philox.h). */
static inline ST_HD double st__gen_rand(const st__gen_t *g, uint64_t i) {
  return st__rng_uniform(g->seed, i, g->wide);
}

/* Standard normal of element i of seed (common/philox.h). */
static inline ST_HD double st__gen_randn(const st__gen_t *g, uint64_t i) {
  return st__rng_normal(g->seed, i);
}

#ifndef __CUDACC__
struct st__tensor;
struct st__tensor_ctx;

/* Constructors (construct.c). Each makes a new contiguous tensor in its
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

#endif
