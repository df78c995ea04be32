/* src/client: the batched copy kernel's argument (kernels/copy_ranges.cu),
 * shared by the kernel and its launcher (copies.c).
 *
 * One launch copies up to ST_COPY_BATCH_MAX device ranges on one device:
 * range i is cut into tiles of 1 << ST_COPY_TILE_SHIFT bytes, tile t of
 * the launch (its block index) belongs to the range i with first[i] <= t
 * < first[i + 1]. Every address and size is a multiple of 16 (the kernel
 * moves 16-byte vectors). The whole batch is passed by value as the
 * kernel's one parameter: no device memory and no upload per launch. It
 * stays under the 4 KiB every driver takes for kernel parameters.
 */
#ifndef ST_CLIENT_COPY_BATCH_H
#define ST_CLIENT_COPY_BATCH_H

#define ST_COPY_BATCH_MAX 128
#define ST_COPY_TILE_SHIFT 16
#define ST_COPY_THREADS 512
/* The kernel's name in its module (extern "C"). */
#define ST_COPY_KERNEL "st_copy_ranges_kernel"

typedef struct st__copy_batch {
  unsigned int n;                               /* ranges, 1 .. MAX */
  unsigned int first[ST_COPY_BATCH_MAX + 1];    /* first tile of each; [n]: tiles */
  unsigned long long dst[ST_COPY_BATCH_MAX];
  unsigned long long src[ST_COPY_BATCH_MAX];
  unsigned long long bytes[ST_COPY_BATCH_MAX];
} st__copy_batch_t;

#endif
