/* bench_pull: a key pulled from one stserver into another over UCX, next
 * to UCX's own figure for the same transport (docs/multihost.md; figures
 * in docs/benchmarks.md, "Keys between servers").
 *
 *   build/bench/bench_pull [--mib 64,512] [--arenas 4] [--iters 5] [--to cpu|cuda:N]
 *
 * Two servers on this host acting as two hosts (a cluster key, loopback
 * TCP, UCX_TLS=tcp UCX_NET_DEVICES=lo unless set): a key of the given size
 * in `arenas` memfd arenas is put on a, pulled by b (a new name each
 * time, deleted after), timed from the pull request to the task's end as
 * a client sees it, and as the receiving server counts it (describe,
 * allocate, transfer, publish). `--to cuda:0` pulls onto a CUDA device:
 * the receiver's helper stages the bytes through host memory (the path of
 * a CPU key pulled onto a GPU, docs/multihost.md). Then ucx_perftest (ucx-utils), when
 * installed, moves the same message sizes over the same transport
 * (tag_bw), the engine's own figure. Prints what it measured. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fixture.h"
#include "kit.h"
#include "wire.h"

static double now_s(void) { return stt_now_ms() / 1e3; }

static void die(const char *what) {
  fprintf(stderr, "bench_pull: %s\n", what);
  exit(1);
}

/* info `path` of the server at socket. */
static char listen_of(const stt_server_t *s, char *out, size_t len) {
  rc_t c;
  msg_t m;
  out[0] = '\0';
  if (rc_open(&c, s->socket) != 0) die("connect");
  if (rc_rpcf(&c, &m, "[0, 1, 'info', []]") == 1)
    snprintf(out, len, "%s", obj_str(obj_path(m.result, "peer.listen")));
  msg_free(&m);
  rc_close(&c);
  return out[0];
}

static int link_up(const stt_server_t *s) {
  rc_t c;
  msg_t m;
  int up = 0;
  if (rc_open(&c, s->socket) != 0) return 0;
  if (rc_rpcf(&c, &m, "[0, 1, 'info', []]") == 1) up = obj_int(obj_path(m.result, "peer.links_up")) >= 1;
  msg_free(&m);
  rc_close(&c);
  return up;
}

/* Puts key `name` of `bytes` in n arenas (tensors t0..) on the server. */
static void put_key(const char *socket, const char *name, uint64_t bytes, int n) {
  char value[4096] = "", arenas[4096] = "";
  int fds[16];
  uint64_t each = bytes / (uint64_t)n;
  for (int k = 0; k < n; k++) {
    fds[k] = rc_memfd_with(each, 0, 1);
    uint8_t *p = fds[k] >= 0 ? mmap(NULL, each, PROT_READ | PROT_WRITE, MAP_SHARED, fds[k], 0)
                             : MAP_FAILED;
    if (p == MAP_FAILED) die("memfd");
    memset(p, 0x5a + k, each);   /* every page present, as a key's are */
    munmap(p, each);
    fcntl(fds[k], F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
    char one[256];
    snprintf(one, sizeof one, "%st%d: tensor(%d, 0, 'uint8', [%llu], [1])", k ? ", " : "", k, k,
             (unsigned long long)each);
    strcat(value, one);
    snprintf(one, sizeof one, "%s{fd: %d, bytes: %llu, device: 'cpu', backend: 'memfd', id: %d}",
             k ? ", " : "", k, (unsigned long long)each, k + 1);
    strcat(arenas, one);
  }
  rc_t c;
  msg_t m;
  if (rc_open(&c, socket) != 0) die("connect");
  if (rc_rpcf_fds(&c, &m, fds, n, "[0, 1, 'put', [{key: '%s', value: {%s}, arenas: [%s]}]]",
                  name, value, arenas) != 1 || m.error)
    die("put");
  msg_free(&m);
  rc_close(&c);
}

/* One pull of `key` as `as` onto `device`: client seconds; *server_s the
 * task's own. */
static double pull_once(rc_t *c, const char *key, const char *as, const char *device,
                        double *server_s) {
  msg_t m;
  double t0 = now_s();
  if (rc_rpcf(c, &m, "[0, 1, 'pull', [{key: '%s', from: 'a', as: '%s', device: '%s'}]]", key,
              as, device) != 1 ||
      m.error) {
    fprintf(stderr, "bench_pull: pull: %s\n",
            m.error ? obj_str(obj_get(m.error, "message")) : "no reply");
    exit(1);
  }
  int64_t id = obj_int(obj_get(m.result, "task_id"));
  msg_free(&m);
  if (rc_rpcf(c, &m, "[0, 2, 'wait', [{task_id: %lld, timeout: 600}]]", (long long)id) != 1 ||
      m.error || strcmp(obj_str(obj_get(m.result, "status")), "completed") != 0) {
    fprintf(stderr, "bench_pull: task %lld: %s\n", (long long)id,
            m.error ? obj_str(obj_get(m.error, "message"))
                    : obj_str(obj_path(m.result, "error.message")));
    exit(1);
  }
  double s = now_s() - t0;
  msg_free(&m);
  if (rc_rpcf(c, &m, "[0, 3, 'result', [{task_id: %lld}]]", (long long)id) != 1 || m.error)
    die("result");
  *server_s = obj_num(obj_path(obj_get(m.result, "value"), "seconds"));
  msg_free(&m);
  if (rc_rpcf(c, &m, "[0, 4, 'delete', [{key: '%s'}]]", as) != 1 || m.error) die("delete");
  msg_free(&m);
  return s;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  const char *mibs = "64,512";
  int arenas = 4, iters = 5;
  const char *to = "cpu";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--mib") && i + 1 < argc) mibs = argv[++i];
    else if (!strcmp(argv[i], "--arenas") && i + 1 < argc) arenas = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--to") && i + 1 < argc) to = argv[++i];
    else {
      fprintf(stderr, "usage: bench_pull [--mib 64,512] [--arenas 4] [--iters 5] "
              "[--to cpu|cuda:N]\n");
      return 2;
    }
  }
  if (arenas < 1 || arenas > 16 || iters < 1 || iters > 100) die("--arenas 1..16, --iters 1..100");
  bk_setup();
  setenv("UCX_TLS", getenv("UCX_TLS") ? getenv("UCX_TLS") : "tcp", 1);
  setenv("UCX_NET_DEVICES", getenv("UCX_NET_DEVICES") ? getenv("UCX_NET_DEVICES") : "lo", 1);
  stt_server_t a, b;
  stt_server_init(&a);
  stt_server_init(&b);
  char key[400];
  snprintf(key, sizeof key, "%s/cluster.key", a.dir);
  stt_write_file(key, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n");
  chmod(key, 0600);
  char cfg[1200], addr[128];
  snprintf(cfg, sizeof cfg, "log_level = '%s', memory_budget = { cpu = 8589934592 }, peer = { "
           "id = 'a', listen = '127.0.0.1:0', secret = '%s', peers = { b = {} }, export = { '*' } },",
           getenv("BENCH_PULL_LOG") ? "debug" : "warn", key);
  stt_server_config(&a, cfg);
  if (stt_server_start(&a) != 0 || !listen_of(&a, addr, sizeof addr)) die("server a");
  snprintf(cfg, sizeof cfg, "log_level = '%s', memory_budget = { cpu = 8589934592 }, peer = { "
           "id = 'b', secret = '%s', peers = { a = '%s' } },",
           getenv("BENCH_PULL_LOG") ? "debug" : "warn", key, addr);
  stt_server_config(&b, cfg);
  if (stt_server_start(&b) != 0) die("server b");
  for (int i = 0; i < 500 && !link_up(&b); i++) stt_sleep_ms(20);
  printf("bench_pull: %s=%s %s=%s, %d arenas per key, %d pulls per size, cpu -> %s\n",
         "UCX_TLS", getenv("UCX_TLS"), "UCX_NET_DEVICES", getenv("UCX_NET_DEVICES"), arenas, iters,
         to);
  char list[256];
  snprintf(list, sizeof list, "%s", mibs);
  rc_t c;
  if (rc_open(&c, b.socket) != 0) die("connect b");
  for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
    uint64_t bytes = (uint64_t)atoll(tok) << 20;
    char name[64];
    snprintf(name, sizeof name, "k%s", tok);
    put_key(a.socket, name, bytes, arenas);
    double cs[100], ss[100];
    for (int i = 0; i < iters + 1; i++) {
      char as[64];
      snprintf(as, sizeof as, "copy%s.%d", tok, i);
      double srv_s;
      double s = pull_once(&c, name, as, to, &srv_s);
      if (i == 0) continue;   /* the first pull starts each side's UCX worker */
      cs[i - 1] = s;
      ss[i - 1] = srv_s;
    }
    qsort(cs, (size_t)iters, sizeof *cs, cmp);
    qsort(ss, (size_t)iters, sizeof *ss, cmp);
    double med = cs[iters / 2], smed = ss[iters / 2];
    printf("pull %6s MiB: client %8.1f ms (%.2f GB/s), server %8.1f ms (%.2f GB/s); "
           "min %.1f ms, max %.1f ms\n",
           tok, med * 1e3, (double)bytes / med / 1e9, smed * 1e3, (double)bytes / smed / 1e9,
           cs[0] * 1e3, cs[iters - 1] * 1e3);
  }
  rc_close(&c);
  if (getenv("BENCH_PULL_LOG")) {   /* both servers' logs, for a slow step */
    char *la = stt_server_log(&a), *lb = stt_server_log(&b);
    printf("--- a\n%s--- b\n%s", la ? la : "", lb ? lb : "");
    free(la);
    free(lb);
  }
  stt_server_stop(&b);
  stt_server_stop(&a);
  stt_server_cleanup(&b);
  stt_server_cleanup(&a);
  /* The engine's own figure over the same transport, when installed. */
  bk_ucx_perftest("tag_bw", 8u << 20, "the engine's own");
  return 0;
}
