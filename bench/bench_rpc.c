/* bench_rpc: control-plane latency and throughput of stserver, against a raw
 * Unix-socket ping-pong measured in the same run.
 *
 *   bench_rpc [--iters N] [--clients N] [--seconds S]
 *
 * Starts its own stserver (a temp dir, the endpoints below) and prints:
 *   - raw UDS ping-pong, 64 B each way (a forked echo process): p50/p99
 *   - stserver ping through libstclient: p50/p99
 *   - call returning a 16-float CPU tensor (map + unmap included): p50/p99
 *   - call returning a fresh 2 MiB CPU tensor, from the connection's result
 *     pool and, with ST_CLIENT_POOL=0, as an arena of its own: p50/p99;
 *     once st.empty (the allocation path alone: no contents promised,
 *     no fill) and once st.ones (written whole: no zero fill, one pass
 *     of the fill kernel)
 *   - calls/s of that call with 1 client and with N client processes
 * Timings are printed, never asserted (shared machines are noisy).
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture.h"
#include "kit.h"
#include "st/client.h"

/* Raw baseline: a forked process echoes 64-byte messages on a UDS. */
static void bench_raw(const char *dir, int iters) {
  double *us = malloc(sizeof(double) * (size_t)iters);
  bk_raw_pingpong(dir, us, iters);
  bk_report("raw UDS ping-pong 64 B (baseline)", us, iters);
  free(us);
}

static void bench_ping(const char *sock, int iters) {
  st_client_t *c = bk_connect(sock);
  double *us = malloc(sizeof(double) * (size_t)iters);
  for (int i = -100; i < iters; i++) {
    double t0 = stt_now_ms();
    if (st_client_ping(c, NULL) != ST_OK) exit(1);
    if (i >= 0) us[i] = (stt_now_ms() - t0) * 1e3;
  }
  bk_report("stserver ping (libstclient)", us, iters);
  free(us);
  st_client_close(c);
}

static int one_call(st_client_t *c) {
  st_result_t *r;
  if (st_client_call(c, "tensor16", NULL, &r) != ST_OK) {
    fprintf(stderr, "call: %s\n", st_client_error(c));
    return -1;
  }
  const st_tensor_t *t = st_result_tensor(r, 0);
  int ok = t && t->numel == 16 && ((float *)t->data)[15] == 15.0f;
  st_result_free(r);
  return ok ? 0 : -1;
}

static void bench_call(const char *sock, int iters) {
  st_client_t *c = bk_connect(sock);
  double *us = malloc(sizeof(double) * (size_t)iters);
  for (int i = -100; i < iters; i++) {
    double t0 = stt_now_ms();
    if (one_call(c) != 0) exit(1);
    if (i >= 0) us[i] = (stt_now_ms() - t0) * 1e3;
  }
  bk_report("call -> 16 x float32 CPU tensor, mapped", us, iters);
  free(us);
  st_client_close(c);
}

/* A fresh 2 MiB result (not cached) of endpoint `ep`, read at both ends
 * and freed: every element is *expect, or anything when expect is NULL
 * (st.empty promises no contents). */
static int fresh_call(st_client_t *c, const char *ep, const float *expect) {
  st_result_t *r;
  if (st_client_call(c, ep, NULL, &r) != ST_OK) {
    fprintf(stderr, "call: %s\n", st_client_error(c));
    return -1;
  }
  const st_tensor_t *t = st_result_tensor(r, 0);
  int ok = t && t->nbytes == 2u << 20;
  if (ok) {
    volatile float first = ((float *)t->data)[0], last = ((float *)t->data)[t->numel - 1];
    ok = !expect || (first == *expect && last == *expect);
  }
  st_result_free(r);
  return ok ? 0 : -1;
}

/* The fresh 2 MiB call of `ep` (st.empty: any contents, st.ones: ones) on a
 * connection with the result pool (pooled) or without (ST_CLIENT_POOL=0
 * while it connects). */
static void bench_fresh(const char *sock, const char *ep, int iters, int pooled) {
  if (!pooled) setenv("ST_CLIENT_POOL", "0", 1);
  st_client_t *c = bk_connect(sock);
  unsetenv("ST_CLIENT_POOL");
  int ones = strcmp(ep, "fresh2m") == 0;
  double *us = malloc(sizeof(double) * (size_t)iters);
  for (int i = -20; i < iters; i++) {
    double t0 = stt_now_ms();
    static const float one = 1.0f;
    if (fresh_call(c, ep, ones ? &one : NULL) != 0) exit(1);
    if (i >= 0) us[i] = (stt_now_ms() - t0) * 1e3;
  }
  char label[128];
  snprintf(label, sizeof label, "call -> fresh 2 MiB CPU tensor, st.%s, %s", ones ? "ones" : "empty",
           pooled ? "result pool" : "own arena (ST_CLIENT_POOL=0)");
  bk_report(label, us, iters);
  free(us);
  st_client_close(c);
}

int main(int argc, char **argv) {
  int spin_us = -1;   /* --spin-us: the server's default */
  int iters = 20000, clients = 16;
  double seconds = 3;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--spin-us") && i + 1 < argc) spin_us = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--clients") && i + 1 < argc) clients = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_rpc [--iters N] [--spin-us N] [--clients N] [--seconds S]\n");
      return 2;
    }
  }
  bk_setup();

  stt_server_t s;
  stt_server_init(&s);
  stt_write_endpoint(&s, "bench.lua",
                     "return st.endpoint{ name = 'tensor16',\n"
                     "  build = function() return st.arange{16, dtype = 'float32'} end }\n");
  stt_write_endpoint(&s, "fresh.lua",
                     "return st.endpoint{ name = 'fresh2m',\n"
                     "  build = function() return st.ones{524288, dtype = 'float32'} end }\n");
  stt_write_endpoint(&s, "empty.lua",
                     "return st.endpoint{ name = 'empty2m',\n"
                     "  build = function() return st.empty{524288, dtype = 'float32'} end }\n");
  bk_server_config(&s, spin_us);
  if (stt_server_start(&s) != 0) return 1;

  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  printf("bench_rpc: %ld CPUs, %d iterations per latency figure\n", ncpu, iters);
  bench_raw(s.dir, iters);
  bench_ping(s.socket, iters);
  bench_call(s.socket, iters);
  int fresh_iters = iters / 10 > 200 ? iters / 10 : 200;
  for (int pooled = 1; pooled >= 0; pooled--) {
    bench_fresh(s.socket, "empty2m", fresh_iters, pooled);
    bench_fresh(s.socket, "fresh2m", fresh_iters, pooled);
  }
  bk_throughput("calls/s", s.socket, 1, seconds, NULL, one_call);
  bk_throughput("calls/s", s.socket, clients, seconds, NULL, one_call);

  int rc = stt_server_stop(&s);
  stt_server_cleanup(&s);
  return rc == 0 ? 0 : 1;
}
