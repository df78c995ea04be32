/* libstclient maps CUDA arenas: the client path against a scripted server
 * that sends a real CUDA arena, descriptor and all, exactly as stserver
 * does (the real server is tests/client/test_gpu_server.c).
 *
 *   test_gpu_map                 the client (this process)
 *   test_gpu_map holder FD       the server's role: st__arena_new_cuda,
 *                                filled from the host, served by the fake
 *                                server; writes "<socket> <uuid>" to FD
 *   test_gpu_map client SOCKET   a second client process
 *
 * Checks: the tensor fields (device, ordinal, UUID, device address), values
 * through st_tensor_copy_to_host and st_tensor_get (contiguous and
 * strided), one import for one allocation named twice in a reply and again
 * by a second reply, the calling thread's context left alone, refusals of
 * descriptors that disagree with their allocation (no descriptor or
 * mapping leaks), a second process sharing the memory, reading and writing
 * after the holder is killed with SIGKILL, and device memory back at its
 * baseline once the results are freed. Exit 77 without a CUDA device. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <st/client.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "client_kit.h"
#include "fake_server.h"
#include "mem/arena.h"
#include "mem/cuda.h"

#ifdef ST_HAVE_CUDA
#include <cuda_runtime_api.h>

#define MiB (1024ull * 1024ull)
#define N_ELEMS 1000003                      /* float32 elements of tensor a */
#define OFF_B (((uint64_t)N_ELEMS * 4 + 255) / 256 * 256)
#define WAIT_MS 60000

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static float pattern(int64_t i) { return (float)(i % 1000) * 0.25f - 7.0f; }

/* ------------------------------------------------------------ the holder */

static fake_server_t fs;
static st__arena_t *arena;
static st__arena_desc_t desc;

/* One reply per endpoint name; every descriptor is a dup of the arena's. */
static int holder_request(fake_server_t *f, int conn, uint32_t id, const char *method,
                          const msgpack_object *params) {
  if (strcmp(method, "call") != 0) return fake_error(conn, id, 16, "UNKNOWN_METHOD", method);
  char ep[64];
  fake_param_str(params, "endpoint", ep, sizeof ep);
  int fds[2] = {st__arena_dup_fd(arena, NULL, 0), -1}, nfds = 1;
  unsigned long long bytes = desc.bytes, aid = desc.id;
  const char *uuid = desc.uuid;
  /* Tensor a: N_ELEMS floats at 0 of arena 0. */
#define TENSOR_A "tensor(0, 0, 'float32', [%d], [1])"
#define CUDA_ARENA(fd) "{fd: " #fd ", bytes: %llu, device: 'cuda', uuid: '%s', backend: 'vmm', id: %llu}"
  int rc;
  if (strcmp(ep, "pair") == 0) {
    /* Two arena entries naming the one allocation, as two tensors of a
     * cached object sent with two descriptors; b is a transposed 2x3. */
    fds[1] = st__arena_dup_fd(arena, NULL, 0);
    nfds = 2;
    rc = fake_replyf(conn, id, fds, nfds,
                     "{value: {a: " TENSOR_A ", b: tensor(1, %llu, 'float32', [3, 2], [1, 3])}, "
                     "arenas: [" CUDA_ARENA(0) ", " CUDA_ARENA(1) "]}",
                     N_ELEMS, (unsigned long long)OFF_B, bytes, uuid, aid, bytes, uuid, aid);
  } else {
    if (strcmp(ep, "too_big") == 0) bytes += 2 * MiB;       /* same id, larger claim */
    if (strcmp(ep, "odd_size") == 0) bytes -= 4096, aid += 1000;
    if (strcmp(ep, "wrong_uuid") == 0) uuid = "GPU-ffffffff-ffff-ffff-ffff-ffffffffffff";
    if (strcmp(ep, "memfd") == 0) {
      close(fds[0]);
      fds[0] = fake_memfd((size_t)bytes, NULL, 0, 1);
      aid += 2000;
    }
    rc = fake_replyf(conn, id, fds, nfds,
                     "{value: " TENSOR_A ", arenas: [" CUDA_ARENA(0) "]}",
                     N_ELEMS, bytes, uuid, aid);
  }
#undef CUDA_ARENA
#undef TENSOR_A
  for (int i = 0; i < nfds; i++) close(fds[i]);
  return rc;
}

/* Allocates and fills the arena, serves it, reports, waits to be killed. */
static int run_holder(int out) {
  char err[512], line[600];
  float *host = malloc((size_t)N_ELEMS * 4);
  float b[6] = {100, 101, 102, 103, 104, 105};
  int rc = host ? st__arena_new_cuda(0, OFF_B + sizeof b, &arena, err, sizeof err)
                : ST_ERR_OUT_OF_MEMORY;
  if (rc == ST_OK) {
    for (int64_t i = 0; i < N_ELEMS; i++) host[i] = pattern(i);
    uint64_t base = (uint64_t)(uintptr_t)st__arena_base(arena);
    rc = st__cuda_copy_to_device(base, host, (uint64_t)N_ELEMS * 4, 0, err, sizeof err);
    if (rc == ST_OK)
      rc = st__cuda_copy_to_device(base + OFF_B, b, sizeof b, 0, err, sizeof err);
  }
  free(host);
  if (rc != ST_OK) {
    snprintf(line, sizeof line, "ERR %s\n", err);
  } else {
    st__arena_describe(arena, &desc);
    fs.on_request = holder_request;
    fake_start(&fs);
    snprintf(line, sizeof line, "%s %s\n", fs.path, desc.uuid);
  }
  if (write(out, line, strlen(line)) != (ssize_t)strlen(line)) return 1;
  close(out);
  if (rc != ST_OK) return 1;
  for (;;) pause(); /* until SIGKILL */
}

/* -------------------------------------------------------- second client */

/* Maps the same allocation, checks the parent's write (element 7 =
 * 4242.5), writes element 8 = -1.25 for the parent to see. */
static int run_client(const char *socket) {
  char err[256];
  st_client_t *c;
  st_result_t *r;
  if (st_client_connect(socket, &c, err, sizeof err) != ST_OK) {
    fprintf(stderr, "second client: connect: %s\n", err);
    return 1;
  }
  if (st_client_call(c, "again", NULL, &r) != ST_OK) {
    fprintf(stderr, "second client: call: %s\n", st_client_error(c));
    return 1;
  }
  st_client_close(c);
  const st_tensor_t *t = st_result_tensor(r, 0);
  float *h = malloc(t->nbytes);
  if (!h || st_tensor_copy_to_host(t, h, t->nbytes) != ST_OK) return 1;
  long bad = 0;
  for (int64_t i = 0; i < t->numel; i++)
    if (i != 7 && i != 8 && h[i] != pattern(i)) bad++;
  if (h[7] != 4242.5f || bad) {
    fprintf(stderr, "second client: element 7 is %g, %ld others differ\n", h[7], bad);
    return 1;
  }
  float v = -1.25f;
  if (st__cuda_copy_to_device((uint64_t)(uintptr_t)t->data + 32, &v, 4, t->device_index, err,
                              sizeof err) != ST_OK) {
    fprintf(stderr, "second client: write: %s\n", err);
    return 1;
  }
  free(h);
  st_result_free(r);
  return 0;
}

/* ------------------------------------------------------------ the tests */

static pid_t holder = -1;
static char sock[128], uuid[ST_CUDA_UUID_LEN];
static uint64_t base_free;
static st_client_t *client;
static st_result_t *r1, *r2;
static size_t mapped0;
static uint64_t reused0;

static pid_t spawn(const char *role, const char *arg, int keep_fd) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  if (keep_fd >= 0) fcntl(keep_fd, F_SETFD, 0);
  char *argv[] = {(char *)"test_gpu_map", (char *)role, (char *)arg, NULL};
  execv("/proc/self/exe", argv);
  _exit(127);
}

static int wait_exit(pid_t pid, int *status) {
  double deadline = now_ms() + WAIT_MS;
  for (;;) {
    pid_t w = waitpid(pid, status, WNOHANG);
    if (w == pid) return 0;
    if (w < 0 && errno != EINTR) return -1;
    if (now_ms() > deadline) return -1;
    struct timespec ts = {0, 5 * 1000 * 1000}; /* polls the child's exit */
    nanosleep(&ts, NULL);
  }
}

/* Reads the holder's one line (poll with a deadline). 0 on success. */
static int read_line(int fd, char *buf, size_t len) {
  size_t used = 0;
  double deadline = now_ms() + WAIT_MS;
  while (used + 1 < len) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int left = (int)(deadline - now_ms());
    if (left <= 0 || poll(&p, 1, left) <= 0) return -1;
    ssize_t n = read(fd, buf + used, len - 1 - used);
    if (n <= 0) return -1;
    used += (size_t)n;
    buf[used] = '\0';
    if (strchr(buf, '\n')) return 0;
  }
  return -1;
}

TEST(maps_one_allocation_once) {
  char err[512];
  CHECK_ERR_MSG(st__cuda_mem_info(0, &base_free, NULL, err, sizeof err), ST_OK, err);
  int p[2];
  CHECK_EQ_INT(pipe2(p, O_CLOEXEC), 0);
  char num[16];
  snprintf(num, sizeof num, "%d", p[1]);
  holder = spawn("holder", num, p[1]);
  CHECK(holder > 0);
  close(p[1]);
  char line[700];
  int got = read_line(p[0], line, sizeof line);
  close(p[0]);
  CHECK_EQ_INT(got, 0);
  if (strncmp(line, "ERR", 3) == 0) fprintf(stderr, "   holder: %s", line);
  CHECK(sscanf(line, "%127s %47s", sock, uuid) == 2 && strncmp(line, "ERR", 3) != 0);
  fprintf(stderr, "   holder serves %s on %s\n", sock, uuid);

  CHECK_ERR_MSG(st_client_connect(sock, &client, err, sizeof err), ST_OK, err);
  st_open_cache_stats(&mapped0, &reused0);
  CHECK_RC(st_client_call(client, "pair", NULL, &r1), ST_OK, client);
  size_t mapped;
  uint64_t reused;
  st_open_cache_stats(&mapped, &reused);
  CHECK_EQ_INT(mapped, mapped0 + 1);  /* two arena entries, one import */
  CHECK_EQ_INT(reused, reused0 + 1);
  const st_tensor_t *a = st_result_find(r1, "a"), *b = st_result_find(r1, "b");
  CHECK(a && b);
  int ordinal = -1;
  CHECK_ERR_MSG(st__cuda_device_by_uuid(uuid, &ordinal, err, sizeof err), ST_OK, err);
  CHECK(a->device == ST_DEVICE_CUDA && b->device == ST_DEVICE_CUDA);
  CHECK_EQ_INT(a->device_index, ordinal);
  CHECK_STR_EQ(a->device_uuid, uuid);
  CHECK(a->data != NULL);
  CHECK_EQ_INT((char *)b->data - (char *)a->data, OFF_B);
  CHECK_EQ_INT(a->numel, N_ELEMS);

  CHECK_RC(st_client_call(client, "again", NULL, &r2), ST_OK, client);
  st_open_cache_stats(&mapped, &reused);
  CHECK_EQ_INT(mapped, mapped0 + 1); /* a second result: the same mapping */
  CHECK_EQ_INT(reused, reused0 + 2);
  CHECK(st_result_tensor(r2, 0)->data == a->data);
}

TEST(values_through_the_host) {
  const st_tensor_t *a = st_result_find(r1, "a"), *b = st_result_find(r1, "b");
  CHECK(a && b);
  float *h = malloc(a->nbytes);
  CHECK(h);
  double t0 = now_ms();
  int rc = st_tensor_copy_to_host(a, h, a->nbytes);
  double t1 = now_ms();
  long bad = 0;
  for (int64_t i = 0; i < a->numel; i++)
    if (h[i] != pattern(i)) bad++;
  free(h);
  CHECK_ERR(rc, ST_OK);
  CHECK_EQ_INT(bad, 0);
  fprintf(stderr, "   copy_to_host of %zu bytes: %.3f ms\n", a->nbytes, t1 - t0);
  t0 = now_ms();
  CHECK(st_tensor_get(a, 999999) == pattern(999999));
  fprintf(stderr, "   st_tensor_get: %.1f us\n", (now_ms() - t0) * 1e3);
  /* b is the transpose of [[100 101 102] [103 104 105]]. */
  float g[6], want[6] = {100, 103, 101, 104, 102, 105};
  CHECK_ERR(st_tensor_copy_to_host(b, g, sizeof g), ST_OK);
  CHECK(memcmp(g, want, sizeof g) == 0);
  for (int k = 0; k < 6; k++) CHECK(st_tensor_get(b, k) == want[k]);
  CHECK_ERR(st_tensor_copy_to_host(b, g, sizeof g - 1), ST_ERR_INVALID_ARGUMENT);
}

typedef CUresult (*get_current_fn)(CUcontext *);

static void *read_on_a_fresh_thread(void *arg) {
  int *ok = arg;
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &q) !=
          cudaSuccess || !fn)
    return NULL;
  get_current_fn get_current;
  memcpy(&get_current, &fn, sizeof fn);
  CUcontext before = (CUcontext)1, after = (CUcontext)1;
  get_current(&before);
  double v = st_tensor_get(st_result_find(r1, "a"), 5);
  float g[6];
  int rc = st_tensor_copy_to_host(st_result_find(r1, "b"), g, sizeof g);
  get_current(&after);
  *ok = before == NULL && after == NULL && v == pattern(5) && rc == ST_OK;
  return NULL;
}

TEST(leaves_the_thread_context_alone) {
  int ok = 0;
  pthread_t t;
  CHECK_EQ_INT(pthread_create(&t, NULL, read_on_a_fresh_thread, &ok), 0);
  pthread_join(t, NULL);
  CHECK_EQ_INT(ok, 1);
}

TEST(descriptors_that_disagree_are_refused) {
  int fds0 = fake_count_fds();
  size_t m0, m;
  st_open_cache_stats(&m0, NULL);
  st_result_t *r = NULL;
  CHECK_RC(st_client_call(client, "too_big", NULL, &r), ST_ERR_PROTOCOL, client);
  fprintf(stderr, "   too_big: %s\n", st_client_error(client));
  CHECK_RC(st_client_call(client, "odd_size", NULL, &r), ST_ERR_PROTOCOL, client);
  CHECK_CONTAINS(st_client_error(client), "granularity");
  /* Checked before the driver sees it: a VMM handle is a descriptor of the
   * NVIDIA control device, not a regular file. */
  CHECK_RC(st_client_call(client, "memfd", NULL, &r), ST_ERR_PROTOCOL, client);
  CHECK_CONTAINS(st_client_error(client),
                 "backend vmm, but the descriptor is a regular file, not an exported CUDA "
                 "allocation");
  CHECK_RC(st_client_call(client, "wrong_uuid", NULL, &r), ST_ERR_CAPABILITY, client);
  CHECK(strncmp(st_client_error(client), "no CUDA device: ", 16) == 0);
  CHECK_CONTAINS(st_client_error(client), "GPU-ffffffff-ffff-ffff-ffff-ffffffffffff");
  CHECK(r == NULL);
  st_open_cache_stats(&m, NULL);
  CHECK_EQ_INT(m, m0);
  CHECK_EQ_INT(fake_count_fds(), fds0);
  double rtt;
  CHECK_RC(st_client_ping(client, &rtt), ST_OK, client);
}

TEST(a_second_process_shares_the_memory) {
  const st_tensor_t *a = st_result_find(r2, "");
  CHECK(a);
  char err[256];
  float v = 4242.5f;
  CHECK_ERR_MSG(st__cuda_copy_to_device((uint64_t)(uintptr_t)a->data + 28, &v, 4, a->device_index,
                                        err, sizeof err),
                ST_OK, err);
  pid_t pid = spawn("client", sock, -1);
  CHECK(pid > 0);
  int st = 0;
  CHECK_EQ_INT(wait_exit(pid, &st), 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  CHECK(st_tensor_get(a, 8) == -1.25);  /* the other process's write */
}

TEST(reads_and_writes_after_the_holder_is_killed) {
  CHECK_EQ_INT(kill(holder, SIGKILL), 0);
  int st = 0;
  CHECK_EQ_INT(wait_exit(holder, &st), 0);
  holder = -1;
  CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  const st_tensor_t *a = st_result_find(r1, "a");
  float *h = malloc(a->nbytes);
  CHECK(h);
  CHECK_ERR(st_tensor_copy_to_host(a, h, a->nbytes), ST_OK);
  long bad = 0;
  for (int64_t i = 0; i < a->numel; i++)
    if (i != 7 && i != 8 && h[i] != pattern(i)) bad++;
  free(h);
  CHECK_EQ_INT(bad, 0);
  char err[256];
  float v = 3.5f;
  CHECK_ERR_MSG(st__cuda_copy_to_device((uint64_t)(uintptr_t)a->data, &v, 4, a->device_index, err,
                                        sizeof err),
                ST_OK, err);
  CHECK(st_tensor_get(a, 0) == 3.5);
  CHECK(st_tensor_get(st_result_tensor(r2, 0), 0) == 3.5);
}

TEST(memory_returns_to_the_baseline) {
  size_t mapped;
  st_result_free(r1);
  r1 = NULL;
  st_open_cache_stats(&mapped, NULL);
  CHECK_EQ_INT(mapped, mapped0 + 1); /* r2 still uses it */
  st_result_free(r2);
  r2 = NULL;
  st_open_cache_stats(&mapped, NULL);
  CHECK_EQ_INT(mapped, mapped0);
  /* The process keeps the unused mapping for reuse (kept arenas) until
   * the bound drops it: bound 0 unmaps it now. */
  size_t kept;
  st_open_cache_keep(0, 0);
  st_open_cache_kept(&kept, NULL);
  CHECK_EQ_INT(kept, 0);
  st_open_cache_keep(16, (uint64_t)256 * MiB);
  char err[256];
  uint64_t free_now = 0;
  double deadline = now_ms() + 10000;
  do {
    CHECK_ERR_MSG(st__cuda_mem_info(0, &free_now, NULL, err, sizeof err), ST_OK, err);
    if (free_now + 4 * MiB >= base_free) break;
    struct timespec ts = {0, 20 * 1000 * 1000}; /* the driver frees asynchronously */
    nanosleep(&ts, NULL);
  } while (now_ms() < deadline);
  fprintf(stderr, "   free: %llu MiB before the holder, %llu MiB now\n",
          (unsigned long long)(base_free / MiB), (unsigned long long)(free_now / MiB));
  CHECK(free_now + 4 * MiB >= base_free);
}

static void cleanup(void) {
  if (holder > 0) {
    kill(holder, SIGKILL);
    waitpid(holder, NULL, 0);
  }
  st_result_free(r1);
  st_result_free(r2);
  st_client_close(client);
  if (sock[0]) {
    unlink(sock);
    char *slash = strrchr(sock, '/');
    if (slash) {
      *slash = '\0';
      rmdir(sock);
    }
  }
}

#endif

int main(int argc, char **argv) {
  char err[512];
  if (st__cuda_available(err, sizeof err) != ST_OK) stt_skip(err);
#ifdef ST_HAVE_CUDA
  if (argc == 3 && strcmp(argv[1], "holder") == 0) return run_holder(atoi(argv[2]));
  if (argc == 3 && strcmp(argv[1], "client") == 0) return run_client(argv[2]);
  RUN(maps_one_allocation_once);
  if (!stt_failed) {
    RUN(values_through_the_host);
    RUN(leaves_the_thread_context_alone);
    RUN(descriptors_that_disagree_are_refused);
    RUN(a_second_process_shares_the_memory);
    RUN(reads_and_writes_after_the_holder_is_killed);
    RUN(memory_returns_to_the_baseline);
  }
  cleanup();
#endif
  return stt_summary();
}
