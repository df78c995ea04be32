/* bench_handoff_remote: per-request KV blocks from a producer on one
 * stserver to a consumer behind another (a hand-off across servers,
 * docs/multihost.md "Hand-offs across servers"), next to the same bytes
 * over a plain TCP connection on loopback and UCX's own figure (figures
 * in docs/benchmarks.md, "Hand-offs across servers").
 *
 *   build/bench/bench_handoff_remote [--blocks 16] [--block-kib 2048]
 *       [--requests 50] [--device cpu|cuda] [--python]
 *
 * Two servers on this host acting as two hosts ("alpha" exports the
 * hand-off, "beta" mirrors it; UCX over TCP on lo). Per request the
 * producer on alpha acquires `blocks` chunks, stamps each (the KV writes
 * themselves are the prefill's work, not the transfer's), publishes them;
 * the consumer on beta reads each ticket (waiting for its bytes), checks
 * the stamp and acknowledges. A request's time runs from its first
 * acquire to its last acknowledgement on beta. --python runs
 * bench_handoff_remote.py on the same two servers (the same request
 * through the Python package). Then the floors: the request's bytes
 * written by one process and read by another over TCP on loopback, and
 * ucx_perftest (tag_lat, one block a message) when installed. */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/wait.h>

#include "cudadrv/driver.h"
#include "kit.h"
#include "remote_kit.h"

static void die(const char *what, const char *why) {
  fprintf(stderr, "bench_handoff_remote: %s: %s\n", what, why ? why : "");
  exit(1);
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* "label: p50 X ms (Y GB/s), p99 Z ms" of n request times (ms). */
static void report(const char *label, double *ms, int n, uint64_t bytes) {
  qsort(ms, (size_t)n, sizeof *ms, cmp);
  double p50 = ms[n / 2];
  printf("%-40s p50 %8.3f ms (%6.2f GB/s)   p99 %8.3f ms   min %8.3f ms\n", label, p50,
         (double)bytes / (p50 / 1e3) / 1e9, ms[(int)(n * 0.99)], ms[0]);
}

/* The stamp of block i of request r, in a chunk's first and last 8 bytes. */
static uint64_t stamp(int r, int i) { return ((uint64_t)r << 20) ^ (uint64_t)i ^ 0x5eedull; }

/* dev: the CUDA ordinal of a chunk's memory, -1 for the CPU. */
static void put_stamp(void *chunk, uint64_t bytes, uint64_t v, int dev) {
  uint8_t *p = chunk;
  if (dev >= 0) {
    uint64_t at = (uint64_t)(uintptr_t)p;
    if (st__cuda_copy_to_device(at, &v, sizeof v, dev, NULL, 0) != 0 ||
        st__cuda_copy_to_device(at + bytes - sizeof v, &v, sizeof v, dev, NULL, 0) != 0)
      die("stamp", "a copy to the device failed");
    return;
  }
  memcpy(p, &v, sizeof v);
  memcpy(p + bytes - sizeof v, &v, sizeof v);
}

static int has_stamp(const void *chunk, uint64_t bytes, uint64_t v, int dev) {
  uint64_t a, b;
  const uint8_t *p = chunk;
  if (dev >= 0) {
    uint64_t at = (uint64_t)(uintptr_t)p;
    if (st__cuda_copy_to_host(&a, at, sizeof a, dev, NULL, 0) != 0 ||
        st__cuda_copy_to_host(&b, at + bytes - sizeof b, sizeof b, dev, NULL, 0) != 0)
      return 0;
  } else {
    memcpy(&a, p, sizeof a);
    memcpy(&b, p + bytes - sizeof b, sizeof b);
  }
  return a == v && b == v;
}

/* Requests through the hand-off; ms[r] each one's time. */
static void handoff_requests(int blocks, uint64_t block, int requests, const char *device,
                             double *ms) {
  st_client_t *pc = bk_connect(ALPHA.socket), *cc = bk_connect(BETA.socket);
  st_handoff_t *p = NULL, *h = NULL;
  if (st_handoff_create(pc, "kvbench", device, block, blocks, 1, &p) != ST_OK)
    die("handoff_create", st_client_error(pc));
  if (st_handoff_open(cc, "kvbench@alpha", &h) != ST_OK)
    die("handoff_open kvbench@alpha", st_client_error(cc));
  int dev = -1, cdev = -1;
  st_handoff_shape(p, NULL, NULL, NULL, NULL, &dev);
  st_handoff_shape(h, NULL, NULL, NULL, NULL, &cdev);
  int *chunk = calloc((size_t)blocks, sizeof *chunk);
  uint64_t *seq = calloc((size_t)blocks, sizeof *seq);
  for (int r = -2; r < requests; r++) {   /* two warm-up requests: every page touched */
    double t0 = stt_now_ms();
    for (int i = 0; i < blocks; i++) {
      void *data;
      if (st_handoff_acquire(p, 10000, &chunk[i], &data) != ST_OK)
        die("acquire", st_handoff_error(p));
      if (r < 0 && dev < 0) memset(data, 0x3c, block);
      put_stamp(data, block, stamp(r + 2, i), dev);
      if (st_handoff_publish(p, chunk[i], block, &seq[i]) != ST_OK)
        die("publish", st_handoff_error(p));
    }
    for (int i = 0; i < blocks; i++) {
      void *data;
      uint64_t got;
      if (st_handoff_read(h, chunk[i], seq[i], 30000, &data, &got) != ST_OK)
        die("read on beta", st_handoff_error(h));
      if (got != block || !has_stamp(data, block, stamp(r + 2, i), cdev))
        die("read on beta", "the block's bytes are not the producer's");
      if (st_handoff_ack(h, chunk[i], seq[i]) != ST_OK) die("ack", st_handoff_error(h));
    }
    if (r >= 0) ms[r] = stt_now_ms() - t0;
  }
  free(chunk);
  free(seq);
  st_handoff_close(h);
  st_handoff_close(p);
  st_client_close(cc);
  st_client_close(pc);
}

static void full_write(int fd, const uint8_t *p, uint64_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w <= 0) die("tcp write", strerror(errno));
    p += w;
    n -= (uint64_t)w;
  }
}

static void full_read(int fd, uint8_t *p, uint64_t n) {
  while (n) {
    ssize_t r = read(fd, p, n);
    if (r <= 0) die("tcp read", r ? strerror(errno) : "closed");
    p += r;
    n -= (uint64_t)r;
  }
}

/* The floor: the request's bytes from this process to a forked one over
 * TCP on loopback, the reader answering one byte once it has them all. */
static void tcp_requests(uint64_t bytes, int requests, double *ms) {
  int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof sa;
  if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(ls, 1) != 0 ||
      getsockname(ls, (struct sockaddr *)&sa, &len) != 0)
    die("tcp listen", strerror(errno));
  uint8_t *buf = malloc(bytes);
  if (!buf) die("tcp", "out of memory");
  memset(buf, 0x3c, bytes);
  pid_t pid = fork();
  if (pid == 0) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) _exit(1);
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (int r = 0; r < requests + 2; r++) {
      full_read(s, buf, bytes);
      full_write(s, buf, 1);
    }
    _exit(0);
  }
  int s = accept(ls, NULL, NULL);
  if (s < 0) die("tcp accept", strerror(errno));
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  for (int r = -2; r < requests; r++) {
    double t0 = stt_now_ms();
    full_write(s, buf, bytes);
    full_read(s, buf, 1);
    if (r >= 0) ms[r] = stt_now_ms() - t0;
  }
  close(s);
  close(ls);
  waitpid(pid, NULL, 0);
  free(buf);
}

int main(int argc, char **argv) {
  int blocks = 16, kib = 2048, requests = 50, python = 0;
  const char *device = "cpu";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--blocks") && i + 1 < argc) blocks = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--block-kib") && i + 1 < argc) kib = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--requests") && i + 1 < argc) requests = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
    else if (!strcmp(argv[i], "--python")) python = 1;
    else {
      fprintf(stderr, "usage: bench_handoff_remote [--blocks 16] [--block-kib 2048] "
              "[--requests 50] [--device cpu|cuda] [--python]\n");
      return 2;
    }
  }
  if (blocks < 1 || blocks > 256 || kib < 1 || kib > 65536 || requests < 1 || requests > 100000)
    die("arguments", "--blocks 1..256, --block-kib 1..65536, --requests 1..100000");
  uint64_t block = (uint64_t)kib << 10, bytes = block * (uint64_t)blocks;
  bk_setup();
  rk_require();
  if (rk_start_with(((uint64_t)2 * bytes + 256 * RK_MIB), ", export = { 'kvbench*' }") != 0) {
    rk_stop();
    die("servers", "the two servers did not start or link");
  }
  printf("bench_handoff_remote: %d blocks of %d KiB a request (%.1f MiB), %d requests, %s, "
         "UCX_TLS=%s\n", blocks, kib, (double)bytes / (1 << 20), requests, device,
         getenv("UCX_TLS"));
  double *ms = calloc((size_t)requests, sizeof *ms);
  handoff_requests(blocks, block, requests, device, ms);
  report("hand-off across servers (C)", ms, requests, bytes);
  if (python) {
    /* The package loads the libstclient this program runs with. */
    Dl_info lib;
    if (dladdr((void *)st_client_connect, &lib) && lib.dli_fname)
      setenv("ST_CLIENT_LIB", lib.dli_fname, 0);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "PYTHONPATH='%s/python' \"${ST_PYTHON:-python3}\" '%s/bench/bench_handoff_remote.py' "
             "'%s' '%s' --blocks %d --block-kib %d --requests %d --device %s",
             ST_BENCH_SOURCE_DIR, ST_BENCH_SOURCE_DIR, ALPHA.socket, BETA.socket, blocks, kib,
             requests, device);
    fflush(stdout);
    if (system(cmd) != 0) printf("bench_handoff_remote.py failed\n");
  }
  if (rk_stop() != 0) die("servers", "a server did not exit cleanly");
  tcp_requests(bytes, requests, ms);
  report("the same bytes over TCP on loopback", ms, requests, bytes);
  bk_ucx_perftest("tag_lat", (unsigned long long)block, "the engine's own, one block");
  free(ms);
  return 0;
}
