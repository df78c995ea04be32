/* src/common/dtype.c: dtype names, sizes, DLPack codes, and the scalar
 * conversions between float32 and the 16- and 8-bit float formats.
 *
 * The conversions are exact bit manipulations with round-to-nearest-even, so
 * that the CPU backend, the CUDA backend and PyTorch produce the same bits
 * for the same float32 input:
 *   float16        IEEE binary16; overflow gives +-inf, NaN gives 0x7e00|sign.
 *   bfloat16       the top half of a float32, rounded; NaN gives 0x7fc0.
 *   float8_e4m3fn  bias 7, no infinity; 0x7f/0xff is NaN and the largest
 *                  finite value is 448. A value that rounds past 448 (any
 *                  |x| > 464), +-inf and NaN give NaN (0x7f|sign).
 *   float8_e5m2    bias 15, IEEE-like: overflow gives +-inf, NaN 0x7f|sign.
 * No state; any thread.
 */
#include "st/dtype.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------ table */

typedef struct {
  const char *name;
  size_t size;
  uint8_t code, bits;
} dtype_info_t;

static const dtype_info_t dtype_table[ST_DTYPE_COUNT] = {
  [ST_DTYPE_INVALID] = {NULL, 0, 0, 0},
#define ST__DTYPE_ROW(e, name, size, code, bits) [ST_DTYPE_##e] = {name, size, code, bits},
  ST_DTYPE_MAP(ST__DTYPE_ROW)
#undef ST__DTYPE_ROW
};

static const struct { const char *alias; st_dtype_t dtype; } dtype_aliases[] = {
  {"float", ST_DTYPE_FLOAT32}, {"double", ST_DTYPE_FLOAT64},
  {"half", ST_DTYPE_FLOAT16},  {"bf16", ST_DTYPE_BFLOAT16},
  {"int", ST_DTYPE_INT32},     {"long", ST_DTYPE_INT64},
};

static int dtype_valid(st_dtype_t d) {
  return d > ST_DTYPE_INVALID && d < ST_DTYPE_COUNT;
}

/* See include/st/dtype.h. Any thread. */
const char *st_dtype_name(st_dtype_t dtype) {
  return dtype_valid(dtype) ? dtype_table[dtype].name : NULL;
}

/* See include/st/dtype.h. Exact, case-sensitive names. Any thread. */
st_dtype_t st_dtype_from_name(const char *name) {
  if (!name) return ST_DTYPE_INVALID;
  for (int d = ST_DTYPE_INVALID + 1; d < ST_DTYPE_COUNT; d++)
    if (strcmp(dtype_table[d].name, name) == 0) return (st_dtype_t)d;
  for (size_t i = 0; i < sizeof dtype_aliases / sizeof dtype_aliases[0]; i++)
    if (strcmp(dtype_aliases[i].alias, name) == 0) return dtype_aliases[i].dtype;
  return ST_DTYPE_INVALID;
}

/* See include/st/dtype.h. Any thread. */
size_t st_dtype_size(st_dtype_t dtype) {
  return dtype_valid(dtype) ? dtype_table[dtype].size : 0;
}

/* See include/st/dtype.h. Either pointer may be NULL. Any thread. */
void st_dtype_dlpack(st_dtype_t dtype, uint8_t *code, uint8_t *bits) {
  int ok = dtype_valid(dtype);
  if (code) *code = ok ? dtype_table[dtype].code : 0;
  if (bits) *bits = ok ? dtype_table[dtype].bits : 0;
}

/* See include/st/dtype.h. Any thread. */
int st_dtype_is_float(st_dtype_t dtype) {
  switch (dtype) {
  case ST_DTYPE_FLOAT16: case ST_DTYPE_BFLOAT16: case ST_DTYPE_FLOAT32:
  case ST_DTYPE_FLOAT64: case ST_DTYPE_FLOAT8_E4M3FN: case ST_DTYPE_FLOAT8_E5M2:
    return 1;
  default:
    return 0;
  }
}

/* ------------------------------------------------------------ float bits */

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* m / 2^shift rounded to nearest, ties to even. shift in [1, 31]. */
static uint32_t rne_shift(uint32_t m, int shift) {
  uint32_t q = m >> shift;
  uint32_t rem = m & ((UINT32_C(1) << shift) - 1);
  uint32_t half = UINT32_C(1) << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) q++;
  return q;
}

/* Encodes the magnitude of a finite float32 (bits `a`, sign cleared) into a
 * binary format with `mbits` mantissa bits and exponent bias `bias`, rounding
 * to nearest even. Returns the unsigned code, which may lie past the largest
 * finite one: the caller maps that to inf or NaN. Subnormal results and the
 * carry from subnormal into the smallest normal come out right because the
 * code is built as (exponent field << mbits) + rounded significand. */
static uint32_t encode_small(uint32_t a, int mbits, int bias) {
  int e = (int)(a >> 23);
  uint32_t m = a & 0x7fffff;
  if (e == 0) e = 1;          /* float32 subnormal: no implicit bit */
  else m |= 0x800000;
  if (m == 0) return 0;
  int eu = e - 127;           /* unbiased exponent of the leading bit slot */
  int emin = 1 - bias;        /* smallest normal exponent of the target */
  if (eu >= emin) {
    /* Normal: keep mbits fraction bits of the 24-bit significand. q carries
     * the implicit bit, hence the "- 1" on the exponent field; a carry out of
     * the significand moves into the exponent on its own. */
    uint32_t q = rne_shift(m, 23 - mbits);
    return ((uint32_t)(eu + bias - 1) << mbits) + q;
  }
  /* Subnormal: count quanta of 2^(emin - mbits). */
  int shift = (emin - mbits) - (e - 150);
  if (shift > 25) return 0;   /* below half the smallest subnormal */
  return rne_shift(m, shift);
}

/* See include/st/dtype.h. Any thread. */
uint16_t st_float_to_half(float f) {
  uint32_t x = f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t a = x & 0x7fffffff;
  if (a > 0x7f800000) return sign | 0x7e00;          /* NaN, quiet */
  if (a == 0x7f800000) return sign | 0x7c00;         /* inf */
  uint32_t c = encode_small(a, 10, 15);
  if (c >= 0x7c00) return sign | 0x7c00;             /* overflow */
  return (uint16_t)(sign | c);
}

/* See include/st/dtype.h. Exact. Any thread. */
float st_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v;
  if (e == 0x1f) return f32_from_bits(sign | 0x7f800000 | (m << 13) | (m ? 0x400000 : 0));
  if (e == 0) v = ldexpf((float)m, -24);
  else v = ldexpf((float)(m | 0x400), (int)e - 25);
  return sign ? -v : v;
}

/* See include/st/dtype.h. Any thread. */
uint16_t st_float_to_bfloat16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffff) > 0x7f800000) return 0x7fc0;   /* NaN, as PyTorch */
  /* Round the low 16 bits away, ties to even; overflow carries into inf. */
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

/* See include/st/dtype.h. Exact. Any thread. */
float st_bfloat16_to_float(uint16_t b) {
  return f32_from_bits((uint32_t)b << 16);
}

/* See include/st/dtype.h. Any thread. */
uint8_t st_float_to_e4m3fn(float f) {
  uint32_t x = f32_bits(f);
  uint8_t sign = (uint8_t)((x >> 24) & 0x80);
  uint32_t a = x & 0x7fffffff;
  if (a >= 0x7f800000) return sign | 0x7f;           /* inf and NaN: NaN */
  uint32_t c = encode_small(a, 3, 7);
  if (c > 0x7e) return sign | 0x7f;                  /* past 448: NaN */
  return (uint8_t)(sign | c);
}

/* See include/st/dtype.h. Exact. Any thread. */
float st_e4m3fn_to_float(uint8_t v) {
  uint32_t e = (v >> 3) & 0xf, m = v & 0x7;
  float r;
  if ((v & 0x7f) == 0x7f) return (v & 0x80) ? -NAN : NAN;
  if (e == 0) r = ldexpf((float)m, -9);
  else r = ldexpf((float)(m | 0x8), (int)e - 10);
  return (v & 0x80) ? -r : r;
}

/* See include/st/dtype.h. Any thread. */
uint8_t st_float_to_e5m2(float f) {
  uint32_t x = f32_bits(f);
  uint8_t sign = (uint8_t)((x >> 24) & 0x80);
  uint32_t a = x & 0x7fffffff;
  if (a > 0x7f800000) return sign | 0x7f;            /* NaN */
  if (a == 0x7f800000) return sign | 0x7c;           /* inf */
  uint32_t c = encode_small(a, 2, 15);
  if (c >= 0x7c) return sign | 0x7c;                 /* overflow: inf */
  return (uint8_t)(sign | c);
}

/* See include/st/dtype.h. Exact. Any thread. */
float st_e5m2_to_float(uint8_t v) {
  uint32_t e = (v >> 2) & 0x1f, m = v & 0x3;
  float r;
  if (e == 0x1f) r = m ? NAN : INFINITY;
  else if (e == 0) r = ldexpf((float)m, -16);
  else r = ldexpf((float)(m | 0x4), (int)e - 17);
  return (v & 0x80) ? -r : r;
}

/* ------------------------------------------------------------ load/store */

/* See include/st/dtype.h. `base` is borrowed; an invalid dtype gives NaN.
 * Any thread. */
double st_dtype_load(st_dtype_t dtype, const void *base, size_t i) {
  const unsigned char *p = (const unsigned char *)base + i * st_dtype_size(dtype);
  switch (dtype) {
  case ST_DTYPE_BOOL: return *p ? 1.0 : 0.0;
  case ST_DTYPE_UINT8: return (double)*p;
  case ST_DTYPE_INT8: { int8_t v; memcpy(&v, p, 1); return (double)v; }
  case ST_DTYPE_INT16: { int16_t v; memcpy(&v, p, 2); return (double)v; }
  case ST_DTYPE_INT32: { int32_t v; memcpy(&v, p, 4); return (double)v; }
  case ST_DTYPE_INT64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
  case ST_DTYPE_FLOAT16: { uint16_t v; memcpy(&v, p, 2); return (double)st_half_to_float(v); }
  case ST_DTYPE_BFLOAT16: { uint16_t v; memcpy(&v, p, 2); return (double)st_bfloat16_to_float(v); }
  case ST_DTYPE_FLOAT32: { float v; memcpy(&v, p, 4); return (double)v; }
  case ST_DTYPE_FLOAT64: { double v; memcpy(&v, p, 8); return v; }
  case ST_DTYPE_FLOAT8_E4M3FN: return (double)st_e4m3fn_to_float(*p);
  case ST_DTYPE_FLOAT8_E5M2: return (double)st_e5m2_to_float(*p);
  case ST_DTYPE_UINT16: { uint16_t v; memcpy(&v, p, 2); return (double)v; }
  case ST_DTYPE_UINT32: { uint32_t v; memcpy(&v, p, 4); return (double)v; }
  case ST_DTYPE_UINT64: { uint64_t v; memcpy(&v, p, 8); return (double)v; }
  default: return NAN;
  }
}

/* v truncated toward zero into int64; NaN gives 0, values past the int64
 * range saturate. */
static int64_t to_int64_sat(double v) {
  if (isnan(v)) return 0;
  if (v >= 9223372036854775808.0) return INT64_MAX;
  if (v <= -9223372036854775808.0) return INT64_MIN;
  return (int64_t)v;
}

/* See include/st/dtype.h. Integer stores keep the low bits of the int64
 * (two's complement wrap, like a C cast); uint64 past INT64_MAX is
 * converted directly. The 16- and 8-bit float formats
 * go through float32 first, as PyTorch's scalar constructors do. `base` is
 * borrowed; an invalid dtype stores nothing. Any thread. */
void st_dtype_store(st_dtype_t dtype, void *base, size_t i, double v) {
  unsigned char *p = (unsigned char *)base + i * st_dtype_size(dtype);
  uint64_t u = (uint64_t)to_int64_sat(v);
  switch (dtype) {
  case ST_DTYPE_BOOL: *p = (v != 0) ? 1 : 0; break;
  case ST_DTYPE_UINT8: case ST_DTYPE_INT8: *p = (uint8_t)u; break;
  case ST_DTYPE_INT16: case ST_DTYPE_UINT16: { uint16_t w = (uint16_t)u; memcpy(p, &w, 2); break; }
  case ST_DTYPE_INT32: case ST_DTYPE_UINT32: { uint32_t w = (uint32_t)u; memcpy(p, &w, 4); break; }
  case ST_DTYPE_INT64: memcpy(p, &u, 8); break;
  case ST_DTYPE_UINT64: {
    uint64_t w = v >= 18446744073709551616.0 ? UINT64_MAX
               : v >= 9223372036854775808.0 ? (uint64_t)v : u;
    memcpy(p, &w, 8);
    break;
  }
  case ST_DTYPE_FLOAT16: { uint16_t w = st_float_to_half((float)v); memcpy(p, &w, 2); break; }
  case ST_DTYPE_BFLOAT16: { uint16_t w = st_float_to_bfloat16((float)v); memcpy(p, &w, 2); break; }
  case ST_DTYPE_FLOAT32: { float f = (float)v; memcpy(p, &f, 4); break; }
  case ST_DTYPE_FLOAT64: memcpy(p, &v, 8); break;
  case ST_DTYPE_FLOAT8_E4M3FN: *p = st_float_to_e4m3fn((float)v); break;
  case ST_DTYPE_FLOAT8_E5M2: *p = st_float_to_e5m2((float)v); break;
  default: break;
  }
}
