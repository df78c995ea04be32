/* bench_streams: named buffers from C (docs/streams.md, "Measured").
 *
 *     build/bench/bench_streams --socket PATH [--iters N]
 *     (or through bench/bench_streams.py, which starts a server and adds
 *     the Python rows)
 *
 * Rows, each next to its floor in the same run:
 *   - memcpy: a 128x128 float32 frame (64 KiB) copied in and out again,
 *     the raw cost of a write + read round trip;
 *   - write+read: st_buffer_write then st_buffer_read of that frame (a
 *     consistent copy) on one handle, in kHz of round trips;
 *   - read_new wake-up: a writer process and a reader process blocked in
 *     st_buffer_read_new ping-pong over two buffers; each side stamps
 *     CLOCK_MONOTONIC into the frame before its write and the other side
 *     measures the time to its wake-up and read (p50, p99).
 * Timings are printed, never asserted.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kit.h"

#define SIDE 128
#define FRAME ((uint64_t)SIDE * SIDE * 4)

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void must(int rc, const char *what, st_buffer_t *b) {
  if (rc == ST_OK) return;
  fprintf(stderr, "%s: %s (%s)\n", what, st_err_name(rc), b ? st_buffer_error(b) : "");
  exit(1);
}

static st_buffer_t *make(st_client_t *c, const char *name, int slots) {
  int64_t shape[2] = {SIDE, SIDE};
  st_buffer_t *b = NULL;
  st_buffer_unlink(c, name);
  if (st_buffer_create(c, name, "cpu", ST_DTYPE_FLOAT32, 2, shape, slots, &b) != ST_OK) {
    fprintf(stderr, "create %s: %s\n", name, st_client_error(c));
    exit(1);
  }
  return b;
}

static void rate(const char *what, int iters, double us) {
  printf("%-44s %8.1f kHz   %6.2f us per round trip\n", what, iters / us * 1e3, us / iters);
}

static void memcpy_row(int iters) {
  static float src[SIDE * SIDE], mid[SIDE * SIDE], dst[SIDE * SIDE];
  for (int i = 0; i < SIDE * SIDE; i++) src[i] = (float)i;
  double t0 = now_us();
  for (int i = 0; i < iters; i++) {
    src[0] = (float)i;
    memcpy(mid, src, FRAME);
    __asm__ volatile("" ::: "memory");
    memcpy(dst, mid, FRAME);
    __asm__ volatile("" ::: "memory");
  }
  rate("memcpy in + out (128x128 float32)", iters, now_us() - t0);
}

static void roundtrip_row(st_client_t *c, int iters, int slots) {
  st_buffer_t *b = make(c, "bench_rt", slots);
  static float src[SIDE * SIDE], dst[SIDE * SIDE];
  for (int i = 0; i < iters / 10; i++) {   /* warm-up */
    must(st_buffer_write(b, src, FRAME, -1, NULL), "write", b);
    must(st_buffer_read(b, dst, FRAME, 1000, NULL, NULL), "read", b);
  }
  double t0 = now_us();
  for (int i = 0; i < iters; i++) {
    src[0] = (float)i;
    must(st_buffer_write(b, src, FRAME, -1, NULL), "write", b);
    must(st_buffer_read(b, dst, FRAME, 1000, NULL, NULL), "read", b);
  }
  char what[64];
  snprintf(what, sizeof what, "st_buffer write+read (slots %d)", slots);
  rate(what, iters, now_us() - t0);
  st_buffer_close(b);
  st_buffer_unlink(c, "bench_rt");
}

/* One side of the ping-pong: reads `in` with read_new, measures the
 * stamp's age, writes `out` with a fresh stamp. The opener writes first. */
static void pingpong(const char *sock, const char *in, const char *out, int iters, int first,
                     double *lat, int ready_fd) {
  st_client_t *c = bk_connect(sock);
  st_buffer_t *r = NULL, *w = NULL;
  must(st_buffer_open(c, in, 0, &r), "open in", NULL);
  must(st_buffer_open(c, out, 0, &w), "open out", NULL);
  /* A handle's read_new waits for writes after it opened: the first
   * write waits until the other side is open. */
  char byte = 1;
  if (!first && write(ready_fd, &byte, 1) != 1) exit(1);
  if (first && read(ready_fd, &byte, 1) != 1) exit(1);
  static double frame[SIDE * SIDE / 2];
  int n = 0;
  if (first) {
    frame[0] = now_us();
    must(st_buffer_write(w, frame, FRAME, -1, NULL), "write", w);
  }
  while (n < iters) {
    must(st_buffer_read_new(r, frame, FRAME, 10000, NULL, NULL), "read_new", r);
    lat[n++] = now_us() - frame[0];
    frame[0] = now_us();
    must(st_buffer_write(w, frame, FRAME, -1, NULL), "write", w);
  }
  st_buffer_close(r);
  st_buffer_close(w);
  st_client_close(c);
}

static void wake_row(st_client_t *c, const char *sock, int iters) {
  st_buffer_t *a = make(c, "bench_ping", 2), *b = make(c, "bench_pong", 2);
  int p[2], ready[2];
  if (pipe(p) != 0 || pipe(ready) != 0) exit(1);
  fflush(NULL);
  pid_t pid = fork();
  double *lat = calloc((size_t)iters, sizeof *lat);
  if (pid == 0) {
    close(p[0]);
    pingpong(sock, "bench_ping", "bench_pong", iters, 0, lat, ready[1]);
    if (write(p[1], lat, (size_t)iters * sizeof *lat) < 0) _exit(1);
    _exit(0);
  }
  close(p[1]);
  double *mine = calloc((size_t)iters, sizeof *mine);
  pingpong(sock, "bench_pong", "bench_ping", iters, 1, mine, ready[0]);
  size_t got = 0, want = (size_t)iters * sizeof *lat;
  while (got < want) {
    ssize_t k = read(p[0], (char *)lat + got, want - got);
    if (k <= 0) break;
    got += (size_t)k;
  }
  waitpid(pid, NULL, 0);
  double *all = calloc((size_t)iters * 2, sizeof *all);
  memcpy(all, lat, (size_t)iters * sizeof *all);
  memcpy(all + iters, mine, (size_t)iters * sizeof *all);
  bk_report("read_new wake-up (write -> reader has it)", all, iters * 2);
  free(all);
  free(lat);
  free(mine);
  st_buffer_close(a);
  st_buffer_close(b);
  st_buffer_unlink(c, "bench_ping");
  st_buffer_unlink(c, "bench_pong");
}

int main(int argc, char **argv) {
  const char *sock = NULL;
  int iters = 100000;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--socket") && i + 1 < argc) sock = argv[++i];
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_streams --socket PATH [--iters N]\n");
      return 2;
    }
  }
  if (!sock || iters < 10) {
    fprintf(stderr, "bench_streams: --socket is required, --iters >= 10\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  st_client_t *c = bk_connect(sock);
  memcpy_row(iters);
  roundtrip_row(c, iters, 1);
  roundtrip_row(c, iters, 4);
  wake_row(c, sock, iters / 10 < 20000 ? iters / 10 : 20000);
  st_client_close(c);
  return 0;
}
