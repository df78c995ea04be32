/* `stserver --takeover` (docs/operations.md, "Upgrades without a service
 * manager"): a new server process takes over from a running one, through
 * libstclient, across processes:
 *   - a new binary that cannot start (its endpoints do not load) asks for
 *     the takeover and fails: the old server serves on, with its keys,
 *     and clients that lost their connection connect again to it;
 *   - under load (clients in processes of their own putting and getting
 *     keys without a pause), a new server takes over: the old one exits
 *     with status 0, every request is answered (a client sees at most one
 *     end of connection, after which it connects again and sends the
 *     request that was not answered), no put is lost or made twice
 *     (each client's versions run 1, 2, ... without a gap), and the new
 *     server serves the same memory (the keys' memfd inodes) and the
 *     buffer, and says what it restored.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_kit.h"
#include "proc.h"

static stt_server_t S;
#define LOADERS 4

/* Requests each loader had answered, in memory the loaders share. */
static volatile uint64_t *answered;

typedef struct load_report {
  uint64_t ok, reconnects, puts, gets, failures;
  char failure[200];
} load_report_t;

static int put_value(st_client_t *c, const char *key, st_result_t *t, uint64_t *v) {
  st_args_t *a = st_args_new();
  int rc = st_args_tensor(a, "x", st_result_tensor(t, 0), NULL, 0);
  if (rc == ST_OK) rc = st_client_put(c, key, a, ST_KEY_PINNED, 0, v);
  st_args_free(a);
  return rc;
}

static st_client_t *connect_retry(const char *path) {
  for (int i = 0; i < 2000; i++) {
    st_client_t *c = NULL;
    if (st_client_connect(path, &c, NULL, 0) == ST_OK) {
      st_client_set_timeout(c, 30000);
      return c;
    }
    usleep(5000);
  }
  return NULL;
}

/* A loader: alternately puts "load/<i>" (version j holds the value j)
 * and gets "model", until `stop` is readable; a request cut by the end
 * of its connection is sent again on a new one. Writes its report to
 * `out`. */
static void loader(int i, int stop, int out) {
  load_report_t rep;
  memset(&rep, 0, sizeof rep);
  char key[32];
  snprintf(key, sizeof key, "load/%d", i);
  st_client_t *c = connect_retry(S.socket);
  if (!c) _exit(2);
  st_result_t *t = stt_tensor_filled(64, 0.0f);
  for (uint64_t j = 1;; j++) {
    char b;
    if (read(stop, &b, 1) >= 0 || errno != EAGAIN) break;
    int is_put = j % 2;
    for (int attempt = 0;; attempt++) {
      int rc;
      uint64_t v = 0;
      if (is_put) {
        ((float *)st_result_tensor(t, 0)->data)[0] = (float)(rep.puts + 1);
        rc = put_value(c, key, t, &v);
      } else {
        st_result_t *r = NULL;
        rc = st_client_get(c, "model", 0, 0, &r, &v);
        if (rc == ST_OK && (!r || ((const float *)st_result_find(r, "x")->data)[0] != 7.0f))
          rc = ST_ERR_INTERNAL;
        st_result_free(r);
      }
      if (rc == ST_OK) {
        if (is_put && v != rep.puts + 1) {
          snprintf(rep.failure, sizeof rep.failure, "put %" PRIu64 " made version %" PRIu64,
                   rep.puts + 1, v);
          rep.failures++;
        }
        rep.ok++;
        __atomic_add_fetch(&answered[i], 1, __ATOMIC_RELAXED);
        if (is_put) rep.puts++;
        else rep.gets++;
        break;
      }
      if (rc != ST_ERR_IO || attempt > 0) {
        snprintf(rep.failure, sizeof rep.failure, "%s: %s", st_client_error_name(c),
                 st_client_error(c));
        rep.failures++;
        break;
      }
      /* The end of the connection: the request never ran. */
      st_client_close(c);
      rep.reconnects++;
      if (!(c = connect_retry(S.socket))) _exit(3);
    }
  }
  st_result_free(t);
  st_client_close(c);
  if (write(out, &rep, sizeof rep) != (ssize_t)sizeof rep) _exit(4);
  _exit(0);
}

/* Starts a process of stserver with the test's config and `extra`
 * flags; its pid. */
static pid_t spawn_server(const char *const *extra) {
  const char *bin = getenv("ST_SERVER_BIN");
  pid_t pid = fork();
  if (pid == 0) {
    FILE *log = fopen(S.log, "a");
    if (log) {
      dup2(fileno(log), 2);
      dup2(fileno(log), 1);
    }
    const char *argv[16] = {bin, "--config", S.config};
    int n = 3;
    for (int i = 0; extra[i] && n < 15; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    execv(bin, (char *const *)argv);
    _exit(127);
  }
  return pid;
}

/* The exit status of pid within ms, or -1. */
static int wait_exit(pid_t pid, int ms) {
  for (int i = 0; i < ms; i++) {
    int status;
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    usleep(1000);
  }
  return -1;
}

/* Requests all loaders had answered. */
static uint64_t answered_all(void) {
  uint64_t n = 0;
  for (int i = 0; i < LOADERS; i++) n += __atomic_load_n(&answered[i], __ATOMIC_RELAXED);
  return n;
}

/* Waits (10 s at most) until the loaders had `more` requests answered. */
static void wait_answered(uint64_t more) {
  uint64_t until = answered_all() + more;
  for (int i = 0; i < 10000 && answered_all() < until; i++) usleep(1000);
}

static st_result_t *model;
static st_client_t *owner;

TEST(a_new_server_that_fails_leaves_the_old_one_serving) {
  owner = stt_client_open(S.socket);
  CHECK(owner);
  if (!owner) return;
  model = stt_tensor_filled(1024, 7.0f);
  uint64_t v = 0;
  CHECK_EQ_INT(put_value(owner, "model", model, &v), ST_OK);
  CHECK_EQ_INT(v, 1);
  pid_t bad = spawn_server((const char *const[]){"--takeover", "--endpoints",
                                                  "/nonexistent/endpoints", NULL});
  CHECK_EQ_INT(wait_exit(bad, 20000), 1);
  /* The old server took its connections' end, then serves on. */
  OPEN_CLIENT(c, S.socket);
  if (!c) return;
  CHECK_EQ_INT(st_client_ping(c, NULL), ST_OK);
  st_result_t *r = NULL;
  CHECK_EQ_INT(st_client_get(c, "model", 0, 0, &r, &v), ST_OK);
  st_result_free(r);
  CHECK(kill(S.pid, 0) == 0);
  char *log = stt_server_log(&S);
  CHECK_CONTAINS(log, "failed: the new server says: failed");
  CHECK_CONTAINS(log, "serving on");
  free(log);
  st_client_close(c);
  st_client_close(owner);   /* the old server closed it */
  owner = NULL;
}

TEST(a_takeover_under_load_loses_nothing) {
  OPEN_CLIENT(c, S.socket);
  if (!c) return;
  st_buffer_t *b = NULL;
  int64_t shape[1] = {16};
  CHECK_EQ_INT(st_buffer_create(c, "frames", "cpu", ST_DTYPE_FLOAT32, 1, shape, 2, &b), ST_OK);
  float f[16] = {5.0f};
  if (b) CHECK_EQ_INT(st_buffer_write(b, f, sizeof f, 1000, NULL), ST_OK);
  int stop[2], out[2];
  CHECK(pipe2(stop, O_CLOEXEC) == 0 && pipe2(out, O_CLOEXEC) == 0);
  fcntl(stop[0], F_SETFL, O_NONBLOCK);
  pid_t kids[LOADERS];
  for (int i = 0; i < LOADERS; i++) {
    kids[i] = fork();
    if (kids[i] == 0) {
      close(stop[1]);
      close(out[0]);
      loader(i, stop[0], out[1]);
    }
  }
  close(out[1]);
  /* Load runs on the old server for a while. */
  wait_answered(400);
  CHECK(answered_all() >= 400);
  pid_t old = S.pid;
  stt_server_t N = S;
  N.extra_args[0] = "--takeover";
  N.extra_args[1] = NULL;
  CHECK_EQ_INT(stt_server_start(&N), 0);
  CHECK_EQ_INT(wait_exit(old, 20000), 0);
  S.pid = N.pid;
  /* Load runs on the new server for a while. */
  st_client_t *d = stt_client_open(S.socket);
  CHECK(d);
  if (!d) return;
  uint64_t then = answered_all();
  wait_answered(400);
  CHECK(answered_all() >= then + 400);
  close(stop[1]);
  load_report_t total;
  memset(&total, 0, sizeof total);
  for (int i = 0; i < LOADERS; i++) {
    load_report_t rep;
    CHECK(read(out[0], &rep, sizeof rep) == (ssize_t)sizeof rep);
    if (rep.failures) STT_FAIL("a loader failed: %s", rep.failure);
    CHECK(rep.reconnects <= 1);
    total.ok += rep.ok;
    total.reconnects += rep.reconnects;
    total.puts += rep.puts;
  }
  for (int i = 0; i < LOADERS; i++) {
    int status;
    waitpid(kids[i], &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  close(out[0]);
  fprintf(stderr, "   %" PRIu64 " requests answered, %" PRIu64 " puts, %" PRIu64
          " reconnects\n", total.ok, total.puts, total.reconnects);
  CHECK(total.reconnects >= 1);
  /* Every acknowledged put is a version, none twice. */
  uint64_t sum = 0;
  for (int i = 0; i < LOADERS; i++) {
    char key[32];
    snprintf(key, sizeof key, "load/%d", i);
    st_result_t *r = NULL;
    uint64_t v = 0;
    CHECK_EQ_INT(st_client_get(d, key, 0, 0, &r, &v), ST_OK);
    if (r) CHECK(((const float *)st_result_find(r, "x")->data)[0] == (float)v);
    st_result_free(r);
    sum += v;
  }
  CHECK_EQ_INT(sum, total.puts);
  /* The same memory, the buffer, and what info says. */
  CHECK(stt_proc_maps_inode(S.pid, stt_proc_inode_at(getpid(), st_result_tensor(model, 0)->data)));
  CHECK(stt_info_int(d, "restart", "restored", "keys") >= 1);
  st_buffer_t *nb = NULL;
  CHECK_EQ_INT(st_buffer_open(d, "frames", 1, &nb), ST_OK);
  if (nb) {
    float g[16];
    CHECK_EQ_INT(st_buffer_read(nb, g, sizeof g, 1000, NULL, NULL), ST_OK);
    CHECK(g[0] == 5.0f);
    st_buffer_close(nb);
  }
  char *log = stt_server_log(&S);
  CHECK_CONTAINS(log, "serves now: exiting");
  CHECK_CONTAINS(log, "the socket handed over");
  free(log);
  st_buffer_close(b);
  st_client_close(c);
  st_client_close(d);
}

int main(void) {
  answered = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (answered == MAP_FAILED) return 1;
  stt_server_setup(&S, "keys = { max_versions = 16, max_keys = 64 },\n"
                       "memory_budget = { cpu = 512 * 1024 * 1024 },\n", NULL);
  RUN(a_new_server_that_fails_leaves_the_old_one_serving);
  RUN(a_takeover_under_load_loses_nothing);
  st_result_free(model);
  return stt_server_finish(&S);
}
