/* CUDA arenas across processes (docs/design.md, section 3, decision 1): a
 * holder process (the server's role) allocates an arena, fills it with a kernel and sends a
 * dup of the exported descriptor; a client process (a second exec of this
 * binary) receives it over a Unix socket with SCM_RIGHTS, imports and maps
 * it, and checks every element. Then the holder releases everything and is
 * killed with SIGKILL; the client keeps reading (and writing) its mapping,
 * because the driver keeps the memory while any mapping exists. Once the
 * client unmaps and exits, device memory returns to its baseline.
 *
 *   test_gpu_ipc                 the test (this process relays the fd)
 *   test_gpu_ipc holder <fd>     the server side
 *   test_gpu_ipc client <fd>     the client side
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "common/philox.h"
#include "mem/arena.h"
#include "mem/cuda.h"
#include "st/dtype.h"

#ifdef ST_HAVE_CUDA
#include "cuda/kernels.h"
#endif

#ifdef ST_HAVE_CUDA

#define MiB (1024ull * 1024ull)
#define N_ELEMS 5000011          /* float32 elements: not a granule multiple */
#define SEED 0x5eedULL
#define WAIT_MS 60000

typedef struct {
  char tag[16];
  uint64_t bytes;                /* allocated (mapped) size */
  int64_t n;
  uint64_t seed;
  char uuid[ST_CUDA_UUID_LEN];
  int status;                    /* 0 ok, else a failure count */
  char text[200];
} msg_t;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Sends m, with fd attached when fd >= 0. 0 on success. */
static int send_msg(int sock, const msg_t *m, int fd) {
  struct iovec iov = {.iov_base = (void *)m, .iov_len = sizeof *m};
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int))];
  } ctl;
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  if (fd >= 0) {
    memset(&ctl, 0, sizeof ctl);
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof ctl.buf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  ssize_t w;
  do w = sendmsg(sock, &mh, MSG_NOSIGNAL);
  while (w < 0 && errno == EINTR);
  return w == (ssize_t)sizeof *m ? 0 : -1;
}

/* Receives one message within WAIT_MS (the peers are local processes, a
 * message is far below the socket buffer, so it arrives whole). *fd gets
 * an attached descriptor or -1. 0 on success, -1 on timeout/EOF/error. */
static int recv_msg(int sock, msg_t *m, int *fd) {
  if (fd) *fd = -1;
  struct pollfd p = {.fd = sock, .events = POLLIN};
  int pr;
  do pr = poll(&p, 1, WAIT_MS);
  while (pr < 0 && errno == EINTR);
  if (pr <= 0) return -1;
  struct iovec iov = {.iov_base = m, .iov_len = sizeof *m};
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int))];
  } ctl;
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                      .msg_controllen = sizeof ctl.buf};
  ssize_t r;
  do r = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_WAITALL);
  while (r < 0 && errno == EINTR);
  if (r != (ssize_t)sizeof *m) return -1;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && fd)
      memcpy(fd, CMSG_DATA(c), sizeof *fd);
  m->tag[sizeof m->tag - 1] = '\0';
  m->text[sizeof m->text - 1] = '\0';
  return 0;
}

static msg_t tagged(const char *tag) {
  msg_t m;
  memset(&m, 0, sizeof m);
  snprintf(m.tag, sizeof m.tag, "%s", tag);
  return m;
}

/* Expected element i: the CPU generator stored as float32. */
static float expected(uint64_t seed, int64_t i) {
  float f;
  st_dtype_store(ST_DTYPE_FLOAT32, &f, 0, st__rng_uniform(seed, (uint64_t)i, 0));
  return f;
}

/* Copies the mapping to the host and counts elements that differ from the
 * generator (or from `fill` for the first `nfill` elements). */
static long count_bad(const st__cuda_mapping_t *m, int64_t n, uint64_t seed, int64_t nfill,
                      float fill, char *err, size_t errlen) {
  float *h = malloc((size_t)n * sizeof *h);
  if (!h) return -1;
  if (st__cuda_copy_to_host(h, m->dptr, (uint64_t)n * 4, m->ordinal, err, errlen) != ST_OK) {
    free(h);
    return -1;
  }
  long bad = 0;
  for (int64_t i = 0; i < n; i++) {
    float want = i < nfill ? fill : expected(seed, i);
    if (memcmp(&h[i], &want, 4) != 0) bad++;
  }
  free(h);
  return bad;
}

/* The server side: allocate, fill, send a dup; on "release" drop every
 * reference and descriptor, answer, and wait to be killed. */
static int run_holder(int sock) {
  char err[512];
  msg_t m = tagged("arena");
  st__arena_t *a = NULL;
  const st__gen_t uniform = {.kind = ST__GEN_RAND, .seed = SEED};   /* float32: 24 bits */
  if (st__arena_new_cuda(0, (uint64_t)N_ELEMS * 4, &a, err, sizeof err) != ST_OK ||
      st__cuda_generate(st__arena_base(a), ST_DTYPE_FLOAT32, N_ELEMS, &uniform, NULL, err,
                        sizeof err) != ST_OK ||
      st__cuda_api(NULL, 0)->cuStreamSynchronize(NULL) != CUDA_SUCCESS) {
    m.status = 1;
    snprintf(m.text, sizeof m.text, "holder: %.180s", err);
    send_msg(sock, &m, -1);
    return 1;
  }
  st__arena_desc_t d = {0};
  st__arena_describe(a, &d);
  m.bytes = d.bytes;
  m.n = N_ELEMS;
  m.seed = SEED;
  snprintf(m.uuid, sizeof m.uuid, "%s", d.uuid);
  int fd = st__arena_dup_fd(a, NULL, 0);
  if (send_msg(sock, &m, fd) != 0) return 1;
  close(fd);
  if (recv_msg(sock, &m, NULL) != 0 || strcmp(m.tag, "release") != 0) return 1;
  st__arena_unref(a);                     /* unmap, free VA, release, close */
  uint64_t count, bytes;
  st__arena_stats(&count, &bytes);
  msg_t r = tagged("released");
  r.status = count == 0 ? 0 : 1;
  snprintf(r.text, sizeof r.text, "holder: %llu arenas live", (unsigned long long)count);
  send_msg(sock, &r, -1);
  /* Wait for SIGKILL (or EOF when the test gives up). */
  recv_msg(sock, &m, NULL);
  return 0;
}

/* The client side: import, verify, report; after "reread" verify again,
 * write through the mapping, verify the write, unmap. */
static int run_client(int sock) {
  char err[512] = "";
  msg_t m;
  int fd;
  if (recv_msg(sock, &m, &fd) != 0 || fd < 0) return 1;
  st__cuda_mapping_t map;
  msg_t r = tagged("mapped");
  double t0 = now_ms();
  int rc = st__cuda_import(fd, m.bytes, m.uuid, &map, err, sizeof err);
  double t1 = now_ms();
  close(fd);
  if (rc != ST_OK) {
    r.status = 1;
    snprintf(r.text, sizeof r.text, "client import: %.180s", err);
    send_msg(sock, &r, -1);
    return 1;
  }
  long bad = count_bad(&map, m.n, m.seed, 0, 0, err, sizeof err);
  r.status = bad != 0;
  snprintf(r.text, sizeof r.text, "client: import+map %.3f ms (first, with context), %ld bad of %lld",
           t1 - t0, bad, (long long)m.n);
  send_msg(sock, &r, -1);

  msg_t q;
  if (recv_msg(sock, &q, NULL) != 0 || strcmp(q.tag, "reread") != 0) return 1;
  r = tagged("reread");
  bad = count_bad(&map, m.n, m.seed, 0, 0, err, sizeof err);
  long bad2 = -1;
  if (bad == 0 &&
      st__cuda_fill((void *)(uintptr_t)map.dptr, ST_DTYPE_FLOAT32, 1000, -1.5, NULL, err,
                    sizeof err) == ST_OK &&
      st__cuda_api(NULL, 0)->cuStreamSynchronize(NULL) == CUDA_SUCCESS)
    bad2 = count_bad(&map, m.n, m.seed, 1000, -1.5f, err, sizeof err);
  r.status = !(bad == 0 && bad2 == 0);
  snprintf(r.text, sizeof r.text, "client after the holder died: %ld bad, after a write %ld bad %.100s",
           bad, bad2, err);
  st__cuda_unmap(&map);
  send_msg(sock, &r, -1);
  return r.status;
}

/* fork + exec of this binary as `role`, handing it `sock` (its end of a
 * socketpair). Returns the pid, or -1. */
static pid_t spawn(const char *role, int sock) {
  char num[16];
  snprintf(num, sizeof num, "%d", sock);
  pid_t pid = fork();
  if (pid != 0) return pid;
  /* Child: only async-signal-safe calls until exec. */
  fcntl(sock, F_SETFD, 0);
  char *argv[] = {(char *)"test_gpu_ipc", (char *)role, num, NULL};
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
    struct timespec ts = {0, 5 * 1000 * 1000};   /* poll the child's exit */
    nanosleep(&ts, NULL);
  }
}

static pid_t holder = -1, client = -1;

/* Kills what a failed check left running. */
static void reap_children(void) {
  pid_t *pids[] = {&holder, &client};
  for (int i = 0; i < 2; i++) {
    if (*pids[i] <= 0) continue;
    kill(*pids[i], SIGKILL);
    waitpid(*pids[i], NULL, 0);
    *pids[i] = -1;
  }
}

TEST(client_outlives_the_holder) {
  char err[512];
  uint64_t base_free, total, free_now = 0;
  CHECK_ERR_MSG(st__cuda_mem_info(0, &base_free, &total, err, sizeof err), ST_OK, err);

  int hs[2], cs[2];
  CHECK_EQ_INT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, hs), 0);
  CHECK_EQ_INT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, cs), 0);
  holder = spawn("holder", hs[1]);
  CHECK(holder > 0);
  close(hs[1]);
  client = spawn("client", cs[1]);
  CHECK(client > 0);
  close(cs[1]);

  msg_t m;
  int fd = -1;
  CHECK_EQ_INT(recv_msg(hs[0], &m, &fd), 0);
  if (m.status) fprintf(stderr, "   %s\n", m.text);
  CHECK_STR_EQ(m.tag, "arena");
  CHECK(fd >= 0);
  CHECK(m.bytes % (2 * MiB) == 0 && m.bytes >= (uint64_t)N_ELEMS * 4);
  /* This process relays the descriptor: the client's copy comes through a
   * second SCM_RIGHTS hop. */
  CHECK_EQ_INT(send_msg(cs[0], &m, fd), 0);
  close(fd);

  msg_t r;
  CHECK_EQ_INT(recv_msg(cs[0], &r, NULL), 0);
  fprintf(stderr, "   %s\n", r.text);
  CHECK_STR_EQ(r.tag, "mapped");
  CHECK_EQ_INT(r.status, 0);

  msg_t rel = tagged("release");
  CHECK_EQ_INT(send_msg(hs[0], &rel, -1), 0);
  CHECK_EQ_INT(recv_msg(hs[0], &r, NULL), 0);
  fprintf(stderr, "   %s\n", r.text);
  CHECK_STR_EQ(r.tag, "released");
  CHECK_EQ_INT(r.status, 0);
  CHECK_EQ_INT(kill(holder, SIGKILL), 0);
  int st = 0;
  CHECK_EQ_INT(wait_exit(holder, &st), 0);
  holder = -1;
  CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  close(hs[0]);

  msg_t again = tagged("reread");
  CHECK_EQ_INT(send_msg(cs[0], &again, -1), 0);
  CHECK_EQ_INT(recv_msg(cs[0], &r, NULL), 0);
  fprintf(stderr, "   %s\n", r.text);
  CHECK_STR_EQ(r.tag, "reread");
  CHECK_EQ_INT(r.status, 0);
  CHECK_EQ_INT(wait_exit(client, &st), 0);
  client = -1;
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  close(cs[0]);

  /* Both processes are gone: their contexts and the allocation are freed
   * (the driver does so asynchronously; poll with a deadline). */
  double deadline = now_ms() + 10000;
  do {
    CHECK_ERR_MSG(st__cuda_mem_info(0, &free_now, NULL, err, sizeof err), ST_OK, err);
    if (free_now + 4 * MiB >= base_free) break;
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  } while (now_ms() < deadline);
  fprintf(stderr, "   free: %llu MiB at start, %llu MiB after both exited\n",
          (unsigned long long)(base_free / MiB), (unsigned long long)(free_now / MiB));
  CHECK(free_now + 4 * MiB >= base_free);
}

#endif

int main(int argc, char **argv) {
  char err[512];
  if (st__cuda_available(err, sizeof err) != ST_OK) stt_skip(err);
#ifdef ST_HAVE_CUDA
  if (argc == 3 && strcmp(argv[1], "holder") == 0) return run_holder(atoi(argv[2]));
  if (argc == 3 && strcmp(argv[1], "client") == 0) return run_client(atoi(argv[2]));
  RUN(client_outlives_the_holder);
  reap_children();
#endif
  return stt_summary();
}
