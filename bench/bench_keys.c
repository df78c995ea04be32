/* bench_keys: latency of publishing a state dict under a key and of
 * getting it (docs/keys.md), through libstclient against a real stserver.
 *
 *   bench_keys [--device cpu|cuda:N] [--mib A,B,...] [--tensors N]
 *              [--iters N] [--first N]
 *
 * For each total size (MiB, default 16,64 on the CPU; the GPU command is
 * `bench_keys --device cuda:0 --mib 64,1024`) a state dict of --tensors
 * (32) float32 tensors from st_tensor_alloc adds up to that size, and it
 * prints p50/p99 of:
 *   - put, first time: every tensor's allocation is new to the connection
 *     (made before the clock starts), so its descriptor travels and the
 *     server imports it (--first times, default 5);
 *   - put again: the same allocations (the argument cache names them by id),
 *     a new version each time (--iters, default 200);
 *   - get with the view GATHER (a strided window of every tensor, copied by
 *     the server: docs/views.md), the first time after a first put: on
 *     CUDA the server maps each allocation then (a put imports handles and
 *     maps nothing), so this row less the next one is the cost of those
 *     mappings; and the same on allocations the server mapped before (a
 *     put again in between, so that the copy is made anew);
 *   - get of the latest version on the same connection (arenas named by id
 *     after the first) and on a new connection each time (descriptors and
 *     mappings).
 * No bytes are copied by a put: its time must not grow with the size.
 * Timings are printed, never asserted.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"
#include "kit.h"
#include "st/client.h"

#define MiB (1024ull * 1024ull)
#define MAX_TENSORS 253

typedef struct state {
  int n;
  st_result_t *allocs[MAX_TENSORS];
  st_args_t *args;
} state_t;

/* A state dict of n tensors adding up to `bytes` on device. 0 or -1. */
static int state_make(state_t *s, const char *device, uint64_t bytes, int n, char *err,
                      size_t errlen) {
  memset(s, 0, sizeof *s);
  s->args = st_args_new();
  int64_t numel = (int64_t)(bytes / (uint64_t)n / 4);
  for (int i = 0; i < n; i++) {
    if (st_tensor_alloc(device, ST_DTYPE_FLOAT32, 1, &numel, &s->allocs[i], err, errlen) !=
        ST_OK)
      return -1;
    s->n = i + 1;
    char name[32];
    snprintf(name, sizeof name, "layers.%d.weight", i);
    if (st_args_tensor(s->args, name, st_result_tensor(s->allocs[i], 0), err, errlen) != ST_OK)
      return -1;
  }
  return 0;
}

static void state_free(state_t *s) {
  st_args_free(s->args);
  for (int i = 0; i < s->n; i++) st_result_free(s->allocs[i]);
  memset(s, 0, sizeof *s);
}

static void put_or_die(st_client_t *c, const char *key, const st_args_t *a) {
  if (st_client_put(c, key, a, ST_KEY_PINNED, 0, NULL) != ST_OK) {
    fprintf(stderr, "put %s: %s\n", key, st_client_error(c));
    exit(1);
  }
}

static void get_or_die(st_client_t *c, const char *key) {
  st_result_t *r = NULL;
  if (st_client_get(c, key, 0, 0, &r, NULL) != ST_OK) {
    fprintf(stderr, "get %s: %s\n", key, st_client_error(c));
    exit(1);
  }
  st_result_free(r);
}

/* Every tensor's elements 0 and 2: a window that is not contiguous, so the
 * server gathers it (reading the allocation) instead of sending it as is. */
#define GATHER "*:slice(0,0,4,2)|contiguous"

static double timed_gather_us(st_client_t *c, const char *key) {
  st_result_t *r = NULL;
  double t0 = stt_now_ms();
  if (st_client_get_view(c, key, 0, 0, GATHER, &r, NULL) != ST_OK) {
    fprintf(stderr, "get %s view %s: %s\n", key, GATHER, st_client_error(c));
    exit(1);
  }
  double us = (stt_now_ms() - t0) * 1000.0;
  st_result_free(r);
  return us;
}

static void bench_size(st_client_t *c, const char *sock, const char *device, uint64_t mib,
                       int ntensors, int iters, int first) {
  char what[96], err[256], key[48];
  snprintf(key, sizeof key, "bench/%llu", (unsigned long long)mib);
  double *us = calloc((size_t)(iters > first ? iters : first), sizeof *us);
  double *gather_us = calloc((size_t)first, sizeof *gather_us);
  for (int i = 0; i < first; i++) {
    state_t s;
    if (state_make(&s, device, mib * MiB, ntensors, err, sizeof err) != 0) {
      fprintf(stderr, "st_tensor_alloc %s: %s\n", device, err);
      exit(1);
    }
    double t0 = stt_now_ms();
    put_or_die(c, key, s.args);
    us[i] = (stt_now_ms() - t0) * 1000.0;
    gather_us[i] = timed_gather_us(c, key);
    state_free(&s);   /* the server keeps the kept versions */
  }
  snprintf(what, sizeof what, "put %4llu MiB/%d tensors, first time", (unsigned long long)mib,
           ntensors);
  bk_report(what, us, first);
  snprintf(what, sizeof what, "get %4llu MiB gather, first read", (unsigned long long)mib);
  bk_report(what, gather_us, first);
  free(gather_us);
  state_t s;
  if (state_make(&s, device, mib * MiB, ntensors, err, sizeof err) != 0) exit(1);
  put_or_die(c, key, s.args);
  for (int i = 0; i < iters; i++) {
    double t0 = stt_now_ms();
    put_or_die(c, key, s.args);
    us[i] = (stt_now_ms() - t0) * 1000.0;
  }
  snprintf(what, sizeof what, "put %4llu MiB/%d tensors, again", (unsigned long long)mib,
           ntensors);
  bk_report(what, us, iters);
  int ng = iters < 50 ? iters : 50;
  timed_gather_us(c, key);   /* the server maps them, if it has not */
  for (int i = 0; i < ng; i++) {
    put_or_die(c, key, s.args);   /* a new version: its copy is made anew */
    us[i] = timed_gather_us(c, key);
  }
  snprintf(what, sizeof what, "get %4llu MiB gather, mapped", (unsigned long long)mib);
  bk_report(what, us, ng);
  for (int i = 0; i < iters; i++) {
    double t0 = stt_now_ms();
    get_or_die(c, key);
    us[i] = (stt_now_ms() - t0) * 1000.0;
  }
  snprintf(what, sizeof what, "get %4llu MiB, same connection", (unsigned long long)mib);
  bk_report(what, us, iters);
  int n = iters < 50 ? iters : 50;
  for (int i = 0; i < n; i++) {
    st_client_t *c2 = bk_connect(sock);
    double t0 = stt_now_ms();
    get_or_die(c2, key);
    us[i] = (stt_now_ms() - t0) * 1000.0;
    st_client_close(c2);
  }
  snprintf(what, sizeof what, "get %4llu MiB, new connection", (unsigned long long)mib);
  bk_report(what, us, n);
  st_client_delete(c, key);
  state_free(&s);
  free(us);
}

int main(int argc, char **argv) {
  const char *device = "cpu", *sizes = NULL;
  int ntensors = 32, iters = 200, first = 5;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
    else if (!strcmp(argv[i], "--mib") && i + 1 < argc) sizes = argv[++i];
    else if (!strcmp(argv[i], "--tensors") && i + 1 < argc) ntensors = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--first") && i + 1 < argc) first = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_keys [--device cpu|cuda:N] [--mib A,B,...] [--tensors N] "
                      "[--iters N] [--first N]\n");
      return 2;
    }
  }
  if (ntensors < 1 || ntensors > MAX_TENSORS) ntensors = 32;
  if (iters < 1) iters = 1;
  if (first < 1) first = 1;
  if (!sizes) sizes = strcmp(device, "cpu") == 0 ? "16,64" : "64,1024";
  bk_setup();
  stt_server_t s;
  stt_server_init(&s);
  bk_server_config(&s, -1);
  if (stt_server_start(&s) != 0) return 1;
  st_client_t *c = bk_connect(s.socket);
  st_client_set_timeout(c, 60000);
  printf("bench_keys: %s, %d tensors per state dict, %ld CPUs\n", device, ntensors,
         sysconf(_SC_NPROCESSORS_ONLN));
  char list[256];
  snprintf(list, sizeof list, "%s", sizes);
  for (char *save = NULL, *w = strtok_r(list, ",", &save); w; w = strtok_r(NULL, ",", &save))
    bench_size(c, s.socket, device, strtoull(w, NULL, 10), ntensors, iters, first);
  st_client_close(c);
  int rc = stt_server_stop(&s);
  stt_server_cleanup(&s);
  return rc == 0 ? 0 : 1;
}
