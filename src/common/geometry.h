/* src/common/geometry.h: the geometry of a tensor inside its allocation,
 * with no allocation and no arena: element counts, contiguity, the byte
 * range a view touches, and the checked arithmetic of views (narrow,
 * slice, permute, view). The one implementation every other place uses:
 * the tensor core (src/tensor), the wire descriptors (src/proto,
 * st__tensor_extent), the client library (src/client) and, through it,
 * stcli.
 *
 * A geometry is a dtype, a byte offset from the allocation's start to
 * element 0, ndim sizes and ndim strides in elements. Strides are never
 * negative (the wire has no negative strides); a stride may be 0
 * (broadcast). Dimensions and indices are 0-based; negative ones count
 * from the end, as in PyTorch.
 *
 * This header depends on include/st only, so that src/proto and
 * libstclient (which link nothing above src/common) can use it; its code
 * is part of st_common.
 *
 * Errors: functions that can fail return ST_OK or ST_ERR_INVALID_ARGUMENT
 * with a message in the caller's buffer (err may be NULL), never raise,
 * and leave the geometry unchanged on failure. Messages name no operation:
 * a caller that has one prefixes it ("narrow: ..."). Threads: any; nothing
 * here keeps state.
 */
#ifndef ST_COMMON_GEOMETRY_H
#define ST_COMMON_GEOMETRY_H

#include <stddef.h>
#include <stdint.h>

#include "st/dtype.h"
#include "st/errors.h"
#include "st/wire.h"

typedef struct st__geom {
  uint64_t offset;                 /* bytes from the allocation start to element 0 */
  st_dtype_t dtype;
  int ndim;                        /* 0 .. ST_MAX_NDIM */
  int64_t shape[ST_MAX_NDIM];
  int64_t strides[ST_MAX_NDIM];    /* in elements, >= 0 */
} st__geom_t;

/* ---------------------------------------------------------- on raw arrays */

/* Product of the ndim sizes (1 for ndim 0); -1 when ndim is out of
 * [0, ST_MAX_NDIM], a size is negative or the product overflows int64 (a
 * zero size gives 0 whatever the others are). */
int64_t st__geom_numel_of(int ndim, const int64_t *shape);

/* 1 when the elements lie in row-major order without gaps (0-element and
 * 0-d tensors are contiguous; a dimension of size 1 may have any stride),
 * else 0. */
int st__geom_contiguous_of(int ndim, const int64_t *shape, const int64_t *strides);

/* Writes the row-major strides of `shape` into strides (a size 0 counts
 * as 1, so that strides stay meaningful for empty tensors). */
void st__geom_row_major(int ndim, const int64_t *shape, int64_t *strides);

/* The byte range [*lo, *hi) that the elements of a view touch: lo is the
 * offset, hi the end of the last element (lo == hi when the view has no
 * element). ST_ERR_INVALID_ARGUMENT for a bad dtype or ndim, a negative
 * size or stride, or arithmetic that overflows (hi must stay within
 * INT64_MAX). */
int st__geom_extent_of(st_dtype_t dtype, uint64_t offset, int ndim, const int64_t *shape,
                       const int64_t *strides, uint64_t *lo, uint64_t *hi);

/* ---------------------------------------------------------- on a geometry */

/* Element count and byte size (numel * element size) of a valid geometry. */
int64_t st__geom_numel(const st__geom_t *g);
uint64_t st__geom_nbytes(const st__geom_t *g);

/* st__geom_contiguous_of and st__geom_row_major on g. */
int st__geom_is_contiguous(const st__geom_t *g);
void st__geom_set_contiguous(st__geom_t *g);

/* A contiguous geometry of `dtype` and `shape` at offset 0. Fails for more
 * than ST_MAX_NDIM dimensions, a negative size, or more than 2^62 bytes. */
int st__geom_init(st__geom_t *g, st_dtype_t dtype, int ndim, const int64_t *shape, char *err,
                  size_t errlen);

/* Dimension `dim` of g (negative: from the end) as an index in [0, ndim)
 * into *out. Fails when out of range, and for a 0-d geometry. */
int st__geom_dim(const st__geom_t *g, int64_t dim, int *out, char *err, size_t errlen);

/* Elements start .. start+length-1 of dimension `dim` (start may be
 * negative: from the end; start == size with length 0 is allowed). */
int st__geom_narrow(st__geom_t *g, int64_t dim, int64_t start, int64_t length, char *err,
                    size_t errlen);

/* Every step-th element of [start, stop) of dimension `dim`, as Python
 * slices: negative bounds count from the end, and bounds are clamped to
 * [0, size] (pass INT64_MAX as stop for "to the end"). step must be > 0. */
int st__geom_slice(st__geom_t *g, int64_t dim, int64_t start, int64_t stop, int64_t step,
                   char *err, size_t errlen);

/* Reorders the dimensions: new dimension i is old dimension dims[i]
 * (negative: from the end). n must be g->ndim and dims a permutation. */
int st__geom_permute(st__geom_t *g, int n, const int64_t *dims, char *err, size_t errlen);

/* Swaps dimensions d0 and d1 (negative: from the end). */
int st__geom_transpose(st__geom_t *g, int64_t d0, int64_t d1, char *err, size_t errlen);

/* Checks a requested shape of n sizes for `numel` elements, inferring the
 * one size that may be -1; the sizes are updated in place. Fails for more
 * than one -1, another negative size, a shape that cannot hold exactly
 * numel elements. */
int st__geom_infer_shape(int64_t numel, int n, int64_t *shape, char *err, size_t errlen);

/* The same elements seen with another shape (sizes as st__geom_infer_shape
 * takes them), row-major. g must be contiguous. */
int st__geom_view(st__geom_t *g, int n, const int64_t *shape, char *err, size_t errlen);

#endif
