/* Several loop threads (loop_threads = 4) over the real socket, under 36
 * client processes at once: every reply reaches its own connection, in
 * the order of its requests, with the right value (cache hits with their
 * descriptor, or {object, same: true} for the half of the clients whose
 * hello asks for objects sent once, which loops answer under the read
 * side of the server lock; fresh results built by workers, tasks with
 * wait and result, tensor arguments read from the caller's memfd,
 * pipelined bursts, misses that evict under the memory budget,
 * invalidations), while the endpoints are reloaded (SIGHUP) all along,
 * some clients exit with requests unanswered and others are SIGKILLed in
 * the middle of their work. The server answers a ping throughout, and
 * once every client is gone it holds what it held before: descriptors,
 * connections, held fds and bytes, nothing in flight, and the request
 * counters add up. STT_STRESS_ROUNDS sets the rounds of each client (a
 * short run by default, for CI); built with -fsanitize=thread it is the
 * race test of the loops. */
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "check.h"
#include "wire.h"

static stt_server_t S;

#define CLIENTS 36
#define ROUNDS 40
/* A ping of the monitor must be answered within this, however loaded. */
#define PING_LIMIT_MS 3000
#define DEADLINE_MS 60000

static const stt_endpoint_t EPS[] = {
    {"cached.lua", "return st.endpoint{ name = 'cached16', cache = true,\n"
                   "  build = function() return st.arange{16, dtype = 'float32'} end }\n"},
    {"double.lua", "return st.endpoint{ name = 'double', params = { v = st.required },\n"
                   "  build = function(a) return a.v * 2 end }\n"},
    {"fresh.lua", "return st.endpoint{ name = 'fresh', params = { n = 4 },\n"
                  "  build = function(a) return st.full{a.n, value = a.n} end }\n"},
    {"slow.lua", "return st.endpoint{ name = 'slow', params = { s = 0.01 },\n"
                 "  build = function(a) st.sleep(a.s); return a.s end }\n"},
    {"big.lua", "return st.endpoint{ name = 'big', cache = true, params = { k = 0 },\n"
                "  build = function(a) return st.full{2^17, value = a.k} end }\n"},
    {"first.lua", "return st.endpoint{ name = 'first',\n"
                  "  params = { x = st.tensor_param{ dtype = 'float64', device = 'cpu' } },\n"
                  "  build = function(a) return a.x:get(0) end }\n"},
    {NULL, NULL}};

/* ------------------------------------------------------------- a client */

#define FIRST_FMT                                                                           \
  "[0, %u, 'call', [{endpoint: 'first', args: {x: tensor(0, 0, 'float64', [1], [1])}, "   \
  "arenas: [{fd: 0, bytes: 4096, device: 'cpu', backend: 'memfd', id: 4242}]}]]"

/* The first wrong thing a client saw, then exit 1. OUT_OF_MEMORY is a
 * right answer under the small budget (misses of many clients at once,
 * replies not read yet): the client goes on. */
static void fail(int who, int round, const char *what, const msg_t *m) {
  if (m && m->error && strcmp(msg_errname(m), "OUT_OF_MEMORY") == 0) return;
  fprintf(stderr, "   client %d, round %d: %s (%s: %s)\n", who, round, what,
          m ? msg_errname(m) : "-", m && m->error ? msg_errmsg(m) : "");
  _exit(1);
}

/* Reads the reply to request `id` and checks it is one: 1, or fail. */
static void next_reply(rc_t *c, msg_t *m, uint32_t id, int who, int round) {
  if (rc_next(c, m, 20000) != 1) fail(who, round, "no reply", NULL);
  if (m->id != id) {
    fprintf(stderr, "   client %d: reply %u, expected %u\n", who, m->id, id);
    fail(who, round, "a reply out of order or to another request", m);
  }
}

/* Whether clients `who` says hello with objects sent once. */
static int refs_of(int who) {
  return who % 2 == 0;
}

/* A reply of cached16 as client `who` sees it, `fds` descriptors with
 * it: in full with its descriptor (a build's, not cached when a reload
 * changed the endpoint meanwhile), or (objects sent once) {object, same:
 * true} with none. */
static int good_hit(const msg_t *m, int who, int fds) {
  if (m->error) return 0;
  const msgpack_object *same = obj_get(m->result, "same");
  if (same && same->type == MSGPACK_OBJECT_BOOLEAN && same->via.boolean)
    return refs_of(who) && fds == 0 && !obj_get(m->result, "value");
  return fds == 1;
}

/* One request of kind `op` on c, its reply checked. */
static void one_op(rc_t *c, int op, int who, int round, int with_tasks) {
  uint32_t id = (uint32_t)(round * 16 + op + 1);
  double v = who * 1000 + round + 0.5;
  msg_t m;
  switch (op) {
  case 0:  /* a cache hit */
    if (rc_sendf(c, "[0, %u, 'call', [{endpoint: 'cached16'}]]", id) != 0)
      fail(who, round, "send", NULL);
    next_reply(c, &m, id, who, round);
    if (!good_hit(&m, who, c->nfds)) fail(who, round, "cached16: not a hit", &m);
    break;
  case 1:  /* a fresh number, built by a worker */
    if (rc_sendf(c, "[0, %u, 'call', [{endpoint: 'double', args: {v: %.1f}}]]", id, v) != 0)
      fail(who, round, "send", NULL);
    next_reply(c, &m, id, who, round);
    if (m.error || obj_num(obj_get(m.result, "value")) != 2 * v)
      fail(who, round, "double: wrong value", &m);
    break;
  case 2:  /* a fresh tensor: its own arena */
    if (rc_sendf(c, "[0, %u, 'call', [{endpoint: 'fresh', args: {n: %d}}]]", id,
                 1 + round % 7) != 0)
      fail(who, round, "send", NULL);
    next_reply(c, &m, id, who, round);
    if (m.error || c->nfds != 1) fail(who, round, "fresh: no tensor", &m);
    break;
  case 3:  /* a task: submit, wait, result */
    if (!with_tasks) {
      one_op(c, 1, who, round, 0);
      return;
    }
    if (rc_sendf(c, "[0, %u, 'submit', [{endpoint: 'slow', args: {s: 0.005}}]]", id) != 0)
      fail(who, round, "send", NULL);
    next_reply(c, &m, id, who, round);
    if (m.error) fail(who, round, "submit", &m);
    {
      long long t = obj_int(obj_get(m.result, "task_id"));
      msg_free(&m);
      if (rc_sendf(c, "[0, %u, 'wait', [{task_id: %lld, timeout: 20}]]", id, t) != 0)
        fail(who, round, "send", NULL);
      next_reply(c, &m, id, who, round);
      if (m.error || strcmp(obj_str(obj_get(m.result, "status")), "completed") != 0)
        fail(who, round, "wait: not completed", &m);
      msg_free(&m);
      if (rc_sendf(c, "[0, %u, 'result', [{task_id: %lld}]]", id, t) != 0)
        fail(who, round, "send", NULL);
      next_reply(c, &m, id, who, round);
      if (m.error || obj_num(obj_get(m.result, "value")) != 0.005)
        fail(who, round, "result: wrong value", &m);
    }
    break;
  case 4: {  /* a tensor argument: the caller's memory is read */
    int fds[1] = {rc_memfd_with(4096, v, 0)};
    if (fds[0] < 0) fail(who, round, "memfd", NULL);
    mpbuf_t b;
    mpbuf_text(&b, FIRST_FMT, id);
    int rc = stt_send_fds(c->fd, b.sb.data, b.sb.size, fds, 1);
    mpbuf_free(&b);
    close(fds[0]);
    if (rc != 0) fail(who, round, "send", NULL);
    next_reply(c, &m, id, who, round);
    if (m.error || obj_num(obj_get(m.result, "value")) != v)
      fail(who, round, "first: not the caller's value", &m);
    break;
  }
  case 6:  /* a cached 512 KiB object: misses evict others under the budget;
              when what is left is in use (replies not yet read by busy
              clients, running calls), the budget refuses: OUT_OF_MEMORY
              is the budget holding, not a wrong reply */
    if (rc_sendf(c, "[0, %u, 'call', [{endpoint: 'big', args: {k: %d}}]]", id,
                 (who * 7 + round) % 400) != 0)
      fail(who, round, "send", NULL);
    next_reply(c, &m, id, who, round);
    if (m.error ? strcmp(msg_errname(&m), "OUT_OF_MEMORY") != 0 : c->nfds != 1)
      fail(who, round, "big: no tensor", &m);
    break;
  case 7:  /* the cached object goes: the next calls build it again */
    if (rc_sendf(c, "[0, %u, 'invalidate_call', [{endpoint: 'cached16'}]]", id) != 0)
      fail(who, round, "send", NULL);
    next_reply(c, &m, id, who, round);
    if (m.error) fail(who, round, "invalidate_call", &m);
    break;
  default: {  /* a pipelined burst of cache hits in one write: answered in
                 the dispatch, so their replies keep the requests' order */
    char burst[1024];
    size_t len = 0;
    for (uint32_t k = 0; k < 4; k++) {
      mpbuf_t b;
      mpbuf_text(&b, "[0, %u, 'call', [{endpoint: 'cached16'}]]", id * 8 + k);
      memcpy(burst + len, b.sb.data, b.sb.size);
      len += b.sb.size;
      mpbuf_free(&b);
    }
    if (rc_send(c, burst, len) != 0) fail(who, round, "send", NULL);
    for (uint32_t k = 0; k < 4; k++) {
      int before = c->nfds;
      next_reply(c, &m, id * 8 + k, who, round);
      if (!good_hit(&m, who, c->nfds - before)) fail(who, round, "burst: not a hit", &m);
      if (k < 3) msg_free(&m);
    }
    break;
  }
  }
  msg_free(&m);
  rc_drop_fds(c);
}

/* Client `who`: kind 0 does ROUNDS rounds of every operation and exits 0;
 * kind 1 does a few, then sends a slow call and a tensor argument and
 * exits without reading; kind 2 works until it is killed. */
static void client(int who, int kind) {
  rc_t c;
  if (rc_open(&c, S.socket) != 0) fail(who, 0, "connect", NULL);
  if (refs_of(who)) {
    msg_t m;
    if (rc_rpcf(&c, &m, "[0, 1, 'hello', [{protocol: 1, features: ['object_refs']}]]") != 1 ||
        m.error)
      fail(who, 0, "hello", &m);
    msg_free(&m);
  }
  const char *env = getenv("STT_STRESS_ROUNDS");
  int full = env && atoi(env) > 0 ? atoi(env) : ROUNDS;
  int rounds = kind == 0 ? full : kind == 1 ? 3 : 1 << 30;
  /* Invalidations are rarer than the rest: one round in 16. */
  for (int r = 0; r < rounds; r++) {
    int op = (who + r) % 7;
    if ((who + r) % 16 == 15) op = 7;
    one_op(&c, op, who, r, kind != 2);
  }
  if (kind == 1) {
    rc_sendf(&c, "[0, 1, 'call', [{endpoint: 'slow', args: {s: 0.2}}]]");
    int fds[1] = {rc_memfd_with(4096, 1, 0)};
    mpbuf_t b;
    mpbuf_text(&b, FIRST_FMT, 2u);
    stt_send_fds(c.fd, b.sb.data, b.sb.size, fds, 1);
    _exit(0);
  }
  rc_close(&c);
  _exit(0);
}

static int kind_of(int i) {
  return i % 6 == 5 ? 1 : i % 6 == 4 ? 2 : 0;
}

/* ------------------------------------------------------------- the test */

/* Polls until the server holds what it held at the start. 0 or -1. */
static int back_to_start(rc_t *mon, int base_fds, int64_t base_arenas) {
  double end = stt_now_ms() + 10000;
  int fds = -1;
  int64_t conns = -1, arenas = -1, held_fds = -1, held_bytes = -1, inflight = -1;
  while (stt_now_ms() < end) {
    conns = rc_info_int(mon, "connections");
    arenas = rc_info_int(mon, "arenas.count");
    held_fds = rc_info_int(mon, "held.fds");
    held_bytes = rc_info_int(mon, "held.bytes");
    inflight = rc_info_int(mon, "inflight");
    fds = stt_proc_fd_count(S.pid);
    if (conns == 1 && arenas == base_arenas && held_fds == 0 && held_bytes == 0 &&
        inflight == 0 && fds == base_fds)
      return 0;
    stt_sleep_ms(5);
  }
  fprintf(stderr,
          "   server: %d descriptors (at start %d), %lld arenas (at start %lld), %lld "
          "connections, held %lld fds and %lld bytes, %lld in flight\n",
          fds, base_fds, (long long)arenas, (long long)base_arenas, (long long)conns,
          (long long)held_fds, (long long)held_bytes, (long long)inflight);
  return -1;
}

TEST(many_clients_on_four_loops_get_their_own_replies) {
  OPEN_RC(mon, S.socket);
  /* The cached object exists from here on. */
  msg_t m;
  CHECK(rc_rpcf(&mon, &m, "[0, 1, 'call', [{endpoint: 'cached16'}]]") == 1 && !m.error);
  msg_free(&m);
  rc_drop_fds(&mon);
  CHECK(rc_wait_info(&mon, "held.fds", 0, 5000) == 0);
  int base_fds = stt_proc_fd_count(S.pid);
  int64_t base_arenas = rc_info_int(&mon, "arenas.count");
  int64_t conns0 = rc_info_int(&mon, "counters.connections");

  pid_t pids[CLIENTS];
  for (int i = 0; i < CLIENTS; i++) {
    pids[i] = fork();
    if (pids[i] == 0) client(i, kind_of(i));
    CHECK(pids[i] > 0);
  }
  /* Wait for the clients that finish, pinging all along; once they are
   * done, kill those that would work forever (in the middle of a call). */
  int left = 0, failed = 0, pings = 0;
  double worst = 0, end = stt_now_ms() + DEADLINE_MS;
  for (int i = 0; i < CLIENTS; i++) left += kind_of(i) != 2;
  double next_reload = stt_now_ms() + 100;
  int reloads = 0;
  while (left > 0 && stt_now_ms() < end) {
    if (stt_now_ms() > next_reload) {
      /* The endpoints load again (SIGHUP) while every kind of call runs. */
      CHECK(kill(S.pid, SIGHUP) == 0);
      reloads++;
      next_reload = stt_now_ms() + 150;
    }
    double t0 = stt_now_ms();
    CHECK(stt_ping(mon.fd, 77) == 0);
    double took = stt_now_ms() - t0;
    if (took > worst) worst = took;
    pings++;
    for (int i = 0; i < CLIENTS; i++) {
      int st;
      if (pids[i] <= 0 || kind_of(i) == 2 || waitpid(pids[i], &st, WNOHANG) != pids[i]) continue;
      pids[i] = 0;
      left--;
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed++;
    }
    stt_sleep_ms(10);
  }
  CHECK_EQ_INT(left, 0);
  CHECK_EQ_INT(failed, 0);
  for (int i = 0; i < CLIENTS; i++) {
    if (pids[i] <= 0) continue;
    kill(pids[i], SIGKILL);
    int st = 0;
    waitpid(pids[i], &st, 0);
    /* Killed at work, not stopped by a wrong reply. */
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  }
  fprintf(stderr, "   %d pings and %d reloads during the run, the slowest ping %.1f ms\n", pings,
          reloads, worst);
  CHECK(worst < PING_LIMIT_MS);
  CHECK_EQ_INT(rc_info_int(&mon, "counters.connections"), conns0 + CLIENTS);

  /* What the clients left cached goes, and cached16 is there as at the
   * start (an invalidation may have been the last word). */
  CHECK(rc_rpcf(&mon, &m, "[0, 3, 'invalidate_endpoint', [{endpoint: 'big'}]]") == 1 &&
        !m.error);
  msg_free(&m);
  CHECK(rc_rpcf(&mon, &m, "[0, 4, 'call', [{endpoint: 'cached16'}]]") == 1 && !m.error);
  msg_free(&m);
  rc_drop_fds(&mon);
  CHECK(back_to_start(&mon, base_fds, base_arenas) == 0);
  /* Every request is accounted for: answered, failed or dropped, but
   * the info request being answered. */
  CHECK(rc_info(&mon, 2, &m) == 1);
  const msgpack_object *k = obj_get(m.result, "counters");
  CHECK_EQ_INT(obj_int(obj_get(k, "requests")),
               obj_int(obj_get(k, "requests_ok")) + obj_int(obj_get(k, "errors")) +
                   obj_int(obj_get(k, "requests_dropped")) + 1);
  CHECK(obj_int(obj_get(k, "requests_dropped")) > 0);
  CHECK(obj_int(obj_get(k, "evictions")) > 0);
  CHECK(obj_int(obj_get(k, "cache_hits")) > 0);
  CHECK(obj_int(obj_get(k, "reloads")) > 0);
  msg_free(&m);
  CHECK(stt_ping(mon.fd, 78) == 0);
  rc_close(&mon);
}

/* A task completes on its submitter's loop: a `wait` of the submitter, one
 * of a connection on another loop and one whose timeout (a timer of loop
 * 0's) ends first are each answered once, rightly, and a waiter whose
 * timer already fired is not answered again at the completion. */
TEST(a_task_s_waiters_on_every_loop_get_one_answer) {
  OPEN_RC(a, S.socket);
  OPEN_RC(b, S.socket);
  OPEN_RC(c, S.socket);
  msg_t m;
  for (int round = 0; round < 20; round++) {
    CHECK(rc_rpcf(&a, &m, "[0, 1, 'submit', [{endpoint: 'slow', args: {s: 0.15}}]]") == 1 &&
          !m.error);
    long long t = obj_int(obj_get(m.result, "task_id"));
    msg_free(&m);
    CHECK(rc_sendf(&c, "[0, 3, 'wait', [{task_id: %lld, timeout: 0.02}]]", t) == 0);
    CHECK(rc_sendf(&b, "[0, 2, 'wait', [{task_id: %lld, timeout: 20}]]", t) == 0);
    CHECK(rc_sendf(&a, "[0, 4, 'wait', [{task_id: %lld, timeout: 20}]]", t) == 0);
    /* c's timer fires first: the task is still running. */
    CHECK(rc_next(&c, &m, 10000) == 1 && m.id == 3 && !m.error);
    CHECK(strcmp(obj_str(obj_get(m.result, "status")), "completed") != 0);
    msg_free(&m);
    CHECK(rc_next(&b, &m, 10000) == 1 && m.id == 2 && !m.error);
    CHECK_STR_EQ(obj_str(obj_get(m.result, "status")), "completed");
    msg_free(&m);
    CHECK(rc_next(&a, &m, 10000) == 1 && m.id == 4 && !m.error);
    CHECK_STR_EQ(obj_str(obj_get(m.result, "status")), "completed");
    msg_free(&m);
    CHECK(rc_rpcf(&a, &m, "[0, 5, 'result', [{task_id: %lld}]]", t) == 1 && !m.error);
    CHECK(obj_num(obj_get(m.result, "value")) == 0.15);
    msg_free(&m);
    /* Nothing more came to c: its next reply is its ping's. */
    CHECK(stt_ping(c.fd, 79) == 0);
  }
  rc_close(&a);
  rc_close(&b);
  rc_close(&c);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  stt_server_setup(&S,
                   "loop_threads = 4, workers = 2, log_level = 'warn',"
                   "memory_budget = { cpu = 64 * 2^20 },"
                   "pool = { slab_bytes = 65536, max_bytes_per_connection = 262144 },",
                   EPS);
  RUN(many_clients_on_four_loops_get_their_own_replies);
  RUN(a_task_s_waiters_on_every_loop_get_one_answer);
  return stt_server_finish(&S);
}
