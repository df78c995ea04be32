/* src/common/generators.h: the generators behind the tensor constructors
 * of src/tensor (arange, rand, randn).
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
 * constructor"): a row in ST__GENERATORS with its formula here, the
 * constructor in src/tensor/constructors.c with its prototype in
 * constructors.h, its Lua binding in src/lua/construct.c.
 *
 * This header needs no CUDA and nothing of src/ but common/philox.h, so
 * that nvcc (src/cuda) and the tensor core compile the same formulas.
 */
#ifndef ST_COMMON_GENERATORS_H
#define ST_COMMON_GENERATORS_H

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

#endif
