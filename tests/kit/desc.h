/* Tensor descriptors (proto/proto.h) built by hand, for the tests of
 * src/proto and of what reads descriptors. Header-only. */
#ifndef STT_DESC_H
#define STT_DESC_H

#include <string.h>

#include "proto/proto.h"

/* A contiguous 1-d tensor of n elements of `dt` at offset 0 of arena 0. */
static inline st__tensor_desc_t stt_desc_1d(st_dtype_t dt, int64_t n) {
  st__tensor_desc_t d;
  memset(&d, 0, sizeof d);
  d.dtype = dt;
  d.ndim = 1;
  d.shape[0] = n;
  d.strides[0] = 1;
  return d;
}

#endif
