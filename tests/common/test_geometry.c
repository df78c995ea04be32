/* src/common/geometry.h: contiguity, element counts, extents and the
 * checked arithmetic of views, with their refusals. Pure arithmetic: no
 * arena, no server. */
#include "check.h"
#include "common/geometry.h"

static char err[256];

/* A geometry of `dtype` with the given sizes (row-major) at offset 0. */
static st__geom_t geom(st_dtype_t dtype, int ndim, const int64_t *shape) {
  st__geom_t g;
  if (st__geom_init(&g, dtype, ndim, shape, err, sizeof err) != ST_OK) {
    fprintf(stderr, "   geometry refused: %s\n", err);
    exit(1);
  }
  return g;
}

TEST(contiguity) {
  const int64_t s23[] = {2, 3}, s0[] = {0, 5}, s1[] = {1, 4};
  CHECK(st__geom_contiguous_of(0, NULL, NULL));                  /* 0-d */
  CHECK(st__geom_contiguous_of(2, s23, (int64_t[]){3, 1}));
  CHECK(!st__geom_contiguous_of(2, s23, (int64_t[]){1, 2}));     /* transposed */
  CHECK(!st__geom_contiguous_of(2, s23, (int64_t[]){4, 1}));     /* a gap */
  CHECK(st__geom_contiguous_of(2, s0, (int64_t[]){7, 9}));       /* no elements */
  CHECK(st__geom_contiguous_of(2, s1, (int64_t[]){99, 1}));      /* size 1: any stride */
  int64_t st[2];
  st__geom_row_major(2, s0, st);
  CHECK(st[0] == 5 && st[1] == 1);
  st__geom_t g = geom(ST_DTYPE_FLOAT16, 2, s23);
  CHECK(g.strides[0] == 3 && g.strides[1] == 1 && g.offset == 0);
  CHECK_EQ_INT(st__geom_numel(&g), 6);
  CHECK_EQ_INT(st__geom_nbytes(&g), 12);
  CHECK(st__geom_is_contiguous(&g));
}

TEST(numel_and_extent) {
  CHECK_EQ_INT(st__geom_numel_of(0, NULL), 1);
  CHECK_EQ_INT(st__geom_numel_of(2, (int64_t[]){4, 0}), 0);
  CHECK_EQ_INT(st__geom_numel_of(2, (int64_t[]){-1, 2}), -1);
  CHECK_EQ_INT(st__geom_numel_of(2, (int64_t[]){INT64_MAX, 2}), -1);
  CHECK_EQ_INT(st__geom_numel_of(ST_MAX_NDIM + 1, NULL), -1);
  uint64_t lo, hi;
  /* A transposed 2x3 float32 view at offset 8: elements 0..5 apart. */
  CHECK_EQ_INT(st__geom_extent_of(ST_DTYPE_FLOAT32, 8, 2, (int64_t[]){3, 2},
                                  (int64_t[]){1, 3}, &lo, &hi), ST_OK);
  CHECK(lo == 8 && hi == 8 + 6 * 4);
  /* Broadcast: stride 0 touches one element. */
  CHECK_EQ_INT(st__geom_extent_of(ST_DTYPE_INT64, 0, 1, (int64_t[]){100}, (int64_t[]){0}, &lo,
                                  &hi), ST_OK);
  CHECK(lo == 0 && hi == 8);
  CHECK_EQ_INT(st__geom_extent_of(ST_DTYPE_INT64, 40, 1, (int64_t[]){0}, (int64_t[]){1}, &lo,
                                  &hi), ST_OK);
  CHECK(lo == 40 && hi == 40);
  CHECK_EQ_INT(st__geom_extent_of(ST_DTYPE_INVALID, 0, 0, NULL, NULL, &lo, &hi),
               ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st__geom_extent_of(ST_DTYPE_UINT8, 0, 1, (int64_t[]){2}, (int64_t[]){-1}, &lo,
                                  &hi), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st__geom_extent_of(ST_DTYPE_UINT8, 0, 2, (int64_t[]){1ll << 40, 1ll << 40},
                                  (int64_t[]){1ll << 40, 1}, &lo, &hi), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st__geom_extent_of(ST_DTYPE_UINT8, (uint64_t)INT64_MAX, 1, (int64_t[]){2},
                                  (int64_t[]){1}, &lo, &hi), ST_ERR_INVALID_ARGUMENT);
}

TEST(init_refusals) {
  st__geom_t g;
  CHECK_EQ_INT(st__geom_init(&g, ST_DTYPE_FLOAT32, ST_MAX_NDIM + 1, NULL, err, sizeof err),
               ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err, "at most 16 dimensions, got 17");
  CHECK_EQ_INT(st__geom_init(&g, ST_DTYPE_FLOAT32, 2, (int64_t[]){2, -3}, err, sizeof err),
               ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(err, "size -3 of dim 1 is negative");
  CHECK_EQ_INT(st__geom_init(&g, ST_DTYPE_FLOAT64, 2, (int64_t[]){1ll << 31, 1ll << 31}, err,
                             sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(err, "tensor shape is too large");
}

TEST(narrow_and_slice) {
  st__geom_t g = geom(ST_DTYPE_INT32, 2, (int64_t[]){4, 5});
  st__geom_t v = g;
  CHECK_EQ_INT(st__geom_narrow(&v, -1, 1, 3, err, sizeof err), ST_OK);
  CHECK(v.shape[1] == 3 && v.offset == 4 && v.strides[0] == 5);
  CHECK(!st__geom_is_contiguous(&v));
  v = g;
  CHECK_EQ_INT(st__geom_narrow(&v, 0, -1, 1, err, sizeof err), ST_OK);   /* the last row */
  CHECK(v.shape[0] == 1 && v.offset == 3 * 5 * 4 && st__geom_is_contiguous(&v));
  v = g;
  CHECK_EQ_INT(st__geom_narrow(&v, 0, 4, 0, err, sizeof err), ST_OK);    /* empty at the end */
  CHECK_EQ_INT(st__geom_narrow(&v, 0, 5, 0, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(err, "start 5 is out of range for dim 0 of size 0");
  v = g;
  CHECK_EQ_INT(st__geom_narrow(&v, 1, 3, 3, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(err, "start 3 + length 3 exceeds size 5 of dim 1");
  CHECK(v.shape[1] == 5 && v.offset == 0);                               /* unchanged */
  CHECK_EQ_INT(st__geom_narrow(&v, 1, 0, -1, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(err, "length -1 is negative");
  CHECK_EQ_INT(st__geom_narrow(&v, 2, 0, 1, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(err, "dim 2 is out of range for a tensor of 2 dims");
  /* Slices clamp like Python's and step through the dimension. */
  v = g;
  CHECK_EQ_INT(st__geom_slice(&v, 1, 1, INT64_MAX, 2, err, sizeof err), ST_OK);
  CHECK(v.shape[1] == 2 && v.strides[1] == 2 && v.offset == 4);
  v = g;
  CHECK_EQ_INT(st__geom_slice(&v, 0, -3, -1, 1, err, sizeof err), ST_OK);
  CHECK(v.shape[0] == 2 && v.offset == 5 * 4);
  v = g;
  CHECK_EQ_INT(st__geom_slice(&v, 0, 3, 1, 1, err, sizeof err), ST_OK);
  CHECK_EQ_INT(v.shape[0], 0);
  CHECK_EQ_INT(st__geom_slice(&v, 0, 0, 1, 0, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(err, "step must be positive, got 0");
  st__geom_t scalar = geom(ST_DTYPE_INT32, 0, NULL);
  CHECK_EQ_INT(st__geom_slice(&scalar, 0, 0, 1, 1, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
}

TEST(permute_and_transpose) {
  st__geom_t g = geom(ST_DTYPE_UINT8, 3, (int64_t[]){2, 3, 4});
  st__geom_t v = g;
  CHECK_EQ_INT(st__geom_permute(&v, 3, (int64_t[]){2, 0, -2}, err, sizeof err), ST_OK);
  CHECK(v.shape[0] == 4 && v.shape[1] == 2 && v.shape[2] == 3);
  CHECK(v.strides[0] == 1 && v.strides[1] == 12 && v.strides[2] == 4);
  CHECK_EQ_INT(st__geom_permute(&v, 3, (int64_t[]){1, 2, 0}, err, sizeof err), ST_OK);
  CHECK(memcmp(v.strides, g.strides, 3 * sizeof(int64_t)) == 0);   /* the inverse */
  CHECK_EQ_INT(st__geom_permute(&v, 3, (int64_t[]){0, 0, 1}, err, sizeof err),
               ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(err, "dim 0 is repeated");
  CHECK_EQ_INT(st__geom_permute(&v, 2, (int64_t[]){0, 1}, err, sizeof err),
               ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(err, "expected 3 dims, got 2");
  CHECK_EQ_INT(st__geom_permute(&v, 3, (int64_t[]){0, 1, 3}, err, sizeof err),
               ST_ERR_INVALID_ARGUMENT);
  v = g;
  CHECK_EQ_INT(st__geom_transpose(&v, 0, -1, err, sizeof err), ST_OK);
  CHECK(v.shape[0] == 4 && v.shape[2] == 2 && v.strides[0] == 1 && v.strides[2] == 12);
  CHECK_EQ_INT(st__geom_transpose(&v, 0, 3, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(err, "dim 3 is out of range for a tensor of 3 dims");
}

TEST(view_and_infer) {
  int64_t s[] = {3, -1};
  CHECK_EQ_INT(st__geom_infer_shape(12, 2, s, err, sizeof err), ST_OK);
  CHECK_EQ_INT(s[1], 4);
  int64_t twice[] = {-1, -1};
  CHECK_EQ_INT(st__geom_infer_shape(12, 2, twice, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(err, "only one size may be -1");
  int64_t bad[] = {5, -1};
  CHECK_EQ_INT(st__geom_infer_shape(12, 2, bad, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(err, "cannot infer size -1 for 12 elements");
  int64_t wrong[] = {5, 2};
  CHECK_EQ_INT(st__geom_infer_shape(12, 2, wrong, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(err, "shape of 10 elements does not fit a tensor of 12 elements");
  st__geom_t g = geom(ST_DTYPE_FLOAT32, 2, (int64_t[]){3, 4});
  CHECK_EQ_INT(st__geom_view(&g, 3, (int64_t[]){2, -1, 2}, err, sizeof err), ST_OK);
  CHECK(g.ndim == 3 && g.shape[1] == 3 && g.strides[0] == 6);
  CHECK_EQ_INT(st__geom_transpose(&g, 0, 1, err, sizeof err), ST_OK);
  CHECK_EQ_INT(st__geom_view(&g, 1, (int64_t[]){12}, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(err, "the tensor is not contiguous (use reshape, which copies)");
}

int main(void) {
  RUN(contiguity);
  RUN(numel_and_extent);
  RUN(init_refusals);
  RUN(narrow_and_slice);
  RUN(permute_and_transpose);
  RUN(view_and_infer);
  return stt_summary();
}
