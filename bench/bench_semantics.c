/* bench_semantics: costs of the endpoint semantics of stserver, through
 * libstclient, with a ping baseline measured in the same run.
 *
 *   bench_semantics [--iters N] [--clients N] [--seconds S] [--slow N]
 *                   [--workers N] [--loop-threads N] [--throughput-only]
 *                   [--profile]
 *
 * Starts its own stserver (a temp dir, the endpoints below) and prints:
 *   - ping p50/p99 with no load (the baseline)
 *   - cached call (a cache hit; the arena is already mapped in this
 *     process, so the open-cache reuses the mapping): p50/p99
 *   - managed call + release (a build, a lease, the lease given back)
 *   - submit + wait, and submit + wait + result, of a trivial endpoint
 *   - calls/s of the cached call with 1 and with N client processes
 *   - ping p50/p99 while N slow builds (1 s of st.sleep each) run as
 *     tasks, on a second server with N workers (--slow N, default 64)
 *   - with --profile: the N-process cached calls/s once more, on a server
 *     of its own that profiles its loop thread (ST_LOOP_PROFILE,
 *     src/server/loopprof.h), and that profile per call: the loop's
 *     time in each phase and the system calls it made
 * --workers sets the server's workers (default 2), --loop-threads its
 * loop_threads (default 1; 0 leaves the server's own default,
 * src/server/config.c); --throughput-only skips the latency figures
 * and the slow builds.
 * Timings are printed, never asserted (shared machines are noisy).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture.h"
#include "kit.h"
#include "st/client.h"

static void die(st_client_t *c, const char *what) {
  fprintf(stderr, "%s: %s: %s\n", what, st_client_error_name(c), st_client_error(c));
  exit(1);
}

/* Ping round trips for `iters` (or until `until_ms` when > 0). */
static int measure_ping(st_client_t *c, double *us, int iters, double until_ms) {
  int n = 0;
  for (int i = -100; i < iters; i++) {
    if (until_ms > 0 && stt_now_ms() >= until_ms) break;
    double t0 = stt_now_ms();
    if (st_client_ping(c, NULL) != ST_OK) die(c, "ping");
    if (i >= 0) us[n++] = (stt_now_ms() - t0) * 1e3;
  }
  return n;
}

static int cached_call(st_client_t *c) {
  st_result_t *r;
  if (st_client_call(c, "cached16", NULL, &r) != ST_OK) die(c, "call cached16");
  const st_tensor_t *t = st_result_tensor(r, 0);
  st_object_info_t o;
  int ok = t && t->numel == 16 && ((float *)t->data)[15] == 15.0f &&
           st_result_object(r, &o) == ST_OK && o.cached;
  st_result_free(r);
  return ok ? 0 : -1;
}

/* One mapping per process, reused by every hit (bk_throughput's prepare). */
static int hold_cached(st_client_t *c, st_result_t **keep) {
  return st_client_call(c, "cached16", NULL, keep) == ST_OK ? 0 : -1;
}

static void bench_cached(const char *sock, int iters) {
  st_client_t *c = bk_connect(sock);
  /* The first call builds and caches; `keep` holds the mapping, so every
   * later hit finds the arena in this process's open-cache. */
  st_result_t *keep;
  if (st_client_call(c, "cached16", NULL, &keep) != ST_OK) die(c, "call cached16");
  size_t mapped0;
  uint64_t reused0, reused1;
  st_open_cache_stats(&mapped0, &reused0);
  double *us = malloc(sizeof(double) * (size_t)iters);
  for (int i = -100; i < iters; i++) {
    double t0 = stt_now_ms();
    if (cached_call(c) != 0) {
      fprintf(stderr, "cached16: not a cached 16-float tensor\n");
      exit(1);
    }
    if (i >= 0) us[i] = (stt_now_ms() - t0) * 1e3;
  }
  st_open_cache_stats(NULL, &reused1);
  bk_report("cached call (hit, mapping reused)", us, iters);
  printf("%-44s %llu of %d calls\n", "  open-cache reuses", (unsigned long long)(reused1 - reused0),
         iters + 100);
  free(us);
  st_result_free(keep);
  st_client_close(c);
}

static void bench_managed(const char *sock, int iters) {
  st_client_t *c = bk_connect(sock);
  double *us = malloc(sizeof(double) * (size_t)iters);
  for (int i = -100; i < iters; i++) {
    double t0 = stt_now_ms();
    st_result_t *r;
    if (st_client_call(c, "managed16", NULL, &r) != ST_OK) die(c, "call managed16");
    st_object_info_t o;
    if (st_result_object(r, &o) != ST_OK || !o.lease) {
      fprintf(stderr, "managed16: no lease in the reply\n");
      exit(1);
    }
    int released;
    if (st_client_release(c, o.id, &released, NULL, NULL) != ST_OK || !released)
      die(c, "release");
    st_result_free(r);
    if (i >= 0) us[i] = (stt_now_ms() - t0) * 1e3;
  }
  bk_report("managed call + release", us, iters);
  free(us);
  st_client_close(c);
}

static void bench_tasks(const char *sock, int iters) {
  st_client_t *c = bk_connect(sock);
  double *us = malloc(sizeof(double) * (size_t)iters);
  for (int with_result = 0; with_result < 2; with_result++) {
    for (int i = -100; i < iters; i++) {
      double t0 = stt_now_ms();
      uint64_t id;
      if (st_client_submit(c, "quick", NULL, &id) != ST_OK) die(c, "submit");
      st_result_t *info;
      if (st_client_task_wait(c, id, 10, &info) != ST_OK) die(c, "wait");
      const st_value_t *s = st_value_get(st_result_value(info), "status");
      if (!s || s->kind != ST_VALUE_STRING || strcmp(s->as.str.ptr, "completed") != 0) {
        fprintf(stderr, "task %llu did not complete\n", (unsigned long long)id);
        exit(1);
      }
      st_result_free(info);
      if (with_result) {
        st_result_t *r;
        if (st_client_task_result(c, id, &r) != ST_OK) die(c, "result");
        st_result_free(r);
      }
      if (i >= 0) us[i] = (stt_now_ms() - t0) * 1e3;
    }
    bk_report(with_result ? "submit + wait + result" : "submit + wait", us, iters);
  }
  free(us);
  st_client_close(c);
}

/* A server of its own with `nslow` workers: submits `nslow` slow builds
 * (1 s of st.sleep each, all running at once; st.sleep wakes every 10 ms
 * to check for a stop request) and pings while they run. */
static void bench_ping_under_load(int nslow, int iters) {
  stt_server_t s;
  stt_server_init(&s);
  stt_write_endpoint(&s, "slow.lua",
                     "return st.endpoint{ name = 'slow',\n"
                     "  build = function() st.sleep(1) return 1 end }\n");
  char cfg[96];
  snprintf(cfg, sizeof cfg, "log_level = 'warn', workers = %d,", nslow);
  stt_server_config(&s, cfg);
  if (stt_server_start(&s) != 0) exit(1);
  st_client_t *sub = bk_connect(s.socket), *c = bk_connect(s.socket);
  uint64_t *ids = calloc((size_t)nslow, sizeof *ids);
  double t0 = stt_now_ms();
  for (int i = 0; i < nslow; i++)
    if (st_client_submit(sub, "slow", NULL, &ids[i]) != ST_OK) die(sub, "submit slow");
  /* Measure inside the builds' second, leaving room for a slow start. */
  double *us = malloc(sizeof(double) * (size_t)iters);
  int n = measure_ping(c, us, iters, t0 + 900);
  int running = 0, pending = 0, completed = 0;
  st_result_t *r;
  if (st_client_tasks(sub, NULL, 0, 1000, &r) != ST_OK) die(sub, "tasks");
  const st_value_t *list = st_result_value(r);
  for (size_t i = 0; list->kind == ST_VALUE_ARRAY && i < list->as.array.len; i++) {
    const st_value_t *status = st_value_get(&list->as.array.items[i], "status");
    if (!status || status->kind != ST_VALUE_STRING) continue;
    running += strcmp(status->as.str.ptr, "running") == 0;
    pending += strcmp(status->as.str.ptr, "pending") == 0;
    completed += strcmp(status->as.str.ptr, "completed") == 0;
  }
  st_result_free(r);
  char what[80];
  snprintf(what, sizeof what, "ping while %d slow builds run", nslow);
  if (n > 0) bk_report(what, us, n);
  printf("%-44s %d running, %d pending, %d completed after %.0f ms\n", "  slow builds", running,
         pending, completed, stt_now_ms() - t0);
  /* All of them end; the server then stops at once. */
  for (int i = 0; i < nslow; i++) {
    st_result_t *info;
    if (st_client_task_wait(sub, ids[i], 30, &info) != ST_OK) die(sub, "wait slow");
    st_result_free(info);
  }
  printf("%-44s %.0f ms from the first submit\n", "  all slow builds completed", stt_now_ms() - t0);
  free(us);
  free(ids);
  st_client_close(c);
  st_client_close(sub);
  stt_server_stop(&s);
  stt_server_cleanup(&s);
}

/* CPU seconds (user, system) the process has used so far, from
 * /proc/<pid>/stat; 0 when it cannot be read. */
static void proc_cpu(pid_t pid, double *user, double *sys) {
  *user = *sys = 0;
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *p = strrchr(buf, ')');   /* the name may hold spaces */
  unsigned long long ut, st;
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
    return;
  long hz = sysconf(_SC_CLK_TCK);
  *user = (double)ut / (double)hz;
  *sys = (double)st / (double)hz;
}

/* bk_throughput of cached calls, then what the server's process spent per
 * call in CPU time: a figure of the loop thread (a cache hit never reaches
 * a worker) that the CPU count of the machine does not distort. */
static void throughput_cached(const stt_server_t *s, const char *label, int nproc,
                              double seconds) {
  double u0, s0, u1, s1;
  proc_cpu(s->pid, &u0, &s0);
  long calls = bk_throughput(label, s->socket, nproc, seconds, hold_cached, cached_call);
  proc_cpu(s->pid, &u1, &s1);
  if (calls > 0)
    printf("%-44s %.2f us per call (user %.2f, system %.2f)\n", "  server CPU",
           ((u1 - u0) + (s1 - s0)) * 1e6 / (double)calls, (u1 - u0) * 1e6 / (double)calls,
           (s1 - s0) * 1e6 / (double)calls);
}

/* The server of the figures above: the four endpoints, `workers` workers,
 * `loops` loop threads. */
static void start_bench_server(stt_server_t *s, int workers, int loops) {
  stt_server_init(s);
  stt_write_endpoint(s, "bench.lua",
                     "return st.endpoint{ name = 'cached16', cache = true,\n"
                     "  build = function() return st.arange{16, dtype = 'float32'} end }\n");
  stt_write_endpoint(s, "managed.lua",
                     "return st.endpoint{ name = 'managed16', managed = true,\n"
                     "  build = function() return st.arange{16, dtype = 'float32'} end }\n");
  stt_write_endpoint(s, "quick.lua",
                     "return st.endpoint{ name = 'quick',\n"
                     "  build = function() return 1 end }\n");
  char cfg[128], l[32] = "";
  if (loops > 0) snprintf(l, sizeof l, " loop_threads = %d,", loops);
  snprintf(cfg, sizeof cfg, "log_level = 'warn', workers = %d,%s", workers, l);
  stt_server_config(s, cfg);
  if (stt_server_start(s) != 0) exit(1);
}

/* The N-process cached calls/s on a server that profiles its loop thread
 * (loopprof.h), then the profile per call: each phase's calls (system
 * calls for read, send, dup, close, ioctl, poll) and nanoseconds. */
static void bench_profile(int clients, double seconds, int workers, int loops) {
  stt_server_t s;
  char path[300];
  const char *tmp = getenv("TMPDIR");
  snprintf(path, sizeof path, "%s/st-loop-profile-%d.txt", tmp && tmp[0] ? tmp : "/tmp",
           (int)getpid());
  setenv("ST_LOOP_PROFILE", path, 1);
  start_bench_server(&s, workers, loops);
  unsetenv("ST_LOOP_PROFILE");
  throughput_cached(&s, "cached calls/s (profiled)", clients, seconds);
  if (stt_server_stop(&s) != 0) exit(1);
  stt_server_cleanup(&s);
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "no loop profile at %s\n", path);
    exit(1);
  }
  printf("loop thread per message (phase: calls per message, ns per message):\n");
  char line[512];
  while (fgets(line, sizeof line, f)) {
    char name[32];
    unsigned long long calls, ns;
    double cpm, nspm;
    if (line[0] == '#') {
      printf("  %s", line);
      continue;
    }
    if (sscanf(line, "%31s %llu %llu %lf %lf", name, &calls, &ns, &cpm, &nspm) == 5)
      printf("  %-10s %8.3f %10.1f ns\n", name, cpm, nspm);
  }
  fclose(f);
  unlink(path);
}

int main(int argc, char **argv) {
  int iters = 5000, clients = 16, slow = 64, workers = 2, loops = 1, only_tp = 0, profile = 0;
  double seconds = 3;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--clients") && i + 1 < argc) clients = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--slow") && i + 1 < argc) slow = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--workers") && i + 1 < argc) workers = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--loop-threads") && i + 1 < argc) loops = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--throughput-only")) only_tp = 1;
    else if (!strcmp(argv[i], "--profile")) profile = 1;
    else {
      fprintf(stderr, "usage: bench_semantics [--iters N] [--clients N] [--seconds S] "
                      "[--slow N (1..256)] [--workers N] [--loop-threads N] "
                      "[--throughput-only] [--profile]\n");
      return 2;
    }
  }
  if (iters < 1 || clients < 1 || slow < 1 || slow > 256 || workers < 1 || loops < 0 ||
      !(seconds > 0)) {
    fprintf(stderr, "bench_semantics: counts and seconds must be positive\n");
    return 2;
  }
  bk_setup();

  stt_server_t s;
  start_bench_server(&s, workers, loops);
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  char ln[40] = "the server's default number of";
  if (loops > 0) snprintf(ln, sizeof ln, "%d", loops);
  printf("bench_semantics: %ld CPUs, %d server workers, %s loop threads, %d iterations per "
         "latency figure\n",
         ncpu, workers, ln, iters);
  if (!only_tp) {
    st_client_t *c = bk_connect(s.socket);
    double *us = malloc(sizeof(double) * (size_t)iters);
    bk_report("ping, no load (baseline)", us, measure_ping(c, us, iters, 0));
    free(us);
    st_client_close(c);
    bench_cached(s.socket, iters);
    bench_managed(s.socket, iters);
    bench_tasks(s.socket, iters);
  }
  throughput_cached(&s, "cached calls/s", 1, seconds);
  throughput_cached(&s, "cached calls/s", clients, seconds);
  int rc = stt_server_stop(&s);
  stt_server_cleanup(&s);
  if (profile) bench_profile(clients, seconds, workers, loops);
  if (!only_tp) bench_ping_under_load(slow, iters * 100);
  return rc == 0 ? 0 : 1;
}
