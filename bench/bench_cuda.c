/* bench_cuda: costs of the CUDA data plane, through libstclient, with the
 * baselines measured in the same run.
 *
 *   bench_cuda [--iters N] [--cold-runs N] [--clients N] [--no-torch]
 *
 * Starts its own stserver (a temp dir, the endpoints below, device =
 * "cuda") and prints:
 *   a. call latency with a CUDA result, next to ping:
 *      - cache hit: a cached 2 MiB tensor whose arena this process keeps
 *        mapped (one result held), so the open-cache reuses the mapping;
 *      - cache hit, re-imported: the same, with no result held, so every
 *        call imports and maps the arena and st_result_free unmaps it;
 *      - plain: every call a new 2 MiB VMM arena on the server, imported
 *        and unmapped by the client (call and free timed apart), and the
 *        same endpoint on the CPU (a memfd) as a baseline, on a connection
 *        without the result pool (ST_CLIENT_POOL=0);
 *      - fresh results from the connection's result pool (docs/pool.md):
 *        a 1 MiB and a 4-float CUDA tensor, each a region of a VMM slab
 *        the client imported once (call and free timed apart), and the
 *        1 MiB one as an allocation of its own (ST_CLIENT_POOL=0).
 *   b. cold open of a ~1 GiB module of 300 float16 tensors in a FRESH
 *      client process (fork + exec of this program): connect + hello,
 *      call + import, first byte of the last tensor readable; once with
 *      the CUDA context created first (timed apart) and once lazily
 *      (context creation inside the call). Then bench/torch_ipc_baseline.py
 *      shares the same state dict through torch.multiprocessing, when
 *      python3 has torch with CUDA.
 *   c. device memory used (cuMemGetInfo) while 1 and then N client
 *      processes (default 8) map one 4 GiB model at once, with each
 *      process's CUDA context overhead reported apart.
 * Timings are printed, never asserted (shared machines are noisy).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture.h"
#include "kit.h"
#include "mem/cuda.h"
#include "st/client.h"

#define MiB (1024.0 * 1024.0)
#define GiB (1024.0 * MiB)

/* 300 float16 tensors of 1,750,000 elements (3.5 MB): 1.05 GB in one
 * arena. 16 float16 tensors of 256 MiB: a 4 GiB model. */
#define COLD_N 300
#define COLD_NUMEL 1750000
#define BIG_N 16
#define BIG_NUMEL (128ll * 1024 * 1024)

static const char *ENDPOINTS =
    "local function model(a)\n"
    "  local parts = {}\n"
    "  for i = 1, a.n do\n"
    "    parts[i] = { 'layers.' .. (i - 1) .. '.weight',\n"
    "                 st.full{a.numel, value = i - 1, dtype = 'float16'} }\n"
    "  end\n"
    "  return st.module(parts, { arch = 'bench' })\n"
    "end\n"
    "local function two_mib() return st.full{524288, value = 1} end\n"
    "local function one_mib() return st.full{262144, value = 1} end\n"
    "local function four() return st.full{4, value = 1} end\n"
    "return {\n"
    "  st.endpoint{ name = 'fresh1m', device = 'cuda', build = one_mib },\n"
    "  st.endpoint{ name = 'fresh4', device = 'cuda', build = four },\n"
    "  st.endpoint{ name = 'cached2m', device = 'cuda', cache = true, build = two_mib },\n"
    "  st.endpoint{ name = 'plain2m', device = 'cuda', build = two_mib },\n"
    "  st.endpoint{ name = 'plain2m_cpu', device = 'cpu', build = two_mib },\n"
    "  st.endpoint{ name = 'model', device = 'cuda', managed = true, cache = true,\n"
    "               params = { n = 1, numel = 1 }, build = model },\n"
    "}\n";

static void die(st_client_t *c, const char *what) {
  fprintf(stderr, "%s: %s: %s\n", what, st_client_error_name(c), st_client_error(c));
  exit(1);
}

static st_args_t *model_args(int n, long long numel) {
  st_args_t *a = st_args_new();
  st_args_int(a, "n", n);
  st_args_int(a, "numel", numel);
  return a;
}

/* A call of `ep`: the result, or exit(1). */
static st_result_t *call_ep(st_client_t *c, const char *ep, const st_args_t *a) {
  st_result_t *r;
  if (st_client_call(c, ep, a, &r) != ST_OK) die(c, ep);
  return r;
}

/* Device memory in use on device 0 (total - free), bytes. */
static double gpu_used(void) {
  uint64_t f = 0, t = 0;
  char err[256];
  if (st__cuda_mem_info(0, &f, &t, err, sizeof err) != ST_OK) {
    fprintf(stderr, "cuMemGetInfo: %s\n", err);
    exit(1);
  }
  return (double)(t - f);
}

/* Used memory once it stops moving: two readings 50 ms apart agree within
 * one 2 MiB granule, or 3 s pass (frees by other processes and the
 * server's collector land asynchronously). */
static double gpu_used_settled(void) {
  double prev = gpu_used(), end = stt_now_ms() + 3000;
  while (stt_now_ms() < end) {
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    double now = gpu_used();
    if (now - prev < 2 * MiB && prev - now < 2 * MiB) return now;
    prev = now;
  }
  return prev;
}

/* ---------------------------------------------------------- a. latency */

static void bench_ping(st_client_t *c, int iters) {
  double *us = malloc(sizeof(double) * (size_t)iters);
  for (int i = -100; i < iters; i++) {
    double t0 = stt_now_ms();
    if (st_client_ping(c, NULL) != ST_OK) die(c, "ping");
    if (i >= 0) us[i] = (stt_now_ms() - t0) * 1e3;
  }
  bk_report("stserver ping (baseline)", us, iters);
  free(us);
}

/* A cached CUDA tensor: with `keep` one result stays alive so each hit
 * reuses the mapping; without it every call imports the arena again and
 * the free unmaps it. */
static void bench_cached(st_client_t *c, int iters, int keep_mapped) {
  st_result_t *keep = call_ep(c, "cached2m", NULL);
  const st_tensor_t *t = st_result_tensor(keep, 0);
  if (!t || t->device != ST_DEVICE_CUDA || st_tensor_get(t, t->numel - 1) != 1.0) {
    fprintf(stderr, "cached2m: not a CUDA tensor of ones\n");
    exit(1);
  }
  if (!keep_mapped) {
    st_result_free(keep);
    keep = NULL;
  }
  size_t mapped;
  uint64_t reused0, reused1;
  st_open_cache_stats(&mapped, &reused0);
  double *us = malloc(sizeof(double) * (size_t)iters);
  for (int i = -100; i < iters; i++) {
    double t0 = stt_now_ms();
    st_result_t *r = call_ep(c, "cached2m", NULL);
    st_result_free(r);
    if (i >= 0) us[i] = (stt_now_ms() - t0) * 1e3;
  }
  st_open_cache_stats(&mapped, &reused1);
  bk_report(keep_mapped ? "cache hit, mapping reused (+free)" : "cache hit, import+map (+unmap)",
            us, iters);
  printf("%-44s %llu of %d calls; %zu allocation(s) mapped after\n", "  open-cache reuses",
         (unsigned long long)(reused1 - reused0), iters + 100, mapped);
  free(us);
  st_result_free(keep);
}

/* A plain endpoint: a new arena per call; the call (server allocation,
 * fill, reply, client import) and the free (unmap) timed apart. */
static void bench_plain(st_client_t *c, const char *ep, const char *label, int iters) {
  double *call = malloc(sizeof(double) * (size_t)iters);
  double *fr = malloc(sizeof(double) * (size_t)iters);
  double *tot = malloc(sizeof(double) * (size_t)iters);
  for (int i = -20; i < iters; i++) {
    double t0 = stt_now_ms();
    st_result_t *r = call_ep(c, ep, NULL);
    double t1 = stt_now_ms();
    st_result_free(r);
    double t2 = stt_now_ms();
    if (i >= 0) {
      call[i] = (t1 - t0) * 1e3;
      fr[i] = (t2 - t1) * 1e3;
      tot[i] = (t2 - t0) * 1e3;
    }
  }
  char what[96];
  snprintf(what, sizeof what, "%s: call", label);
  bk_report(what, call, iters);
  snprintf(what, sizeof what, "%s: free", label);
  bk_report(what, fr, iters);
  snprintf(what, sizeof what, "%s: call + free", label);
  bk_report(what, tot, iters);
  free(call);
  free(fr);
  free(tot);
}

/* A plain endpoint on a connection of its own, with the result pool or
 * without it (ST_CLIENT_POOL=0 while it connects). */
static void bench_fresh(const char *sock, const char *ep, const char *label, int iters,
                        int pooled) {
  if (!pooled) setenv("ST_CLIENT_POOL", "0", 1);
  st_client_t *c = bk_connect(sock);
  unsetenv("ST_CLIENT_POOL");
  bench_plain(c, ep, label, iters);
  st_client_close(c);
}

/* ------------------------------------------------- fresh client processes */

static const char *self_exe = "/proc/self/exe";

/* fork + exec of this program with argv; its stdout into *out (malloc'ed,
 * NUL-terminated). Returns the exit status (0 ok). */
static int run_self(char *const argv[], char **out) {
  int p[2];
  if (pipe(p) != 0) exit(1);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(p[1], 1);
    close(p[0]);
    close(p[1]);
    execv(self_exe, argv);
    _exit(127);
  }
  close(p[1]);
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  ssize_t n;
  while ((n = read(p[0], buf + len, cap - len - 1)) > 0) {
    len += (size_t)n;
    if (cap - len < 256) buf = realloc(buf, cap *= 2);
  }
  buf[len] = '\0';
  close(p[0]);
  int status;
  waitpid(pid, &status, 0);
  *out = buf;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Child: cold open of the 300-tensor module. Prints one line:
 * "cold <exec> <ctx> <connect> <call> <first byte> <total>" in ms, total
 * from this process's first instruction of main to the last tensor's
 * first element read back. */
static int child_cold(const char *sock, int ctx_first, double t_parent) {
  double t0 = stt_now_ms();
  double t_ctx = t0;
  char err[256];
  if (ctx_first) {
    if (st__cuda_ctx_enter(0, err, sizeof err) != ST_OK) {
      fprintf(stderr, "context: %s\n", err);
      return 1;
    }
    t_ctx = stt_now_ms();
  }
  st_client_t *c;
  if (st_client_connect(sock, &c, err, sizeof err) != ST_OK) {
    fprintf(stderr, "connect: %s\n", err);
    return 1;
  }
  double t_conn = stt_now_ms();
  st_args_t *a = model_args(COLD_N, COLD_NUMEL);
  st_result_t *r = call_ep(c, "model", a);
  double t_call = stt_now_ms();
  size_t n = st_result_tensor_count(r);
  const st_tensor_t *last = n ? st_result_tensor(r, n - 1) : NULL;
  double v = last ? st_tensor_get(last, 0) : -1;
  double t_ready = stt_now_ms();
  if (n != COLD_N || v != COLD_N - 1) {
    fprintf(stderr, "cold open: %zu tensors, last starts with %g\n", n, v);
    return 1;
  }
  printf("cold %.3f %.3f %.3f %.3f %.3f %.3f\n", t0 - t_parent, t_ctx - t0, t_conn - t_ctx,
         t_call - t_conn, t_ready - t_call, t_ready - t0);
  st_args_free(a);
  st_result_free(r);
  st_client_close(c);
  return 0;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n ? v[n / 2] : 0;
}

static void bench_cold(st_client_t *c, const char *sock, int runs) {
  /* Build and cache the module first: the children measure opening it. */
  st_args_t *a = model_args(COLD_N, COLD_NUMEL);
  double t0 = stt_now_ms();
  st_result_t *r = call_ep(c, "model", a);
  double build_ms = stt_now_ms() - t0;
  st_object_info_t o;
  if (st_result_object(r, &o) != ST_OK || st_result_tensor_count(r) != COLD_N) {
    fprintf(stderr, "model: not a managed module of %d tensors\n", COLD_N);
    exit(1);
  }
  printf("cold open: module of %d float16 tensors x %d elements, arena %.1f MiB "
         "(built and cached in %.0f ms)\n",
         COLD_N, COLD_NUMEL, o.bytes / MiB, build_ms);
  st_result_free(r);
  st_args_free(a);
  for (int ctx_first = 1; ctx_first >= 0; ctx_first--) {
    double cols[6][64];
    int got = 0;
    for (int i = 0; i < runs && i < 64; i++) {
      char tp[32];
      snprintf(tp, sizeof tp, "%.3f", stt_now_ms());
      char *argv[] = {"bench_cuda", "--child-cold", (char *)sock, ctx_first ? "1" : "0", tp,
                      NULL};
      char *out;
      int st = run_self(argv, &out);
      double v[6];
      if (st == 0 && sscanf(out, "cold %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3],
                            &v[4], &v[5]) == 6) {
        for (int k = 0; k < 6; k++) cols[k][got] = v[k];
        got++;
      } else {
        fprintf(stderr, "cold child failed (status %d): %s\n", st, out);
      }
      free(out);
    }
    if (!got) continue;
    double m[6];
    for (int k = 0; k < 6; k++) m[k] = median(cols[k], got);
    printf("  fresh process, %s (median of %d):\n",
           ctx_first ? "CUDA context created first" : "context created by the first import",
           got);
    printf("    fork+exec to main %.1f ms (not counted)\n", m[0]);
    if (ctx_first) printf("    cuInit + primary context      %8.1f ms\n", m[1]);
    printf("    connect + hello               %8.1f ms\n", m[2]);
    printf("    call + import (1 arena)%s %8.1f ms\n", ctx_first ? "       " : " + ctx ", m[3]);
    printf("    last tensor's first element   %8.1f ms\n", m[4]);
    printf("    total, main -> all usable     %8.1f ms   (min %.1f, max %.1f)\n", m[5],
           cols[5][0], cols[5][got - 1]);
  }
}

static void bench_torch(int runs) {
  int have = system("python3 -c 'import sys, torch; "
                    "sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1");
  if (have != 0) {
    printf("torch.multiprocessing CUDA IPC baseline: skipped: no torch with CUDA\n");
    return;
  }
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "python3 %s/bench/torch_ipc_baseline.py --n %d --numel %d --runs %d",
           ST_BENCH_SOURCE_DIR, COLD_N, COLD_NUMEL, runs);
  fflush(stdout);
  int rc = system(cmd);
  if (rc != 0) printf("torch baseline exited with status %d\n", rc);
}

/* ------------------------------------------------ c. many processes, one model */

/* Child: create the context, report, wait; map the model, report, wait;
 * free and exit. `rd`/`wr`: the go and ready pipes' ends. */
static int child_map(const char *sock, int rd, int wr) {
  char err[256], b = 'c';
  if (st__cuda_ctx_enter(0, err, sizeof err) != ST_OK) {
    fprintf(stderr, "context: %s\n", err);
    return 1;
  }
  if (write(wr, &b, 1) != 1 || read(rd, &b, 1) != 1) return 1;
  st_client_t *c;
  if (st_client_connect(sock, &c, err, sizeof err) != ST_OK) {
    fprintf(stderr, "connect: %s\n", err);
    return 1;
  }
  st_args_t *a = model_args(BIG_N, BIG_NUMEL);
  st_result_t *r = call_ep(c, "model", a);
  size_t n = st_result_tensor_count(r);
  const st_tensor_t *last = n ? st_result_tensor(r, n - 1) : NULL;
  if (n != BIG_N || !last || st_tensor_get(last, 0) != BIG_N - 1) {
    fprintf(stderr, "map child: wrong model (%zu tensors)\n", n);
    return 1;
  }
  b = 'm';
  if (write(wr, &b, 1) != 1 || read(rd, &b, 1) != 1) return 1;
  st_result_free(r);
  st_args_free(a);
  st_client_close(c);
  return 0;
}

static void nvsmi_used(const char *when) {
  FILE *p = popen("nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>/dev/null", "r");
  if (!p) return;
  char line[128];
  if (fgets(line, sizeof line, p)) {
    line[strcspn(line, "\n")] = '\0';
    printf("    nvidia-smi memory.used %-28s %s (all processes, first GPU)\n", when, line);
  }
  pclose(p);
}

static void read_n(int fd, int n) {
  char b;
  for (int i = 0; i < n; i++)
    if (read(fd, &b, 1) != 1) {
      fprintf(stderr, "a map child died\n");
      exit(1);
    }
}

static void write_n(int fd, int n) {
  char b = 'g';
  for (int i = 0; i < n; i++)
    if (write(fd, &b, 1) != 1) exit(1);
}

static void round_of(const char *sock, int k, double base, double model_bytes) {
  int go[2], ready[2];
  if (pipe(go) != 0 || pipe(ready) != 0) exit(1);
  char rd[16], wr[16];
  snprintf(rd, sizeof rd, "%d", go[0]);
  snprintf(wr, sizeof wr, "%d", ready[1]);
  pid_t pids[256];
  for (int i = 0; i < k; i++) {
    if ((pids[i] = fork()) == 0) {
      close(go[1]);
      close(ready[0]);
      char *argv[] = {"bench_cuda", "--child-map", (char *)sock, rd, wr, NULL};
      execv(self_exe, argv);
      _exit(127);
    }
  }
  close(go[0]);
  close(ready[1]);
  read_n(ready[0], k);
  double with_ctx = gpu_used_settled();
  write_n(go[1], k);
  read_n(ready[0], k);
  double mapped = gpu_used_settled();
  printf("  %d client process%s mapping the %.2f GiB model at once:\n", k, k == 1 ? "" : "es",
         model_bytes / GiB);
  printf("    CUDA contexts of the clients  %8.0f MiB (%.0f MiB per process)\n",
         (with_ctx - base) / MiB, (with_ctx - base) / MiB / k);
  printf("    their mappings of the model   %8.0f MiB (a copy per process: %.0f MiB)\n",
         (mapped - with_ctx) / MiB, k * model_bytes / MiB);
  nvsmi_used("while mapped:");
  write_n(go[1], k);
  close(go[1]);
  close(ready[0]);
  for (int i = 0; i < k; i++) waitpid(pids[i], NULL, 0);
}

static void bench_many(st_client_t *c, const char *sock, int clients) {
  double before = gpu_used_settled();
  st_args_t *a = model_args(BIG_N, BIG_NUMEL);
  double t0 = stt_now_ms();
  st_result_t *r = call_ep(c, "model", a);
  double build_ms = stt_now_ms() - t0;
  st_object_info_t o;
  if (st_result_object(r, &o) != ST_OK) {
    fprintf(stderr, "model: no object\n");
    exit(1);
  }
  double model_bytes = (double)o.bytes;
  st_result_free(r);   /* unmapped here; the cache (and our lease) keep it */
  st_args_free(a);
  double base = gpu_used_settled();
  printf("one model mapped by many processes: %d float16 tensors of %lld elements, arena "
         "%.2f GiB (built in %.0f ms)\n",
         BIG_N, BIG_NUMEL, model_bytes / GiB, build_ms);
  printf("    device memory the server holds for it  %8.0f MiB\n", (base - before) / MiB);
  nvsmi_used("with no client mapping:");
  round_of(sock, 1, base, model_bytes);
  double after1 = gpu_used_settled();
  round_of(sock, clients, after1, model_bytes);
  double after = gpu_used_settled();
  printf("    after the clients exited: %+.0f MiB against before the first round\n",
         (after - base) / MiB);
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv) {
  if (argc >= 5 && !strcmp(argv[1], "--child-cold"))
    return child_cold(argv[2], atoi(argv[3]), atof(argv[4]));
  if (argc >= 5 && !strcmp(argv[1], "--child-map"))
    return child_map(argv[2], atoi(argv[3]), atoi(argv[4]));
  int spin_us = -1;   /* --spin-us: the server's default */
  int iters = 5000, cold_runs = 5, clients = 8, torch = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--spin-us") && i + 1 < argc) spin_us = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--cold-runs") && i + 1 < argc) cold_runs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--clients") && i + 1 < argc) clients = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--no-torch")) torch = 0;
    else {
      fprintf(stderr, "usage: bench_cuda [--iters N] [--spin-us N] [--cold-runs N] [--clients N] [--no-torch]\n");
      return 2;
    }
  }
  if (iters < 1 || cold_runs < 1 || clients < 1 || clients > 256) {
    fprintf(stderr, "bench_cuda: --iters, --cold-runs >= 1, --clients in 1..256\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  char why[512];
  if (st__cuda_available(why, sizeof why) != ST_OK) {
    printf("bench_cuda: skipped: %s\n", why);
    return 0;
  }
  bk_setup();

  stt_server_t s;
  stt_server_init(&s);
  stt_write_endpoint(&s, "bench.lua", ENDPOINTS);
  bk_server_config(&s, spin_us);
  if (stt_server_start(&s) != 0) return 1;

  char uuid[ST_CUDA_UUID_LEN] = "";
  if (st__cuda_device_uuid(0, uuid, why, sizeof why) != ST_OK) snprintf(uuid, sizeof uuid, "?");
  printf("bench_cuda: %ld CPUs, device 0 %s, %d iterations per latency figure\n",
         sysconf(_SC_NPROCESSORS_ONLN), uuid, iters);
  st_client_t *c = bk_connect(s.socket);
  printf("a. call latency with a 2 MiB CUDA result\n");
  bench_ping(c, iters);
  bench_cached(c, iters, 1);
  bench_cached(c, iters, 0);
  int plain = iters / 5 > 200 ? iters / 5 : 200;
  bench_fresh(s.socket, "plain2m", "plain, new 2 MiB VMM arena", plain, 0);
  bench_fresh(s.socket, "plain2m_cpu", "plain, new 2 MiB memfd (CPU)", plain, 0);
  bench_fresh(s.socket, "fresh1m", "fresh 1 MiB CUDA result, result pool", iters, 1);
  bench_fresh(s.socket, "fresh4", "fresh 4-float CUDA result, result pool", iters, 1);
  bench_fresh(s.socket, "fresh1m", "fresh 1 MiB CUDA result, own VMM arena", plain, 0);
  printf("b. cold open in a fresh process\n");
  bench_cold(c, s.socket, cold_runs);
  if (torch) bench_torch(cold_runs > 3 ? 3 : cold_runs);
  printf("c. device memory, many processes mapping one model\n");
  bench_many(c, s.socket, clients);

  st_client_close(c);
  int rc = stt_server_stop(&s);
  stt_server_cleanup(&s);
  return rc == 0 ? 0 : 1;
}
