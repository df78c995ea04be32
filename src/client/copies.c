/* src/client: device copies of libstclient (st_copy_ranges, st_get_into,
 * st_result_copy_into, live updates): st__client_cuda_copies.
 *
 * A call's ranges are first merged where they follow each other in both
 * destination and source, inside one allocation per side (the driver
 * refuses a cuMemcpy that runs into the next allocation). What is left
 * goes one of two ways:
 *
 *   - two or more ranges whose both sides are memory of the call's device
 *     (asked of the driver per range, unless the caller vouches with
 *     ST_COPY_DEVICE), with addresses and sizes that are multiples of 16:
 *     the batched copy kernel (kernels/copy_ranges.cu), one launch per
 *     ST_COPY_BATCH_MAX ranges. Each cuMemcpyAsync costs the GPU a fixed
 *     time of its own, which one launch for all the ranges does not pay
 *     (docs/benchmarks.md, "The batched copy kernel");
 *   - anything else (one range, a host side, another device's memory, an
 *     odd address): cuMemcpyAsync, which infers the direction.
 *
 * The kernel is an embedded fat binary (st__copy_fatbin, built by
 * src/CMakeLists.txt) loaded with the driver once per device into its
 * primary context, on the first call that needs it, and kept for the life
 * of the process. A device where it does not load or launch (a driver
 * older than the code) copies with cuMemcpyAsync from then on.
 *
 * Ranges of one call run concurrently: destinations must not overlap.
 *
 * Threads: any. The kernel table has its own lock; the counters are
 * atomic.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "client/client_internal.h"
#include "common/fail.h"

static _Atomic uint64_t by_kernel, by_memcpy;

/* See client.h. Any thread. */
ST_API void st_copy_stats(uint64_t *kernel_ranges, uint64_t *memcpy_ranges) {
  if (kernel_ranges) *kernel_ranges = atomic_load(&by_kernel);
  if (memcpy_ranges) *memcpy_ranges = atomic_load(&by_memcpy);
}

#ifdef ST_HAVE_CUDA
#include <pthread.h>

#include "client/copy_batch.h"

extern const unsigned char st__copy_fatbin[];

/* Devices whose kernel is kept; above, copies use cuMemcpyAsync. */
#define KERNEL_DEVICES 64
/* A range this long or longer goes by cuMemcpyAsync: a batch's tiles
 * then always fit the grid (ST_COPY_BATCH_MAX << (38 - 16) < 2^31). */
#define KERNEL_RANGE_LIMIT (1ull << 38)

static pthread_mutex_t kernel_lock = PTHREAD_MUTEX_INITIALIZER;
static CUfunction kernel_of[KERNEL_DEVICES];
static signed char kernel_state[KERNEL_DEVICES]; /* 0 untried, 1 loaded, -1 none */

/* The copy kernel of device `ordinal`, whose primary context is current:
 * loaded on first use; NULL where it cannot be. */
static CUfunction copy_kernel(const st__cuda_api_t *a, int ordinal) {
  if (ordinal < 0 || ordinal >= KERNEL_DEVICES) return NULL;
  pthread_mutex_lock(&kernel_lock);
  if (!kernel_state[ordinal]) {
    CUmodule m = NULL;
    CUfunction f = NULL;
    kernel_state[ordinal] = -1;
    if (a->cuModuleLoadData(&m, st__copy_fatbin) == CUDA_SUCCESS &&
        a->cuModuleGetFunction(&f, m, ST_COPY_KERNEL) == CUDA_SUCCESS) {
      kernel_of[ordinal] = f;
      kernel_state[ordinal] = 1;
    }
  }
  CUfunction f = kernel_state[ordinal] > 0 ? kernel_of[ordinal] : NULL;
  pthread_mutex_unlock(&kernel_lock);
  return f;
}

/* After a failed launch: device `ordinal` copies with cuMemcpyAsync. */
static void kernel_drop(int ordinal) {
  pthread_mutex_lock(&kernel_lock);
  kernel_state[ordinal] = -1;
  pthread_mutex_unlock(&kernel_lock);
}

/* 1 when address p is memory of device `ordinal` (a kernel there may
 * read and write it). */
static int on_device(const st__cuda_api_t *a, uint64_t p, int ordinal) {
  CUpointer_attribute what[2] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  unsigned int type = 0;
  int dev = -1;
  void *data[2] = {&type, &dev};
  return a->cuPointerGetAttributes(2, what, data, (CUdeviceptr)p) == CUDA_SUCCESS &&
         type == CU_MEMORYTYPE_DEVICE && dev == ordinal;
}

/* One call's work: its first range (held until a second shows that the
 * kernel may pay), the batch, and where it goes. */
typedef struct {
  const st__cuda_api_t *a;
  CUfunction f;
  int ordinal;
  void *stream;
  int vouched;                   /* ST_COPY_DEVICE: no per-range check */
  int held;                      /* first_* holds the call's first range */
  uint64_t first_dst, first_src, first_bytes;
  st__copy_batch_t b;
  char *why;
  size_t whylen;
} copier_t;

static int one_copy(copier_t *c, uint64_t dst, uint64_t src, uint64_t bytes) {
  atomic_fetch_add(&by_memcpy, 1);
  return st__cuda_copy_async(dst, src, bytes, c->stream, c->why, c->whylen);
}

/* Copies the batch in one launch (by cuMemcpyAsync each if the launch
 * fails: the device copies that way from then on). */
static int launch(copier_t *c) {
  st__copy_batch_t *b = &c->b;
  unsigned int n = b->n;
  if (n == 0) return ST_OK;
  void *params[1] = {b};
  CUresult r = c->a->cuLaunchKernel(c->f, b->first[n], 1, 1, ST_COPY_THREADS, 1, 1, 0,
                                    (CUstream)c->stream, params, NULL);
  b->n = 0;
  if (r == CUDA_SUCCESS) {
    atomic_fetch_add(&by_kernel, n);
    return ST_OK;
  }
  kernel_drop(c->ordinal);
  c->f = NULL;
  int rc = ST_OK;
  for (unsigned int i = 0; rc == ST_OK && i < n; i++)
    rc = one_copy(c, b->dst[i], b->src[i], b->bytes[i]);
  return rc;
}

/* One range, decided: into the batch when the kernel can take it, else
 * by cuMemcpyAsync now (destinations do not overlap: the order between
 * the two ways does not matter). */
static int place(copier_t *c, uint64_t dst, uint64_t src, uint64_t bytes) {
  if (!c->f || ((dst | src | bytes) & 15) || bytes >= KERNEL_RANGE_LIMIT ||
      (!c->vouched && (!on_device(c->a, dst, c->ordinal) || !on_device(c->a, src, c->ordinal))))
    return one_copy(c, dst, src, bytes);
  st__copy_batch_t *b = &c->b;
  if (b->n == 0) b->first[0] = 0;
  b->dst[b->n] = dst;
  b->src[b->n] = src;
  b->bytes[b->n] = bytes;
  b->first[b->n + 1] = b->first[b->n] + (unsigned int)((bytes + (1ull << ST_COPY_TILE_SHIFT) - 1) >>
                                                       ST_COPY_TILE_SHIFT);
  b->n++;
  return b->n == ST_COPY_BATCH_MAX ? launch(c) : ST_OK;
}

/* Queues one merged range. A call's only range goes by cuMemcpyAsync
 * (faster than the kernel for one range, and no checks): the first is
 * held until a second comes or the call ends. */
static int queue_range(copier_t *c, uint64_t dst, uint64_t src, uint64_t bytes) {
  if (!c->held && c->b.n == 0 && c->f) {
    c->held = 1;
    c->first_dst = dst, c->first_src = src, c->first_bytes = bytes;
    return ST_OK;
  }
  int rc = ST_OK;
  if (c->held) {
    c->held = 0;
    rc = place(c, c->first_dst, c->first_src, c->first_bytes);
  }
  return rc == ST_OK ? place(c, dst, src, bytes) : rc;
}

/* The call's end: what is held or batched goes. */
static int finish(copier_t *c) {
  if (c->held) {
    c->held = 0;
    return one_copy(c, c->first_dst, c->first_src, c->first_bytes);
  }
  if (c->b.n != 1) return launch(c);
  c->b.n = 0;    /* one range left after a full launch: no launch for it */
  return one_copy(c, c->b.dst[0], c->b.src[0], c->b.bytes[0]);
}

/* See client_internal.h. Any thread. */
int st__client_cuda_copies(const st__client_copy_t *copies, size_t n, int ordinal, void *stream,
                           int flags, char *err, size_t errlen) {
  char why[300];
  const st__cuda_api_t *a = st__cuda_api(why, sizeof why);
  if (!a) return st__fail(ST_ERR_CAPABILITY, err, errlen, "%s", why);
  CUcontext saved = st__client_ctx_save();
  int rc = st__cuda_ctx_enter(ordinal, why, sizeof why);
  copier_t c = {.a = a, .ordinal = ordinal, .stream = stream,
                .vouched = (flags & ST_COPY_DEVICE) != 0, .why = why, .whylen = sizeof why};
  if (rc == ST_OK && n > 1) c.f = copy_kernel(a, ordinal);
  for (size_t i = 0; rc == ST_OK && i < n;) {
    /* Copies that follow each other in both destination and source go as
     * one, as long as the merged ranges stay inside one allocation on
     * each side. Those ends are looked up once per run, and only when a
     * merge is possible. */
    uint64_t dst = (uintptr_t)copies[i].dst, src = (uintptr_t)copies[i].src;
    uint64_t bytes = copies[i].bytes, dst_end = 0, src_end = 0;
    int looked = 0;
    for (i++; i < n && (uintptr_t)copies[i].dst == dst + bytes &&
              (uintptr_t)copies[i].src == src + bytes;
         i++) {
      if (!looked++ && (!st__cuda_alloc_end(dst, &dst_end) || !st__cuda_alloc_end(src, &src_end)))
        dst_end = src_end = 0;
      uint64_t more = copies[i].bytes;
      if (dst + bytes + more > dst_end || src + bytes + more > src_end) break;
      bytes += more;
    }
    if (bytes) rc = queue_range(&c, dst, src, bytes);
  }
  if (rc == ST_OK) rc = finish(&c);
  if (rc == ST_OK && (flags & ST_COPY_SYNC)) rc = st__cuda_stream_sync(stream, why, sizeof why);
  st__client_ctx_restore(a, saved);
  return rc == ST_OK ? ST_OK : st__fail(rc, err, errlen, "cuda:%d: %s", ordinal, why);
}

#else /* !ST_HAVE_CUDA */

/* See client_internal.h: no CUDA memory without CUDA. */
int st__client_cuda_copies(const st__client_copy_t *copies, size_t n, int ordinal, void *stream,
                           int flags, char *err, size_t errlen) {
  (void)copies;
  (void)n;
  (void)stream;
  (void)flags;
  return st__fail(ST_ERR_CAPABILITY, err, errlen,
                  "no CUDA device: built without CUDA support (cuda:%d)", ordinal);
}

#endif
