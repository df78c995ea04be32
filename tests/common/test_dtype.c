/* dtype table, scalar float conversions and load/store (include/st/dtype.h).
 * The 16- and 8-bit encoders are also checked against a slow reference that
 * picks the nearest representable value by search, ties to the even code. */
#include <math.h>

#include "check.h"
#include "st/dtype.h"

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float ffrom(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

TEST(names_sizes_dlpack) {
  static const struct { st_dtype_t d; const char *name; size_t size; int code, bits, fl; } t[] = {
    {ST_DTYPE_BOOL, "bool", 1, 6, 8, 0},
    {ST_DTYPE_UINT8, "uint8", 1, 1, 8, 0},
    {ST_DTYPE_INT8, "int8", 1, 0, 8, 0},
    {ST_DTYPE_INT16, "int16", 2, 0, 16, 0},
    {ST_DTYPE_INT32, "int32", 4, 0, 32, 0},
    {ST_DTYPE_INT64, "int64", 8, 0, 64, 0},
    {ST_DTYPE_FLOAT16, "float16", 2, 2, 16, 1},
    {ST_DTYPE_BFLOAT16, "bfloat16", 2, 4, 16, 1},
    {ST_DTYPE_FLOAT32, "float32", 4, 2, 32, 1},
    {ST_DTYPE_FLOAT64, "float64", 8, 2, 64, 1},
    {ST_DTYPE_FLOAT8_E4M3FN, "float8_e4m3fn", 1, 10, 8, 1},
    {ST_DTYPE_FLOAT8_E5M2, "float8_e5m2", 1, 12, 8, 1},
    {ST_DTYPE_UINT16, "uint16", 2, 1, 16, 0},
    {ST_DTYPE_UINT32, "uint32", 4, 1, 32, 0},
    {ST_DTYPE_UINT64, "uint64", 8, 1, 64, 0},
  };
  CHECK_EQ_INT(sizeof t / sizeof t[0], ST_DTYPE_COUNT - 1);
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    uint8_t code = 99, bits = 99;
    CHECK_STR_EQ(st_dtype_name(t[i].d), t[i].name);
    CHECK_EQ_INT(st_dtype_from_name(t[i].name), t[i].d);
    CHECK_EQ_INT(st_dtype_size(t[i].d), t[i].size);
    st_dtype_dlpack(t[i].d, &code, &bits);
    CHECK_EQ_INT(code, t[i].code);
    CHECK_EQ_INT(bits, t[i].bits);
    CHECK_EQ_INT(bits, 8 * t[i].size);
    CHECK_EQ_INT(st_dtype_is_float(t[i].d), t[i].fl);
  }
}

TEST(aliases_and_invalid) {
  CHECK_EQ_INT(st_dtype_from_name("float"), ST_DTYPE_FLOAT32);
  CHECK_EQ_INT(st_dtype_from_name("double"), ST_DTYPE_FLOAT64);
  CHECK_EQ_INT(st_dtype_from_name("half"), ST_DTYPE_FLOAT16);
  CHECK_EQ_INT(st_dtype_from_name("bf16"), ST_DTYPE_BFLOAT16);
  CHECK_EQ_INT(st_dtype_from_name("int"), ST_DTYPE_INT32);
  CHECK_EQ_INT(st_dtype_from_name("long"), ST_DTYPE_INT64);
  CHECK_EQ_INT(st_dtype_from_name("Float32"), ST_DTYPE_INVALID);
  CHECK_EQ_INT(st_dtype_from_name("float128"), ST_DTYPE_INVALID);
  CHECK_EQ_INT(st_dtype_from_name(""), ST_DTYPE_INVALID);
  CHECK_EQ_INT(st_dtype_from_name(NULL), ST_DTYPE_INVALID);
  CHECK(st_dtype_name(ST_DTYPE_INVALID) == NULL);
  CHECK(st_dtype_name(ST_DTYPE_COUNT) == NULL);
  CHECK(st_dtype_name((st_dtype_t)-3) == NULL);
  CHECK_EQ_INT(st_dtype_size(ST_DTYPE_INVALID), 0);
  CHECK_EQ_INT(st_dtype_size(ST_DTYPE_COUNT), 0);
  uint8_t code = 9, bits = 9;
  st_dtype_dlpack(ST_DTYPE_INVALID, &code, &bits);
  CHECK_EQ_INT(code, 0);
  CHECK_EQ_INT(bits, 0);
  CHECK_EQ_INT(st_dtype_is_float(ST_DTYPE_INVALID), 0);
}

/* ------------------------------------------------------------- reference */

typedef float (*decode_fn)(uint32_t code);
static float dec_half(uint32_t c) { return st_half_to_float((uint16_t)c); }
static float dec_e4m3(uint32_t c) { return st_e4m3fn_to_float((uint8_t)c); }
static float dec_e5m2(uint32_t c) { return st_e5m2_to_float((uint8_t)c); }
static float dec_bf16(uint32_t c) { return st_bfloat16_to_float((uint16_t)c); }

/* Nearest code to |x| among the positive codes 0..over, where `over` is
 * the first code past the largest finite one (inf, or NaN for e4m3fn) and
 * counts as the value `over_val`. Ties go to the even code. */
static uint32_t ref_encode(double a, decode_fn dec, uint32_t over, double over_val) {
  uint32_t lo = 0, hi = over;
  if (a >= over_val) return over;
  while (hi - lo > 1) {   /* largest code with value <= a */
    uint32_t mid = lo + (hi - lo) / 2;
    if ((double)dec(mid) <= a) lo = mid;
    else hi = mid;
  }
  double vlo = dec(lo), vhi = (lo + 1 == over) ? over_val : (double)dec(lo + 1);
  if (a - vlo < vhi - a) return lo;
  if (a - vlo > vhi - a) return lo + 1;
  return (lo & 1) ? lo + 1 : lo;
}

static uint32_t rng_state = 12345;
static uint32_t next_u32(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 17;
  rng_state ^= rng_state << 5;
  return rng_state;
}

/* Random finite floats concentrated on a format's range (exponent window
 * [emin, emax] of float32 biased exponents) and compares with the reference. */
static int check_against_ref(uint32_t (*enc)(float), decode_fn dec, uint32_t over,
                             double over_val, uint32_t sign_bit, int emin, int emax) {
  for (int n = 0; n < 400000; n++) {
    uint32_t r = next_u32();
    uint32_t e = (uint32_t)(emin + (int)(next_u32() % (uint32_t)(emax - emin + 1)));
    float f = ffrom((r & 0x807fffff) | (e << 23));
    /* Also hit exact ties and codes: a decoded value, or the midpoint. */
    if (n % 4 == 1) f = dec(r % over) * ((r & 0x80000000u) ? -1.0f : 1.0f);
    if (n % 4 == 2) {
      uint32_t c = r % over;
      double v0 = dec(c), v1 = (c + 1 == over) ? over_val : dec(c + 1);
      f = (float)((v0 + v1) / 2);
    }
    uint32_t want = ref_encode(fabs((double)f), dec, over, over_val);
    if (signbit(f)) want |= sign_bit;
    uint32_t got = enc(f);
    if (got != want) {
      fprintf(stderr, "x=%a (0x%08x): got 0x%x want 0x%x\n", (double)f, fbits(f), got, want);
      return 0;
    }
  }
  return 1;
}

static uint32_t enc_half(float f) { return st_float_to_half(f); }
static uint32_t enc_e4m3(float f) { return st_float_to_e4m3fn(f); }
static uint32_t enc_e5m2(float f) { return st_float_to_e5m2(f); }
static uint32_t enc_bf16(float f) { return st_float_to_bfloat16(f); }

/* Every code of `count` decodes to a value that encodes back to it (a
 * NaN to a NaN). */
static void check_every_code_round_trips(decode_fn dec, uint32_t (*enc)(float), uint32_t count) {
  for (uint32_t c = 0; c < count; c++) {
    float f = dec(c);
    if (isnan(f)) CHECK(isnan(dec(enc(f))));
    else CHECK_EQ_INT(enc(f), c);
  }
}

TEST(half_matches_reference) {
  /* 2^-26 .. 2^17: subnormals, normals and overflow. */
  CHECK(check_against_ref(enc_half, dec_half, 0x7c00, 65536.0, 0x8000, 127 - 26, 127 + 17));
}

TEST(bfloat16_matches_reference) {
  CHECK(check_against_ref(enc_bf16, dec_bf16, 0x7f80, ldexp(1.0, 128), 0x8000, 1, 254));
}

TEST(e4m3fn_matches_reference) {
  CHECK(check_against_ref(enc_e4m3, dec_e4m3, 0x7f, 480.0, 0x80, 127 - 12, 127 + 10));
}

TEST(e5m2_matches_reference) {
  CHECK(check_against_ref(enc_e5m2, dec_e5m2, 0x7c, 65536.0, 0x80, 127 - 19, 127 + 17));
}

/* ------------------------------------------------------------- edge cases */

TEST(half_edges) {
  CHECK_EQ_INT(st_float_to_half(1.0f), 0x3c00);
  CHECK_EQ_INT(st_float_to_half(-2.0f), 0xc000);
  CHECK_EQ_INT(st_float_to_half(65504.0f), 0x7bff);          /* max */
  CHECK_EQ_INT(st_float_to_half(65519.0f), 0x7bff);
  CHECK_EQ_INT(st_float_to_half(65520.0f), 0x7c00);          /* tie: to inf */
  CHECK_EQ_INT(st_float_to_half(1e10f), 0x7c00);
  CHECK_EQ_INT(st_float_to_half(-INFINITY), 0xfc00);
  CHECK_EQ_INT(st_float_to_half(ldexpf(1, -24)), 0x0001);    /* smallest subnormal */
  CHECK_EQ_INT(st_float_to_half(ldexpf(1, -25)), 0x0000);    /* tie: to even 0 */
  CHECK_EQ_INT(st_float_to_half(ldexpf(3, -26)), 0x0001);
  CHECK_EQ_INT(st_float_to_half(ldexpf(3, -25)), 0x0002);    /* 1.5 quanta: tie to 2 */
  CHECK_EQ_INT(st_float_to_half(ldexpf(1, -14)), 0x0400);    /* smallest normal */
  CHECK_EQ_INT(st_float_to_half(ldexpf(1023, -24) + ldexpf(1, -25)), 0x0400);  /* carry */
  CHECK_EQ_INT(st_float_to_half(1.0f + ldexpf(1, -11)), 0x3c00);  /* tie to even */
  CHECK_EQ_INT(st_float_to_half(1.0f + ldexpf(3, -11)), 0x3c02);
  CHECK_EQ_INT(st_float_to_half(-0.0f), 0x8000);
  CHECK_EQ_INT(st_float_to_half(1e-30f), 0x0000);
  CHECK_EQ_INT(st_float_to_half(NAN), 0x7e00);
  CHECK_EQ_INT(st_float_to_half(-NAN), 0xfe00);
  CHECK(st_half_to_float(0x7bff) == 65504.0f);
  CHECK(st_half_to_float(0x0001) == ldexpf(1, -24));
  CHECK(isinf(st_half_to_float(0x7c00)));
  CHECK(isnan(st_half_to_float(0x7e00)));
  CHECK(isnan(st_half_to_float(0x7c01)));   /* signalling pattern reads as NaN */
  /* Every half round-trips. */
  check_every_code_round_trips(dec_half, enc_half, 0x10000);
}

TEST(bfloat16_edges) {
  CHECK_EQ_INT(st_float_to_bfloat16(1.0f), 0x3f80);
  CHECK_EQ_INT(st_float_to_bfloat16(1.0f + ldexpf(1, -8)), 0x3f80);   /* tie to even */
  CHECK_EQ_INT(st_float_to_bfloat16(1.0f + ldexpf(3, -8)), 0x3f82);   /* tie to even */
  CHECK_EQ_INT(st_float_to_bfloat16(1.0f + ldexpf(1, -8) + ldexpf(1, -20)), 0x3f81);
  CHECK_EQ_INT(st_float_to_bfloat16(ffrom(0x7f7fffff)), 0x7f80);      /* FLT_MAX: inf */
  CHECK_EQ_INT(st_float_to_bfloat16(INFINITY), 0x7f80);
  CHECK_EQ_INT(st_float_to_bfloat16(-INFINITY), 0xff80);
  CHECK_EQ_INT(st_float_to_bfloat16(NAN), 0x7fc0);
  CHECK_EQ_INT(st_float_to_bfloat16(ffrom(0x7f800001)), 0x7fc0);      /* stays NaN */
  CHECK_EQ_INT(st_float_to_bfloat16(ffrom(0x00010000)), 0x0001);      /* subnormal */
  CHECK(st_bfloat16_to_float(0x3f80) == 1.0f);
  check_every_code_round_trips(dec_bf16, enc_bf16, 0x10000);
}

TEST(e4m3fn_edges) {
  CHECK_EQ_INT(st_float_to_e4m3fn(1.0f), 0x38);
  CHECK_EQ_INT(st_float_to_e4m3fn(448.0f), 0x7e);            /* max */
  CHECK_EQ_INT(st_float_to_e4m3fn(-448.0f), 0xfe);
  CHECK_EQ_INT(st_float_to_e4m3fn(464.0f), 0x7e);            /* tie: to even 448 */
  CHECK_EQ_INT(st_float_to_e4m3fn(465.0f), 0x7f);            /* rounds past max: NaN */
  CHECK_EQ_INT(st_float_to_e4m3fn(480.0f), 0x7f);
  CHECK_EQ_INT(st_float_to_e4m3fn(-480.0f), 0xff);
  CHECK_EQ_INT(st_float_to_e4m3fn(1e6f), 0x7f);
  CHECK_EQ_INT(st_float_to_e4m3fn(INFINITY), 0x7f);
  CHECK_EQ_INT(st_float_to_e4m3fn(-INFINITY), 0xff);
  CHECK_EQ_INT(st_float_to_e4m3fn(NAN), 0x7f);
  CHECK_EQ_INT(st_float_to_e4m3fn(-NAN), 0xff);
  CHECK_EQ_INT(st_float_to_e4m3fn(ldexpf(1, -9)), 0x01);     /* smallest subnormal */
  CHECK_EQ_INT(st_float_to_e4m3fn(ldexpf(1, -10)), 0x00);    /* tie to even 0 */
  CHECK_EQ_INT(st_float_to_e4m3fn(ldexpf(3, -10)), 0x02);    /* tie to even 2 */
  CHECK_EQ_INT(st_float_to_e4m3fn(ldexpf(7, -9)), 0x07);     /* largest subnormal */
  CHECK_EQ_INT(st_float_to_e4m3fn(ldexpf(1, -6)), 0x08);     /* smallest normal */
  CHECK_EQ_INT(st_float_to_e4m3fn(-0.0f), 0x80);
  CHECK(st_e4m3fn_to_float(0x7e) == 448.0f);
  CHECK(st_e4m3fn_to_float(0x01) == ldexpf(1, -9));
  CHECK(isnan(st_e4m3fn_to_float(0x7f)));
  CHECK(isnan(st_e4m3fn_to_float(0xff)));
  CHECK(st_e4m3fn_to_float(0x78) == 256.0f);   /* 0x78 is a number, not inf */
  for (uint32_t c = 0; c < 0x100; c++) {
    /* NaN codes (0x7f, 0xff) come back as themselves, sign kept. */
    CHECK_EQ_INT(st_float_to_e4m3fn(st_e4m3fn_to_float((uint8_t)c)), c);
  }
}

TEST(e5m2_edges) {
  CHECK_EQ_INT(st_float_to_e5m2(1.0f), 0x3c);
  CHECK_EQ_INT(st_float_to_e5m2(57344.0f), 0x7b);            /* max */
  CHECK_EQ_INT(st_float_to_e5m2(61439.0f), 0x7b);
  CHECK_EQ_INT(st_float_to_e5m2(61440.0f), 0x7c);            /* tie: to inf */
  CHECK_EQ_INT(st_float_to_e5m2(65536.0f), 0x7c);            /* overflow: inf */
  CHECK_EQ_INT(st_float_to_e5m2(-1e9f), 0xfc);
  CHECK_EQ_INT(st_float_to_e5m2(INFINITY), 0x7c);
  CHECK_EQ_INT(st_float_to_e5m2(-INFINITY), 0xfc);
  CHECK_EQ_INT(st_float_to_e5m2(NAN), 0x7f);
  CHECK_EQ_INT(st_float_to_e5m2(-NAN), 0xff);
  CHECK_EQ_INT(st_float_to_e5m2(ldexpf(1, -16)), 0x01);     /* smallest subnormal */
  CHECK_EQ_INT(st_float_to_e5m2(ldexpf(1, -17)), 0x00);     /* tie to even */
  CHECK_EQ_INT(st_float_to_e5m2(ldexpf(1, -14)), 0x04);     /* smallest normal */
  CHECK_EQ_INT(st_float_to_e5m2(1.0f + 0.125f), 0x3c);      /* tie to even */
  CHECK_EQ_INT(st_float_to_e5m2(1.0f + 0.375f), 0x3e);      /* tie to even */
  CHECK(st_e5m2_to_float(0x7b) == 57344.0f);
  CHECK(isinf(st_e5m2_to_float(0x7c)) && st_e5m2_to_float(0x7c) > 0);
  CHECK(isinf(st_e5m2_to_float(0xfc)) && st_e5m2_to_float(0xfc) < 0);
  CHECK(isnan(st_e5m2_to_float(0x7d)));
  for (uint32_t c = 0; c < 0x100; c++) {
    float f = st_e5m2_to_float((uint8_t)c);
    if (isnan(f)) CHECK(isnan(st_e5m2_to_float(st_float_to_e5m2(f))));
    else CHECK_EQ_INT(st_float_to_e5m2(f), c);
  }
}

/* ------------------------------------------------------------- load/store */

static double roundtrip(st_dtype_t d, double v) {
  unsigned char buf[64];
  memset(buf, 0xaa, sizeof buf);
  st_dtype_store(d, buf, 3, v);
  /* Only element 3 changed. */
  size_t es = st_dtype_size(d);
  for (size_t i = 0; i < sizeof buf; i++)
    if ((i < 3 * es || i >= 4 * es) && buf[i] != 0xaa) return -12345.0;
  return st_dtype_load(d, buf, 3);
}

TEST(integer_store_truncates_and_wraps) {
  CHECK(roundtrip(ST_DTYPE_INT8, 5.9) == 5);
  CHECK(roundtrip(ST_DTYPE_INT8, -5.9) == -5);
  CHECK(roundtrip(ST_DTYPE_INT8, 127) == 127);
  CHECK(roundtrip(ST_DTYPE_INT8, 128) == -128);
  CHECK(roundtrip(ST_DTYPE_INT8, 200) == -56);
  CHECK(roundtrip(ST_DTYPE_INT8, 300.7) == 44);
  CHECK(roundtrip(ST_DTYPE_UINT8, -1) == 255);
  CHECK(roundtrip(ST_DTYPE_UINT8, 256) == 0);
  CHECK(roundtrip(ST_DTYPE_UINT8, 255.99) == 255);
  CHECK(roundtrip(ST_DTYPE_INT16, 70000) == 4464);
  CHECK(roundtrip(ST_DTYPE_INT16, -32769) == 32767);
  CHECK(roundtrip(ST_DTYPE_INT32, 2147483648.0) == -2147483648.0);
  CHECK(roundtrip(ST_DTYPE_INT32, 4294967297.0) == 1);
  CHECK(roundtrip(ST_DTYPE_INT64, 1e30) == 9223372036854775807.0);
  CHECK(roundtrip(ST_DTYPE_INT64, -1e30) == -9223372036854775808.0);
  CHECK(roundtrip(ST_DTYPE_INT64, INFINITY) == 9223372036854775807.0);
  CHECK(roundtrip(ST_DTYPE_INT64, -123456789.5) == -123456789);
  /* Saturation happens before the wrap: +huge is INT64_MAX, low byte 0xff. */
  CHECK(roundtrip(ST_DTYPE_UINT8, 1e30) == 255);
  CHECK(roundtrip(ST_DTYPE_INT8, -1e30) == 0);
  CHECK(roundtrip(ST_DTYPE_INT32, NAN) == 0);
  CHECK(roundtrip(ST_DTYPE_UINT8, NAN) == 0);
  CHECK(roundtrip(ST_DTYPE_INT64, NAN) == 0);
  /* The unsigned types wrap alike; uint64 keeps [2^63, 2^64) exactly and
   * saturates past it. */
  CHECK(roundtrip(ST_DTYPE_UINT16, -1) == 65535);
  CHECK(roundtrip(ST_DTYPE_UINT16, 65536) == 0);
  CHECK(roundtrip(ST_DTYPE_UINT16, 65535.9) == 65535);
  CHECK(roundtrip(ST_DTYPE_UINT32, -1) == 4294967295.0);
  CHECK(roundtrip(ST_DTYPE_UINT32, 4294967296.0) == 0);
  CHECK(roundtrip(ST_DTYPE_UINT32, 3000000000.0) == 3000000000.0);
  CHECK(roundtrip(ST_DTYPE_UINT64, 9223372036854775808.0) == 9223372036854775808.0);
  CHECK(roundtrip(ST_DTYPE_UINT64, 18446744073709549568.0) == 18446744073709549568.0);
  CHECK(roundtrip(ST_DTYPE_UINT64, 1e30) == 18446744073709551615.0);
  CHECK(roundtrip(ST_DTYPE_UINT64, NAN) == 0);
  unsigned char b[8];
  uint64_t u;
  st_dtype_store(ST_DTYPE_UINT64, b, 0, -1.0);
  memcpy(&u, b, 8);
  CHECK(u == UINT64_MAX);
  st_dtype_store(ST_DTYPE_UINT64, b, 0, 1e30);
  memcpy(&u, b, 8);
  CHECK(u == UINT64_MAX);
  st_dtype_store(ST_DTYPE_UINT64, b, 0, 12345678901234567168.0);
  memcpy(&u, b, 8);
  CHECK(u == UINT64_C(12345678901234567168));
  st_dtype_store(ST_DTYPE_INT64, b, 0, -2.0);
  int64_t v;
  memcpy(&v, b, 8);
  CHECK_EQ_INT(v, -2);
}

TEST(bool_store) {
  CHECK(roundtrip(ST_DTYPE_BOOL, 0) == 0);
  CHECK(roundtrip(ST_DTYPE_BOOL, -0.0) == 0);
  CHECK(roundtrip(ST_DTYPE_BOOL, 0.5) == 1);
  CHECK(roundtrip(ST_DTYPE_BOOL, -3) == 1);
  CHECK(roundtrip(ST_DTYPE_BOOL, NAN) == 1);
  unsigned char b = 7;   /* any nonzero byte loads as true */
  CHECK(st_dtype_load(ST_DTYPE_BOOL, &b, 0) == 1.0);
  st_dtype_store(ST_DTYPE_BOOL, &b, 0, 2.0);
  CHECK_EQ_INT(b, 1);
}

TEST(float_store) {
  CHECK(roundtrip(ST_DTYPE_FLOAT64, 0.1) == 0.1);
  CHECK(roundtrip(ST_DTYPE_FLOAT32, 0.1) == (double)0.1f);
  CHECK(roundtrip(ST_DTYPE_FLOAT16, 65504) == 65504);
  CHECK(isinf(roundtrip(ST_DTYPE_FLOAT16, 70000)));
  CHECK(roundtrip(ST_DTYPE_FLOAT16, ldexp(1, -24)) == ldexp(1, -24));
  CHECK(roundtrip(ST_DTYPE_BFLOAT16, 1.0 + ldexp(1, -8)) == 1.0);
  CHECK(roundtrip(ST_DTYPE_FLOAT8_E4M3FN, 448) == 448);
  CHECK(isnan(roundtrip(ST_DTYPE_FLOAT8_E4M3FN, 480)));
  CHECK(isnan(roundtrip(ST_DTYPE_FLOAT8_E4M3FN, INFINITY)));
  CHECK(roundtrip(ST_DTYPE_FLOAT8_E5M2, 57344) == 57344);
  CHECK(isinf(roundtrip(ST_DTYPE_FLOAT8_E5M2, 1e6)));
  CHECK(isnan(roundtrip(ST_DTYPE_FLOAT32, NAN)));
  CHECK(isnan(roundtrip(ST_DTYPE_FLOAT16, NAN)));
  CHECK(isnan(roundtrip(ST_DTYPE_BFLOAT16, NAN)));
  CHECK(isnan(roundtrip(ST_DTYPE_FLOAT8_E5M2, NAN)));
  CHECK(roundtrip(ST_DTYPE_FLOAT16, -1.5) == -1.5);
  /* Invalid dtype: loads NaN, stores nothing. */
  unsigned char b[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  st_dtype_store(ST_DTYPE_INVALID, b, 0, 1.0);
  CHECK_EQ_INT(b[0], 1);
  CHECK(isnan(st_dtype_load(ST_DTYPE_INVALID, b, 0)));
}

int main(void) {
  RUN(names_sizes_dlpack);
  RUN(aliases_and_invalid);
  RUN(half_matches_reference);
  RUN(bfloat16_matches_reference);
  RUN(e4m3fn_matches_reference);
  RUN(e5m2_matches_reference);
  RUN(half_edges);
  RUN(bfloat16_edges);
  RUN(e4m3fn_edges);
  RUN(e5m2_edges);
  RUN(integer_store_truncates_and_wraps);
  RUN(bool_store);
  RUN(float_store);
  return stt_summary();
}
