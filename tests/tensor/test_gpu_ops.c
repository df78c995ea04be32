/* The tensor core on cuda:0 against its CPU backend: each scenario runs
 * the same operations on both devices and the bytes must match (randn:
 * within the last-place differences of the device's log and cos, see
 * docs/cuda.md). Also copies between the CPU and the device (strided,
 * casting), overlapping copies, element access, and that nothing is left
 * queued or allocated. Skips (77) without a CUDA device. */
#include <math.h>

#include "check.h"
#include "mem/cuda.h"
#include "tensor/constructors.h"
#include "tensor/ops.h"

static st__tensor_ctx_t C;
static char err[512];

/* A scenario builds its result on `device` into *out. */
typedef int (*scenario_fn)(int device, st__tensor_t *out);

/* (i - 5) * 0.75 into a new {rows, cols} tensor of dtype d on `device`. */
static int values(int device, st__tensor_t *t, st_dtype_t d, int64_t rows, int64_t cols) {
  st__tensor_t a, v;
  int64_t shape[] = {rows, cols};
  int rc = st__tensor_arange(&C, &a, device, ST_DTYPE_FLOAT64, -3.75, -3.75 + 0.75 * rows * cols,
                             0.75, err, sizeof err);
  if (rc == ST_OK) rc = st__tensor_view(&v, &a, 2, shape, err, sizeof err);
  if (rc == ST_OK) {
    rc = st__tensor_to(&C, t, &v, device, d, "to", err, sizeof err);
    st__tensor_release(&v);
  }
  st__tensor_release(&a);
  return rc;
}

/* Host bytes of t (contiguous, t's dtype) into a new CPU tensor. */
static int host_copy(const st__tensor_t *t, st__tensor_t *h) {
  return st__tensor_to(&C, h, t, ST__DEV_CPU, t->geom.dtype, "to", err, sizeof err);
}

/* Runs s on the CPU and on cuda:0; ST_OK when the bytes agree (within
 * `tol`, relative, when tol > 0). */
static int same_on_both(scenario_fn s, double tol) {
  st__tensor_t cpu, gpu, back;
  int rc = s(ST__DEV_CPU, &cpu);
  if (rc == ST_OK) rc = s(0, &gpu);
  if (rc == ST_OK) rc = host_copy(&gpu, &back);
  if (rc == ST_OK) rc = st__tensor_sync_used(&C, err, sizeof err);
  if (rc != ST_OK) {
    fprintf(stderr, "   %s\n", err);
    return rc;
  }
  const st__geom_t *g = &cpu.geom;
  int64_t n = st__geom_numel(g);
  for (int64_t i = 0; i < n && rc == ST_OK; i++) {
    size_t es = st_dtype_size(g->dtype);
    const char *a = st__tensor_data(&cpu) + i * (int64_t)es, *b = st__tensor_data(&back) + i * (int64_t)es;
    double x = st_dtype_load(g->dtype, a, 0), y = st_dtype_load(g->dtype, b, 0);
    if (memcmp(a, b, es) == 0 || (isnan(x) && isnan(y))) continue;
    if (tol > 0 && fabs(x - y) <= tol * fmax(1, fabs(x))) continue;
    fprintf(stderr, "   %s element %lld: cpu %.17g, cuda %.17g\n", st_dtype_name(g->dtype),
            (long long)i, x, y);
    rc = ST_ERR_INTERNAL;
  }
  st__tensor_release(&cpu);
  st__tensor_release(&gpu);
  st__tensor_release(&back);
  return rc;
}

static st_dtype_t D = ST_DTYPE_FLOAT32;       /* the dtype scenarios build */
static st_dtype_t S = ST_DTYPE_FLOAT32;       /* the source dtype of casts */

static int s_arange(int dev, st__tensor_t *t) {
  return st__tensor_arange(&C, t, dev, D, -7.5, 1000, 0.37, err, sizeof err);
}
static int s_rand(int dev, st__tensor_t *t) {
  return st__tensor_rand(&C, t, dev, D, 2, (int64_t[]){33, 65}, 1234, err, sizeof err);
}
static int s_randn(int dev, st__tensor_t *t) {
  return st__tensor_randn(&C, t, dev, D, 2, (int64_t[]){33, 65}, 99, err, sizeof err);
}

/* full, then a strided fill and an affine on a slice. */
static int s_fill_affine(int dev, st__tensor_t *t) {
  st__tensor_t v;
  int rc = st__tensor_full(&C, t, dev, D, 2, (int64_t[]){6, 7}, 1.5, err, sizeof err);
  if (rc == ST_OK) rc = st__tensor_slice(&v, t, 1, 1, INT64_MAX, 3, err, sizeof err);
  if (rc == ST_OK) rc = st__tensor_fill(&C, &v, -2.25, "fill", err, sizeof err);
  if (rc == ST_OK) rc = st__tensor_affine(&C, t, 0.3, 0.7, "mul_", err, sizeof err);
  st__tensor_release(&v);
  return rc;
}

/* A transposed source of dtype S built on `from`, cast into every other
 * column (from `col`) of a zeroed {4, 6} tensor of D on `dev`. */
static int cast_into(int from, int dev, int col, st__tensor_t *t) {
  st__tensor_t src, srcT, dstv;
  int rc = values(from, &src, S, 3, 4);
  if (rc == ST_OK) rc = st__tensor_transpose(&srcT, &src, 0, 1, err, sizeof err);
  if (rc == ST_OK) rc = st__tensor_zeros(&C, t, dev, D, 2, (int64_t[]){4, 6}, err, sizeof err);
  if (rc == ST_OK) rc = st__tensor_slice(&dstv, t, 1, col, INT64_MAX, 2, err, sizeof err);
  if (rc == ST_OK) rc = st__tensor_copy(&C, &dstv, &srcT, "copy_", err, sizeof err);
  st__tensor_release(&src);
  st__tensor_release(&srcT);
  st__tensor_release(&dstv);
  return rc;
}

/* On one device. */
static int s_cast_strided(int dev, st__tensor_t *t) { return cast_into(dev, dev, 0, t); }

/* From the other side: CPU -> cuda:0 and cuda:0 -> CPU. */
static int s_across(int dev, st__tensor_t *t) {
  return cast_into(dev == ST__DEV_CPU ? 0 : ST__DEV_CPU, dev, 1, t);
}

/* Overlapping views of one arena, and an element written and read. */
static int s_overlap(int dev, st__tensor_t *t) {
  st__tensor_t lo, hi;
  double v = 0;
  int rc = values(dev, t, D, 1, 10);
  if (rc == ST_OK) rc = st__tensor_narrow(&lo, t, 1, 0, 8, err, sizeof err);
  if (rc == ST_OK) rc = st__tensor_narrow(&hi, t, 1, 2, 8, err, sizeof err);
  if (rc == ST_OK) rc = st__tensor_copy(&C, &hi, &lo, "copy_", err, sizeof err);
  if (rc == ST_OK) rc = st__tensor_get(&C, t, 9, &v, "get", err, sizeof err);
  if (rc == ST_OK) rc = st__tensor_set(&C, t, 0, v + 1, "set", err, sizeof err);
  st__tensor_release(&lo);
  st__tensor_release(&hi);
  return rc;
}

TEST(generators_match_cpu) {
  for (D = ST_DTYPE_INVALID + 1; D < ST_DTYPE_COUNT; D++) {
    CHECK_EQ_INT(same_on_both(s_arange, 0), ST_OK);
    if (!st_dtype_is_float(D)) continue;
    CHECK_EQ_INT(same_on_both(s_rand, 0), ST_OK);
    if (D == ST_DTYPE_FLOAT32 || D == ST_DTYPE_FLOAT64)
      CHECK_EQ_INT(same_on_both(s_randn, D == ST_DTYPE_FLOAT64 ? 1e-13 : 1e-6), ST_OK);
  }
}

TEST(fill_affine_overlap_match_cpu) {
  for (D = ST_DTYPE_INVALID + 1; D < ST_DTYPE_COUNT; D++) {
    CHECK_EQ_INT(same_on_both(s_fill_affine, 0), ST_OK);
    CHECK_EQ_INT(same_on_both(s_overlap, 0), ST_OK);
  }
}

TEST(casts_match_cpu) {
  for (S = ST_DTYPE_INVALID + 1; S < ST_DTYPE_COUNT; S++)
    for (D = ST_DTYPE_INVALID + 1; D < ST_DTYPE_COUNT; D++) {
      CHECK_EQ_INT(same_on_both(s_cast_strided, 0), ST_OK);
      CHECK_EQ_INT(same_on_both(s_across, 0), ST_OK);
    }
  CHECK_EQ_INT(C.cuda_used, 0);               /* same_on_both synchronized */
  uint64_t live, bytes;
  st__arena_stats(&live, &bytes);
  CHECK_EQ_INT(live, 0);                      /* temporaries included */
}

int main(void) {
  char why[256];
  if (st__cuda_available(why, sizeof why) != ST_OK) stt_skip(why);
  st__tensor_ctx_init(&C);
  C.in_call = 1;                              /* as inside a build body */
  RUN(generators_match_cpu);
  RUN(fill_affine_overlap_match_cpu);
  RUN(casts_match_cpu);
  return stt_summary();
}
