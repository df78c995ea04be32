/* The random generator (src/common/philox.h): Random123 known answers, the
 * stream layout and the distributions. */
#include <math.h>

#include "check.h"
#include "common/philox.h"

static int kat(const uint32_t ctr[4], const uint32_t key[2], const uint32_t want[4]) {
  uint32_t out[4];
  st__philox4x32_10(ctr, key, out);
  for (int i = 0; i < 4; i++) {
    if (out[i] != want[i]) {
      fprintf(stderr, "word %d: got %08x want %08x\n", i, out[i], want[i]);
      return 0;
    }
  }
  return 1;
}

TEST(known_answers) {
  /* Random123 kat_vectors, philox4x32 with 10 rounds. */
  {
    const uint32_t c[4] = {0, 0, 0, 0}, k[2] = {0, 0};
    const uint32_t w[4] = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
    CHECK(kat(c, k, w));
  }
  {
    const uint32_t c[4] = {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff};
    const uint32_t k[2] = {0xffffffff, 0xffffffff};
    const uint32_t w[4] = {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd};
    CHECK(kat(c, k, w));
  }
  {
    const uint32_t c[4] = {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344};
    const uint32_t k[2] = {0xa4093822, 0x299f31d0};
    const uint32_t w[4] = {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1};
    CHECK(kat(c, k, w));
  }
}

TEST(output_may_alias_counter) {
  uint32_t c[4] = {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344};
  const uint32_t k[2] = {0xa4093822, 0x299f31d0};
  st__philox4x32_10(c, k, c);
  CHECK_EQ_INT(c[0], 0xd16cfe09);
  CHECK_EQ_INT(c[3], 0x24126ea1);
}

TEST(stream_layout) {
  /* seed and index split into low/high words: key {lo, hi}, ctr {lo, hi, 0, 0}. */
  uint64_t seed = UINT64_C(0x0000000100000002), i = UINT64_C(0x0000000300000004);
  const uint32_t c[4] = {4, 3, 0, 0}, k[2] = {2, 1};
  uint32_t x[4], y[4];
  st__philox4x32_10(c, k, x);
  st__rng_block(seed, i, y);
  for (int j = 0; j < 4; j++) CHECK_EQ_INT(x[j], y[j]);
  CHECK(st__rng_uniform(seed, i, 0) == (double)(x[0] >> 8) * ldexp(1.0, -24));
  double wide = (double)(((uint64_t)x[0] << 21) | (x[1] >> 11)) * ldexp(1.0, -53);
  CHECK(st__rng_uniform(seed, i, 1) == wide);
}

TEST(first_values_are_pinned) {
  /* Seed 0, element 0 is the first known answer: x0 = 0x6627e8d5,
   * x1 = 0xe169c58d. These values must never change. */
  CHECK(st__rng_uniform(0, 0, 0) == (double)0x6627e8 / 16777216.0);
  double wide = (double)((UINT64_C(0x6627e8d5) << 21) | (0xe169c58du >> 11)) /
                9007199254740992.0;
  CHECK(st__rng_uniform(0, 0, 1) == wide);
  double u1 = (0x6627e8d5 + 1.0) / 4294967296.0, u2 = 0xe169c58d / 4294967296.0;
  double z = sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2);
  CHECK(fabs(st__rng_normal(0, 0) - z) < 1e-15);
  CHECK(fabs(st__rng_normal(0, 0) - 0.99113767909666) < 1e-12);
}

TEST(uniform_range_and_mean) {
  double sum = 0, sumw = 0;
  const int n = 100000;
  for (int i = 0; i < n; i++) {
    double u = st__rng_uniform(42, (uint64_t)i, 0);
    double w = st__rng_uniform(42, (uint64_t)i, 1);
    CHECK(u >= 0.0 && u < 1.0);
    CHECK(w >= 0.0 && w < 1.0);
    /* Narrow values are exact in float32. */
    CHECK((double)(float)u == u);
    CHECK(u * 16777216.0 == floor(u * 16777216.0));
    sum += u;
    sumw += w;
  }
  CHECK(fabs(sum / n - 0.5) < 0.01);
  CHECK(fabs(sumw / n - 0.5) < 0.01);
}

TEST(normal_moments) {
  const int n = 100000;
  double sum = 0, sq = 0;
  for (int i = 0; i < n; i++) {
    double z = st__rng_normal(7, (uint64_t)i);
    CHECK(isfinite(z));
    sum += z;
    sq += z * z;
  }
  double mean = sum / n, var = sq / n - mean * mean;
  fprintf(stderr, "normal: mean %.5f var %.5f\n", mean, var);
  CHECK(fabs(mean) < 0.02);
  CHECK(fabs(var - 1.0) < 0.03);
}

TEST(deterministic_and_seed_dependent) {
  CHECK(st__rng_uniform(1, 5, 0) == st__rng_uniform(1, 5, 0));
  CHECK(st__rng_normal(1, 5) == st__rng_normal(1, 5));
  int same = 0;
  for (uint64_t i = 0; i < 1000; i++)
    same += st__rng_uniform(1, i, 1) == st__rng_uniform(2, i, 1);
  CHECK(same == 0);
  /* Seeds differing only in the high word give other streams too. */
  CHECK(st__rng_uniform(UINT64_C(1) << 32, 0, 1) != st__rng_uniform(0, 0, 1));
  CHECK(st__rng_uniform(0, UINT64_C(1) << 32, 1) != st__rng_uniform(0, 0, 1));
}

int main(void) {
  RUN(known_answers);
  RUN(output_may_alias_counter);
  RUN(stream_layout);
  RUN(first_values_are_pinned);
  RUN(uniform_range_and_mean);
  RUN(normal_moments);
  RUN(deterministic_and_seed_dependent);
  return stt_summary();
}
