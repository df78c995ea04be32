/* soak: N client connections against a real stserver for a fixed time,
 * then a check that the server is back where it started.
 *
 *   soak [--conns N] [--procs P] [--seconds S] [--think-ms MS] [--kill-pct PCT]
 *        [--reload-s S] [--cuda-procs P] [--rss-tol-mb MB] [--budget-mb MB]
 *
 * Defaults: 1000 connections in 50 processes (threads, one connection
 * each), 600 s, 50 ms mean pause between operations, 10% of the client
 * processes SIGKILLed (at evenly spaced times, mid-request) and replaced,
 * a reload every 5 s (SIGHUP and the `reload` method in turn; every other
 * one rewrites soak_cached.lua so that its cache is dropped), 2 processes
 * doing CUDA operations when the server has a CUDA device.
 *
 * The server runs in a temp dir with a config this program writes (64 MiB
 * CPU budget, tasks.ttl_s = 5, max_connections = N + 64) and the endpoints
 * of bench/soak/endpoints. Each client thread mixes ping, fresh (pooled)
 * and cached calls, leases (managed object, release), tensor arguments
 * (memfd from st_tensor_alloc, through the argument cache),
 * submit/wait/result, invalidations (worker.c), puts and gets through views
 * (keys.c), live keys with a publisher and bound readers (live.c), buffers
 * with read_new (buffers.c), hand-offs (handoff.c), and on a GPU host CUDA
 * results and CUDA tensor arguments.
 *
 * Reported at start and at the end (after the clients left, the caches were
 * invalidated, the keys and buffers the load left named were removed and
 * the server went idle): server fds, RSS, RssShmem, arenas, objects, pool
 * bytes, the CPU budget's charge, keys, buffers, held descriptors and
 * holdings, device free memory (info, and nvidia-smi where present); then
 * requests sent, answered, lost, error replies by code, p50/p99 ping under
 * load. PASS when: fds, arenas, objects, pool bytes, budget, keys,
 * buffers, held fds/bytes and holdings equal their start values,
 * RssShmem within 1 MiB, RSS within --rss-tol-mb (default 64), device free
 * memory within 4 MiB, 0 requests lost, 0 wrong replies, no client process
 * hung or died on its own, and the server exits cleanly on SIGTERM. Exit
 * status 0 on PASS, 1 on FAIL.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture.h"
#include "kit.h"
#include "snapshot.h"
#include "soak.h"
#include "st/client.h"

typedef struct opts {
  int conns, procs, kill_pct, cuda_procs, think_ms;
  double seconds, reload_s, rss_tol_mb, budget_mb;
} opts_t;

static void usage(void) {
  fprintf(stderr, "usage: soak [--conns N] [--procs P] [--seconds S] [--think-ms MS] "
                  "[--kill-pct PCT] [--reload-s S] [--cuda-procs P] [--rss-tol-mb MB] "
                  "[--budget-mb MB]\n");
  exit(2);
}

static opts_t parse(int argc, char **argv) {
  opts_t o = {.conns = 1000, .procs = 0, .kill_pct = 10, .cuda_procs = 2, .think_ms = 50,
              .seconds = 600, .reload_s = 5, .rss_tol_mb = 64, .budget_mb = 64};
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) usage();
    i++;
    if (!strcmp(f, "--conns")) o.conns = atoi(v);
    else if (!strcmp(f, "--procs")) o.procs = atoi(v);
    else if (!strcmp(f, "--seconds")) o.seconds = atof(v);
    else if (!strcmp(f, "--think-ms")) o.think_ms = atoi(v);
    else if (!strcmp(f, "--kill-pct")) o.kill_pct = atoi(v);
    else if (!strcmp(f, "--reload-s")) o.reload_s = atof(v);
    else if (!strcmp(f, "--cuda-procs")) o.cuda_procs = atoi(v);
    else if (!strcmp(f, "--rss-tol-mb")) o.rss_tol_mb = atof(v);
    else if (!strcmp(f, "--budget-mb")) o.budget_mb = atof(v);
    else usage();
  }
  if (o.procs <= 0) o.procs = o.conns / 20 > 0 ? o.conns / 20 : 1;
  if (o.conns < o.procs || o.conns <= 0 || o.seconds <= 0) usage();
  return o;
}

/* Gives this process (and the server it starts) enough descriptors for
 * the connections: the soft limit up to the hard one. */
static void raise_nofile(int conns) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  getrlimit(RLIMIT_NOFILE, &rl);
  printf("soak: RLIMIT_NOFILE %llu\n", (unsigned long long)rl.rlim_cur);
  if (rl.rlim_cur < (rlim_t)conns * 2 + 256)
    printf("soak: warning: %d connections want about %d descriptors in the server\n", conns,
           conns * 2 + 256);
}

static sk_shared_t *SH;
static stt_server_t S;

static pid_t spawn(int slot, int use_cuda) {
  sk_slot_t *s = &SH->slots[slot];
  s->use_cuda = use_cuda;
  atomic_store(&s->state, SK_RUNNING);
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    exit(1);
  }
  if (pid == 0) sk_worker_main(SH, slot);
  atomic_store(&s->pid, pid);
  return pid;
}

/* Writes soak_cached.lua with `version` (a reload then sees it changed). */
static void write_cached(int version) {
  char path[600], *text = NULL;
  snprintf(path, sizeof path, "%s/bench/soak/endpoints/soak_cached.lua", ST_BENCH_SOURCE_DIR);
  FILE *f = fopen(path, "r");
  if (!f) { perror(path); exit(1); }
  size_t cap = 1 << 16, n = fread(text = malloc(cap), 1, cap - 1, f);
  fclose(f);
  text[n] = '\0';
  char *v = strstr(text, "local version = ");
  char out[1 << 16];
  if (!v) { fprintf(stderr, "soak_cached.lua has no 'local version = '\n"); exit(1); }
  snprintf(out, sizeof out, "%.*slocal version = %d%s", (int)(v - text), text, version,
           strchr(v, '\n'));
  stt_write_endpoint(&S, "soak_cached.lua", out);
  free(text);
}

static void write_endpoints(void) {
  static const char *const names[] = {"soak_fresh.lua", "soak_managed.lua", "soak_scale.lua",
                                      "soak_task.lua", "soak_cuda.lua"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char path[600];
    snprintf(path, sizeof path, "%s/bench/soak/endpoints/%s", ST_BENCH_SOURCE_DIR, names[i]);
    FILE *f = fopen(path, "r");
    if (!f) { perror(path); exit(1); }
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    stt_write_endpoint(&S, names[i], text);
  }
  write_cached(0);
}

/* Alternates SIGHUP and the `reload` method; every other one changes a file. */
static void reload(st_client_t *mon, int n) {
  if (n % 2 == 0) write_cached(n);
  if (n % 4 < 2) {
    kill(S.pid, SIGHUP);
    return;
  }
  st_result_t *r = NULL;
  if (st_client_reload(mon, &r) != ST_OK)
    printf("soak: reload: %s: %s\n", st_client_error_name(mon), st_client_error(mon));
  st_result_free(r);
}

/* Kills one running client process at random and starts its replacement. */
static void kill_one(int *nslots_used, unsigned *seed) {
  int live[4096], n = 0;
  for (int i = 1; i < *nslots_used && n < 4096; i++)
    if (atomic_load(&SH->slots[i].state) == SK_RUNNING) live[n++] = i;
  if (!n || *nslots_used >= SH->nslots) return;
  int victim = live[rand_r(seed) % (unsigned)n];
  sk_slot_t *s = &SH->slots[victim];
  pid_t pid = atomic_load(&s->pid);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  atomic_store(&s->state, SK_KILLED);
  spawn((*nslots_used)++, s->use_cuda);
}

/* Client processes that ended on their own (crash, exit 1) so far. */
static int reap_unexpected(int nslots_used) {
  int bad = 0;
  for (int i = 0; i < nslots_used; i++) {
    sk_slot_t *s = &SH->slots[i];
    int st;
    if (atomic_load(&s->state) != SK_RUNNING) continue;
    if (waitpid(atomic_load(&s->pid), &st, WNOHANG) > 0) {
      atomic_store(&s->state, SK_EXITED);
      if (!atomic_load(&SH->stop) || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        printf("soak: client process %d ended on its own (status %d)\n", (int)s->pid, st);
        bad++;
      }
    }
  }
  return bad;
}

/* Asks every client to stop and waits (90 s) for them; returns how many
 * had to be killed (hung). */
static int stop_clients(int nslots_used) {
  atomic_store(&SH->stop, 1);
  int hung = 0;
  double end = stt_now_ms() + 90000;
  for (int i = 0; i < nslots_used; i++) {
    sk_slot_t *s = &SH->slots[i];
    if (atomic_load(&s->state) != SK_RUNNING) continue;
    pid_t pid = atomic_load(&s->pid);
    int st, r;
    while ((r = waitpid(pid, &st, WNOHANG)) == 0 && stt_now_ms() < end) stt_sleep_ms(20);
    if (r == 0) {
      printf("soak: client process %d did not stop within 90 s: killed\n", (int)pid);
      kill(pid, SIGKILL);
      waitpid(pid, NULL, 0);
      hung++;
    }
    atomic_store(&s->state, SK_EXITED);
  }
  return hung;
}

int main(int argc, char **argv) {
  opts_t o = parse(argc, argv);
  setenv("ST_SERVER_BIN", ST_BENCH_SERVER_BIN, 0);
  setenv("ST_SOURCE_DIR", ST_BENCH_SOURCE_DIR, 0);
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  raise_nofile(o.conns);

  int nkill = (o.procs * o.kill_pct + 50) / 100;
  int nslots = 1 + o.procs + nkill;
  size_t shsize = sizeof(sk_shared_t) + (size_t)nslots * sizeof(sk_slot_t);
  SH = mmap(NULL, shsize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (SH == MAP_FAILED) { perror("mmap"); return 1; }
  memset(SH, 0, shsize);
  SH->nslots = nslots;

  stt_server_init(&S);
  char cfg[512];
  snprintf(cfg, sizeof cfg,
           "log_level = 'warn', workers = 4, memory_budget = { cpu = %.0f * 1024 * 1024 },\n"
           "limits = { max_connections = %d }, tasks = { ttl_s = 5 },\n",
           o.budget_mb, o.conns + 64);
  stt_server_config(&S, cfg);
  write_endpoints();
  if (stt_server_start(&S) != 0) return 1;
  printf("soak: server pid %d, dir %s\n", (int)S.pid, S.dir);
  st_client_t *mon = bk_connect(S.socket);
  snprintf(SH->opts.socket, sizeof SH->opts.socket, "%s", S.socket);
  SH->opts.cuda = sk_info_int(mon, "cuda", "devices") > 0;
  SH->opts.think_ms = o.think_ms;
  SH->opts.conns_per_proc = 1;

  /* Warm up: one process runs each operation once, so that lazily made
   * state (worker Lua states, CUDA contexts) is in the start figures. */
  SH->opts.warmup = 1;
  pid_t w = spawn(0, SH->opts.cuda);
  int wst;
  waitpid(w, &wst, 0);
  SH->opts.warmup = 0;
  if (!WIFEXITED(wst) || WEXITSTATUS(wst) != 0 || atomic_load(&SH->slots[0].wrong)) {
    printf("soak: warm-up failed (status %d)\n", wst);
    return 1;
  }
  sk_snapshot_t start, end;
  if (sk_settle(mon, &S, NULL, &start) != 0) printf("soak: server not idle before the load\n");
  sk_snapshot_print("start", &start);

  int per = o.conns / o.procs, used = 1;
  SH->opts.conns_per_proc = per;
  printf("soak: %d connections in %d client processes (%d each), %.0f s, think %d ms, "
         "%d kills, reload every %.0f s, CUDA %s\n", per * o.procs, o.procs, per, o.seconds,
         o.think_ms, nkill, o.reload_s, SH->opts.cuda ? "yes" : "no");
  for (int p = 0; p < o.procs; p++) spawn(used++, SH->opts.cuda && p < o.cuda_procs);

  double t0 = stt_now_ms(), next_reload = o.reload_s * 1e3, next_report = 10e3;
  long mid_rss = -1;   /* the RSS halfway through the load (sk_report) */
  int kills = 0, reloads = 0, unexpected = 0;
  unsigned seed = (unsigned)getpid();
  while (stt_now_ms() - t0 < o.seconds * 1e3) {
    double now = stt_now_ms() - t0;
    if (kills < nkill && now >= o.seconds * 1e3 * (kills + 1) / (nkill + 1)) {
      kill_one(&used, &seed);
      kills++;
    }
    if (o.reload_s > 0 && now >= next_reload) {
      reload(mon, reloads++);
      next_reload += o.reload_s * 1e3;
    }
    unexpected += reap_unexpected(used);
    if (waitpid(S.pid, NULL, WNOHANG) == S.pid) {
      printf("soak: FAIL: the server died during the load\n");
      S.pid = -1;
      return 1;
    }
    if (now >= next_report) {
      long rss = sk_progress(mon, &S, SH, used, now / 1e3);
      if (mid_rss < 0 && now >= o.seconds * 500.0) mid_rss = rss;
      next_report += 10e3;
    }
    stt_sleep_ms(50);
  }
  int hung = stop_clients(used);
  double load_s = (stt_now_ms() - t0) / 1e3;
  printf("soak: load over after %.1f s: %d kills, %d reloads; clients stopped\n", load_s, kills,
         reloads);

  int settled = sk_settle(mon, &S, &start, &end);
  sk_snapshot_print("end", &end);
  int pass = sk_report(SH, used, load_s, &start, &end, mid_rss, o.rss_tol_mb) && settled == 0;
  if (hung || unexpected) {
    printf("soak: %d client processes hung, %d ended on their own\n", hung, unexpected);
    pass = 0;
  }
  st_client_close(mon);
  int rc = stt_server_stop(&S);
  if (rc != 0) {
    printf("soak: the server did not exit cleanly on SIGTERM\n");
    pass = 0;
  }
  stt_server_cleanup(&S);
  printf("soak: %s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
