/* Owners and per-uid quotas (docs/security.md, finding 2 and 3) over the
 * real socket with two uids: root (the test) and uid 65534 (a child that
 * becomes it, then connects; allow_uids admits it).
 *  - uid 65534 cannot see root's task (status, wait, result, cancel and
 *    tasks answer NOT_FOUND or leave it out);
 *  - a key granted to it (readers) it may get, read-only; another is
 *    NOT_FOUND; it may not delete a key it only reads;
 *  - it fills every quota it has (buffers, hand-offs, descriptors, keys,
 *    tasks), each refusal a LIMIT naming the quota, and root can still
 *    put, create, call, get and submit;
 *  - root lists every uid's keys and tasks, and deletes uid 65534's key
 *    only with force.
 * Needs root (to become uid 65534); skipped otherwise. */
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "check.h"
#include "endpoints.h"
#include "wire.h"

#define NOBODY 65534

/* fill() and ok() take the request's text from their callers. */
#pragma GCC diagnostic ignored "-Wformat-nonliteral"

static const char ONE_EP[] =
    "return st.endpoint{ name = \"one\", build = function() return 1 end }\n";

/* Globals small enough to fill fast; every quota is derived (a quarter):
 * keys 2, buffers 1, hand-offs 4 x 1, tasks 1, descriptors 16. */
static const char CONFIG[] =
    "allow_uids = { 65534 }, workers = 4,\n"
    "keys = { max_keys = 8 },\n"
    "tasks = { capacity = 4 },\n"
    "limits = { max_buffers = 4, max_handoffs_per_connection = 1, max_arena_fds = 64 },\n";

static stt_server_t S;
static uint64_t root_task;

/* What a run checks (each TEST below one of them). */
enum { M_TASKS = 1, M_NAMES = 2, M_FILL = 4, M_FORCE = 8 };
static int mode;

/* ------------------------------------------------------------- the child */

static int step;

/* In the child: the request's reply must be `want` with `part` in its
 * message, else the child exits with the step number. */
static void expect(rc_t *c, int want, const char *part, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void expect(rc_t *c, int want, const char *part, const char *fmt, ...) {
  step++;
  char why[6000];
  va_list ap;
  va_start(ap, fmt);
  int ok = rc_vexpect(c, NULL, 0, want, part, why, sizeof why, fmt, ap);
  va_end(ap);
  if (ok) return;
  fprintf(stderr, "   uid %d, step %d: %s\n", NOBODY, step, why);
  _exit(step);
}

/* In the child: sends fmt until a reply is an error (at most `max`
 * times; %d is the attempt); that error must be LIMIT naming `quota`.
 * Returns how many succeeded. */
static int fill(rc_t *c, const char *quota, int max, int memfds, const char *fmt) {
  step++;
  for (int i = 0; i < max; i++) {
    int fds[8];
    for (int k = 0; k < memfds; k++) fds[k] = rc_memfd_with(4096, 1.0, 0);
    char text[2048];
    snprintf(text, sizeof text, fmt, i);
    mpbuf_t b;
    mpbuf_init(&b);
    stt_pack(&b.pk, "%s", text);
    msg_t m;
    if (rc_rpc_fds(c, &b, fds, memfds, &m) != 1) _exit(step);
    if (!m.error) {
      msg_free(&m);
      rc_drop_fds(c);
      continue;
    }
    char why[6000];
    int ok = reply_is(&m, ST_ERR_LIMIT, quota, why, sizeof why);
    msg_free(&m);
    if (!ok) {
      fprintf(stderr, "   uid %d, step %d, after %d: %s\n", NOBODY, step, i, why);
      _exit(step);
    }
    return i;
  }
  fprintf(stderr, "   uid %d, step %d: no refusal naming %s\n", NOBODY, step, quota);
  _exit(step);
}

/* A put of a key with 8 memfd arenas (%d: its number). */
#define PUT8 \
  "[0, 1, 'put', [{key: 'fd%d', value: {a: tensor(0, 0, 'float32', [4], [1]), " \
  "b: tensor(1, 0, 'float32', [4], [1]), c: tensor(2, 0, 'float32', [4], [1]), " \
  "d: tensor(3, 0, 'float32', [4], [1]), e: tensor(4, 0, 'float32', [4], [1]), " \
  "f: tensor(5, 0, 'float32', [4], [1]), g: tensor(6, 0, 'float32', [4], [1]), " \
  "h: tensor(7, 0, 'float32', [4], [1])}, arenas: [" \
  "{fd: 0, bytes: 4096, device: 'cpu', backend: 'memfd', id: 1}, " \
  "{fd: 1, bytes: 4096, device: 'cpu', backend: 'memfd', id: 2}, " \
  "{fd: 2, bytes: 4096, device: 'cpu', backend: 'memfd', id: 3}, " \
  "{fd: 3, bytes: 4096, device: 'cpu', backend: 'memfd', id: 4}, " \
  "{fd: 4, bytes: 4096, device: 'cpu', backend: 'memfd', id: 5}, " \
  "{fd: 5, bytes: 4096, device: 'cpu', backend: 'memfd', id: 6}, " \
  "{fd: 6, bytes: 4096, device: 'cpu', backend: 'memfd', id: 7}, " \
  "{fd: 7, bytes: 4096, device: 'cpu', backend: 'memfd', id: 8}]}]]"

#define NCONN 8

/* The child, as uid 65534: the ownership checks, then every quota
 * filled; writes one byte to `done` and holds its connections until
 * `go` says so. */
static void child(const char *socket, int done, int go) {
  if (setgroups(0, NULL) != 0 || setresgid(NOBODY, NOBODY, NOBODY) != 0 ||
      setresuid(NOBODY, NOBODY, NOBODY) != 0)
    _exit(100);
  rc_t c[NCONN];
  for (int i = 0; i < NCONN; i++)
    if (rc_open(&c[i], socket) != 0) _exit(101);
  rc_t *a = &c[0];
  if (mode & M_TASKS) {
  /* Finding 2: root's task is no business of this uid. */
  expect(a, ST_ERR_NOT_FOUND, "not found", "[0, 1, 'status', [{task_id: %llu}]]",
         (unsigned long long)root_task);
  expect(a, ST_ERR_NOT_FOUND, "not found", "[0, 2, 'result', [{task_id: %llu}]]",
         (unsigned long long)root_task);
  expect(a, ST_ERR_NOT_FOUND, "not found", "[0, 3, 'cancel', [{task_id: %llu}]]",
         (unsigned long long)root_task);
  expect(a, ST_ERR_NOT_FOUND, "not found", "[0, 4, 'wait', [{task_id: %llu, timeout: 0}]]",
         (unsigned long long)root_task);
  step++;
  msg_t m;
  if (rc_rpcf(a, &m, "[0, 5, 'tasks', [{}]]") != 1 || m.error ||
      m.result->type != MSGPACK_OBJECT_ARRAY || m.result->via.array.size != 0) {
    fprintf(stderr, "   uid %d: tasks lists another uid's task\n", NOBODY);
    _exit(step);
  }
  msg_free(&m);
  }
  if (mode & M_NAMES) {
  /* Names: granted read, not granted, and no removal by a reader. */
  expect(a, ST_OK, NULL, "[0, 6, 'get', [{key: 'shared'}]]");
  rc_drop_fds(a);
  expect(a, ST_ERR_NOT_FOUND, "no key 'private'", "[0, 7, 'get', [{key: 'private'}]]");
  expect(a, ST_ERR_NOT_FOUND, "no key 'private'", "[0, 8, 'delete', [{key: 'private'}]]");
  expect(a, ST_ERR_AUTH, "may only read", "[0, 9, 'delete', [{key: 'shared'}]]");
  expect(a, ST_ERR_AUTH, "root and the server's uid", "[0, 10, 'keys', [{all: true}]]");
  expect(a, ST_ERR_NOT_FOUND, "no buffer named 'rootbuf'",
         "[0, 11, 'buffer_open', [{name: 'rootbuf', readonly: true}]]");
  }
  if (mode & M_FORCE) expect(a, ST_OK, NULL, "[0, 12, 'put', [{key: 'bk', value: 5}]]");
  if (mode & M_FILL) {
  /* Finding 3: every quota, filled. */
  fill(a, "quotas.buffers", 20, 0,
       "[0, 20, 'buffer_create', [{name: 'b%d', shape: [4], dtype: 'float32'}]]");
  step++;
  int made = 0;
  for (int i = 0; i < NCONN; i++) {
    char why[6000];
    int ok = rc_expect(&c[i], ST_OK, NULL, why, sizeof why,
                       "[0, 21, 'handoff_create', [{name: 'h%d', chunk_bytes: 4096, chunks: 1, "
                       "consumers: 1}]]", i);
    rc_drop_fds(&c[i]);
    if (ok) {
      made++;
      continue;
    }
    if (!strstr(why, "quotas.handoffs")) {
      fprintf(stderr, "   uid %d: hand-off %d: %s\n", NOBODY, i, why);
      _exit(step);
    }
    break;
  }
  if (made == NCONN) _exit(step);
  fill(a, "quotas.fds", 20, 8, PUT8);
  fill(a, "quotas.keys", 20, 0, "[0, 22, 'put', [{key: 'k%d', value: 1}]]");
  fill(a, "quotas.tasks", 20, 0,
       "[0, 23, 'submit', [{endpoint: 'sleeper', args: {s: 3%d}}]]");
  }
  if (write(done, "k", 1) != 1) _exit(102);
  char ch;
  if (read(go, &ch, 1) != 1) _exit(103);
  for (int i = 0; i < NCONN; i++) rc_close(&c[i]);
  _exit(0);
}

/* ------------------------------------------------------------- root */

static void ok(rc_t *c, const char *fmt, const char *name) {
  char why[6000];
  if (!rc_expect(c, ST_OK, NULL, why, sizeof why, fmt, name)) STT_FAIL("%s", why);
  rc_drop_fds(c);
}

/* How many entries of list reply m have "uid" = uid. */
static int with_uid(const msg_t *m, int64_t uid) {
  int n = 0;
  if (m->error || m->result->type != MSGPACK_OBJECT_ARRAY) return -1;
  for (uint32_t i = 0; i < m->result->via.array.size; i++)
    n += obj_int(obj_get(&m->result->via.array.ptr[i], "uid")) == uid;
  return n;
}

static void body(stt_server_t *s) {
  chmod(s->dir, 0711);
  chmod(s->socket, 0666);
  OPEN_RC(r, s->socket);
  root_task = rk_submit(&r, "sleeper", "s", 30);
  CHECK(root_task != 0);
  if (mode & M_NAMES) {
    ok(&r, "[0, 1, 'put', [{key: '%s', value: 2, readers: {uids: [65534]}}]]", "shared");
    ok(&r, "[0, 1, 'put', [{key: '%s', value: 3}]]", "private");
  }
  ok(&r, "[0, 1, 'buffer_create', [{name: '%s', shape: [4], dtype: 'float32'}]]", "rootbuf");

  int done[2], go[2];
  CHECK(pipe(done) == 0 && pipe(go) == 0);
  pid_t pid = fork();
  if (pid == 0) {
    close(done[0]);
    close(go[1]);
    child(s->socket, done[1], go[0]);
  }
  /* The child's ends close here: a child that failed early reads as EOF. */
  close(done[1]);
  close(go[0]);
  char ch = 0;
  int filled = read(done[0], &ch, 1) == 1;
  CHECK(filled);

  /* uid 65534 holds all it may: root still works. */
  if (filled && (mode & M_FILL)) {
    ok(&r, "[0, 30, 'put', [{key: '%s', value: 4}]]", "after");
    ok(&r, "[0, 31, 'buffer_create', [{name: '%s', shape: [4], dtype: 'float32'}]]", "after");
    ok(&r, "[0, 32, 'handoff_create', [{name: '%s', chunk_bytes: 4096, chunks: 1, "
           "consumers: 1}]]", "after");
    ok(&r, "[0, 33, 'call', [{endpoint: '%s'}]]", "one");
    ok(&r, "[0, 34, 'get', [{key: '%s'}]]", "after");
    int fds[1] = {rc_memfd_with(4096, 1.0, 0)};
    char why[6000];
    if (!rc_expect_fds(&r, fds, 1, ST_OK, NULL, why, sizeof why,
                       "[0, 35, 'put', [{key: 'afterfd', value: tensor(0, 0, 'float32', [4], "
                       "[1]), arenas: [{fd: 0, bytes: 4096, device: 'cpu', backend: 'memfd', "
                       "id: 1}]}]]"))
      STT_FAIL("%s", why);
    uint64_t t = rk_submit(&r, "one", NULL, 0);
    CHECK(t != 0);
  }

  /* Root sees every uid's keys and tasks, and removes with force. */
  msg_t m;
  char why[6000];
  if (mode & M_FORCE) {
    CHECK(rc_rpcf(&r, &m, "[0, 40, 'keys', [{all: true}]]") == 1);
    CHECK_EQ_INT(with_uid(&m, NOBODY), 1);
    msg_free(&m);
    CHECK(rc_rpcf(&r, &m, "[0, 41, 'keys', [{}]]") == 1);
    CHECK_EQ_INT(with_uid(&m, NOBODY), 0);
    msg_free(&m);
    CHECK(rc_expect(&r, ST_ERR_AUTH, "force", why, sizeof why,
                    "[0, 43, 'delete', [{key: 'bk'}]]"));
    CHECK(rc_expect(&r, ST_OK, NULL, why, sizeof why,
                    "[0, 44, 'delete', [{key: 'bk', force: true}]]"));
    CHECK(rc_expect(&r, ST_ERR_NOT_FOUND, NULL, why, sizeof why,
                    "[0, 46, 'get', [{key: 'bk'}]]"));
  }
  if (mode & M_FILL)
    CHECK(rc_expect(&r, ST_OK, NULL, why, sizeof why,
                    "[0, 45, 'buffer_unlink', [{name: 'b0', force: true}]]"));
  CHECK(rc_rpcf(&r, &m, "[0, 42, 'tasks', [{}]]") == 1);
  if (mode & M_FILL) CHECK_EQ_INT(with_uid(&m, NOBODY), 1);
  if (!m.error && m.result->type == MSGPACK_OBJECT_ARRAY)
    for (uint32_t i = 0; i < m.result->via.array.size; i++) {
      const msgpack_object *t = &m.result->via.array.ptr[i];
      if (strcmp(obj_str(obj_get(t, "status")), "running") &&
          strcmp(obj_str(obj_get(t, "status")), "pending"))
        continue;
      msg_t cm;
      CHECK_EQ_INT(rk_id(&r, "cancel", "task_id", (uint64_t)obj_int(obj_get(t, "id")), &cm), 1);
      CHECK(!cm.error);
      msg_free(&cm);
    }
  msg_free(&m);

  if (filled) CHECK(write(go[1], "g", 1) == 1);
  close(go[1]);
  close(done[0]);
  int status = -1;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK_EQ_INT(WEXITSTATUS(status), 0);
  rc_close(&r);
}

static void run(int m) {
  mode = m;
  stt_server_init(&S);
  stt_write_endpoint(&S, "one.lua", ONE_EP);
  stt_write_endpoint(&S, "sleeper.lua", STT_EP_SLEEPER);
  stt_server_config(&S, CONFIG);
  CHECK_EQ_INT(stt_server_run(&S, body), 0);
  stt_server_cleanup(&S);
}

TEST(another_uids_task_is_not_found) { run(M_TASKS); }
TEST(a_granted_reader_gets_and_others_get_not_found) { run(M_NAMES); }
TEST(one_uid_at_every_quota_never_locks_another_out) { run(M_FILL); }
TEST(root_lists_all_keys_and_deletes_another_uids_with_force) { run(M_FORCE); }

int main(void) {
  if (geteuid() != 0) stt_skip("needs root to run a client as another uid");
  signal(SIGPIPE, SIG_IGN);
  RUN(another_uids_task_is_not_found);
  RUN(a_granted_reader_gets_and_others_get_not_found);
  RUN(one_uid_at_every_quota_never_locks_another_out);
  RUN(root_lists_all_keys_and_deletes_another_uids_with_force);
  return stt_summary();
}
