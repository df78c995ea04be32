/* bench_percall: the per-call rows of issues 12 and 32 through libstclient, for
 * bench/bench_percall.py, which starts the server, runs this program
 * against it and prints its rows next to the Python package's.
 *
 *   bench_percall --socket PATH --dir DIR [--device cpu|cuda] [--iters N] [--rows KEY,...]
 *                 [--tasks N]
 *
 * Endpoints (bench_percall.py writes them): cached16 (cache), fresh4
 * (plain), mcached16 (managed + cache), managed16 (managed), quick (plain,
 * returns 1), echo (returns its tensor argument), echo_int (returns its
 * integer argument), module300 (cache, a module of 300 tensors),
 * mmodule300 (the same, managed), slow (serialized, sleeps an hour).
 * DIR holds the raw socket of the floor. --tasks: the server's
 * tasks.capacity (bench_percall.py's config: 10000).
 *
 * Rows: raw, ping, cached_kept, cached_dropped, fresh, mcached_release (a
 * managed cached call + release, the result dropped), managed_release (a
 * fresh managed result + release), submit_wait, targ_4k (a 4 KiB tensor
 * argument returned), int_arg (the same call with an integer argument),
 * module300 (cached, mapping kept), mmodule300_held_release (a managed
 * call of a held 300-tensor module + release), info; two rows that split
 * managed_release in its parts: managed_call (the call alone, the release
 * after the clock stopped) and release_only (the release alone, the call
 * before the clock started); and info_full (info with the task table full:
 * first two tasks of `slow`, one running and one waiting for its turn,
 * then quick tasks, each waited for, until the table holds --tasks of
 * them; a table already full is left as it is).
 *
 * Prints one line per row, "row KEY N P50 P99 MEAN" (microseconds), in
 * the order of --rows (default: every row, the floor "raw" first). Timings are printed, never asserted.
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
static int64_t table_capacity = 10000;   /* --tasks */

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

enum {
  PING, CACHED_KEPT, CACHED_DROPPED, FRESH, MCACHED, MANAGED, SUBMIT, TARG, INT_ARG, MODULE,
  MMODULE, INFO, MANAGED_CALL, RELEASE_ONLY, INFO_FULL
};

/* The managed result of a split row between its timed and untimed part. */
static st_result_t *pending;

/* The untimed part of a split row before one call: the call whose release
 * is timed. */
static void before_one(int what) {
  if (what == RELEASE_ONLY) pending = call("managed16", NULL);
}

/* The untimed part of a split row after one call: the release of the call
 * that was timed. */
static void after_one(int what) {
  if (what != MANAGED_CALL) return;
  release_object(pending);
  st_result_free(pending);
  pending = NULL;
}

/* info's tasks.<name> now. */
static int64_t info_tasks(const char *name) {
  st_result_t *r;
  if (st_client_info(client, &r) != ST_OK) die("info");
  const st_value_t *v = st_value_get(st_value_get(st_result_value(r), "tasks"), name);
  int64_t n = v && v->kind == ST_VALUE_INT ? v->as.integer : -1;
  st_result_free(r);
  return n;
}

/* The task table full (info_full): two tasks of the serialized `slow`,
 * one running and one waiting behind it (a pending task older than every
 * finished one), then quick tasks until the table holds table_capacity
 * tasks, all of them finished but those two. */
static void fill_task_table(void) {
  if (info_tasks("total") >= table_capacity && info_tasks("pending") >= 1) return;
  uint64_t id;
  for (int i = 0; i < 2; i++)
    if (st_client_submit(client, "slow", NULL, &id) != ST_OK) die("submit slow");
  for (int64_t i = 0; i < table_capacity - 2; i++) {
    st_result_t *r;
    if (st_client_submit(client, "quick", NULL, &id) != ST_OK) die("submit");
    if (st_client_task_wait(client, id, 10, &r) != ST_OK) die("wait");
    st_result_free(r);
  }
  if (info_tasks("total") != table_capacity || info_tasks("pending") < 1) {
    fprintf(stderr, "bench_percall: the task table holds %lld tasks, %lld pending (want %lld, "
                    "one or more pending): is --tasks the server's tasks.capacity?\n",
            (long long)info_tasks("total"), (long long)info_tasks("pending"),
            (long long)table_capacity);
    exit(1);
  }
}

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
  case INT_ARG: {
    st_args_t *a = st_args_new();
    if (!a || st_args_int(a, "x", 1024) != ST_OK) die("integer argument");
    st_result_t *v;
    if (st_client_call(client, "echo_int", a, &v) != ST_OK) die("echo_int");
    st_args_free(a);
    st_result_free(v);
    return;
  }
  case MODULE:
    r = call("module300", NULL);
    break;
  case MMODULE:
    r = call("mmodule300", NULL);
    release_object(r);
    break;
  case INFO:
  case INFO_FULL:
    if (st_client_info(client, &r) != ST_OK) die("info");
    break;
  case MANAGED_CALL:
    pending = call("managed16", NULL);
    return;
  case RELEASE_ONLY:
    release_object(pending);
    r = pending;
    pending = NULL;
    break;
  }
  st_result_free(r);
}

static void measure(const char *key, int what, int iters, st_result_t *targ) {
  double *us = malloc(sizeof(double) * (size_t)iters);
  for (int i = -100; i < iters; i++) {
    before_one(what);
    double t0 = stt_now_ms();
    one(what, targ);
    if (i >= 0) us[i] = (stt_now_ms() - t0) * 1e3;
    after_one(what);
  }
  row(key, us, iters);
  free(us);
}

/* Runs row `key` (a name of `rows`), with what it needs set up. */
static void run_row(const char *key, const char *dir, int iters) {
  static const struct {
    const char *key;
    int what;
  } rows[] = {{"ping", PING},
              {"cached_kept", CACHED_KEPT},
              {"cached_dropped", CACHED_DROPPED},
              {"fresh", FRESH},
              {"mcached_release", MCACHED},
              {"managed_release", MANAGED},
              {"submit_wait", SUBMIT},
              {"targ_4k", TARG},
              {"int_arg", INT_ARG},
              {"module300", MODULE},
              {"mmodule300_held_release", MMODULE},
              {"info", INFO},
              {"managed_call", MANAGED_CALL},
              {"release_only", RELEASE_ONLY},
              {"info_full", INFO_FULL}};
  if (!strcmp(key, "raw")) {
    double *us = malloc(sizeof(double) * (size_t)iters);
    bk_raw_pingpong(dir, us, iters);
    row("raw", us, iters);
    free(us);
    return;
  }
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    if (strcmp(key, rows[i].key) != 0) continue;
    st_result_t *keep = NULL, *targ = NULL;
    /* Kept: one result holds the mapping, so every hit reuses it. */
    if (rows[i].what == CACHED_KEPT) keep = call("cached16", NULL);
    if (rows[i].what == MODULE || rows[i].what == MMODULE) {
      /* Held: the managed one with its lease, given back after the row. */
      keep = call(rows[i].what == MODULE ? "module300" : "mmodule300", NULL);
      iters = iters / 4 ? iters / 4 : 1;
    }
    if (rows[i].what == INFO_FULL) fill_task_table();
    if (rows[i].what == TARG) {
      char err[256];
      int64_t n = 1024;
      if (st_tensor_alloc(device, ST_DTYPE_FLOAT32, 1, &n, &targ, err, sizeof err) != ST_OK) {
        fprintf(stderr, "bench_percall: st_tensor_alloc: %s\n", err);
        exit(1);
      }
    }
    measure(key, rows[i].what, iters, targ);
    if (rows[i].what == MMODULE) release_object(keep);
    st_result_free(keep);
    st_result_free(targ);
    return;
  }
  fprintf(stderr, "bench_percall: no row %s\n", key);
  exit(2);
}

int main(int argc, char **argv) {
  const char *sock = NULL, *dir = NULL;
  char rows[512] = "raw,ping,cached_kept,cached_dropped,fresh,mcached_release,managed_release,"
                   "submit_wait,targ_4k,int_arg,module300,mmodule300_held_release,info,"
                   "managed_call,release_only,info_full";
  int iters = 2000;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--socket") && i + 1 < argc) sock = argv[++i];
    else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
    else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--rows") && i + 1 < argc) snprintf(rows, sizeof rows, "%s", argv[++i]);
    else if (!strcmp(argv[i], "--tasks") && i + 1 < argc) table_capacity = atoll(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_percall --socket PATH --dir DIR [--device cpu|cuda] "
                      "[--iters N] [--rows KEY,...] [--tasks N]\n");
      return 2;
    }
  }
  if (!sock || !dir || iters < 1 || table_capacity < 3) {
    fprintf(stderr, "bench_percall: --socket and --dir are required, --iters >= 1, --tasks >= 3\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  client = bk_connect(sock);
  for (char *save = NULL, *key = strtok_r(rows, ",", &save); key; key = strtok_r(NULL, ",", &save))
    run_row(key, dir, iters);
  st_client_close(client);
  return 0;
}
