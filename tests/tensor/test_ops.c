/* The tensor core on the CPU, without Lua: constructors' bytes (arange,
 * rand bit-exact against Philox, randn), copies with every cast pair on
 * strided and overlapping views, fill, affine, views of arenas, and the
 * dispatch and device refusals with the codes a call fails with. */
#include <math.h>

#include "check.h"
#include "common/philox.h"
#include "tensor/backend.h"
#include "tensor/constructors.h"
#include "tensor/ops.h"

static st__tensor_ctx_t C;
static char err[512];

/* Element i (row-major, following the strides) of a CPU tensor. */
static double at(const st__tensor_t *t, int64_t i) {
  int64_t off = 0;
  for (int k = t->geom.ndim - 1; k >= 0; k--) {
    off += (i % t->geom.shape[k]) * t->geom.strides[k];
    i /= t->geom.shape[k];
  }
  return st_dtype_load(t->geom.dtype, st__tensor_data(t), (size_t)off);
}

/* A CPU tensor of dtype d and shape {rows, cols} holding (i - 5) * 0.75
 * (exact in every dtype's range that matters; casts decide the rest). */
static int values(st__tensor_t *t, st_dtype_t d, int64_t rows, int64_t cols) {
  int64_t shape[] = {rows, cols};
  int rc = st__tensor_new(&C, t, ST__DEV_CPU, d, 2, shape, ST__INIT_ZEROS, err, sizeof err);
  for (int64_t i = 0; rc == ST_OK && i < rows * cols; i++)
    st_dtype_store(d, st__tensor_data(t), (size_t)i, (double)(i - 5) * 0.75);
  return rc;
}

TEST(constructors_bytes) {
  st__tensor_t t;
  CHECK_EQ_INT(st__tensor_arange(&C, &t, ST__DEV_CPU, ST_DTYPE_INVALID, 2, 11, 3, err, sizeof err),
               ST_OK);
  CHECK(t.geom.dtype == ST_DTYPE_INT64 && t.geom.ndim == 1 && t.geom.shape[0] == 3);
  CHECK(at(&t, 0) == 2 && at(&t, 1) == 5 && at(&t, 2) == 8);
  st__tensor_release(&t);
  CHECK_EQ_INT(st__tensor_arange(&C, &t, ST__DEV_CPU, ST_DTYPE_INVALID, 1, 0, -0.25, err,
                                 sizeof err), ST_OK);
  CHECK(t.geom.dtype == ST_DTYPE_FLOAT32 && t.geom.shape[0] == 4 && at(&t, 3) == 0.25);
  st__tensor_release(&t);
  CHECK_EQ_INT(st__tensor_arange(&C, &t, ST__DEV_CPU, ST_DTYPE_FLOAT32, 0, 1, 0, err, sizeof err),
               ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(err, "arange: start, stop and step must be finite and step nonzero");
  CHECK(t.arena == NULL);
  const int64_t shape[] = {7, 33};
  for (int wide = 0; wide < 2; wide++) {
    st_dtype_t d = wide ? ST_DTYPE_FLOAT64 : ST_DTYPE_FLOAT32;
    unsigned char want[8];
    CHECK_EQ_INT(st__tensor_rand(&C, &t, ST__DEV_CPU, d, 2, shape, 42, err, sizeof err), ST_OK);
    for (int64_t i = 0; i < 7 * 33; i++) {
      st_dtype_store(d, want, 0, st__rng_uniform(42, (uint64_t)i, wide));
      CHECK(memcmp(st__tensor_data(&t) + i * st_dtype_size(d), want, st_dtype_size(d)) == 0);
    }
    st__tensor_release(&t);
    CHECK_EQ_INT(st__tensor_randn(&C, &t, ST__DEV_CPU, d, 2, shape, 7, err, sizeof err), ST_OK);
    for (int64_t i = 0; i < 7 * 33; i++) {
      st_dtype_store(d, want, 0, st__rng_normal(7, (uint64_t)i));
      CHECK(memcmp(st__tensor_data(&t) + i * st_dtype_size(d), want, st_dtype_size(d)) == 0);
    }
    st__tensor_release(&t);
  }
  CHECK_EQ_INT(st__tensor_rand(&C, &t, ST__DEV_CPU, ST_DTYPE_INT32, 2, shape, 0, err, sizeof err),
               ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(err, "rand: dtype must be a floating type, got int32");
  CHECK_EQ_INT(st__tensor_full(&C, &t, ST__DEV_CPU, ST_DTYPE_BFLOAT16, 2, shape, -2.5, err,
                               sizeof err), ST_OK);
  for (int64_t i = 0; i < 7 * 33; i++) CHECK(at(&t, i) == -2.5);
  st__tensor_release(&t);
  CHECK_EQ_INT(st__tensor_zeros(&C, &t, ST__DEV_CPU, ST_DTYPE_INT8, 1, (int64_t[]){0}, err,
                                sizeof err), ST_OK);
  CHECK(t.arena && st__geom_numel(&t.geom) == 0);
  st__tensor_release(&t);
}

/* Every pair of dtypes: a transposed source into a contiguous and into a
 * strided destination stores st_dtype_store(dst, st_dtype_load(src)). */
TEST(copy_every_cast) {
  for (int sd = ST_DTYPE_INVALID + 1; sd < ST_DTYPE_COUNT; sd++) {
    for (int dd = ST_DTYPE_INVALID + 1; dd < ST_DTYPE_COUNT; dd++) {
      st__tensor_t src, srcT, dst, big, dstv;
      CHECK_EQ_INT(values(&src, (st_dtype_t)sd, 3, 4), ST_OK);
      CHECK_EQ_INT(st__tensor_transpose(&srcT, &src, 0, 1, err, sizeof err), ST_OK);
      CHECK_EQ_INT(st__tensor_to(&C, &dst, &srcT, ST__DEV_CPU, (st_dtype_t)dd, "copy", err,
                                 sizeof err), ST_OK);
      CHECK_EQ_INT(values(&big, (st_dtype_t)dd, 4, 6), ST_OK);   /* every other column */
      CHECK_EQ_INT(st__tensor_slice(&dstv, &big, 1, 0, INT64_MAX, 2, err, sizeof err), ST_OK);
      CHECK_EQ_INT(st__tensor_copy(&C, &dstv, &srcT, "copy", err, sizeof err), ST_OK);
      for (int64_t i = 0; i < 12; i++) {
        unsigned char want[8];
        st_dtype_store((st_dtype_t)dd, want, 0, at(&srcT, i));
        double w = st_dtype_load((st_dtype_t)dd, want, 0);
        CHECK(at(&dst, i) == w || (isnan(w) && isnan(at(&dst, i))));
        CHECK(at(&dstv, i) == w || (isnan(w) && isnan(at(&dstv, i))));
      }
      unsigned char keep[8];   /* untouched: -3 as dd holds it (unsigned types wrap) */
      st_dtype_store((st_dtype_t)dd, keep, 0, (1 - 5) * 0.75);
      CHECK(at(&big, 1) == st_dtype_load((st_dtype_t)dd, keep, 0) ||
            st_dtype_size((st_dtype_t)dd) == 1);
      st__tensor_t *all[] = {&src, &srcT, &dst, &big, &dstv};
      for (int k = 0; k < 5; k++) st__tensor_release(all[k]);
    }
  }
  st__tensor_t a, b;
  CHECK_EQ_INT(values(&a, ST_DTYPE_FLOAT32, 2, 3), ST_OK);
  CHECK_EQ_INT(values(&b, ST_DTYPE_FLOAT32, 3, 2), ST_OK);
  CHECK_EQ_INT(st__tensor_copy(&C, &a, &b, "copy_", err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(err, "copy_: source and destination shapes differ");
  st__tensor_release(&a);
  st__tensor_release(&b);
}

/* Views of one arena that overlap copy as if through a temporary. */
TEST(copy_overlapping) {
  for (int dir = 0; dir < 2; dir++) {
    st__tensor_t t, lo, hi;
    CHECK_EQ_INT(st__tensor_arange(&C, &t, ST__DEV_CPU, ST_DTYPE_INT64, 0, 10, 1, err,
                                   sizeof err), ST_OK);
    CHECK_EQ_INT(st__tensor_narrow(&lo, &t, 0, 0, 8, err, sizeof err), ST_OK);
    CHECK_EQ_INT(st__tensor_narrow(&hi, &t, 0, 2, 8, err, sizeof err), ST_OK);
    CHECK_EQ_INT(st__tensor_copy(&C, dir ? &lo : &hi, dir ? &hi : &lo, "copy_", err, sizeof err),
                 ST_OK);
    for (int64_t i = 0; i < 10; i++) {
      int64_t want = dir ? (i < 8 ? i + 2 : i) : (i < 2 ? i : i - 2);
      CHECK_EQ_INT(at(&t, i), want);
    }
    st__tensor_release(&t);
    st__tensor_release(&lo);
    st__tensor_release(&hi);
  }
  uint64_t live, bytes;
  st__arena_stats(&live, &bytes);
  CHECK_EQ_INT(live, 0);                      /* temporaries are gone too */
}

TEST(fill_and_affine) {
  st__tensor_t t, col;
  CHECK_EQ_INT(values(&t, ST_DTYPE_FLOAT16, 4, 3), ST_OK);
  CHECK_EQ_INT(st__tensor_narrow(&col, &t, 1, 1, 1, err, sizeof err), ST_OK);
  CHECK_EQ_INT(st__tensor_fill(&C, &col, 9.5, "fill", err, sizeof err), ST_OK);
  CHECK_EQ_INT(st__tensor_affine(&C, &col, 2, -1, "mul_", err, sizeof err), ST_OK);
  for (int64_t i = 0; i < 12; i++)
    CHECK(at(&t, i) == (i % 3 == 1 ? 18.0 : (double)(i - 5) * 0.75));
  CHECK_EQ_INT(st__tensor_affine(&C, &t, 0.1, 0.2, "add_", err, sizeof err), ST_OK);
  unsigned char want[2];
  volatile double p = 18.0 * 0.1;
  st_dtype_store(ST_DTYPE_FLOAT16, want, 0, p + 0.2);
  CHECK(memcmp(st__tensor_data(&t) + 2, want, 2) == 0);
  double v;
  CHECK_EQ_INT(st__tensor_set(&C, &t, 5, 4.0, "set", err, sizeof err), ST_OK);
  CHECK_EQ_INT(st__tensor_get(&C, &t, 5, &v, "get", err, sizeof err), ST_OK);
  CHECK(v == 4.0);
  st__tensor_release(&col);
  st__tensor_release(&t);
}

TEST(views_and_descriptors) {
  st__tensor_t t, v, r, back;
  CHECK_EQ_INT(st__tensor_arange(&C, &t, ST__DEV_CPU, ST_DTYPE_INT32, 0, 24, 1, err, sizeof err),
               ST_OK);
  CHECK_EQ_INT(st__tensor_view(&v, &t, 3, (int64_t[]){2, 3, 4}, err, sizeof err), ST_OK);
  st__tensor_release(&t);                     /* the view keeps the arena */
  CHECK_EQ_INT(st__tensor_permute(&t, &v, 3, (int64_t[]){2, 0, 1}, err, sizeof err), ST_OK);
  CHECK(at(&t, 1) == 4 && at(&t, 6) == 1);
  CHECK_EQ_INT(st__tensor_reshape(&C, &r, &t, 2, (int64_t[]){4, -1}, "reshape", err, sizeof err),
               ST_OK);
  CHECK(r.arena != t.arena && st__geom_is_contiguous(&r.geom) && r.geom.shape[1] == 6);
  for (int64_t i = 0; i < 24; i++) CHECK(at(&r, i) == at(&t, i));
  st__tensor_desc_t d;
  st__tensor_describe(&t, 3, &d);
  CHECK(d.arena == 3 && d.ndim == 3 && d.strides[0] == 1);
  CHECK_EQ_INT(st__tensor_from_desc(&back, t.arena, &d, err, sizeof err), ST_OK);
  CHECK(back.arena == t.arena && at(&back, 6) == 1);
  d.shape[0] = 5;                             /* past the arena's 96 bytes */
  CHECK_EQ_INT(st__tensor_from_desc(&back, t.arena, &d, err, sizeof err),
               ST_ERR_INVALID_ARGUMENT);
  st__tensor_t *all[] = {&t, &v, &r, &back};
  for (int k = 0; k < 4; k++) st__tensor_release(all[k]);
}

/* The backends are complete tables; a device without one, or one this
 * process cannot use, is refused with a clear error and the call's code. */
TEST(dispatch_and_devices) {
  const st__tensor_backend_t *be = st__tensor_backend(ST__DEV_CPU);
  CHECK(be && be->fill && be->affine && be->copy && be->generate && be->copy_bytes && be->sync &&
        be->quiesce);
  CHECK_STR_EQ(be->name, "cpu");
  CHECK(st__tensor_backend(-5) == NULL && st__tensor_backend(ST__DEV_MAX) == NULL);
  CHECK_EQ_INT(st__tensor_backend_for(&C, -5, "fill", &be, err, sizeof err),
               ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(err, "fill: no tensor backend for device -5");
  st__tensor_t t;
  CHECK_EQ_INT(st__tensor_new(&C, &t, 0, ST_DTYPE_FLOAT32, 0, NULL, ST__INIT_ZEROS, err, sizeof err),
               ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(err, "tensor: CUDA tensors can only be built inside a build body (cuda:0)");
  CHECK_EQ_INT(C.err_code, 0);                /* a misuse, not the call's resources */
  C.in_call = 1;
  CHECK_EQ_INT(st__tensor_new(&C, &t, 64, ST_DTYPE_FLOAT32, 0, NULL, ST__INIT_ZEROS, err, sizeof err),
               ST_ERR_CAPABILITY);
  CHECK_STR_EQ(err, "no CUDA device: cuda:64 is unavailable: no such device in this process");
  CHECK_EQ_INT(C.err_code, ST_ERR_CAPABILITY);
  CHECK_STR_EQ(C.err_msg, err);
  st__tensor_ctx_clear_error(&C);
  int dev = 7;
  C.cuda_device = -1;
  CHECK_EQ_INT(st__tensor_device_parse(&C, "cuda", "zeros", &dev, err, sizeof err),
               ST_ERR_CAPABILITY);
  CHECK_CONTAINS(err, "zeros: no CUDA device: \"cuda\" names the CUDA device");
  CHECK_EQ_INT(st__tensor_device_parse(&C, "gpu", "zeros", &dev, err, sizeof err),
               ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(err, "zeros: unknown device 'gpu' (expected \"cpu\", \"cuda\" or \"cuda:N\")");
  CHECK_EQ_INT(st__tensor_device_parse(&C, "cpu", "zeros", &dev, err, sizeof err), ST_OK);
  CHECK_EQ_INT(dev, ST__DEV_CPU);
  CHECK(st__tensor_is_device_name("cuda:12") && !st__tensor_is_device_name("cuda:12345"));
  char name[16];
  CHECK_STR_EQ(st__tensor_device_name(3, name, sizeof name), "cuda:3");
  st__tensor_ctx_init(&C);
}

int main(void) {
  st__tensor_ctx_init(&C);
  RUN(constructors_bytes);
  RUN(copy_every_cast);
  RUN(copy_overlapping);
  RUN(fill_and_affine);
  RUN(views_and_descriptors);
  RUN(dispatch_and_devices);
  return stt_summary();
}
