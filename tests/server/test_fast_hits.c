/* Repeated cache hits answered by the loops that serve the connections,
 * without loop 0 (docs/pool.md, section 7), against a real stserver with
 * loop_threads = 3:
 *   - `stserver --check` shows loop_threads, and its default follows the
 *     CPUs the server may run on;
 *   - with loop 0's thread stopped (ptrace), calls answered {object, same:
 *     true} keep coming on two connections (loops 1 and 2), and so does a
 *     cache miss (built on a worker, completed on its connection's loop),
 *     while what needs loop 0 waits: a new connection's ping, answered once
 *     loop 0 runs again;
 *   - the hits are counted: counters and stats add up, the endpoint's ok
 *     count includes them;
 *   - the object's last use (object_info) moves with hits answered so.
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "check.h"
#include "wire.h"

static stt_server_t S;

#define HITS 200

static const stt_endpoint_t EPS[] = {
    {"c16.lua", "return st.endpoint{ name = 'c16', cache = true,\n"
                "  build = function() return st.arange{16, dtype = 'float32'} end }\n"},
    {"num.lua", "return st.endpoint{ name = 'num', cache = true, params = { k = 0 },\n"
                "  build = function(a) return a.k end }\n"},
    {NULL, NULL}};

static int flag(const msgpack_object *o) {
  return o && o->type == MSGPACK_OBJECT_BOOLEAN && o->via.boolean;
}

/* Connects and says hello with "object_refs"; 0 or -1. */
static int open_refs(rc_t *c) {
  if (rc_open(c, S.socket) != 0) return -1;
  msg_t m;
  int rc = rc_rpcf(c, &m, "[0, 1, 'hello', [{protocol: 1, features: ['object_refs']}]]");
  int ok = rc == 1 && !m.error;
  if (rc == 1) msg_free(&m);
  return ok ? 0 : -1;
}

/* The object id of the last reply of call_c16. */
static long long object_id;

/* One call of c16 with id `id`: 1 for {object, same: true}, 0 for a full
 * reply, -1 for no reply within 5 s or an error. */
static int call_c16(rc_t *c, uint32_t id) {
  if (rc_sendf(c, "[0, %u, 'call', [{endpoint: 'c16'}]]", id) != 0) return -1;
  msg_t m;
  if (rc_next(c, &m, 5000) != 1) return -1;
  int r = m.id != id || m.error ? -1 : flag(obj_get(m.result, "same"));
  if (r >= 0) object_id = obj_field(&m, "id");
  msg_free(&m);
  rc_drop_fds(c);
  return r;
}

TEST(check_shows_loop_threads) {
  const char *args[] = {"--config", S.config, "--check", NULL};
  stt_proc_t r;
  CHECK_EQ_INT(stt_run(&r, getenv("ST_SERVER_BIN"), args, NULL, 0), 0);
  CHECK_CONTAINS(r.out, "loop_threads=3");
}

/* `--check` of a config that leaves loop_threads and spin_us to the
 * server, run on `ncpu` CPUs of this process's (its affinity): what it
 * prints. */
static void check_on_cpus(int ncpu, stt_proc_t *r) {
  char path[600];
  snprintf(path, sizeof path, "%s", S.config);
  snprintf(strrchr(path, '/'), sizeof path - (size_t)(strrchr(path, '/') - path), "/defaults.lua");
  char text[1400];
  snprintf(text, sizeof text, "return { base_path = \"%s\", endpoints = \"%s\" }\n", S.base,
           S.endpoints);
  stt_write_file(path, text);
  cpu_set_t all, some;
  CHECK(sched_getaffinity(0, sizeof all, &all) == 0);
  CPU_ZERO(&some);
  for (int i = 0, n = 0; i < CPU_SETSIZE && n < ncpu; i++)
    if (CPU_ISSET(i, &all)) {
      CPU_SET(i, &some);
      n++;
    }
  CHECK(sched_setaffinity(0, sizeof some, &some) == 0);
  const char *args[] = {"--config", path, "--check", NULL};
  CHECK_EQ_INT(stt_run(r, getenv("ST_SERVER_BIN"), args, NULL, 0), 0);
  CHECK(sched_setaffinity(0, sizeof all, &all) == 0);
}

/* The defaults follow the CPUs the server may use: one loop and no
 * polling below 8; 1 + min(4, CPUs / 4) loops and 50 µs from 8 on. */
TEST(loop_threads_default_follows_the_cpus) {
  stt_proc_t r;
  check_on_cpus(1, &r);
  CHECK_CONTAINS(r.out, "spin_us=0 loop_threads=1\n");
  cpu_set_t all;
  CHECK(sched_getaffinity(0, sizeof all, &all) == 0);
  int n = CPU_COUNT(&all);
  if (n < 8) {
    printf("   (%d CPUs: the default of 8 or more is not seen here)\n", n);
    return;
  }
  check_on_cpus(n, &r);
  char want[64];
  snprintf(want, sizeof want, "spin_us=50 loop_threads=%d\n", 1 + (n / 4 < 4 ? n / 4 : 4));
  CHECK_CONTAINS(r.out, want);
  check_on_cpus(8, &r);
  CHECK_CONTAINS(r.out, "spin_us=50 loop_threads=3\n");
}

/* Whether fd has something to read within ms (the SIGCHLD of a ptrace
 * stop may interrupt the poll: it goes on to the same deadline). */
static int readable_within(int fd, int ms) {
  double end = stt_now_ms() + ms;
  for (;;) {
    int left = (int)(end - stt_now_ms());
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n = poll(&p, 1, left > 0 ? left : 0);
    if (n > 0) return 1;
    if (n == 0 || errno != EINTR) return 0;
  }
}

/* Whether thread `tid` of the server sits in its poll (it holds no lock
 * there): /proc/<pid>/task/<tid>/syscall names the system call it waits
 * in. */
static int in_poll(pid_t tid) {
  char path[64], text[64] = "";
  snprintf(path, sizeof path, "/proc/%d/task/%d/syscall", (int)S.pid, (int)tid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int ok = fgets(text, sizeof text, f) != NULL;
  fclose(f);
  long nr = ok ? strtol(text, NULL, 10) : -1;
  return
#ifdef SYS_epoll_wait
      nr == SYS_epoll_wait ||
#endif
      nr == SYS_epoll_pwait;
}

/* Stops the thread `tid` of the server alone (ptrace), in its poll; 0 or
 * -1. PTRACE_DETACH lets it go on. */
static int stop_thread(pid_t tid) {
  double end = stt_now_ms() + 10000;
  while (stt_now_ms() < end) {
    if (ptrace(PTRACE_SEIZE, tid, NULL, NULL) != 0) return -1;
    if (ptrace(PTRACE_INTERRUPT, tid, NULL, NULL) != 0) return -1;
    int st = 0;
    if (waitpid(tid, &st, __WALL) != tid || !WIFSTOPPED(st)) return -1;
    if (in_poll(tid)) return 0;
    ptrace(PTRACE_DETACH, tid, NULL, NULL);
    stt_sleep_ms(1);
  }
  return -1;
}

TEST(hits_are_answered_while_loop_0_is_stopped) {
  rc_t a, b;
  CHECK(open_refs(&a) == 0);
  CHECK(open_refs(&b) == 0);
  /* Built once, then held in full by both connections. */
  CHECK_EQ_INT(call_c16(&a, 2), 0);
  CHECK_EQ_INT(call_c16(&b, 2), 0);
  CHECK_EQ_INT(call_c16(&a, 3), 1);
  OPEN_RC(mon, S.socket);
  int64_t hits0 = rc_info_int(&mon, "counters.cache_hits");
  msg_t m;
  CHECK(rc_rpcf(&mon, &m, "[0, 5, 'object_info', [{object_id: %lld}]]", object_id) == 1);
  double used0 = m.error ? 0 : obj_get(m.result, "last_accessed_at")->via.f64;
  msg_free(&m);

  /* Loop 0 is the server's main thread: its tid is the pid. */
  CHECK(stop_thread(S.pid) == 0);
  int same = 0;
  for (uint32_t i = 0; i < HITS; i++) {
    same += call_c16(&a, 100 + i) == 1;
    same += call_c16(&b, 100 + i) == 1;
  }
  /* A miss is built and answered too: its completion comes back to its
   * connection's loop. What needs loop 0 waits: a new connection (loop 0
   * accepts). */
  CHECK(rc_sendf(&a, "[0, 7, 'call', [{endpoint: 'num', args: {k: 7}}]]") == 0);
  rc_t late;
  CHECK(rc_open(&late, S.socket) == 0);
  CHECK(rc_sendf(&late, "[0, 8, 'ping', []]") == 0);
  int early_miss = readable_within(a.fd, 5000);
  int early_ping = readable_within(late.fd, 300);
  CHECK(ptrace(PTRACE_DETACH, S.pid, NULL, NULL) == 0);
  CHECK_EQ_INT(same, 2 * HITS);
  CHECK_EQ_INT(early_miss, 1);
  CHECK_EQ_INT(early_ping, 0);
  msg_t w;
  CHECK_EQ_INT(rc_next(&a, &w, 5000), 1);
  CHECK(w.id == 7 && !w.error);
  msg_free(&w);
  rc_drop_fds(&a);
  CHECK_EQ_INT(rc_next(&late, &w, 5000), 1);
  CHECK(w.id == 8 && !w.error);
  msg_free(&w);

  /* Counted like any hit; the object's last use moved. */
  CHECK_EQ_INT(rc_info_int(&mon, "counters.cache_hits"), hits0 + 2 * HITS);
  CHECK(rc_info(&mon, 6, &m) == 1);
  const msgpack_object *k = obj_get(m.result, "counters");
  CHECK_EQ_INT(obj_int(obj_get(k, "requests")),
               obj_int(obj_get(k, "requests_ok")) + obj_int(obj_get(k, "errors")) +
                   obj_int(obj_get(k, "requests_dropped")) + 1);
  CHECK_EQ_INT(obj_int(obj_get(k, "calls")),
               obj_int(obj_get(k, "calls_ok")) + obj_int(obj_get(k, "calls_failed")) +
                   obj_int(obj_get(k, "calls_dropped")));
  msg_free(&m);
  CHECK(rc_rpcf(&mon, &m, "[0, 9, 'object_info', [{object_id: %lld}]]", object_id) == 1);
  CHECK(!m.error && obj_get(m.result, "last_accessed_at")->via.f64 > used0);
  msg_free(&m);
  rc_close(&late);
  rc_close(&a);
  rc_close(&b);
  rc_close(&mon);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  stt_server_setup(&S, "loop_threads = 3, memory_budget = { cpu = 64 * 2^20 },", EPS);
  RUN(check_shows_loop_threads);
  RUN(loop_threads_default_follows_the_cpus);
  RUN(hits_are_answered_while_loop_0_is_stopped);
  return stt_server_finish(&S);
}
