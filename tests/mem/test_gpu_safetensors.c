/* safetensors into CUDA arenas (src/mem/safetensors_cuda.c): the pinned
 * staging pool, every dtype copied back and compared with the CPU load,
 * conversion in the staging chunks, a 1 GiB file through a caller's
 * stream, concurrent loads sharing a small pool, cancellation returning
 * every chunk and arena. Without a CUDA build or device: checks that the
 * failure is a clear "no CUDA device: <reason>" error, then exits 77. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "mem/arena.h"
#include "mem/cuda.h"
#include "mem/safetensors.h"

#define MiB (1024ull * 1024ull)

static char dir[256];
static char small_path[512], big_path[512];

/* Word i of the data buffer of the big file. */
static uint32_t pattern(uint64_t i) { return (uint32_t)(i * 2654435761u) ^ (uint32_t)(i >> 32); }

/* Writes a file whose tensors (t000, t001, ... of dtypes sdt, element
 * sizes esize) have the given element counts back to back; the data
 * buffer is pattern() words or, with real_values, float32 values (bytes
 * are bytes: every dtype reads them, and the CPU and CUDA loads must agree
 * bit for bit). */
static void write_file(const char *path, int n, const uint64_t *numel, const char *const *sdt,
                       const int *esize, int real_values) {
  char *hdr = malloc(1 << 16);
  size_t hl = 0;
  uint64_t at = 0;
  hl += (size_t)sprintf(hdr + hl, "{\"__metadata__\":{\"format\":\"pt\"}");
  for (int k = 0; k < n; k++) {
    hl += (size_t)sprintf(hdr + hl, ",\"t%03d\":{\"dtype\":\"%s\",\"shape\":[%llu],"
                          "\"data_offsets\":[%llu,%llu]}", k, sdt[k],
                          (unsigned long long)numel[k], (unsigned long long)at,
                          (unsigned long long)(at + numel[k] * (uint64_t)esize[k]));
    at += numel[k] * (uint64_t)esize[k];
  }
  hl += (size_t)sprintf(hdr + hl, "}");
  while (hl % 8) hdr[hl++] = ' ';
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) exit(2);
  unsigned char lb[8];
  for (int i = 0; i < 8; i++) lb[i] = (unsigned char)((uint64_t)hl >> (8 * i));
  if (write(fd, lb, 8) != 8 || write(fd, hdr, hl) != (ssize_t)hl) exit(2);
  size_t chunk = 16 * MiB;
  uint32_t *buf = malloc(chunk);
  for (uint64_t off = 0; off < at; off += chunk) {
    size_t len = at - off < chunk ? (size_t)(at - off) : chunk;
    for (size_t w = 0; w < (len + 3) / 4; w++) {
      uint64_t i = off / 4 + w;
      float f = (float)(i % 1999) * 0.37f - 300.0f;   /* rounds differently in every format */
      if (real_values) memcpy(&buf[w], &f, 4);
      else buf[w] = pattern(i);
    }
    if (write(fd, buf, len) != (ssize_t)len) exit(2);
  }
  free(buf);
  free(hdr);
  close(fd);
}

#ifdef ST_HAVE_CUDA
static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Loads path into a CPU arena and a CUDA arena and compares the bytes. */
static int same_as_cpu(const char *path, st_dtype_t dtype, int threads, void *stream) {
  char err[1024];
  st__safetensors_t *s = NULL;
  if (st__safetensors_open(path, 0, &s, err, sizeof err) != ST_OK) {
    fprintf(stderr, "   open: %s\n", err);
    return 0;
  }
  size_t n = s->ntensors;
  uint64_t *oc = malloc(n * sizeof *oc), *og = malloc(n * sizeof *og);
  st_dtype_t *dc = malloc(n * sizeof *dc), *dg = malloc(n * sizeof *dg);
  st__arena_t *ac = NULL, *ag = NULL;
  st__safetensors_opts_t cpu = {.dtype = dtype, .device = -1, .threads = threads};
  st__safetensors_opts_t gpu = {.dtype = dtype, .device = 0, .threads = threads, .stream = stream};
  int ok = st__safetensors_load(s, &cpu, &ac, oc, dc, err, sizeof err) == ST_OK;
  if (!ok) fprintf(stderr, "   cpu load: %s\n", err);
  double t0 = now_s();
  ok = ok && st__safetensors_load(s, &gpu, &ag, og, dg, err, sizeof err) == ST_OK;
  double t1 = now_s();
  if (!ok) fprintf(stderr, "   cuda load: %s\n", err);
  if (ok) {
    ok = st__arena_device(ag) == 0 && st__arena_bytes(ag) == st__arena_bytes(ac) &&
         memcmp(oc, og, n * sizeof *oc) == 0 && memcmp(dc, dg, n * sizeof *dc) == 0;
    uint64_t bytes = st__arena_bytes(ag);
    char *host = malloc(bytes ? bytes : 1);
    ok = ok && host &&
         st__cuda_copy_to_host(host, (uint64_t)(uintptr_t)st__arena_base(ag), bytes, 0, err,
                               sizeof err) == ST_OK;
    /* Compare each tensor's bytes (padding between tensors is zero on both). */
    ok = ok && memcmp(host, st__arena_base(ac), bytes) == 0;
    if (bytes > 256 * MiB)
      fprintf(stderr, "   %.0f MiB into cuda:0 in %.3f s (%.1f GB/s, arena creation included)\n",
              (double)bytes / MiB, t1 - t0, (double)bytes / (t1 - t0) / 1e9);
    free(host);
  }
  st__arena_unref(ac);
  st__arena_unref(ag);
  free(oc);
  free(og);
  free(dc);
  free(dg);
  st__safetensors_free(s);
  return ok;
}
#endif

TEST(no_device_is_a_clear_error) {
  char err[512];
  st__safetensors_t *s = NULL;
  CHECK_ERR_MSG(st__safetensors_open(small_path, 0, &s, err, sizeof err), ST_OK, err);
  uint64_t off[64];
  st_dtype_t dt[64];
  st__arena_t *a = (st__arena_t *)1;
  st__safetensors_opts_t o = {.device = 0};
  CHECK_ERR_MSG(st__safetensors_load(s, &o, &a, off, dt, err, sizeof err), ST_ERR_CAPABILITY, err);
  CHECK(a == NULL);
  CHECK_CONTAINS(err, "no CUDA device: ");
  CHECK_ERR_MSG(st__staging_init(0, err, sizeof err), ST_ERR_CAPABILITY, err);
  st__safetensors_free(s);
}

#ifdef ST_HAVE_CUDA

TEST(staging_pool_is_made_once) {
  char err[512];
  /* 64 MiB: 16 chunks of 4 MiB, small enough for concurrent loads to wait. */
  CHECK_ERR_MSG(st__staging_init(64 * MiB, err, sizeof err), ST_OK, err);
  uint64_t chunk = 0;
  int n = 0;
  st__staging_info(&chunk, &n);
  CHECK_EQ_INT(chunk, 4 * MiB);
  CHECK_EQ_INT(n, 16);
  CHECK_ERR_MSG(st__staging_init(1024 * MiB, err, sizeof err), ST_OK, err);   /* no-op */
  st__staging_info(&chunk, &n);
  CHECK_EQ_INT(n, 16);
}

TEST(every_dtype_matches_the_cpu_load) {
  /* Conversions run on the CPU in the staging chunk: the bytes must equal
   * the CPU load's, NaNs included. */
  CHECK(same_as_cpu(small_path, ST_DTYPE_INVALID, 2, NULL));
  CHECK(same_as_cpu(small_path, ST_DTYPE_FLOAT16, 3, NULL));
  CHECK(same_as_cpu(small_path, ST_DTYPE_BFLOAT16, 1, NULL));
  CHECK(same_as_cpu(small_path, ST_DTYPE_FLOAT64, 4, NULL));    /* grows: 2x the chunk room */
}

TEST(a_1gib_file_on_a_callers_stream) {
  const st__cuda_api_t *cu = st__cuda_api(NULL, 0);
  char err[256];
  CHECK_ERR_MSG(st__cuda_ctx_enter(0, err, sizeof err), ST_OK, err);
  CUstream stream = NULL;
  CHECK_EQ_INT(cu->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CHECK(same_as_cpu(big_path, ST_DTYPE_INVALID, 4, stream));
  cu->cuStreamDestroy(stream);
}

typedef struct worker {
  const char *path;
  st_dtype_t dtype;
  int ok;
} worker_t;

static void *load_thread(void *arg) {
  worker_t *w = arg;
  w->ok = same_as_cpu(w->path, w->dtype, 3, NULL);
  return NULL;
}

TEST(concurrent_loads_share_the_pool) {
  worker_t w[4] = {{big_path, ST_DTYPE_INVALID, 0}, {small_path, ST_DTYPE_FLOAT16, 0},
                   {big_path, ST_DTYPE_INVALID, 0}, {small_path, ST_DTYPE_INVALID, 0}};
  pthread_t t[4];
  for (int i = 0; i < 4; i++) CHECK_EQ_INT(pthread_create(&t[i], NULL, load_thread, &w[i]), 0);
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 4; i++) CHECK(w[i].ok);
}

static int stop_after(void *ud) {
  int *left = ud;
  return __atomic_sub_fetch(left, 1, __ATOMIC_RELAXED) < 0 ? ST_ERR_CANCELLED : 0;
}

TEST(cancel_returns_everything) {
  char err[512];
  st__safetensors_t *s = NULL;
  CHECK_ERR_MSG(st__safetensors_open(big_path, 0, &s, err, sizeof err), ST_OK, err);
  uint64_t count0 = 0, bytes0 = 0, free0 = 0, total = 0;
  st__arena_stats(&count0, &bytes0);
  CHECK_ERR_MSG(st__cuda_mem_info(0, &free0, &total, err, sizeof err), ST_OK, err);
  size_t n = s->ntensors;
  uint64_t *off = malloc(n * sizeof *off);
  st_dtype_t *dt = malloc(n * sizeof *dt);
  int left = 20;                       /* some batches copied, then cancelled */
  st__arena_t *a = (st__arena_t *)1;
  st__safetensors_opts_t o = {.device = 0, .threads = 4, .stop = stop_after, .stop_ud = &left};
  CHECK_ERR_MSG(st__safetensors_load(s, &o, &a, off, dt, err, sizeof err), ST_ERR_CANCELLED, err);
  CHECK(a == NULL);
  uint64_t count1 = 0, bytes1 = 0, free1 = 0;
  st__arena_stats(&count1, &bytes1);
  CHECK_EQ_INT(count1, count0);
  CHECK_ERR_MSG(st__cuda_mem_info(0, &free1, &total, err, sizeof err), ST_OK, err);
  CHECK(free1 + 64 * MiB >= free0);    /* the 1 GiB arena went back */
  /* Every chunk came back: a load that needs the whole pool still runs. */
  o.stop = NULL;
  o.threads = 16;
  CHECK_ERR_MSG(st__safetensors_load(s, &o, &a, off, dt, err, sizeof err), ST_OK, err);
  st__arena_unref(a);
  free(off);
  free(dt);
  st__safetensors_free(s);
}

#endif

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/st-gpu-sft-XXXXXX");
  if (!mkdtemp(dir)) return 2;
  snprintf(small_path, sizeof small_path, "%s/small.safetensors", dir);
  snprintf(big_path, sizeof big_path, "%s/big.safetensors", dir);
  {
    /* Odd sizes so that pieces, chunks and alignment padding all vary. */
    uint64_t numel[] = {1, 3, 1000, 4099, 1 << 20, 3 * (1 << 20) + 5, 17, 0, 2000003, 77,
                        1 << 21, 5};
    const char *sdt[] = {"F32", "F16", "BF16", "I64", "F32", "BF16", "U8", "F32", "F8_E4M3",
                         "BOOL", "F16", "F64"};
    int es[] = {4, 2, 2, 8, 4, 2, 1, 4, 1, 1, 2, 8};
    write_file(small_path, 12, numel, sdt, es, 1);
  }
  char err[512];
  int have = st__cuda_available(err, sizeof err) == ST_OK;
  if (!have) {
    RUN(no_device_is_a_clear_error);
    unlink(small_path);
    rmdir(dir);
    if (stt_failed) return stt_summary();
    stt_skip(err);
  }
#ifdef ST_HAVE_CUDA
  {
    /* 1 GiB of data: 7 float32 tensors of about 128 MiB with odd element
     * counts, and the rest in an eighth. */
    uint64_t numel[8];
    const char *sdt[8];
    int es[8];
    uint64_t left = 1024 * MiB / 4;
    for (int k = 0; k < 8; k++) {
      numel[k] = k < 7 ? left / (uint64_t)(8 - k) + (uint64_t)k * 3 + 1 : left;
      left -= numel[k];
      sdt[k] = "F32";
      es[k] = 4;
    }
    write_file(big_path, 8, numel, sdt, es, 0);
  }
  RUN(staging_pool_is_made_once);
  RUN(every_dtype_matches_the_cpu_load);
  RUN(a_1gib_file_on_a_callers_stream);
  RUN(concurrent_loads_share_the_pool);
  RUN(cancel_returns_everything);
#endif
  unlink(small_path);
  unlink(big_path);
  rmdir(dir);
  return stt_summary();
}
