/* Construction kernels on the device against the CPU backend: fill, arange,
 * rand, randn and cast for every dtype, written into CUDA arenas and read
 * back (arange, rand and randn through the tensor core's constructors, as
 * the server builds them). fill, arange, rand and cast must store the very
 * bytes st_dtype_store stores (NaN payloads aside: the device canonicalizes
 * NaNs in float conversions); randn must agree within a few units in the last
 * place (device and libm log/cos differ in their last bits), and the test
 * prints how many elements are not bit-identical. The conversions of
 * src/cuda/dtype_dev.h are checked against dtype.c for every 16- and 8-bit
 * code and a large sample of float32 inputs, rounding ties included. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/philox.h"
#include "mem/arena.h"
#include "mem/cuda.h"
#include "st/dtype.h"
#include "common/generators.h"
#include "tensor/constructors.h"
#include "tensor/tensor.h"

#ifdef ST_HAVE_CUDA
#include "cuda/kernels.h"

#define MiB (1024ull * 1024ull)
#define BUF_BYTES (160 * MiB)

static const st__cuda_api_t *cu;
static st__arena_t *buf_a, *buf_b;   /* device scratch, BUF_BYTES each */
static st__tensor_ctx_t C;           /* as inside a build body */
static char err[512];

static void *dev(st__arena_t *a, uint64_t off) { return (char *)st__arena_base(a) + off; }
static uint64_t dptr(st__arena_t *a, uint64_t off) { return (uint64_t)(uintptr_t)dev(a, off); }

static int sync0(void) { return cu->cuStreamSynchronize(NULL) == CUDA_SUCCESS; }

static int down(void *host, st__arena_t *a, uint64_t off, uint64_t bytes) {
  return st__cuda_copy_to_host(host, dptr(a, off), bytes, 0, err, sizeof err) == ST_OK;
}

static int up(st__arena_t *a, uint64_t off, const void *host, uint64_t bytes) {
  return st__cuda_copy_to_device(dptr(a, off), host, bytes, 0, err, sizeof err) == ST_OK;
}

/* The bytes of t, a contiguous tensor of C on cuda:0, into host once the
 * work C queued is done; t is released. 1 on success. */
static int down_tensor(void *host, st__tensor_t *t) {
  int ok = st__tensor_sync_used(&C, err, sizeof err) == ST_OK &&
           st__cuda_copy_to_host(host, (uint64_t)(uintptr_t)st__tensor_data(t),
                                 st__geom_nbytes(&t->geom), 0, err, sizeof err) == ST_OK;
  st__tensor_release(t);
  return ok;
}

static int is_nan_elem(st_dtype_t d, const void *p, size_t i) {
  return st_dtype_is_float(d) && isnan(st_dtype_load(d, p, i));
}

/* Index of the first element that differs (NaN equals NaN), or -1. */
static int64_t first_diff(st_dtype_t d, const void *got, const void *want, int64_t n) {
  size_t es = st_dtype_size(d);
  for (int64_t i = 0; i < n; i++) {
    const char *g = (const char *)got + (size_t)i * es, *w = (const char *)want + (size_t)i * es;
    if (memcmp(g, w, es) == 0) continue;
    if (is_nan_elem(d, got, (size_t)i) && is_nan_elem(d, want, (size_t)i)) continue;
    return i;
  }
  return -1;
}

static void report_diff(st_dtype_t d, const char *what, const void *got, const void *want,
                        int64_t i) {
  fprintf(stderr, "   %s %s: element %lld is %.17g, CPU stores %.17g\n", what, st_dtype_name(d),
          (long long)i, st_dtype_load(d, got, (size_t)i), st_dtype_load(d, want, (size_t)i));
}

/* Bits of element i as a signed integer ordered like the values
 * (sign-magnitude to two's complement), for ulp distances. */
static int64_t ordered(st_dtype_t d, const void *p, size_t i) {
  size_t es = st_dtype_size(d);
  uint64_t b = 0;
  memcpy(&b, (const char *)p + i * es, es);       /* little endian */
  uint64_t sign = 1ull << (es * 8 - 1);
  int64_t mag = (int64_t)(b & (sign - 1));
  return (b & sign) ? -mag : mag;
}

TEST(fill_matches_cpu) {
  const double vals[] = {0, 1, -1, 1.5, -3.25, 300.7, 1e9, -1e20, 65504.5, 448, 500,
                         1e-8, 3e-5, NAN, INFINITY, -INFINITY};
  const int64_t n = 1025;
  unsigned char got[1025 * 8 + 64], want[1025 * 8];
  for (int d = ST_DTYPE_INVALID + 1; d < ST_DTYPE_COUNT; d++) {
    for (size_t k = 0; k < sizeof vals / sizeof vals[0]; k++) {
      size_t es = st_dtype_size((st_dtype_t)d);
      CHECK_EQ_INT(cu->cuMemsetD8Async((CUdeviceptr)dptr(buf_a, 0), 0x5a, 16384, NULL),
                   CUDA_SUCCESS);
      CHECK_ERR_MSG(st__cuda_fill(dev(buf_a, 256), (st_dtype_t)d, n, vals[k], NULL, err, sizeof err),
                    ST_OK, err);
      CHECK(sync0());
      CHECK(down(got, buf_a, 256, (uint64_t)n * es + 8));
      for (int64_t i = 0; i < n; i++) st_dtype_store((st_dtype_t)d, want, (size_t)i, vals[k]);
      CHECK(memcmp(got, want, (size_t)n * es) == 0);   /* bytes, NaN included */
      CHECK_EQ_INT(got[n * es], 0x5a);                 /* nothing past the end */
    }
  }
  /* Enough elements for the grid-stride loop to go round several times. */
  const int64_t big = 65536LL * 256 * 2 + 3;
  CHECK_ERR_MSG(st__cuda_fill(dev(buf_a, 0), ST_DTYPE_UINT8, big, 7, NULL, err, sizeof err),
                ST_OK, err);
  CHECK(sync0());
  unsigned char *h = malloc((size_t)big);
  CHECK(h);
  int ok = down(h, buf_a, 0, (uint64_t)big);
  int64_t bad = 0;
  for (int64_t i = 0; i < big; i++) bad += h[i] != 7;
  free(h);
  CHECK(ok);
  CHECK_EQ_INT(bad, 0);
}

TEST(arange_matches_cpu) {
  static unsigned char got[70001 * 8], want[70001 * 8];
  const struct { double start, step; int64_t n; } cases[] = {
    {-7.5, 0.37, 5001}, {0, 1, 70001}, {1e6, -123.456, 4097}, {0.1, 0.1, 3333}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    for (int d = ST_DTYPE_INVALID + 1; d < ST_DTYPE_COUNT; d++) {
      int64_t n = cases[c].n;
      /* half a step past the last element: exactly n elements */
      double stop = cases[c].start + ((double)n - 0.5) * cases[c].step;
      st__tensor_t t;
      CHECK_ERR_MSG(st__tensor_arange(&C, &t, 0, (st_dtype_t)d, cases[c].start, stop,
                                      cases[c].step, err, sizeof err),
                    ST_OK, err);
      CHECK_EQ_INT(st__geom_numel(&t.geom), n);
      CHECK(down_tensor(got, &t));
      for (int64_t i = 0; i < n; i++)
        st_dtype_store((st_dtype_t)d, want, (size_t)i, cases[c].start + (double)i * cases[c].step);
      int64_t i = first_diff((st_dtype_t)d, got, want, n);
      if (i >= 0) report_diff((st_dtype_t)d, "arange", got, want, i);
      CHECK_EQ_INT(i, -1);
    }
  }
}

static const st_dtype_t float_dtypes[] = {ST_DTYPE_FLOAT32, ST_DTYPE_FLOAT16, ST_DTYPE_BFLOAT16,
                                          ST_DTYPE_FLOAT64, ST_DTYPE_FLOAT8_E4M3FN,
                                          ST_DTYPE_FLOAT8_E5M2};

TEST(rand_is_bit_identical) {
  err[0] = '\0';
  const int64_t n = (1 << 21) + 3;
  const uint64_t seeds[] = {0, 42, 0xdeadbeefcafef00dULL};
  unsigned char *got = malloc((size_t)n * 8), *want = malloc((size_t)n * 8);
  CHECK(got && want);
  for (size_t s = 0; s < 3; s++) {
    for (size_t k = 0; k < sizeof float_dtypes / sizeof float_dtypes[0]; k++) {
      st_dtype_t d = float_dtypes[k];
      size_t es = st_dtype_size(d);
      int wide = d == ST_DTYPE_FLOAT64;
      st__tensor_t t;
      if (st__tensor_rand(&C, &t, 0, d, 1, &n, seeds[s], err, sizeof err) != ST_OK) break;
      if (!down_tensor(got, &t)) break;
      for (int64_t i = 0; i < n; i++)
        st_dtype_store(d, want, (size_t)i, st__rng_uniform(seeds[s], (uint64_t)i, wide));
      if (memcmp(got, want, (size_t)n * es) != 0) {
        int64_t i = first_diff(d, got, want, n);
        report_diff(d, "rand", got, want, i);
        free(got);
        free(want);
        CHECK(!"rand differs from the CPU generator");
      }
    }
  }
  free(got);
  free(want);
  CHECK_STR_EQ(err, "");
}

TEST(randn_matches_cpu_within_ulps) {
  const int64_t n = 1 << 21;
  const uint64_t seed = 7;
  unsigned char *got = malloc((size_t)n * 8), *want = malloc((size_t)n * 8);
  CHECK(got && want);
  /* Allowed distance in units of the dtype's last place. */
  const int64_t tol[] = {2, 1, 1, 8, 1, 1};
  int ok = 1;
  for (size_t k = 0; k < sizeof float_dtypes / sizeof float_dtypes[0] && ok; k++) {
    st_dtype_t d = float_dtypes[k];
    st__tensor_t t;
    if (st__tensor_randn(&C, &t, 0, d, 1, &n, seed, err, sizeof err) != ST_OK ||
        !down_tensor(got, &t)) {
      fprintf(stderr, "   randn %s: %s\n", st_dtype_name(d), err);
      ok = 0;
      break;
    }
    for (int64_t i = 0; i < n; i++) st_dtype_store(d, want, (size_t)i, st__rng_normal(seed, (uint64_t)i));
    int64_t differ = 0, worst = 0, worst_i = 0;
    for (int64_t i = 0; i < n; i++) {
      int64_t dist = llabs(ordered(d, got, (size_t)i) - ordered(d, want, (size_t)i));
      if (dist) differ++;
      if (dist > worst) { worst = dist; worst_i = i; }
    }
    fprintf(stderr, "   randn %-14s %lld of %lld elements not bit-identical, worst %lld ulp\n",
            st_dtype_name(d), (long long)differ, (long long)n, (long long)worst);
    if (worst > tol[k]) {
      report_diff(d, "randn", got, want, worst_i);
      ok = 0;
    }
  }
  free(got);
  free(want);
  CHECK(ok);
}

TEST(arguments_are_checked) {
  const int64_t ten = 10;
  st__tensor_t t;
  CHECK_ERR_MSG(st__tensor_rand(&C, &t, 0, ST_DTYPE_INT32, 1, &ten, 1, err, sizeof err),
                ST_ERR_INVALID_ARGUMENT, err);
  CHECK_CONTAINS(err, "floating");
  CHECK(t.arena == NULL);
  CHECK_ERR_MSG(st__tensor_randn(&C, &t, 0, ST_DTYPE_BOOL, 1, &ten, 1, err, sizeof err),
                ST_ERR_INVALID_ARGUMENT, err);
  CHECK(t.arena == NULL);
  CHECK_ERR_MSG(st__cuda_fill(dev(buf_a, 0), ST_DTYPE_INVALID, 10, 1, NULL, err, sizeof err),
                ST_ERR_INVALID_ARGUMENT, err);
  CHECK_ERR_MSG(st__cuda_fill(dev(buf_a, 0), ST_DTYPE_COUNT, 10, 1, NULL, err, sizeof err),
                ST_ERR_INVALID_ARGUMENT, err);
  const st__gen_t up_by_one = {.kind = ST__GEN_ARANGE, .a = 0, .b = 1};
  const st__gen_t uniform = {.kind = ST__GEN_RAND, .seed = 1};
  CHECK_ERR_MSG(st__cuda_generate(dev(buf_a, 0), ST_DTYPE_FLOAT32, -1, &up_by_one, NULL, err,
                                  sizeof err),
                ST_ERR_INVALID_ARGUMENT, err);
  CHECK_CONTAINS(err, "negative");
  CHECK_ERR_MSG(st__cuda_cast(dev(buf_a, 0), ST_DTYPE_FLOAT32, NULL, ST_DTYPE_INT8, 5, NULL, err,
                              sizeof err),
                ST_ERR_INVALID_ARGUMENT, err);
  /* Nothing to do is not an error, whatever the pointer. */
  CHECK_ERR_MSG(st__cuda_fill(NULL, ST_DTYPE_FLOAT32, 0, 1, NULL, err, sizeof err), ST_OK, err);
  CHECK_ERR_MSG(st__cuda_generate(NULL, ST_DTYPE_FLOAT16, 0, &uniform, NULL, err, sizeof err),
                ST_OK, err);
  CHECK(sync0());
}

/* Every (source, destination) dtype pair on values that exercise
 * truncation, wrapping, saturation, rounding ties, overflow and NaN. */
TEST(cast_matches_cpu) {
  enum { N = 4096 };
  static const double special[] = {
    0, -0.0, 1, -1, 0.5, -0.5, 1.5, 2.5, -2.5, 127, 128, 255, 256, -129, 32767, 32768, -32769,
    65504, 65519.9, 65520, 448, 464, 465, 57344, 61440, 1e-8, 6e-8, 1e-45, 1e-39, 3.4e38, 1e300,
    2147483647.0, 2147483648.0, -2147483649.0, 9.3e18, -9.3e18, 1.0000001, 0.1, -0.7,
    NAN, -NAN, INFINITY, -INFINITY};
  static double vals[N];
  size_t ns = sizeof special / sizeof special[0];
  for (int i = 0; i < N; i++)
    vals[i] = (size_t)i < ns ? special[i] : (double)(i - 2048) * 0.731 * ((i % 7) ? 1 : 1000.5);
  static unsigned char src[N * 8], got[N * 8], want[N * 8];
  for (int s = ST_DTYPE_INVALID + 1; s < ST_DTYPE_COUNT; s++) {
    for (int i = 0; i < N; i++) st_dtype_store((st_dtype_t)s, src, (size_t)i, vals[i]);
    CHECK(up(buf_a, 0, src, (uint64_t)N * st_dtype_size((st_dtype_t)s)));
    for (int d = ST_DTYPE_INVALID + 1; d < ST_DTYPE_COUNT; d++) {
      CHECK_ERR_MSG(st__cuda_cast(dev(buf_b, 0), (st_dtype_t)d, dev(buf_a, 0), (st_dtype_t)s, N,
                                  NULL, err, sizeof err),
                    ST_OK, err);
      CHECK(sync0());
      CHECK(down(got, buf_b, 0, (uint64_t)N * st_dtype_size((st_dtype_t)d)));
      /* A cast to the same dtype is a copy of the bytes: through a double
       * the CPU reference would round a uint64 above 2^53. */
      if (s == d)
        memcpy(want, src, (size_t)N * st_dtype_size((st_dtype_t)d));
      else
        for (int i = 0; i < N; i++)
          st_dtype_store((st_dtype_t)d, want, (size_t)i,
                         st_dtype_load((st_dtype_t)s, src, (size_t)i));
      int64_t i = first_diff((st_dtype_t)d, got, want, N);
      if (i >= 0) {
        fprintf(stderr, "   cast %s -> %s:\n", st_dtype_name((st_dtype_t)s),
                st_dtype_name((st_dtype_t)d));
        report_diff((st_dtype_t)d, "cast", got, want, i);
      }
      CHECK_EQ_INT(i, -1);
    }
  }
}

/* Decoding: every code of the 16- and 8-bit formats to float32. */
TEST(decoding_every_code_matches_dtype_c) {
  static uint16_t codes[65536];
  static float got[65536];
  for (int i = 0; i < 65536; i++) codes[i] = (uint16_t)i;
  const st_dtype_t fmt[] = {ST_DTYPE_FLOAT16, ST_DTYPE_BFLOAT16, ST_DTYPE_FLOAT8_E4M3FN,
                            ST_DTYPE_FLOAT8_E5M2};
  CHECK(up(buf_a, 0, codes, sizeof codes));
  static uint8_t codes8[256];
  for (int i = 0; i < 256; i++) codes8[i] = (uint8_t)i;
  CHECK(up(buf_a, sizeof codes, codes8, sizeof codes8));
  for (int k = 0; k < 4; k++) {
    int wide = k < 2;
    int n = wide ? 65536 : 256;
    CHECK_ERR_MSG(st__cuda_cast(dev(buf_b, 0), ST_DTYPE_FLOAT32, dev(buf_a, wide ? 0 : sizeof codes),
                                fmt[k], n, NULL, err, sizeof err),
                  ST_OK, err);
    CHECK(sync0());
    CHECK(down(got, buf_b, 0, (uint64_t)n * 4));
    for (int i = 0; i < n; i++) {
      float w = k == 0 ? st_half_to_float((uint16_t)i)
              : k == 1 ? st_bfloat16_to_float((uint16_t)i)
              : k == 2 ? st_e4m3fn_to_float((uint8_t)i)
                       : st_e5m2_to_float((uint8_t)i);
      if (isnan(w) && isnan(got[i])) continue;
      if (memcmp(&w, &got[i], 4) != 0) {
        fprintf(stderr, "   %s code 0x%x: device %.9g, dtype.c %.9g\n", st_dtype_name(fmt[k]), i,
                (double)got[i], (double)w);
        CHECK(!"decoding differs");
      }
    }
  }
}

/* Encoding: float32 -> each narrow format for every upper-16-bit pattern
 * combined with low bits around the rounding points of every format, and a
 * stride through all 2^32 patterns. */
TEST(encoding_matches_dtype_c) {
  static const uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff,
                                  0x2000, 0x2001, 0x7fff, 0x8000, 0x8001, 0xffff};
  const size_t nl = sizeof lows / sizeof lows[0];
  const uint64_t stride = 257;
  const size_t n = 65536 * nl + (size_t)((1ull << 32) / stride);
  uint32_t *in = malloc(n * 4);
  uint16_t *got16 = malloc(n * 2);
  uint8_t *got8 = malloc(n);
  CHECK(in && got16 && got8);
  size_t k = 0;
  for (uint32_t hi = 0; hi < 65536; hi++)
    for (size_t l = 0; l < nl; l++) in[k++] = hi << 16 | lows[l];
  for (uint64_t x = 0; k < n; x += stride) in[k++] = (uint32_t)x;
  int ok = up(buf_a, 0, in, n * 4);
  const st_dtype_t fmt[] = {ST_DTYPE_FLOAT16, ST_DTYPE_BFLOAT16, ST_DTYPE_FLOAT8_E4M3FN,
                            ST_DTYPE_FLOAT8_E5M2};
  long bad = 0;
  for (int f = 0; f < 4 && ok; f++) {
    int wide = f < 2;
    ok = st__cuda_cast(dev(buf_b, 0), fmt[f], dev(buf_a, 0), ST_DTYPE_FLOAT32, (int64_t)n, NULL,
                       err, sizeof err) == ST_OK &&
         sync0() && (wide ? down(got16, buf_b, 0, n * 2) : down(got8, buf_b, 0, n));
    for (size_t i = 0; i < n && ok; i++) {
      float x;
      memcpy(&x, &in[i], 4);
      uint32_t g = wide ? got16[i] : got8[i];
      uint32_t w = f == 0 ? st_float_to_half(x)
                 : f == 1 ? st_float_to_bfloat16(x)
                 : f == 2 ? st_float_to_e4m3fn(x)
                          : st_float_to_e5m2(x);
      if (g == w) continue;
      if (isnan(x)) {          /* NaN in, some NaN out: the device drops NaN signs */
        double gv = st_dtype_load(fmt[f], wide ? (const void *)&got16[i] : (const void *)&got8[i], 0);
        if (isnan(gv)) continue;
      }
      if (bad++ < 5)
        fprintf(stderr, "   %s of float32 bits 0x%08x: device 0x%x, dtype.c 0x%x\n",
                st_dtype_name(fmt[f]), in[i], g, w);
    }
  }
  fprintf(stderr, "   %zu float32 inputs x 4 formats checked\n", n);
  free(in);
  free(got16);
  free(got8);
  CHECK(ok);
  CHECK_EQ_INT(bad, 0);
}

/* Workers queue on their own stream (docs/design.md, section 2): the constructor's work
 * on the thread's created stream stores what the kernel stores on the
 * default stream. */
TEST(kernels_run_on_a_created_stream) {
  const int64_t n = 1 << 20;
  const st__gen_t g = {.kind = ST__GEN_RANDN, .seed = 99};
  st__tensor_t t;
  int rc1 = st__tensor_randn(&C, &t, 0, ST_DTYPE_BFLOAT16, 1, &n, 99, err, sizeof err);
  CHECK_ERR_MSG(rc1, ST_OK, err);
  CHECK_ERR_MSG(st__cuda_generate(dev(buf_b, 0), ST_DTYPE_BFLOAT16, n, &g, NULL, err, sizeof err),
                ST_OK, err);
  static uint16_t x[1 << 20], y[1 << 20];
  CHECK(down_tensor(x, &t));
  CHECK(sync0());
  CHECK(down(y, buf_b, 0, sizeof y));
  CHECK(memcmp(x, y, sizeof x) == 0);
}

/* Workers (docs/design.md, section 2): each thread builds with its own context, on its own
 * stream, into its own arena; another thread drops the arenas. */
typedef struct {
  int index;
  st__arena_t *arena;
  int64_t worst_ulp;
  char err[256];
} worker_t;

static void *worker_main(void *arg) {
  worker_t *w = arg;
  const int64_t n = 1 << 20;
  w->worst_ulp = -1;
  st__tensor_ctx_t c;
  st__tensor_ctx_init(&c);
  c.in_call = 1;
  st__tensor_t t = {0};
  float *h = malloc((size_t)n * 4);
  if (h &&
      st__tensor_randn(&c, &t, 0, ST_DTYPE_FLOAT32, 1, &n, 1000 + (uint64_t)w->index, w->err,
                       sizeof w->err) == ST_OK &&
      st__tensor_sync_used(&c, w->err, sizeof w->err) == ST_OK &&
      st__cuda_copy_to_host(h, (uint64_t)(uintptr_t)st__tensor_data(&t), (uint64_t)n * 4, 0,
                            w->err, sizeof w->err) == ST_OK) {
    w->worst_ulp = 0;
    for (int64_t i = 0; i < n; i++) {
      float want;
      st_dtype_store(ST_DTYPE_FLOAT32, &want, 0,
                     st__rng_normal(1000 + (uint64_t)w->index, (uint64_t)i));
      int64_t d = llabs(ordered(ST_DTYPE_FLOAT32, h, (size_t)i) - ordered(ST_DTYPE_FLOAT32, &want, 0));
      if (d > w->worst_ulp) w->worst_ulp = d;
    }
  }
  w->arena = t.arena;                   /* the reference goes to the test's thread */
  free(h);
  return NULL;
}

TEST(kernels_from_worker_threads) {
  enum { W = 4 };
  worker_t w[W];
  pthread_t t[W];
  uint64_t n0, b0, n1, b1;
  st__arena_stats(&n0, &b0);
  for (int i = 0; i < W; i++) {
    memset(&w[i], 0, sizeof w[i]);
    w[i].index = i;
    CHECK_EQ_INT(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
  }
  for (int i = 0; i < W; i++) pthread_join(t[i], NULL);
  int ok = 1;
  for (int i = 0; i < W; i++) {
    if (w[i].worst_ulp < 0 || w[i].worst_ulp > 2) {
      fprintf(stderr, "   worker %d: worst %lld ulp %s\n", i, (long long)w[i].worst_ulp, w[i].err);
      ok = 0;
    }
    st__arena_unref(w[i].arena);          /* released by another thread */
  }
  st__arena_stats(&n1, &b1);
  CHECK(ok);
  CHECK_EQ_INT(n1, n0);
  CHECK_EQ_INT(b1, b0);
}

#endif

int main(void) {
  char why[512];
  if (st__cuda_available(why, sizeof why) != ST_OK) stt_skip(why);
#ifdef ST_HAVE_CUDA
  cu = st__cuda_api(NULL, 0);
  st__tensor_ctx_init(&C);
  C.in_call = 1;
  if (st__arena_new_cuda(0, BUF_BYTES, &buf_a, err, sizeof err) != ST_OK ||
      st__arena_new_cuda(0, BUF_BYTES, &buf_b, err, sizeof err) != ST_OK) {
    fprintf(stderr, "cannot allocate scratch arenas: %s\n", err);
    return 1;
  }
  RUN(fill_matches_cpu);
  RUN(arange_matches_cpu);
  RUN(rand_is_bit_identical);
  RUN(randn_matches_cpu_within_ulps);
  RUN(arguments_are_checked);
  RUN(cast_matches_cpu);
  RUN(decoding_every_code_matches_dtype_c);
  RUN(encoding_matches_dtype_c);
  RUN(kernels_run_on_a_created_stream);
  RUN(kernels_from_worker_threads);
  st__arena_unref(buf_a);
  st__arena_unref(buf_b);
#endif
  return stt_summary();
}
