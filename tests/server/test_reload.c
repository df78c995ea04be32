/* The reload method over the real socket: it reports changed, added and
 * removed endpoints by fingerprint and drops only the caches of changed
 * ones; a reload with a syntax error keeps the old generation serving and
 * answers ok = false with file:line (also in info); reloads while a client
 * hammers calls lose no request. A slow endpoint file loads off the loop
 * thread (other clients' pings are answered while it runs), requests made
 * meanwhile coalesce into one more load (past 64 waiting: BUSY), a top
 * level that runs past endpoint_load_timeout_s fails the reload naming the
 * file and the key, and a uid outside reload_uids is refused. */
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "wire.h"

static stt_server_t S;

static const char A_EP[] =
    "return st.endpoint{ name = 'a', cache_format_key = 'a:{n}', params = { n = 1 },\n"
    "  build = function(a) return st.full{a.n, value = 1} end }\n";

static void write_b(int version) {
  char text[512];
  snprintf(text, sizeof text,
           "-- version %d\n"
           "return st.endpoint{ name = 'b', cache_format_key = 'b:{n}', params = { n = 1 },\n"
           "  build = function(a) return st.full{a.n, value = %d} end }\n",
           version, version);
  stt_write_endpoint(&S, "b.lua", text);
}

/* reload; the reply in *m (caller frees). */
static int reload(rc_t *c, msg_t *m) {
  return rc_rpcf(c, m, "[0, 40, 'reload', []]");
}

/* The single name of list `key` of a reload reply, or "" (or "<n>" when
 * there are n != 1). */
static const char *only_name(const msg_t *m, const char *key) {
  static char buf[64];
  const msgpack_object *l = obj_get(m->result, key);
  if (!l || l->type != MSGPACK_OBJECT_ARRAY) return "?";
  if (l->via.array.size == 0) return "";
  if (l->via.array.size > 1) {
    snprintf(buf, sizeof buf, "<%u>", l->via.array.size);
    return buf;
  }
  return obj_str(&l->via.array.ptr[0]);
}

/* The object id of a call of `ep` with n, or INT64_MIN when the call
 * failed (an error reply is printed). */
static int64_t call_id(rc_t *c, const char *ep, int64_t n) {
  msg_t m;
  if (rk_call(c, ep, "n", n, &m) != 1) return INT64_MIN;
  int64_t id = m.error ? INT64_MIN : obj_field(&m, "id");
  msg_free(&m);
  return id;
}

/* Removes the endpoint file <name>.lua and reloads: the reload names
 * `name` removed. A check: fails the test. */
static void check_removed_by_reload(rc_t *c, const char *name) {
  char path[700];
  snprintf(path, sizeof path, "%s/%s.lua", S.endpoints, name);
  CHECK(unlink(path) == 0);
  msg_t m;
  CHECK(reload(c, &m) == 1 && !m.error);
  CHECK_STR_EQ(only_name(&m, "removed"), name);
  msg_free(&m);
}

TEST(reload_drops_only_changed_caches) {
  OPEN_RC(c, S.socket);
  int64_t oa = call_id(&c, "a", 2), ob = call_id(&c, "b", 2);
  CHECK(oa != INT64_MIN && ob != INT64_MIN);
  msg_t m;
  int64_t gen0 = rc_info_int(&c, "generation.number");
  write_b(2);
  CHECK(reload(&c, &m) == 1 && !m.error);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "ok")), 1);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "generation")), gen0 + 1);
  CHECK(obj_get(m.result, "error")->type == MSGPACK_OBJECT_NIL);
  CHECK_STR_EQ(only_name(&m, "changed"), "b");
  CHECK_STR_EQ(only_name(&m, "added"), "");
  CHECK_STR_EQ(only_name(&m, "removed"), "");
  msg_free(&m);
  /* a keeps its cache entry; b's went with its old definition. */
  CHECK_EQ_INT(info_field(&c, (uint64_t)oa, "cached"), 1);
  CHECK_EQ_INT(info_field(&c, (uint64_t)ob, "cached"), INT64_MIN);
  CHECK_EQ_INT(call_id(&c, "a", 2), oa);
  int64_t ob2 = call_id(&c, "b", 2);
  CHECK(ob2 != INT64_MIN && ob2 != ob);
  /* added, then removed */
  stt_write_endpoint(&S, "c.lua",
                     "return st.endpoint{ name = 'c', build = function() return 3 end }\n");
  CHECK(reload(&c, &m) == 1 && !m.error);
  CHECK_STR_EQ(only_name(&m, "added"), "c");
  CHECK_STR_EQ(only_name(&m, "changed"), "");
  msg_free(&m);
  check_removed_by_reload(&c, "c");
  CHECK(rk_call(&c, "c", NULL, 0, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_UNKNOWN_ENDPOINT, NULL);
  msg_free(&m);
  rc_close(&c);
}

TEST(reload_with_a_syntax_error_keeps_serving) {
  OPEN_RC(c, S.socket);
  int64_t ob = call_id(&c, "b", 3);
  CHECK(ob != INT64_MIN);
  msg_t m;
  int64_t gen0 = rc_info_int(&c, "generation.number");
  int64_t failures0 = rc_info_int(&c, "counters.reload_failures");
  stt_write_endpoint(&S, "b.lua", "-- broken\nreturn st.endpoint{ name = 'b',, }\n");
  CHECK(reload(&c, &m) == 1 && !m.error);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "ok")), 0);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "generation")), gen0);
  CHECK_CONTAINS(obj_str(obj_get(m.result, "error")), "b.lua:2:");
  CHECK_STR_EQ(only_name(&m, "changed"), "");
  msg_free(&m);
  CHECK_EQ_INT(rc_info_int(&c, "counters.reload_failures"), failures0 + 1);
  CHECK_EQ_INT(rc_info_int(&c, "generation.last_reload.ok"), 0);
  msg_t info;
  CHECK(rc_info(&c, 3, &info) == 1);
  CHECK_CONTAINS(obj_str(obj_path(info.result, "generation.last_reload.error")), "b.lua:2:");
  msg_free(&info);
  /* The old generation serves, with its cache. */
  CHECK_EQ_INT(call_id(&c, "b", 3), ob);
  CHECK(rk_call(&c, "b", "n", 4, &m) == 1 && !m.error);
  msg_free(&m);
  write_b(2);
  CHECK(reload(&c, &m) == 1 && !m.error);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "ok")), 1);
  CHECK_STR_EQ(only_name(&m, "changed"), "");   /* the same text as before the error */
  msg_free(&m);
  CHECK_EQ_INT(info_field(&c, (uint64_t)ob, "cached"), 1);
  rc_close(&c);
}

/* The load: pipelined calls, up to 8 in flight, until told to stop. */
typedef struct load {
  volatile int stop;
  int sent, ok, failed, lost;
  char first_error[256];
} load_t;

static void *hammer(void *arg) {
  load_t *L = arg;
  rc_t c;
  if (rc_open(&c, S.socket) != 0) {
    L->lost = -1;
    return NULL;
  }
  int inflight = 0;
  uint32_t id = 0;
  while (!__atomic_load_n(&L->stop, __ATOMIC_RELAXED) || inflight > 0) {
    while (inflight < 8 && !__atomic_load_n(&L->stop, __ATOMIC_RELAXED)) {
      id++;
      int rc = id % 3 == 0
                   ? rc_sendf(&c, "[0, %u, 'call', [{endpoint: 'a', args: {n: %u}}]]", id, id % 5)
                   : rc_sendf(&c, "[0, %u, 'call', [{endpoint: 'work', args: {}}]]", id);
      if (rc != 0) break;
      L->sent++;
      inflight++;
    }
    msg_t m;
    if (rc_next(&c, &m, 10000) != 1) {
      L->lost += inflight;
      break;
    }
    inflight--;
    if (m.error) {
      if (!L->failed)
        snprintf(L->first_error, sizeof L->first_error, "%s: %s", msg_errname(&m), msg_errmsg(&m));
      L->failed++;
    } else {
      L->ok++;
    }
    msg_free(&m);
    rc_drop_fds(&c);
  }
  rc_close(&c);
  return NULL;
}

static void write_work(int version) {
  char text[512];
  snprintf(text, sizeof text,
           "-- version %d\n"
           "return st.endpoint{ name = 'work',\n"
           "  build = function() st.sleep(0.002); return %d end }\n",
           version, version);
  stt_write_endpoint(&S, "work.lua", text);
}

TEST(reload_under_load_loses_no_request) {
  OPEN_RC(c, S.socket);
  load_t L1, L2;
  memset(&L1, 0, sizeof L1);
  memset(&L2, 0, sizeof L2);
  pthread_t t1, t2;
  CHECK(pthread_create(&t1, NULL, hammer, &L1) == 0);
  CHECK(pthread_create(&t2, NULL, hammer, &L2) == 0);
  int reloads = 0, good = 0;
  for (int i = 0; i < 20; i++) {
    write_work(100 + i);
    msg_t m;
    if (reload(&c, &m) == 1) {
      reloads++;
      if (!m.error && obj_int(obj_get(m.result, "ok")) == 1 &&
          strcmp(only_name(&m, "changed"), "work") == 0)
        good++;
      msg_free(&m);
    }
    stt_sleep_ms(10);   /* spread the reloads over the load */
  }
  __atomic_store_n(&L1.stop, 1, __ATOMIC_RELAXED);
  __atomic_store_n(&L2.stop, 1, __ATOMIC_RELAXED);
  pthread_join(t1, NULL);
  pthread_join(t2, NULL);
  fprintf(stderr, "   %d reloads; load: %d + %d calls sent, %d + %d ok\n", reloads, L1.sent,
          L2.sent, L1.ok, L2.ok);
  if (L1.failed || L2.failed) fprintf(stderr, "   first error: %s%s\n", L1.first_error, L2.first_error);
  CHECK_EQ_INT(reloads, 20);
  CHECK_EQ_INT(good, 20);
  CHECK(L1.sent > 20 && L2.sent > 20);
  CHECK_EQ_INT(L1.lost, 0);
  CHECK_EQ_INT(L2.lost, 0);
  CHECK_EQ_INT(L1.failed + L2.failed, 0);
  CHECK_EQ_INT(L1.ok, L1.sent);
  CHECK_EQ_INT(L2.ok, L2.sent);
  msg_t m;
  CHECK(rk_call(&c, "work", NULL, 0, &m) == 1 && !m.error);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "value")), 119);
  msg_free(&m);
  rc_close(&c);
}

/* Nonzero when c has no whole message to read now. */
static int nothing_yet(rc_t *c) {
  msg_t m;
  rc_pump(c);
  if (!rc_take(c, &m)) return 1;
  msg_free(&m);
  return 0;
}

/* An endpoint file whose top level spins for 2 to 3 s of wall-clock time
 * (os.time counts whole seconds; os.clock would count the CPU time of
 * every thread of the server). */
static void write_slow(void) {
  stt_write_endpoint(&S, "slow.lua",
                     "local t0 = os.time()\n"
                     "while os.time() < t0 + 3 do end\n"
                     "return st.endpoint{ name = 'slow', build = function() return 1 end }\n");
}

TEST(slow_reload_leaves_the_loop_serving_and_requests_coalesce) {
  OPEN_RC(a, S.socket);
  OPEN_RC(b, S.socket);
  OPEN_RC(p, S.socket);
  int64_t gen0 = rc_info_int(&p, "generation.number");
  write_slow();
  CHECK(rc_sendf(&a, "[0, 1, 'reload', []]") == 0);
  /* The load runs for 2 s or more: pings on another connection are answered
   * meanwhile, and the reload is still unanswered after them. */
  for (int i = 0; i < 5; i++) CHECK(stt_ping(p.fd, 100 + (uint32_t)i) == 0);
  CHECK(nothing_yet(&a));
  CHECK_EQ_INT(rc_info_int(&p, "generation.reloading"), 1);
  /* Requests made during the load wait for one more load; the 65th
   * waiting one is BUSY. */
  for (uint32_t id = 1; id <= 64; id++) CHECK(rc_sendf(&b, "[0, %u, 'reload', []]", id) == 0);
  CHECK(stt_ping(p.fd, 200) == 0);
  CHECK(nothing_yet(&a));
  msg_t m;
  CHECK(rc_next(&a, &m, 30000) == 1 && !m.error);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "ok")), 1);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "generation")), gen0 + 1);
  CHECK_STR_EQ(only_name(&m, "added"), "slow");
  msg_free(&m);
  int ok = 0, busy = 0;
  for (int i = 0; i < 64; i++) {
    CHECK(rc_next(&b, &m, 30000) == 1);
    if (m.error) {
      CHECK_REPLY(&m, ST_ERR_BUSY, "already waiting");
      busy++;
    } else {
      CHECK_EQ_INT(obj_int(obj_get(m.result, "ok")), 1);
      CHECK_EQ_INT(obj_int(obj_get(m.result, "generation")), gen0 + 2);
      ok++;
    }
    msg_free(&m);
  }
  CHECK_EQ_INT(ok, 63);
  CHECK_EQ_INT(busy, 1);
  CHECK_EQ_INT(rc_info_int(&p, "generation.number"), gen0 + 2);
  /* Back to the quick files for the tests after this one. */
  check_removed_by_reload(&p, "slow");
  rc_close(&a);
  rc_close(&b);
  rc_close(&p);
}

/* A server whose reload_uids leaves out our uid, with a short
 * endpoint_load_timeout_s. */
static void limits_body(stt_server_t *T) {
  OPEN_RC(c, T->socket);
  msg_t m;
  CHECK(rc_rpcf(&c, &m, "[0, 1, 'reload', []]") == 1);
  CHECK_REPLY(&m, ST_ERR_AUTH, "reload_uids");
  msg_free(&m);
  /* SIGHUP is the owner's: a file that loops fails the load at the limit,
   * and the old generation keeps serving. */
  stt_write_endpoint(T, "loop.lua",
                     "while true do end\n"
                     "return st.endpoint{ name = 'loop', build = function() return 1 end }\n");
  CHECK(kill(T->pid, SIGHUP) == 0);
  CHECK(rc_wait_info(&c, "counters.reload_failures", 1, 20000) == 0);
  CHECK(rc_info(&c, 2, &m) == 1);
  const char *err = obj_str(obj_path(m.result, "generation.last_reload.error"));
  CHECK_CONTAINS(err, "loop.lua:1:");
  CHECK_CONTAINS(err, "at most 0.3 s: endpoint_load_timeout_s");
  CHECK_EQ_INT(obj_int(obj_path(m.result, "generation.number")), 1);
  msg_free(&m);
  /* A file whose top level builds a huge string fails at the load's
   * memory limit, not by exhausting the host. */
  char loop_path[400];
  snprintf(loop_path, sizeof loop_path, "%s/loop.lua", T->endpoints);
  CHECK(unlink(loop_path) == 0);
  stt_write_endpoint(T, "big.lua",
                     "local s = string.rep('x', 2^30)\n"
                     "return st.endpoint{ name = 'big', build = function() return 1 end }\n");
  CHECK(kill(T->pid, SIGHUP) == 0);
  CHECK(rc_wait_info(&c, "counters.reload_failures", 2, 20000) == 0);
  CHECK(rc_info(&c, 2, &m) == 1);
  err = obj_str(obj_path(m.result, "generation.last_reload.error"));
  CHECK_CONTAINS(err, "big.lua: the top level went past the 64 MiB");
  CHECK_EQ_INT(obj_int(obj_path(m.result, "generation.number")), 1);
  msg_free(&m);
  CHECK(rk_call(&c, "a", "n", 2, &m) == 1 && !m.error);
  msg_free(&m);
  rc_close(&c);
}

TEST(reload_limits_and_who_may_reload) {
  stt_server_t T;
  stt_server_init(&T);
  char cfg[200];
  snprintf(cfg, sizeof cfg, "workers = 1, endpoint_load_timeout_s = 0.3, reload_uids = { %u },",
           (unsigned)getuid() + 1);
  stt_server_config(&T, cfg);
  stt_write_endpoint(&T, "a.lua", A_EP);
  CHECK(stt_server_run(&T, limits_body) == 0);
  stt_server_cleanup(&T);
}

#define NOBODY 65534

/* In a child running as NOBODY: ping works (allow_uids admits it), reload
 * is AUTH (the default reload_uids is root and the server's uid). The
 * child's exit status: 0 when it saw that. */
static int nobody_reloads(const char *socket) {
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (setgroups(0, NULL) != 0 || setresgid(NOBODY, NOBODY, NOBODY) != 0 ||
        setresuid(NOBODY, NOBODY, NOBODY) != 0)
      _exit(10);
    rc_t c;
    if (rc_open(&c, socket) != 0) _exit(11);
    if (stt_ping(c.fd, 1) != 0) _exit(12);
    msg_t m;
    if (rc_rpcf(&c, &m, "[0, 2, 'reload', []]") != 1) _exit(13);
    char why[600];
    int ok = reply_is(&m, ST_ERR_AUTH, "uid 65534 may not reload", why, sizeof why);
    msg_free(&m);
    if (!ok) {
      fprintf(stderr, "   %s\n", why);
      _exit(14);
    }
    _exit(stt_ping(c.fd, 3) == 0 ? 0 : 15);
  }
  int status;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

static int nobody_status = -1;

static void default_uids_body(stt_server_t *T) {
  chmod(T->dir, 0711);
  chmod(T->socket, 0666);
  nobody_status = nobody_reloads(T->socket);
  OPEN_RC(c, T->socket);   /* the server's own uid may */
  msg_t m;
  CHECK(reload(&c, &m) == 1 && !m.error);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "ok")), 1);
  msg_free(&m);
  rc_close(&c);
}

TEST(by_default_only_root_and_the_server_uid_may_reload) {
  if (geteuid() != 0) {
    fprintf(stderr, "   skipped: needs root to become uid %d\n", NOBODY);
    return;
  }
  stt_server_t T;
  stt_server_init(&T);
  stt_server_config(&T, "workers = 1, allow_uids = { 65534 },");
  stt_write_endpoint(&T, "a.lua", A_EP);
  CHECK(stt_server_run(&T, default_uids_body) == 0);
  CHECK_EQ_INT(nobody_status, 0);
  stt_server_cleanup(&T);
}

/* RssAnon of pid in kB (anonymous memory: the heap, Lua states'
 * allocations, thread stacks), or -1. */
static long rss_anon_kb(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "RssAnon:", 8)) kb = atol(line + 8);
  if (f) fclose(f);
  return kb;
}

/* Every reload loads each file into a Lua state of its own: each state's
 * memory goes back when the load ends, so reloads leave the server's
 * memory flat (a state closed without giving LuaJIT its own allocator
 * back kept its whole arena: about 270 kB per reload here). */
TEST(reloads_leave_memory_flat) {
  OPEN_RC(c, S.socket);
  msg_t m;
  for (int i = 0; i < 20; i++) {   /* warm up: every allocator's high-water mark */
    CHECK(reload(&c, &m) == 1 && !m.error);
    msg_free(&m);
  }
  long before = rss_anon_kb(S.pid);
  for (int i = 0; i < 100; i++) {
    CHECK(reload(&c, &m) == 1 && !m.error);
    msg_free(&m);
  }
  long after = rss_anon_kb(S.pid);
  fprintf(stderr, "   RssAnon %ld kB before 100 reloads, %ld kB after\n", before, after);
  CHECK(before > 0 && after > 0);
  CHECK(after < before + 8192);   /* the leak was 27 MB per 100 */
  rc_close(&c);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  stt_server_init(&S);
  stt_server_config(&S, "workers = 2,");
  stt_write_endpoint(&S, "a.lua", A_EP);
  write_b(1);
  write_work(0);
  stt_server_start_or_exit(&S);
  RUN(reload_drops_only_changed_caches);
  RUN(reload_with_a_syntax_error_keeps_serving);
  RUN(reload_under_load_loses_no_request);
  RUN(slow_reload_leaves_the_loop_serving_and_requests_coalesce);
  RUN(reload_limits_and_who_may_reload);
  RUN(reloads_leave_memory_flat);
  RUN(by_default_only_root_and_the_server_uid_may_reload);
  return stt_server_finish(&S);
}
