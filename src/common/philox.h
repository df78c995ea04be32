/* src/common/philox.h: the counter-based random generator of sharedtensor.
 *
 * Header-only and free of libc beyond <stdint.h> and <math.h>, so the CPU
 * backend and a CUDA kernel compile the same code (ST_HD marks functions
 * __host__ __device__ under nvcc) and produce the same numbers. This comment
 * is the contract: a tensor built with a given seed holds the same values on
 * every backend, host and version.
 *
 * Generator: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy
 * as 1, 2, 3", SC'11), as in Random123:
 *   - state: a 128-bit counter ctr[0..3] and a 64-bit key key[0..1];
 *   - one round: with M0 = 0xD2511F53 and M1 = 0xCD9E8D57, take the 64-bit
 *     products p0 = M0 * ctr[0] and p1 = M1 * ctr[2] and set
 *       ctr = { hi(p1) ^ ctr[1] ^ key[0], lo(p1),
 *               hi(p0) ^ ctr[3] ^ key[1], lo(p0) };
 *   - ten rounds; before each round but the first the key is bumped by the
 *     Weyl constants: key[0] += 0x9E3779B9, key[1] += 0xBB67AE85 (mod 2^32);
 *   - the output x0..x3 is the counter after the tenth round.
 *
 * Streams: element i (0-based, row-major over the tensor's shape) of a
 * tensor built with seed s uses
 *   key = { s & 0xffffffff, s >> 32 },  ctr = { i & 0xffffffff, i >> 32, 0, 0 }
 * and x0..x3 = Philox4x32-10(ctr, key). Elements are independent: any
 * element can be computed alone, in any order, on any thread.
 *
 * Distributions (computed in double, then stored in the tensor's dtype with
 * round-to-nearest-even):
 *   uniform, narrow (float32, float16, bfloat16, float8):
 *       u = (x0 >> 8) * 2^-24                       in [0, 1)
 *   uniform, wide (float64):
 *       u = ((uint64)x0 << 21 | x1 >> 11) * 2^-53   in [0, 1)
 *   normal (Box-Muller, one value per element):
 *       u1 = (x0 + 1) * 2^-32  in (0, 1],  u2 = x1 * 2^-32  in [0, 1)
 *       z  = sqrt(-2 ln u1) * cos(2 pi u2)
 * x2 and x3 are reserved for future distributions.
 */
#ifndef ST_COMMON_PHILOX_H
#define ST_COMMON_PHILOX_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define ST_HD __host__ __device__
#else
#define ST_HD
#endif

#define ST__PHILOX_M0 0xD2511F53u
#define ST__PHILOX_M1 0xCD9E8D57u
#define ST__PHILOX_W0 0x9E3779B9u
#define ST__PHILOX_W1 0xBB67AE85u
#define ST__TWO_PI    6.283185307179586476925286766559

/* Philox4x32 with 10 rounds: out = f(ctr, key). Arrays are borrowed; `out`
 * may alias `ctr`. */
static inline ST_HD void st__philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
                                           uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int r = 0; r < 10; r++) {
    if (r > 0) {
      k0 += ST__PHILOX_W0;
      k1 += ST__PHILOX_W1;
    }
    uint64_t p0 = (uint64_t)ST__PHILOX_M0 * c0;
    uint64_t p1 = (uint64_t)ST__PHILOX_M1 * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1;
    c3 = (uint32_t)p0;
    c0 = n0;
    c2 = n2;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/* x0..x3 for element i of the stream of `seed` (see the header comment). */
static inline ST_HD void st__rng_block(uint64_t seed, uint64_t i, uint32_t out[4]) {
  uint32_t ctr[4] = {(uint32_t)i, (uint32_t)(i >> 32), 0, 0};
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  st__philox4x32_10(ctr, key, out);
}

/* Uniform double in [0, 1) for element i: 24 random bits when !wide (every
 * value is exact in float32), 53 when wide (float64). */
static inline ST_HD double st__rng_uniform(uint64_t seed, uint64_t i, int wide) {
  uint32_t x[4];
  st__rng_block(seed, i, x);
  if (!wide) return (double)(x[0] >> 8) * (1.0 / 16777216.0);
  uint64_t m = ((uint64_t)x[0] << 21) | (x[1] >> 11);
  return (double)m * (1.0 / 9007199254740992.0);
}

/* Standard normal double for element i (Box-Muller on x0, x1). */
static inline ST_HD double st__rng_normal(uint64_t seed, uint64_t i) {
  uint32_t x[4];
  st__rng_block(seed, i, x);
  double u1 = ((double)x[0] + 1.0) * (1.0 / 4294967296.0);
  double u2 = (double)x[1] * (1.0 / 4294967296.0);
  return sqrt(-2.0 * log(u1)) * cos(ST__TWO_PI * u2);
}

#endif
