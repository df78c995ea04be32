/* src/client/kernels: the batched copy of libstclient (copy_batch.h).
 *
 * Built by nvcc into a fat binary that libstclient embeds and loads with
 * the driver (copies.c): no CUDA runtime state of its own in the caller's
 * process. One block per tile of 64 KiB; each thread moves four 16-byte
 * vectors per step, all loads before the stores. Its GPU time against
 * one cuMemcpyAsync of the same bytes and one copy per range:
 * docs/benchmarks.md, "The batched copy kernel".
 */
#include "client/copy_batch.h"

#define UNROLL 4

extern "C" __global__ void __launch_bounds__(ST_COPY_THREADS)
    st_copy_ranges_kernel(const __grid_constant__ st__copy_batch_t b) {
  /* The range of this tile: the last i with first[i] <= tile. */
  unsigned int tile = blockIdx.x;
  int lo = 0, hi = (int)b.n - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) >> 1;
    if (b.first[mid] <= tile)
      lo = mid;
    else
      hi = mid - 1;
  }
  unsigned long long off = (unsigned long long)(tile - b.first[lo]) << ST_COPY_TILE_SHIFT;
  unsigned long long len = b.bytes[lo] - off;
  if (len > (1ull << ST_COPY_TILE_SHIFT)) len = 1ull << ST_COPY_TILE_SHIFT;
  const uint4 *s = (const uint4 *)(b.src[lo] + off);
  uint4 *d = (uint4 *)(b.dst[lo] + off);
  unsigned int nv = (unsigned int)(len >> 4), i = threadIdx.x;
  for (; i + (UNROLL - 1) * blockDim.x < nv; i += UNROLL * blockDim.x) {
    uint4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) v[u] = s[i + u * blockDim.x];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) d[i + u * blockDim.x] = v[u];
  }
  for (; i < nv; i += blockDim.x) d[i] = s[i];
}
