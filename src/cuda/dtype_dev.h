/* src/cuda/dtype_dev.h: element loads and stores for device code, bit for
 * bit the conversions of src/common/dtype.c.
 *
 * dtype.c is the reference (and the contract of st_dtype_store /
 * st_dtype_load in include/st/dtype.h); these functions repeat its
 * arithmetic as __host__ __device__ inline code so that a kernel stores the
 * same bits the CPU backend stores for the same double: integers truncate
 * toward zero then wrap (NaN gives 0, values past int64 saturate), bool is
 * v != 0, 16- and 8-bit floats go double -> float (round to nearest even,
 * as a C cast and cvt.rn do) -> format with round to nearest even.
 * tests/mem/test_gpu_kernels.c checks them against dtype.c on the device.
 *
 * Valid C and C++ (nvcc), no state, any thread.
 */
#ifndef ST_CUDA_DTYPE_DEV_H
#define ST_CUDA_DTYPE_DEV_H

#include <stdint.h>
#include <string.h>

#include "common/philox.h"   /* ST_HD */
#include "st/dtype.h"

static inline ST_HD uint32_t st__dev_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline ST_HD float st__dev_f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* m / 2^shift rounded to nearest, ties to even. shift in [1, 31]. */
static inline ST_HD uint32_t st__dev_rne_shift(uint32_t m, int shift) {
  uint32_t q = m >> shift;
  uint32_t rem = m & ((UINT32_C(1) << shift) - 1);
  uint32_t half = UINT32_C(1) << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) q++;
  return q;
}

/* Magnitude of a finite float32 (bits `a`, sign clear) in a binary format
 * of `mbits` mantissa bits and bias `bias`, possibly past the largest
 * finite code (the caller maps that to inf or NaN). As encode_small in
 * dtype.c. */
static inline ST_HD uint32_t st__dev_encode_small(uint32_t a, int mbits, int bias) {
  int e = (int)(a >> 23);
  uint32_t m = a & 0x7fffff;
  if (e == 0) e = 1;
  else m |= 0x800000;
  if (m == 0) return 0;
  int eu = e - 127;
  int emin = 1 - bias;
  if (eu >= emin) {
    uint32_t q = st__dev_rne_shift(m, 23 - mbits);
    return ((uint32_t)(eu + bias - 1) << mbits) + q;
  }
  int shift = (emin - mbits) - (e - 150);
  if (shift > 25) return 0;
  return st__dev_rne_shift(m, shift);
}

static inline ST_HD uint16_t st__dev_float_to_half(float f) {
  uint32_t x = st__dev_f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t a = x & 0x7fffffff;
  if (a > 0x7f800000) return (uint16_t)(sign | 0x7e00);
  if (a == 0x7f800000) return (uint16_t)(sign | 0x7c00);
  uint32_t c = st__dev_encode_small(a, 10, 15);
  if (c >= 0x7c00) return (uint16_t)(sign | 0x7c00);
  return (uint16_t)(sign | c);
}

/* Exact: the value of a binary16 (or bfloat16, fp8) code is built as
 * mantissa * 2^k, which float32 holds exactly; the float product by a
 * power of two is exact too (no ldexpf needed on the device). */
static inline ST_HD float st__dev_pow2f(int k) {
  return st__dev_f32_from_bits((uint32_t)(k + 127) << 23);   /* k in [-126, 127] */
}

static inline ST_HD float st__dev_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v;
  if (e == 0x1f)
    return st__dev_f32_from_bits(sign | 0x7f800000 | (m << 13) | (m ? 0x400000 : 0));
  if (e == 0) v = (float)m * st__dev_pow2f(-24);
  else v = (float)(m | 0x400) * st__dev_pow2f((int)e - 25);
  return sign ? -v : v;
}

static inline ST_HD uint16_t st__dev_float_to_bfloat16(float f) {
  uint32_t x = st__dev_f32_bits(f);
  if ((x & 0x7fffffff) > 0x7f800000) return 0x7fc0;
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

static inline ST_HD float st__dev_bfloat16_to_float(uint16_t b) {
  return st__dev_f32_from_bits((uint32_t)b << 16);
}

/* The NaN of dtype.c's fp8 loads: the C NAN (0x7fc00000), negated when the
 * sign bit is set. */
static inline ST_HD float st__dev_nanf(int negative) {
  return st__dev_f32_from_bits(negative ? 0xffc00000u : 0x7fc00000u);
}

static inline ST_HD uint8_t st__dev_float_to_e4m3fn(float f) {
  uint32_t x = st__dev_f32_bits(f);
  uint8_t sign = (uint8_t)((x >> 24) & 0x80);
  uint32_t a = x & 0x7fffffff;
  if (a >= 0x7f800000) return (uint8_t)(sign | 0x7f);
  uint32_t c = st__dev_encode_small(a, 3, 7);
  if (c > 0x7e) return (uint8_t)(sign | 0x7f);
  return (uint8_t)(sign | c);
}

static inline ST_HD float st__dev_e4m3fn_to_float(uint8_t v) {
  uint32_t e = (v >> 3) & 0xf, m = v & 0x7;
  float r;
  if ((v & 0x7f) == 0x7f) return st__dev_nanf(v & 0x80);
  if (e == 0) r = (float)m * st__dev_pow2f(-9);
  else r = (float)(m | 0x8) * st__dev_pow2f((int)e - 10);
  return (v & 0x80) ? -r : r;
}

static inline ST_HD uint8_t st__dev_float_to_e5m2(float f) {
  uint32_t x = st__dev_f32_bits(f);
  uint8_t sign = (uint8_t)((x >> 24) & 0x80);
  uint32_t a = x & 0x7fffffff;
  if (a > 0x7f800000) return (uint8_t)(sign | 0x7f);
  if (a == 0x7f800000) return (uint8_t)(sign | 0x7c);
  uint32_t c = st__dev_encode_small(a, 2, 15);
  if (c >= 0x7c) return (uint8_t)(sign | 0x7c);
  return (uint8_t)(sign | c);
}

static inline ST_HD float st__dev_e5m2_to_float(uint8_t v) {
  uint32_t e = (v >> 2) & 0x1f, m = v & 0x3;
  float r;
  if (e == 0x1f) {
    if (m) return st__dev_nanf(v & 0x80);
    r = st__dev_f32_from_bits(0x7f800000u);
  } else if (e == 0) {
    r = (float)m * st__dev_pow2f(-16);
  } else {
    r = (float)(m | 0x4) * st__dev_pow2f((int)e - 17);
  }
  return (v & 0x80) ? -r : r;
}

/* v truncated toward zero into int64; NaN gives 0, values past the int64
 * range saturate (as to_int64_sat in dtype.c). */
static inline ST_HD int64_t st__dev_to_int64_sat(double v) {
  if (v != v) return 0;
  if (v >= 9223372036854775808.0) return INT64_MAX;
  if (v <= -9223372036854775808.0) return INT64_MIN;
  return (int64_t)v;
}

/* Element i of a buffer of `dtype` as a double, as st_dtype_load. An
 * invalid dtype gives 0 (callers validate dtypes first). */
static inline ST_HD double st__dev_load(st_dtype_t dtype, const void *base, int64_t i) {
  const unsigned char *p = (const unsigned char *)base;
  switch (dtype) {
  case ST_DTYPE_BOOL: return p[i] ? 1.0 : 0.0;
  case ST_DTYPE_UINT8: return (double)p[i];
  case ST_DTYPE_INT8: return (double)((const int8_t *)base)[i];
  case ST_DTYPE_INT16: return (double)((const int16_t *)base)[i];
  case ST_DTYPE_INT32: return (double)((const int32_t *)base)[i];
  case ST_DTYPE_INT64: return (double)((const int64_t *)base)[i];
  case ST_DTYPE_FLOAT16: return (double)st__dev_half_to_float(((const uint16_t *)base)[i]);
  case ST_DTYPE_BFLOAT16: return (double)st__dev_bfloat16_to_float(((const uint16_t *)base)[i]);
  case ST_DTYPE_FLOAT32: return (double)((const float *)base)[i];
  case ST_DTYPE_FLOAT64: return ((const double *)base)[i];
  case ST_DTYPE_FLOAT8_E4M3FN: return (double)st__dev_e4m3fn_to_float(p[i]);
  case ST_DTYPE_FLOAT8_E5M2: return (double)st__dev_e5m2_to_float(p[i]);
  case ST_DTYPE_UINT16: return (double)((const uint16_t *)base)[i];
  case ST_DTYPE_UINT32: return (double)((const uint32_t *)base)[i];
  case ST_DTYPE_UINT64: return (double)((const uint64_t *)base)[i];
  default: return 0.0;
  }
}

/* Stores v as element i of a buffer of `dtype`, as st_dtype_store. The
 * buffer is aligned for its element type (arena offsets are). */
static inline ST_HD void st__dev_store(st_dtype_t dtype, void *base, int64_t i, double v) {
  uint64_t u = (uint64_t)st__dev_to_int64_sat(v);
  switch (dtype) {
  case ST_DTYPE_BOOL: ((uint8_t *)base)[i] = (v != 0) ? 1 : 0; break;
  case ST_DTYPE_UINT8: case ST_DTYPE_INT8: ((uint8_t *)base)[i] = (uint8_t)u; break;
  case ST_DTYPE_INT16: case ST_DTYPE_UINT16: ((uint16_t *)base)[i] = (uint16_t)u; break;
  case ST_DTYPE_INT32: case ST_DTYPE_UINT32: ((uint32_t *)base)[i] = (uint32_t)u; break;
  case ST_DTYPE_INT64: ((uint64_t *)base)[i] = u; break;
  case ST_DTYPE_UINT64:
    ((uint64_t *)base)[i] = v >= 18446744073709551616.0 ? UINT64_MAX
                          : v >= 9223372036854775808.0 ? (uint64_t)v : u;
    break;
  case ST_DTYPE_FLOAT16: ((uint16_t *)base)[i] = st__dev_float_to_half((float)v); break;
  case ST_DTYPE_BFLOAT16: ((uint16_t *)base)[i] = st__dev_float_to_bfloat16((float)v); break;
  case ST_DTYPE_FLOAT32: ((float *)base)[i] = (float)v; break;
  case ST_DTYPE_FLOAT64: ((double *)base)[i] = v; break;
  case ST_DTYPE_FLOAT8_E4M3FN: ((uint8_t *)base)[i] = st__dev_float_to_e4m3fn((float)v); break;
  case ST_DTYPE_FLOAT8_E5M2: ((uint8_t *)base)[i] = st__dev_float_to_e5m2((float)v); break;
  default: break;
  }
}

#endif
