/* bench_percall: the per-call rows of issue 12 through libstclient, for
 * bench/bench_percall.py, which starts the server, runs this program
 * against it and prints its rows next to the Python package's.
 *
 *   bench_percall --socket PATH --dir DIR [--device cpu|cuda] [--iters N]
 *
 * Endpoints (bench_percall.py writes them): cached16 (cache), fresh4
 * (plain), mcached16 (managed + cache), managed16 (managed), quick (plain,
 * returns 1), echo (returns its tensor argument), module300 (cache, a
 * module of 300 tensors). DIR holds the raw socket of the floor.
 *
 * Prints one line per row, "row KEY N P50 P99 MEAN" (microseconds), the
 * floor first. Timings are printed, never asserted.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"
#include "kit.h"
#include "st/client.h"

static st_client_t *client;
static const char *device = "cpu";

static void die(const char *what) {
  fprintf(stderr, "bench_percall: %s: %s: %s\n", what, st_client_error_name(client),
          st_client_error(client));
  exit(1);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void row(const char *key, double *us, int n) {
  qsort(us, (size_t)n, sizeof *us, cmp_double);
  double sum = 0;
  for (int i = 0; i < n; i++) sum += us[i];
  printf("row %s %d %.2f %.2f %.2f\n", key, n, us[n / 2], us[(int)(n * 0.99)], sum / n);
}

/* One call of `endpoint`, whose value holds a tensor; the caller frees the
 * result. */
static st_result_t *call(const char *endpoint, const st_args_t *a) {
  st_result_t *r;
  if (st_client_call(client, endpoint, a, &r) != ST_OK) die(endpoint);
  if (st_result_tensor_count(r) == 0) {
    fprintf(stderr, "bench_percall: %s returned no tensor\n", endpoint);
    exit(1);
  }
  return r;
}

static void release_object(st_result_t *r) {
  st_object_info_t o;
  if (st_result_object(r, &o) != ST_OK) die("no object in a managed reply");
  if (st_client_release(client, o.id, NULL, NULL, NULL) != ST_OK) die("release");
}

enum { PING, CACHED_KEPT, CACHED_DROPPED, FRESH, MCACHED, MANAGED, SUBMIT, TARG, MODULE, INFO };

static void one(int what, st_result_t *targ) {
  st_result_t *r = NULL;
  switch (what) {
  case PING:
    if (st_client_ping(client, NULL) != ST_OK) die("ping");
    return;
  case CACHED_KEPT:
  case CACHED_DROPPED:
    r = call("cached16", NULL);
    break;
  case FRESH:
    r = call("fresh4", NULL);
    break;
  case MCACHED:
    r = call("mcached16", NULL);
    release_object(r);
    break;
  case MANAGED:
    r = call("managed16", NULL);
    release_object(r);
    break;
  case SUBMIT: {
    uint64_t id;
    if (st_client_submit(client, "quick", NULL, &id) != ST_OK) die("submit");
    if (st_client_task_wait(client, id, 10, &r) != ST_OK) die("wait");
    break;
  }
  case TARG: {
    /* The arguments are built per call, as a binding does. */
    char err[256];
    st_args_t *a = st_args_new();
    if (!a || st_args_tensor(a, "x", st_result_tensor(targ, 0), err, sizeof err) != ST_OK) {
      fprintf(stderr, "bench_percall: tensor argument: %s\n", err);
      exit(1);
    }
    r = call("echo", a);
    st_args_free(a);
    break;
  }
  case MODULE:
    r = call("module300", NULL);
    break;
  case INFO:
    if (st_client_info(client, &r) != ST_OK) die("info");
    break;
  }
  st_result_free(r);
}

static void measure(const char *key, int what, int iters, st_result_t *targ) {
  double *us = malloc(sizeof(double) * (size_t)iters);
  for (int i = -100; i < iters; i++) {
    double t0 = stt_now_ms();
    one(what, targ);
    if (i >= 0) us[i] = (stt_now_ms() - t0) * 1e3;
  }
  row(key, us, iters);
  free(us);
}

int main(int argc, char **argv) {
  const char *sock = NULL, *dir = NULL;
  int iters = 2000;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--socket") && i + 1 < argc) sock = argv[++i];
    else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
    else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_percall --socket PATH --dir DIR [--device cpu|cuda] "
                      "[--iters N]\n");
      return 2;
    }
  }
  if (!sock || !dir || iters < 1) {
    fprintf(stderr, "bench_percall: --socket and --dir are required, --iters >= 1\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  double *us = malloc(sizeof(double) * (size_t)iters);
  bk_raw_pingpong(dir, us, iters);
  row("raw", us, iters);
  free(us);

  client = bk_connect(sock);
  measure("ping", PING, iters, NULL);
  /* Kept: one result holds the mapping, so every hit reuses it. */
  st_result_t *keep = call("cached16", NULL);
  measure("cached_kept", CACHED_KEPT, iters, NULL);
  st_result_free(keep);
  measure("cached_dropped", CACHED_DROPPED, iters, NULL);
  measure("fresh", FRESH, iters, NULL);
  measure("mcached_release", MCACHED, iters, NULL);
  measure("managed_release", MANAGED, iters, NULL);
  measure("submit_wait", SUBMIT, iters, NULL);
  st_result_t *targ;
  char err[256];
  int64_t n = 1024;
  if (st_tensor_alloc(device, ST_DTYPE_FLOAT32, 1, &n, &targ, err, sizeof err) != ST_OK) {
    fprintf(stderr, "bench_percall: st_tensor_alloc: %s\n", err);
    return 1;
  }
  measure("targ_4k", TARG, iters, targ);
  st_result_free(targ);
  keep = call("module300", NULL);
  measure("module300", MODULE, iters / 4 ? iters / 4 : 1, NULL);
  st_result_free(keep);
  measure("info", INFO, iters, NULL);
  st_client_close(client);
  return 0;
}
