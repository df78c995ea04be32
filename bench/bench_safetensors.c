/* bench_safetensors: st.load_safetensors' C loader (src/mem/safetensors.h)
 * against the copy ceilings measured in the same run.
 *
 *   bench_safetensors [--dir D] [--tensors N] [--mib M] [--reps R]
 *                     [--threads T,T,...] [--cpu-only] [--keep]
 *
 * Writes D/st-bench.safetensors (default /tmp; N = 128 float16 tensors of
 * M = 32 MiB: 4 GiB), reads it once so that it is page-cache hot, and
 * prints GB/s (1e9 bytes of tensor data per second, best of R = 2) of:
 *   - pread from the page cache into ordinary memory, 1 and 8 threads
 *     (what the readers can do at best)
 *   - the loader into a CUDA arena with 1, 4, 8 and 16 reader threads
 *     (arena creation included), and with a float16 -> bfloat16 conversion
 *   - the pinned host->device ceiling: cuMemcpyHtoDAsync of the same total
 *     from one pinned buffer in 32 MiB chunks into a CUDA arena; and the
 *     same copy from pageable memory
 *   (none of the CUDA rows with --cpu-only or without a device)
 *   - a table of CPU arena loads at T = 1, 2, 4, 8 threads (--threads):
 *     at each thread count, in the same run, the page-cache read (pread of
 *     the file into one reused 16 MiB buffer per thread), a pread into new
 *     memory of the file's size (whose pages are faulted in, as an arena's
 *     must be made), the loader, its ratio to each, and how the loader
 *     filled the arena (bytes copied in the kernel / read into pages its
 *     readers committed: src/mem/safetensors_load.c)
 * With --keep the file stays (for a comparison with
 * safetensors.torch.load_file). Timings are printed, never asserted.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "mem/arena.h"
#include "mem/cuda.h"
#include "mem/safetensors.h"

#ifdef ST_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define MiB (1024ull * 1024ull)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, const char *err) {
  fprintf(stderr, "%s: %s\n", what, err);
  exit(1);
}

static void report(const char *what, uint64_t bytes, double s) {
  printf("%-58s %7.2f GB/s  (%.3f s)\n", what, (double)bytes / s / 1e9, s);
}

/* ------------------------------------------------------------ the file */

static uint64_t write_file(const char *path, int ntensors, uint64_t tensor_bytes) {
  size_t cap = 256 + (size_t)ntensors * 128, hl = 0;
  char *hdr = malloc(cap);
  hl += (size_t)snprintf(hdr + hl, cap - hl, "{\"__metadata__\":{\"format\":\"pt\"}");
  for (int k = 0; k < ntensors; k++)
    hl += (size_t)snprintf(hdr + hl, cap - hl,
                           ",\"layers.%d.weight\":{\"dtype\":\"F16\",\"shape\":[%llu,1024],"
                           "\"data_offsets\":[%llu,%llu]}", k,
                           (unsigned long long)(tensor_bytes / 2048),
                           (unsigned long long)((uint64_t)k * tensor_bytes),
                           (unsigned long long)((uint64_t)(k + 1) * tensor_bytes));
  hl += (size_t)snprintf(hdr + hl, cap - hl, "}");
  while (hl % 8) hdr[hl++] = ' ';
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) die("open", path);
  unsigned char lb[8];
  for (int i = 0; i < 8; i++) lb[i] = (unsigned char)((uint64_t)hl >> (8 * i));
  if (write(fd, lb, 8) != 8 || write(fd, hdr, hl) != (ssize_t)hl) die("write", path);
  uint16_t *buf = malloc(tensor_bytes);
  uint32_t x = 2463534242u;
  for (int k = 0; k < ntensors; k++) {
    for (uint64_t i = 0; i < tensor_bytes / 2; i++) {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      buf[i] = (uint16_t)(0x3000 | (x & 0x0fff));   /* finite float16 values */
    }
    for (uint64_t off = 0; off < tensor_bytes;) {
      ssize_t n = write(fd, (char *)buf + off, (size_t)(tensor_bytes - off));
      if (n <= 0) die("write", path);
      off += (uint64_t)n;
    }
  }
  free(buf);
  free(hdr);
  close(fd);
  return (uint64_t)ntensors * tensor_bytes;
}

/* ------------------------------------------------------------ pread ceiling */

typedef struct rd {
  int fd;
  uint64_t start, end;
  char *buf;                  /* 16 MiB reused, or NULL: `fresh` at start */
  char *fresh;                /* the whole file's memory, faulted in here */
} rd_t;

static void *read_range(void *arg) {
  rd_t *r = arg;
  for (uint64_t off = r->start; off < r->end;) {
    size_t want = r->end - off < 16 * MiB ? (size_t)(r->end - off) : 16 * MiB;
    ssize_t n = pread(r->fd, r->buf ? r->buf : r->fresh + off, want, (off_t)off);
    if (n <= 0) break;
    off += (uint64_t)n;
  }
  return NULL;
}

/* Seconds to pread the file with `threads` threads: into one 16 MiB
 * buffer per thread, which stays in the CPU caches (the copy's ceiling),
 * or, when `fresh`, into new memory of the file's size (anonymous, its
 * pages faulted in by the reads: what an arena's pages cost too). */
static double pread_all(const char *path, uint64_t size, int threads, int fresh) {
  int fd = open(path, O_RDONLY);
  rd_t r[64];
  pthread_t t[64];
  double t0 = now_s();
  char *mem = NULL;
  if (fresh) {
    mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) die("mmap", "fresh memory");
  }
  for (int i = 0; i < threads; i++) {
    r[i].fd = fd;
    r[i].start = size / (uint64_t)threads * (uint64_t)i;
    r[i].end = i == threads - 1 ? size : size / (uint64_t)threads * (uint64_t)(i + 1);
    r[i].buf = fresh ? NULL : malloc(16 * MiB);
    r[i].fresh = mem;
    pthread_create(&t[i], NULL, read_range, &r[i]);
  }
  for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
  double dt = now_s() - t0;
  for (int i = 0; i < threads; i++) free(r[i].buf);
  if (mem) munmap(mem, size);
  close(fd);
  return dt;
}

/* ------------------------------------------------------------ the loader */

static double load_once(const char *path, int device, int threads, st_dtype_t dtype) {
  char err[1024];
  double t0 = now_s();
  st__safetensors_t *s = NULL;
  if (st__safetensors_open(path, 0, &s, err, sizeof err) != ST_OK) die("open", err);
  uint64_t *off = malloc(s->ntensors * sizeof *off);
  st_dtype_t *dt = malloc(s->ntensors * sizeof *dt);
  st__arena_t *a = NULL;
  st__safetensors_opts_t o = {.dtype = dtype, .device = device, .threads = threads};
  if (st__safetensors_load(s, &o, &a, off, dt, err, sizeof err) != ST_OK) die("load", err);
  double dtime = now_s() - t0;
  st__arena_unref(a);
  st__safetensors_free(s);
  free(off);
  free(dt);
  return dtime;
}

#ifdef ST_HAVE_CUDA
/* The loader's best time of reps; printed. */
static double bench_loader(const char *label, const char *path, uint64_t bytes, int device,
                           int threads, st_dtype_t dtype, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    double t = load_once(path, device, threads, dtype);
    if (t < best) best = t;
  }
  char what[128];
  snprintf(what, sizeof what, "%s, %d thread%s", label, threads, threads == 1 ? "" : "s");
  report(what, bytes, best);
  return best;
}

/* cuMemcpyHtoDAsync of `bytes` from src in 32 MiB chunks into a fresh CUDA
 * arena on one stream; best of reps. */
static double copy_ceiling(const void *src, uint64_t bytes, int reps) {
  char err[512];
  st__arena_t *a = NULL;
  if (st__arena_new_cuda(0, bytes, &a, err, sizeof err) != ST_OK) die("arena", err);
  const st__cuda_api_t *cu = st__cuda_api(err, sizeof err);
  CUstream stream = NULL;
  if (cu->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) die("stream", "");
  CUdeviceptr base = (CUdeviceptr)(uintptr_t)st__arena_base(a);
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    double t0 = now_s();
    for (uint64_t off = 0; off < bytes; off += 32 * MiB) {
      size_t n = bytes - off < 32 * MiB ? (size_t)(bytes - off) : 32 * MiB;
      if (cu->cuMemcpyHtoDAsync(base + off, (const char *)src + off, n, stream) != CUDA_SUCCESS)
        die("cuMemcpyHtoDAsync", "");
    }
    if (cu->cuStreamSynchronize(stream) != CUDA_SUCCESS) die("sync", "");
    double t = now_s() - t0;
    if (t < best) best = t;
  }
  cu->cuStreamDestroy(stream);
  st__arena_unref(a);
  return best;
}
#endif

/* ------------------------------------------------------------ CPU table */

/* The loader into a CPU arena at each thread count, next to the two
 * reads of the same file at that count, each the best of reps, measured
 * one after the other. */
static void cpu_table(const char *path, uint64_t bytes, const int *threads, int nthreads,
                      int reps) {
  char huge[256];
  int offered = st__arena_shmem_huge(huge, sizeof huge);
  printf("\nCPU arena loads: safetensors -> CPU arena (memfd), file page-cache hot, best of %d,\n"
         "GB/s = 1e9 bytes of tensor data per second; %ld cores online\n"
         "  page-cache read   pread of the file into one reused 16 MiB buffer per thread\n"
         "                    (the copy alone: the target is loader >= 0.7x this)\n"
         "  new memory        pread of the file into new anonymous memory of its size,\n"
         "                    faulted in by the reads (the copy plus making the pages)\n"
         "  loader            st__safetensors_load into a new CPU arena: the memfd made,\n"
         "                    filled and sealed as clients get it (arena creation included)\n"
         "  kernel / read     how the loader filled it: bytes copied in the kernel from the\n"
         "                    page cache into the memfd (splice, one reader at a time) /\n"
         "                    bytes read into pages the readers committed (pread)\n"
         "  huge pages for shared memory: %s (%s)\n\n",
         reps, sysconf(_SC_NPROCESSORS_ONLN),
         offered ? "offered: large arenas ask for them, no kernel copy"
                 : "not offered: 4 KiB pages",
         huge);
  printf("%7s  %15s  %10s  %7s  %18s  %13s  %13s\n", "threads", "page-cache read",
         "new memory", "loader", "loader/page-cache", "loader/new", "kernel / read");
  for (int i = 0; i < nthreads; i++) {
    int n = threads[i];
    double best[2] = {1e30, 1e30}, t = 1e30;
    for (int fresh = 0; fresh < 2; fresh++)
      for (int r = 0; r < reps; r++) {
        double d = pread_all(path, bytes, n, fresh);
        if (d < best[fresh]) best[fresh] = d;
      }
    st__safetensors_cpu_counts_t c0, c1;
    st__safetensors_cpu_counts(&c0);
    for (int r = 0; r < reps; r++) {
      double d = load_once(path, -1, n, ST_DTYPE_INVALID);
      if (d < t) t = d;
    }
    st__safetensors_cpu_counts(&c1);
    double spliced = (double)(c1.spliced - c0.spliced), read = (double)(c1.read - c0.read);
    double all = spliced + read > 0 ? spliced + read : 1;
    printf("%7d  %15.2f  %10.2f  %7.2f  %17.2fx  %12.2fx  %5.0f%% / %3.0f%%\n", n,
           (double)bytes / best[0] / 1e9, (double)bytes / best[1] / 1e9, (double)bytes / t / 1e9,
           best[0] / t, best[1] / t, 100 * spliced / all, 100 * read / all);
  }
}

int main(int argc, char **argv) {
  const char *dir = "/tmp";
  int ntensors = 128, reps = 2, keep = 0, cpu_only = 0;
  int threads[16] = {1, 2, 4, 8}, nthreads = 4;
  uint64_t mib = 32;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
    else if (!strcmp(argv[i], "--tensors") && i + 1 < argc) ntensors = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = (uint64_t)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--keep")) keep = 1;
    else if (!strcmp(argv[i], "--cpu-only")) cpu_only = 1;
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
      nthreads = 0;
      for (char *p = argv[++i]; *p && nthreads < 16;) {
        int n = (int)strtol(p, &p, 10);
        if (n < 1 || n > 64) return 2;
        threads[nthreads++] = n;
        if (*p == ',') p++;
        else if (*p) return 2;
      }
      if (nthreads == 0) return 2;
    } else {
      fprintf(stderr, "usage: bench_safetensors [--dir D] [--tensors N] [--mib M] [--reps R] "
                      "[--threads T,T,...] [--cpu-only] [--keep]\n");
      return 2;
    }
  }
  if (ntensors < 1 || mib < 1 || reps < 1) return 2;
  setvbuf(stdout, NULL, _IOLBF, 0);
  char path[512];
  snprintf(path, sizeof path, "%s/st-bench.safetensors", dir);
  double t0 = now_s();
  uint64_t bytes = write_file(path, ntensors, mib * MiB);
  printf("file %s: %d float16 tensors of %llu MiB, %.2f GB of data (written in %.1f s)\n", path,
         ntensors, (unsigned long long)mib, (double)bytes / 1e9, now_s() - t0);
  report("page cache -> memory, pread, 1 thread (warm-up read)", bytes,
         pread_all(path, bytes, 1, 0));
  report("page cache -> memory, pread, 1 thread", bytes, pread_all(path, bytes, 1, 0));
  report("page cache -> memory, pread, 8 threads", bytes, pread_all(path, bytes, 8, 0));

  char err[512];
  if (cpu_only) {
    printf("CUDA: skipped (--cpu-only)\n");
  } else if (st__cuda_available(err, sizeof err) != ST_OK) {
    printf("CUDA: skipped (%s)\n", err);
  } else {
#ifdef ST_HAVE_CUDA
    char uuid[ST_CUDA_UUID_LEN];
    st__cuda_device_uuid(0, uuid, err, sizeof err);
    printf("CUDA device 0: %s\n", uuid);
    double ts = now_s();
    if (st__staging_init(ST_SAFETENSORS_DEFAULT_STAGING, err, sizeof err) != ST_OK)
      die("staging", err);
    uint64_t chunk = 0;
    int nchunks = 0;
    st__staging_info(&chunk, &nchunks);
    printf("pinned staging pool: %d chunks of %llu MiB, allocated in %.0f ms (once per process)\n",
           nchunks, (unsigned long long)(chunk / MiB), (now_s() - ts) * 1e3);
    ts = now_s();
    st__arena_t *a = NULL;
    if (st__arena_new_cuda(0, bytes, &a, err, sizeof err) != ST_OK) die("arena", err);
    printf("%-58s %.1f ms\n", "CUDA arena creation alone (same size, zero-filled)",
           (now_s() - ts) * 1e3);
    st__arena_unref(a);
    static const int cuda_threads[] = {1, 4, 8, 16};
    for (int i = 0; i < 4; i++)
      bench_loader("st loader -> CUDA arena", path, bytes, 0, cuda_threads[i], ST_DTYPE_INVALID,
                   reps);
    bench_loader("st loader -> CUDA arena, float16 -> bfloat16", path, bytes, 0, 8,
                 ST_DTYPE_BFLOAT16, reps);
    void *pinned = NULL;
    ts = now_s();
    if (cudaHostAlloc(&pinned, bytes, cudaHostAllocPortable) != cudaSuccess)
      die("cudaHostAlloc", "failed");
    double alloc_ms = (now_s() - ts) * 1e3;
    memset(pinned, 1, bytes);
    char what[128];
    snprintf(what, sizeof what, "pinned host -> device ceiling (%.0f ms to pin)", alloc_ms);
    report(what, bytes, copy_ceiling(pinned, bytes, reps));
    cudaFreeHost(pinned);
    void *pageable = malloc(bytes);
    memset(pageable, 1, bytes);
    report("pageable host -> device (same copies, malloc'ed source)", bytes,
           copy_ceiling(pageable, bytes, reps));
    free(pageable);
#endif
  }
  {
    double tc = now_s();
    st__arena_t *a = NULL;
    if (st__arena_new_cpu(bytes, &a, err, sizeof err) != ST_OK) die("arena", err);
    printf("%-58s %.1f ms\n", "CPU arena creation alone (memfd, fallocate, map)",
           (now_s() - tc) * 1e3);
    st__arena_unref(a);
  }
  cpu_table(path, bytes, threads, nthreads, reps);
  if (keep) printf("kept %s\n", path);
  else unlink(path);
  return 0;
}
