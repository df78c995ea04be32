/* st_get_into with CUDA memory (docs/views.md, section 2) against a real
 * stserver; the publisher is this program run again with --child (a fork
 * cannot use the parent's CUDA), which puts and exits:
 *   - device to device into device memory this process allocated, on the
 *     legacy default stream and on a stream of its own;
 *   - device to host and host to device (a CPU key into device memory);
 *   - a refusal leaves the device memory unchanged;
 *   - a second st_get_into maps nothing new;
 *   - st_copy_ranges merges only ranges that follow on both sides;
 *   - st_copy_ranges of hundreds of ranges between separate allocations
 *     goes by the batched copy kernel (several launches), and a range
 *     with an odd address or a host side by cuMemcpyAsync, every byte
 *     where its range says; the same with ST_COPY_DEVICE (no check per
 *     range).
 * (The CPU path: test_into.c.) Exit 77 without a CUDA device. */
#include <st/client.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "client_kit.h"
#include "fixture.h"
#include "mem/cuda.h"

#include "../server/gpu_kit.h"

#ifdef ST_HAVE_CUDA

#define N 4096

static stt_server_t srv;
static st_client_t *cli;
static const int64_t SHAPE[1] = {N};

/* A float32 tensor of N elements on `device` from st_tensor_alloc, element
 * i = i * scale (NULL on failure). */
static st_result_t *filled(const char *device, float scale) {
  st_result_t *r = NULL;
  char err[256];
  if (st_tensor_alloc(device, ST_DTYPE_FLOAT32, 1, SHAPE, &r, err, sizeof err) != ST_OK) {
    fprintf(stderr, "   st_tensor_alloc: %s\n", err);
    return NULL;
  }
  static float h[N];
  for (int i = 0; i < N; i++) h[i] = (float)i * scale;
  const st_tensor_t *t = st_result_tensor(r, 0);
  int rc = t->device == ST_DEVICE_CUDA
               ? st__cuda_copy_to_device((uint64_t)(uintptr_t)t->data, h, sizeof h, 0, err,
                                         sizeof err)
               : (memcpy(t->data, h, sizeof h), ST_OK);
  if (rc != ST_OK) {
    st_result_free(r);
    return NULL;
  }
  return r;
}

/* 1 when every element of t (host or device) is i * scale. */
static int holds(const st_tensor_t *t, float scale) {
  static float h[N];
  if (st_tensor_copy_to_host(t, h, sizeof h) != ST_OK) return 0;
  for (int i = 0; i < N; i++)
    if (h[i] != (float)i * scale) return 0;
  return 1;
}

/* --child SOCKET: puts "gd" {w: cuda:0, i * 2} and "gh" {w: cpu, i * 3}. */
static int child(const char *sock) {
  st_client_t *c = stt_client_open(sock);
  if (!c) return 90;
  const char *keys[2] = {"gd", "gh"}, *devs[2] = {"cuda:0", "cpu"};
  for (int k = 0; k < 2; k++) {
    st_result_t *t = filled(devs[k], (float)(k + 2));
    st_args_t *a = st_args_new();
    char err[256];
    if (!t || st_args_tensor(a, "w", st_result_tensor(t, 0), err, sizeof err) != ST_OK ||
        st_client_put(c, keys[k], a, ST_KEY_PINNED, 0, NULL) != ST_OK)
      return 91 + k;
    st_args_free(a);
    st_result_free(t);
  }
  st_client_close(c);
  return 0;
}

static int run_publisher(void) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    execl("/proc/self/exe", "test_gpu_into", "--child", srv.socket, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status)
             ? WEXITSTATUS(status)
             : -1;
}

/* A destination named "w" over tensor t's memory. */
static st_tensor_t dest(const st_tensor_t *t) {
  return (st_tensor_t){.name = "w", .data = t->data, .dtype = ST_DTYPE_FLOAT32, .ndim = 1,
                       .shape = SHAPE, .device = t->device, .device_index = t->device_index};
}

TEST(device_to_device_into_memory_of_this_process) {
  st_result_t *mine = filled("cuda:0", 0.0f);
  CHECK(mine);
  st_tensor_t d = dest(st_result_tensor(mine, 0));
  uint64_t got = 0;
  CHECK_RC(st_get_into(cli, "gd", 0, NULL, &d, 1, NULL, &got), ST_OK, cli);
  CHECK_EQ_INT(got, 1);
  CHECK(holds(st_result_tensor(mine, 0), 2.0f));
  /* on a stream of this process's own */
  const st__cuda_api_t *a = st__cuda_api(NULL, 0);
  CUstream s = NULL;
  CHECK(a && a->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  st_result_free(mine);
  mine = filled("cuda:0", 0.0f);
  d = dest(st_result_tensor(mine, 0));
  CHECK_RC(st_get_into(cli, "gd", 0, NULL, &d, 1, s, NULL), ST_OK, cli);
  CHECK(holds(st_result_tensor(mine, 0), 2.0f));   /* complete on return */
  a->cuStreamDestroy(s);
  /* a shape that differs: refused, the device memory unchanged */
  st_result_free(mine);
  mine = filled("cuda:0", 5.0f);
  static const int64_t half[1] = {N / 2};
  d = dest(st_result_tensor(mine, 0));
  d.shape = half;
  CHECK_RC(st_get_into(cli, "gd", 0, NULL, &d, 1, NULL, NULL), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS(st_client_error(cli), "'w': shape [2048] here, [4096] in the source");
  CHECK(holds(st_result_tensor(mine, 0), 5.0f));
  st_result_free(mine);
}

TEST(device_to_host_and_host_to_device) {
  static float h[N];
  st_tensor_t d = {.name = "w", .data = h, .dtype = ST_DTYPE_FLOAT32, .ndim = 1, .shape = SHAPE,
                   .device = ST_DEVICE_CPU, .device_index = -1};
  CHECK_RC(st_get_into(cli, "gd", 0, NULL, &d, 1, NULL, NULL), ST_OK, cli);
  CHECK(h[4095] == 4095.0f * 2.0f && h[1] == 2.0f);
  st_result_t *mine = filled("cuda:0", 0.0f);
  CHECK(mine);
  d = dest(st_result_tensor(mine, 0));
  CHECK_RC(st_get_into(cli, "gh", 0, NULL, &d, 1, NULL, NULL), ST_OK, cli);
  CHECK(holds(st_result_tensor(mine, 0), 3.0f));
  st_result_free(mine);
}

TEST(a_second_get_into_maps_nothing_new) {
  st_result_t *mine = filled("cuda:0", 0.0f);
  CHECK(mine);
  st_tensor_t d = dest(st_result_tensor(mine, 0));
  CHECK_RC(st_get_into(cli, "gd", 0, NULL, &d, 1, NULL, NULL), ST_OK, cli);
  size_t mapped, mapped2;
  uint64_t reused, reused2;
  st_open_cache_stats(&mapped, &reused);
  CHECK(stt_client_settle(cli));
  uint64_t free0 = gk_free();
  CHECK_RC(st_get_into(cli, "gd", 0, NULL, &d, 1, NULL, NULL), ST_OK, cli);
  st_open_cache_stats(&mapped2, &reused2);
  CHECK_EQ_INT(mapped2, mapped);
  CHECK_EQ_INT(reused2, reused);   /* a `same` reply: no descriptor came */
  CHECK_EQ_INT(gk_free(), free0);
  st_result_free(mine);
}

/* st_copy_ranges on the device: ranges that follow each other on both
 * sides go as one copy, and a range that follows in the destination only
 * must not be merged: every element lands where its range says. */
TEST(copy_ranges_merges_only_what_follows_on_both_sides) {
  st_result_t *a = filled("cuda:0", 1.0f), *b = filled("cuda:0", 0.0f);
  CHECK(a && b);
  uint64_t A = (uint64_t)(uintptr_t)st_result_tensor(a, 0)->data;
  uint64_t B = (uint64_t)(uintptr_t)st_result_tensor(b, 0)->data;
  const uint64_t q = N / 4 * sizeof(float);   /* a quarter */
  /* B's quarters get A's 0, 1, 3, 2: the first two merge; the last two
   * follow each other in B only. */
  uint64_t dst[4] = {B, B + q, B + 2 * q, B + 3 * q};
  uint64_t src[4] = {A, A + q, A + 3 * q, A + 2 * q};
  uint64_t bytes[4] = {q, q, q, q};
  char err[300] = "";
  CHECK_ERR_MSG(st_copy_ranges(0, dst, src, bytes, 4, NULL, ST_COPY_SYNC, err, sizeof err), ST_OK, err);
  static float h[N];
  CHECK_EQ_INT(st_tensor_copy_to_host(st_result_tensor(b, 0), h, sizeof h), ST_OK);
  int bad = 0;
  for (int i = 0; i < N; i++) {
    int quarter = i / (N / 4), from = quarter < 2 ? quarter : 5 - quarter;
    float want = (float)(from * (N / 4) + i % (N / 4));
    bad += h[i] != want;
  }
  CHECK_EQ_INT(bad, 0);
  st_result_free(a);
  st_result_free(b);
}

/* A device allocation of `bytes` uint8 from st_tensor_alloc holding
 * host[] (NULL on failure). */
static st_result_t *device_bytes(const unsigned char *host, size_t bytes) {
  st_result_t *r = NULL;
  const int64_t shape[1] = {(int64_t)bytes};
  char err[256];
  if (st_tensor_alloc("cuda:0", ST_DTYPE_UINT8, 1, shape, &r, err, sizeof err) != ST_OK) {
    fprintf(stderr, "   st_tensor_alloc: %s\n", err);
    return NULL;
  }
  const st_tensor_t *t = st_result_tensor(r, 0);
  if (st__cuda_copy_to_device((uint64_t)(uintptr_t)t->data, host, bytes, 0, err,
                              sizeof err) != ST_OK) {
    st_result_free(r);
    return NULL;
  }
  return r;
}

#define SRCS 2
#define DSTS 4
#define SRC_BYTES (16u << 20)
#define DST_BYTES (12u << 20)

/* How many of the DSTS destinations differ from their part of want[]
 * (DST_BYTES each), read back through got[]; -1 when one cannot be read. */
static int differing(st_result_t *const *d, const unsigned char *want, unsigned char *got) {
  int bad = 0;
  for (int j = 0; j < DSTS; j++) {
    if (st_tensor_copy_to_host(st_result_tensor(d[j], 0), got, DST_BYTES) != ST_OK) return -1;
    bad += memcmp(got, want + (size_t)j * DST_BYTES, DST_BYTES) != 0;
  }
  return bad;
}

/* Hundreds of ranges from two source allocations into four destination
 * allocations (none follows another on both sides, so none merges): the
 * kernel copies them in launches of at most 128; a range at an odd
 * address and a range into host memory go by cuMemcpyAsync; a range of
 * zero bytes copies nothing. Every destination byte equals the same
 * copies done on the host. */
TEST(copy_ranges_batches_ranges_of_separate_allocations) {
  static const size_t sizes[] = {16, 48, 4096, 65552, 200000, 1048608, 32, 65536};
  unsigned char *src_h = malloc((size_t)SRCS * SRC_BYTES);
  unsigned char *want = calloc((size_t)DSTS, DST_BYTES), *got = malloc(DST_BYTES);
  unsigned char host_dst[64] = {0}, host_want[64] = {0};
  size_t cap = 1024, n = 0;
  uint64_t *dst = calloc(cap, sizeof *dst), *src = calloc(cap, sizeof *src);
  uint64_t *bytes = calloc(cap, sizeof *bytes);
  CHECK(src_h && want && got && dst && src && bytes);
  uint32_t x = 12345;
  for (size_t i = 0; i < (size_t)SRCS * SRC_BYTES; i++) {
    x = x * 1664525u + 1013904223u;
    src_h[i] = (unsigned char)(x >> 24);
  }
  st_result_t *s[SRCS], *d[DSTS];
  uint64_t S[SRCS], D[DSTS];
  for (int i = 0; i < SRCS; i++) {
    s[i] = device_bytes(src_h + (size_t)i * SRC_BYTES, SRC_BYTES);
    CHECK(s[i] != NULL);
    S[i] = (uint64_t)(uintptr_t)st_result_tensor(s[i], 0)->data;
  }
  for (int i = 0; i < DSTS; i++) {
    d[i] = device_bytes(want + (size_t)i * DST_BYTES, DST_BYTES);   /* zeros */
    CHECK(d[i] != NULL);
    D[i] = (uint64_t)(uintptr_t)st_result_tensor(d[i], 0)->data;
  }
  /* Each destination cut front to back into ranges of the sizes above,
   * each from a pseudo-random 16-byte aligned place of a source. */
  for (int j = 0; j < DSTS; j++) {
    size_t at = 0;
    for (size_t k = 0; at + sizes[k % 8] <= DST_BYTES - 64; k++) {
      size_t len = sizes[k % 8];
      x = x * 1664525u + 1013904223u;
      int from = (int)(x >> 31);
      size_t off = ((size_t)(x >> 8) % (SRC_BYTES - len)) & ~(size_t)15;
      dst[n] = D[j] + at;
      src[n] = S[from] + off;
      bytes[n] = len;
      memcpy(want + (size_t)j * DST_BYTES + at, src_h + (size_t)from * SRC_BYTES + off, len);
      n++;
      at += len + 16;    /* a gap: no two ranges follow in the destination */
    }
  }
  CHECK(n > 2 * 128 && n + 3 <= cap);
  /* At an odd address, into host memory, and of zero bytes. */
  dst[n] = D[0] + DST_BYTES - 7;
  src[n] = S[1] + 3;
  bytes[n] = 5;
  memcpy(want + DST_BYTES - 7, src_h + SRC_BYTES + 3, 5);
  n++;
  dst[n] = (uint64_t)(uintptr_t)host_dst;
  src[n] = S[0] + 4096;
  bytes[n] = sizeof host_dst;
  memcpy(host_want, src_h + 4096, sizeof host_want);
  n++;
  dst[n] = D[1];
  src[n] = S[0];
  bytes[n] = 0;
  n++;
  uint64_t k0 = 0, m0 = 0, k1 = 0, m1 = 0;
  st_copy_stats(&k0, &m0);
  char err[300] = "";
  CHECK_ERR_MSG(st_copy_ranges(0, dst, src, bytes, n, NULL, ST_COPY_SYNC, err, sizeof err), ST_OK, err);
  st_copy_stats(&k1, &m1);
  CHECK_EQ_INT((long long)(k1 - k0), (long long)(n - 3));   /* all but the three */
  CHECK_EQ_INT((long long)(m1 - m0), 2);                    /* odd and host */
  CHECK_EQ_INT(differing(d, want, got), 0);
  CHECK(memcmp(host_dst, host_want, sizeof host_dst) == 0);
  /* Again with the caller vouching for the device ranges (ST_COPY_DEVICE:
   * no check per range), into destinations zeroed first: the same bytes,
   * every range by the kernel. */
  unsigned char *zero = calloc(1, DST_BYTES);
  CHECK(zero != NULL);
  for (int j = 0; j < DSTS; j++)
    CHECK(st__cuda_copy_to_device(D[j], zero, DST_BYTES, 0, err, sizeof err) == ST_OK);
  free(zero);
  size_t dev_n = n - 3;    /* the ranges the kernel took above */
  st_copy_stats(&k0, &m0);
  CHECK_ERR_MSG(st_copy_ranges(0, dst, src, bytes, dev_n, NULL, ST_COPY_SYNC | ST_COPY_DEVICE, err,
                               sizeof err),
                ST_OK, err);
  st_copy_stats(&k1, &m1);
  CHECK_EQ_INT((long long)(k1 - k0), (long long)dev_n);
  CHECK_EQ_INT((long long)(m1 - m0), 0);
  memset(want + DST_BYTES - 7, 0, 5);   /* the odd range is not copied this time */
  CHECK_EQ_INT(differing(d, want, got), 0);
  for (int i = 0; i < SRCS; i++) st_result_free(s[i]);
  for (int i = 0; i < DSTS; i++) st_result_free(d[i]);
  free(src_h);
  free(want);
  free(got);
  free(dst);
  free(src);
  free(bytes);
}

#endif

int main(int argc, char **argv) {
#ifdef ST_HAVE_CUDA
  if (argc == 3 && strcmp(argv[1], "--child") == 0) return child(argv[2]);
#else
  (void)argc;
  (void)argv;
#endif
  gk_require_device();
#ifdef ST_HAVE_CUDA
  cli = stt_one_worker_client(&srv, NULL);
  if (!cli) return 1;
  if (run_publisher() != 0) {
    fprintf(stderr, "the publisher failed\n");
    return 1;
  }
  RUN(device_to_device_into_memory_of_this_process);
  RUN(device_to_host_and_host_to_device);
  RUN(a_second_get_into_maps_nothing_new);
  RUN(copy_ranges_merges_only_what_follows_on_both_sides);
  RUN(copy_ranges_batches_ranges_of_separate_allocations);
  return stt_client_finish(cli, &srv);
#else
  return 77;
#endif
}
