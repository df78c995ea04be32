/* Tasks over the real socket: submit/status/wait/result/cancel/tasks; a
 * queued task is cancelled at once, a running one that checks
 * st.cancelled() ends cancelled; wait answers at its timeout with the
 * current info; st.progress shows in status; a result is handed over once
 * and its memory goes with it; finished tasks expire after tasks.ttl_s;
 * calls of execution = "task" endpoints answer like result; info's task
 * counts stay right with the table full. */
#include <signal.h>

#include "check.h"
#include "wire.h"

static stt_server_t S;

TEST(submit_wait_result_once) {
  OPEN_RC(c, S.socket);
  uint64_t t = rk_submit(&c, "slow", "s", 0.05);
  CHECK(t > 0);
  msg_t m;
  CHECK(rc_rpcf(&c, &m,
                "[0, 2, 'wait', [{task_id: %lld, timeout: 10.0}]]", (long long)t) == 1 && !m.error);
  CHECK_STR_EQ(obj_str(obj_get(m.result, "status")), "completed");
  CHECK_STR_EQ(obj_str(obj_get(m.result, "endpoint")), "slow");
  CHECK_EQ_INT(obj_int(obj_get(m.result, "id")), t);
  CHECK(obj_get(m.result, "created_at")->via.f64 <= obj_get(m.result, "started_at")->via.f64);
  CHECK(obj_get(m.result, "started_at")->via.f64 <= obj_get(m.result, "completed_at")->via.f64);
  CHECK(obj_get(m.result, "error")->type == MSGPACK_OBJECT_NIL);
  CHECK(obj_get(m.result, "object_id")->type == MSGPACK_OBJECT_NIL);
  msg_free(&m);
  /* The unfetched result is the server's: one arena. */
  CHECK_EQ_INT(rc_info_int(&c, "arenas.count"), 1);
  CHECK(rk_id(&c, "result", "task_id", t, &m) == 1 && !m.error);
  CHECK_EQ_INT(c.nfds, 1);
  CHECK(obj_get(m.result, "value")->type == MSGPACK_OBJECT_EXT);
  msg_free(&m);
  rc_drop_fds(&c);
  /* Fetched: the server keeps nothing of it. */
  CHECK(rc_wait_info(&c, "arenas.count", 0, 5000) == 0);
  CHECK(rk_id(&c, "result", "task_id", t, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_TASK, "already taken");
  msg_free(&m);
  CHECK_EQ_INT(c.nfds, 0);
  rc_close(&c);
}

TEST(result_of_unfinished_failed_and_unknown_tasks) {
  OPEN_RC(c, S.socket);
  msg_t m;
  uint64_t t = rk_submit(&c, "slow", "s", 0.3);
  CHECK(rk_id(&c, "result", "task_id", t, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_TASK, NULL);
  CHECK(strstr(msg_errmsg(&m), "is running") || strstr(msg_errmsg(&m), "is pending"));
  msg_free(&m);
  uint64_t f = rk_submit(&c, "fail", NULL, 0);
  CHECK(rk_wait_status(&c, f, "failed", 5000) == 0);
  CHECK(rk_id(&c, "status", "task_id", f, &m) == 1 && !m.error);
  CHECK_EQ_INT(obj_int(obj_path(m.result, "error.code")), 7);
  CHECK_CONTAINS(obj_str(obj_path(m.result, "error.message")), "fail.lua:2: nope");
  msg_free(&m);
  CHECK(rk_id(&c, "result", "task_id", f, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_ENDPOINT, "fail.lua:2: nope");
  msg_free(&m);
  CHECK(rk_id(&c, "status", "task_id", 999999, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_NOT_FOUND, NULL);
  msg_free(&m);
  /* submit binds like call. */
  CHECK_RPC(&c, ST_ERR_INVALID_ARGUMENT, NULL,
            "[0, 3, 'submit', [{endpoint: 'slow', args: {nope: 1}}]]");
  CHECK_RPC(&c, ST_ERR_UNKNOWN_ENDPOINT, NULL,
            "[0, 4, 'submit', [{endpoint: 'nosuch', args: {}}]]");
  CHECK(rk_wait_status(&c, t, "completed", 5000) == 0);
  rc_close(&c);
}

TEST(cancel_pending_then_running) {
  OPEN_RC(c, S.socket);
  /* Both workers busy: the third task stays pending. */
  uint64_t a = rk_submit(&c, "slow", "s", 5.0), b = rk_submit(&c, "slow", "s", 5.0);
  CHECK(rk_wait_status(&c, a, "running", 5000) == 0);
  CHECK(rk_wait_status(&c, b, "running", 5000) == 0);
  uint64_t q = rk_submit(&c, "slow", "s", 5.0);
  CHECK_STR_EQ(rk_status(&c, q), "pending");
  CHECK_EQ_INT(rc_info_int(&c, "tasks.pending"), 1);
  msg_t m;
  CHECK(rk_id(&c, "cancel", "task_id", q, &m) == 1 && !m.error);
  CHECK_STR_EQ(obj_str(obj_get(m.result, "status")), "cancelled");
  CHECK_EQ_INT(obj_int(obj_path(m.result, "error.code")), 18);
  CHECK(obj_get(m.result, "started_at")->type == MSGPACK_OBJECT_NIL);
  msg_free(&m);
  CHECK(rk_id(&c, "result", "task_id", q, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_CANCELLED, NULL);
  msg_free(&m);
  /* Running: st.sleep sees the flag; both end cancelled long before 5 s. */
  double t0 = stt_now_ms();
  CHECK(rk_id(&c, "cancel", "task_id", a, &m) == 1 && !m.error);
  msg_free(&m);
  CHECK(rk_id(&c, "cancel", "task_id", b, &m) == 1 && !m.error);
  msg_free(&m);
  CHECK(rk_wait_status(&c, a, "cancelled", 3000) == 0);
  CHECK(rk_wait_status(&c, b, "cancelled", 3000) == 0);
  CHECK(stt_now_ms() - t0 < 3000);
  /* Cancelling a finished task changes nothing. */
  CHECK(rk_id(&c, "cancel", "task_id", a, &m) == 1 && !m.error);
  CHECK_STR_EQ(obj_str(obj_get(m.result, "status")), "cancelled");
  msg_free(&m);
  CHECK(rc_wait_info(&c, "inflight", 0, 3000) == 0);
  rc_close(&c);
}

TEST(cancel_a_body_that_checks_cancelled) {
  OPEN_RC(c, S.socket);
  uint64_t t = rk_submit(&c, "loop", NULL, 0);
  CHECK(rk_wait_status(&c, t, "running", 5000) == 0);
  msg_t m;
  CHECK(rk_id(&c, "cancel", "task_id", t, &m) == 1 && !m.error);
  msg_free(&m);
  CHECK(rk_wait_status(&c, t, "cancelled", 3000) == 0);
  CHECK(rk_id(&c, "result", "task_id", t, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_CANCELLED, NULL);
  msg_free(&m);
  rc_close(&c);
}

TEST(wait_timeout_returns_current_info) {
  OPEN_RC(c, S.socket);
  uint64_t t = rk_submit(&c, "slow", "s", 0.6);
  msg_t m;
  double t0 = stt_now_ms();
  CHECK(rc_rpcf(&c, &m,
                "[0, 2, 'wait', [{task_id: %lld, timeout: 0.05}]]", (long long)t) == 1 && !m.error);
  double took = stt_now_ms() - t0;
  const char *s = obj_str(obj_get(m.result, "status"));
  CHECK(strcmp(s, "running") == 0 || strcmp(s, "pending") == 0);
  msg_free(&m);
  fprintf(stderr, "   wait(0.05) answered after %.1f ms\n", took);
  CHECK(took >= 40 && took < 400);
  /* Waits of several connections end together when the task does. */
  OPEN_RC(d, S.socket);
  CHECK(rc_sendf(&d, "[0, 3, 'wait', [{task_id: %lld, timeout: 10}]]", (long long)t) == 0);
  CHECK(rc_rpcf(&c, &m, "[0, 4, 'wait', [{task_id: %lld}]]", (long long)t) == 1 && !m.error);
  CHECK_STR_EQ(obj_str(obj_get(m.result, "status")), "completed");
  msg_free(&m);
  CHECK(rc_next(&d, &m, 5000) == 1 && !m.error);
  CHECK_STR_EQ(obj_str(obj_get(m.result, "status")), "completed");
  msg_free(&m);
  CHECK(stt_now_ms() - t0 < 3000);
  /* A bad timeout. */
  CHECK_RPC(&c, ST_ERR_INVALID_ARGUMENT, NULL, "[0, 5, 'wait', [{task_id: %lld, timeout: 4000.0}]]",
            (long long)t);
  rc_close(&d);
  rc_close(&c);
}

TEST(progress_shows_in_status) {
  OPEN_RC(c, S.socket);
  uint64_t t = rk_submit(&c, "steps", "s", 0.08);
  double end = stt_now_ms() + 5000;
  int seen = 0;
  while (!seen && stt_now_ms() < end) {
    msg_t m;
    CHECK(rk_id(&c, "status", "task_id", t, &m) == 1 && !m.error);
    const msgpack_object *p = obj_get(m.result, "progress");
    if (p && p->type == MSGPACK_OBJECT_FLOAT64 && p->via.f64 > 0 && p->via.f64 < 1 &&
        strcmp(obj_str(obj_get(m.result, "status")), "running") == 0) {
      CHECK_CONTAINS(obj_str(obj_get(m.result, "note")), "step ");
      seen = 1;
    }
    msg_free(&m);
    if (!seen) stt_sleep_ms(2);
  }
  CHECK(seen);
  msg_t m;
  CHECK(rc_rpcf(&c, &m, "[0, 2, 'wait', [{task_id: %lld}]]", (long long)t) == 1 && !m.error);
  CHECK_STR_EQ(obj_str(obj_get(m.result, "status")), "completed");
  CHECK(obj_get(m.result, "progress")->via.f64 == 1.0);
  CHECK_STR_EQ(obj_str(obj_get(m.result, "note")), "step 4");
  msg_free(&m);
  rc_close(&c);
}

TEST(task_endpoint_call_and_managed_result) {
  OPEN_RC(c, S.socket);
  int64_t submitted = rc_info_int(&c, "counters.tasks_submitted");
  msg_t m;
  CHECK(rk_call(&c, "mtask", "n", 3, &m) == 1 && !m.error);
  CHECK(obj_get(m.result, "value")->type == MSGPACK_OBJECT_EXT);
  CHECK_EQ_INT(obj_field(&m, "lease"), 1);
  CHECK_EQ_INT(obj_field(&m, "refcount"), 1);
  int64_t oid = obj_field(&m, "id");
  msg_free(&m);
  CHECK_EQ_INT(rc_info_int(&c, "counters.tasks_submitted"), submitted + 1);
  /* submit + result: a lease for the fetching connection. */
  uint64_t t = rk_submit(&c, "mtask", "n", 4);
  CHECK(rk_wait_status(&c, t, "completed", 5000) == 0);
  CHECK(rk_id(&c, "status", "task_id", t, &m) == 1 && !m.error);
  int64_t tobj = obj_int(obj_get(m.result, "object_id"));
  CHECK(tobj > 0 && tobj != oid);
  msg_free(&m);
  CHECK_EQ_INT(info_field(&c, (uint64_t)tobj, "refcount"), 0);   /* held by the task */
  CHECK(rk_id(&c, "result", "task_id", t, &m) == 1 && !m.error);
  rc_drop_fds(&c);
  CHECK_EQ_INT(obj_field(&m, "id"), tobj);
  CHECK_EQ_INT(obj_field(&m, "lease"), 1);
  msg_free(&m);
  CHECK_EQ_INT(info_field(&c, (uint64_t)tobj, "refcount"), 1);
  CHECK(rk_id(&c, "release", "object_id", (uint64_t)tobj, &m) == 1 && !m.error);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "destroyed")), 1);
  msg_free(&m);
  /* tasks, newest first, with a filter. */
  CHECK(rc_rpcf(&c, &m, "[0, 3, 'tasks', [{status: 'completed'}]]") == 1 && !m.error);
  CHECK(m.result->type == MSGPACK_OBJECT_ARRAY && m.result->via.array.size >= 2);
  CHECK_EQ_INT(obj_int(obj_get(&m.result->via.array.ptr[0], "id")), t);
  for (uint32_t i = 0; i < m.result->via.array.size; i++)
    CHECK_STR_EQ(obj_str(obj_get(&m.result->via.array.ptr[i], "status")), "completed");
  msg_free(&m);
  CHECK_RPC(&c, ST_ERR_INVALID_ARGUMENT, NULL, "[0, 4, 'tasks', [{status: 'done'}]]");
  rc_close(&c);
}

TEST(finished_tasks_expire_after_the_ttl) {
  OPEN_RC(c, S.socket);
  int64_t expired = rc_info_int(&c, "counters.tasks_expired");
  uint64_t t = rk_submit(&c, "slow", "s", 0.01);
  CHECK(rk_wait_status(&c, t, "completed", 5000) == 0);
  CHECK(rc_info_int(&c, "arenas.count") >= 1);   /* the unfetched result */
  double t0 = stt_now_ms();
  double end = t0 + 5000;
  while (strcmp(rk_status(&c, t), "") != 0 && stt_now_ms() < end) stt_sleep_ms(5);
  double gone = stt_now_ms() - t0;
  fprintf(stderr, "   task dropped %.0f ms after completion (ttl 1.5 s)\n", gone);
  msg_t m;
  CHECK(rk_id(&c, "status", "task_id", t, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_NOT_FOUND, NULL);
  msg_free(&m);
  CHECK(gone > 1000);
  CHECK(rc_wait_info(&c, "arenas.count", 0, 5000) == 0);
  CHECK(rc_info_int(&c, "counters.tasks_expired") > expired);
  rc_close(&c);
}

TEST(closing_the_caller_cancels_its_task) {
  rc_t c, w;
  CHECK(rc_open(&c, S.socket) == 0);
  CHECK(rc_open(&w, S.socket) == 0);
  CHECK(rc_sendf(&c, "[0, 1, 'call', [{endpoint: 'tslow', args: {}}]]") == 0);
  CHECK(rc_wait_info(&w, "tasks.running", 1, 5000) == 0);
  rc_close(&c);
  CHECK(rc_wait_info(&w, "tasks.running", 0, 3000) == 0);
  msg_t m;
  CHECK(rc_rpcf(&w, &m, "[0, 2, 'tasks', [{status: 'cancelled'}]]") == 1 && !m.error);
  CHECK(m.result->via.array.size >= 1);
  CHECK_STR_EQ(obj_str(obj_get(&m.result->via.array.ptr[0], "endpoint")), "tslow");
  msg_free(&m);
  rc_close(&w);
}

/* The ids of a `tasks` reply, into ids[] (at most cap); their count, or
 * -1 when the reply is no array of task info. */
static int page_ids(const msg_t *m, int64_t *ids, int cap) {
  if (m->error || m->result->type != MSGPACK_OBJECT_ARRAY) return -1;
  int n = (int)m->result->via.array.size;
  for (int i = 0; i < n && i < cap; i++) ids[i] = obj_int(obj_get(&m->result->via.array.ptr[i], "id"));
  return n;
}

/* 250 finished tasks on a server that keeps 1000. */
static void paging_body(stt_server_t *T) {
  OPEN_RC(c, T->socket);
  int64_t first = 0, last = 0;
  for (int i = 0; i < 250; i++) {
    uint64_t t = rk_submit(&c, "num", NULL, 0);
    CHECK(t > 0);
    if (!first) first = (int64_t)t;
    last = (int64_t)t;
  }
  CHECK(rc_wait_info(&c, "tasks.completed", 250, 10000) == 0);
  msg_t m;
  int64_t ids[1000];
  /* Without a limit: the newest 100. */
  CHECK(rc_rpcf(&c, &m, "[0, 1, 'tasks', []]") == 1);
  CHECK_EQ_INT(page_ids(&m, ids, 1000), 100);
  CHECK_EQ_INT(ids[0], last);
  msg_free(&m);
  /* Pages of 100 by the cursor: every task once, newest first. */
  int64_t before = 0, prev = INT64_MAX;
  int total = 0, pages = 0, n;
  do {
    CHECK(rc_rpcf(&c, &m, "[0, 2, 'tasks', [{limit: 100, before: %lld, status: 'completed'}]]",
                  (long long)before) == 1);
    n = page_ids(&m, ids, 1000);
    msg_free(&m);
    CHECK(n >= 0 && n <= 100);
    for (int i = 0; i < n; i++) {
      CHECK(ids[i] < prev);
      prev = ids[i];
    }
    total += n;
    pages++;
    if (n) before = ids[n - 1];
  } while (n == 100 && pages < 10);
  CHECK_EQ_INT(total, 250);
  CHECK_EQ_INT(pages, 3);
  CHECK_EQ_INT(prev, first);
  /* A cursor whose task is gone still pages from below it. */
  CHECK(rc_rpcf(&c, &m, "[0, 3, 'tasks', [{limit: 2, before: %lld}]]", (long long)last + 1000) == 1);
  CHECK_EQ_INT(page_ids(&m, ids, 1000), 2);
  CHECK_EQ_INT(ids[0], last);
  msg_free(&m);
  CHECK(rc_rpcf(&c, &m, "[0, 4, 'tasks', [{limit: 1000}]]") == 1);
  CHECK_EQ_INT(page_ids(&m, ids, 1000), 250);
  msg_free(&m);
  CHECK_RPC(&c, ST_ERR_INVALID_ARGUMENT, "'limit' must be in 1..1000, got 1001",
            "[0, 5, 'tasks', [{limit: 1001}]]");
  CHECK_RPC(&c, ST_ERR_INVALID_ARGUMENT, "'limit' must be in 1..1000, got 0",
            "[0, 6, 'tasks', [{limit: 0}]]");
  rc_close(&c);
}

TEST(tasks_come_in_pages) {
  stt_server_t T;
  stt_server_init(&T);
  stt_server_config(&T, "workers = 2, tasks = { capacity = 1000 },");
  stt_write_endpoint(&T, "num.lua", "return st.endpoint{ name = 'num', build = function() return 7 end }\n");
  CHECK(stt_server_run(&T, paging_body) == 0);
  stt_server_cleanup(&T);
}

/* info's task counts: a task a worker took counts as running although
 * nothing asked its status, also behind newer finished tasks (the
 * count's walk stops at the last pending task, not before it). */
TEST(info_counts_a_started_task_behind_finished_ones) {
  OPEN_RC(c, S.socket);
  uint64_t a = rk_submit(&c, "slow", "s", 0.8);
  uint64_t done[3];
  for (int i = 0; i < 3; i++) done[i] = rk_submit(&c, "slow", "s", 0.0);
  for (int i = 0; i < 3; i++) CHECK(rk_wait_status(&c, done[i], "completed", 5000) == 0);
  CHECK(rc_wait_info(&c, "tasks.running", 1, 3000) == 0);
  CHECK_EQ_INT(rc_info_int(&c, "tasks.pending"), 0);
  CHECK_STR_EQ(rk_status(&c, a), "running");
  CHECK(rk_wait_status(&c, a, "completed", 5000) == 0);
  CHECK_EQ_INT(rc_info_int(&c, "tasks.running"), 0);
  rc_close(&c);
}

/* info's tasks map, read once: pending, running, completed, failed,
 * cancelled, total into n[0..5]; 0, or -1 when the parts do not add up
 * to total (said on stderr). */
static int task_counts(rc_t *c, int64_t n[6]) {
  static const char *const names[6] = {"pending", "running",   "completed",
                                       "failed",  "cancelled", "total"};
  msg_t m;
  if (rc_info(c, 999998, &m) != 1) return -1;
  const msgpack_object *t = obj_get(m.result, "tasks");
  int64_t sum = 0;
  for (int i = 0; i < 6; i++) {
    n[i] = obj_int(obj_get(t, names[i]));
    if (i < 5) sum += n[i];
  }
  msg_free(&m);
  if (sum == n[5]) return 0;
  fprintf(stderr, "   tasks: %lld pending, %lld running, %lld completed, %lld failed, %lld "
                  "cancelled: %lld, not total %lld\n", (long long)n[0], (long long)n[1],
          (long long)n[2], (long long)n[3], (long long)n[4], (long long)sum, (long long)n[5]);
  return -1;
}

/* Whether info's counts are `want` (pending, running, completed, failed,
 * cancelled, total) and add up. */
static int counts_are(rc_t *c, int64_t p, int64_t r, int64_t done, int64_t failed,
                      int64_t cancelled, int64_t total) {
  int64_t n[6];
  if (task_counts(c, n) != 0) return 0;
  int64_t want[6] = {p, r, done, failed, cancelled, total};
  if (!memcmp(n, want, sizeof n)) return 1;
  fprintf(stderr, "   tasks: %lld/%lld/%lld/%lld/%lld of %lld, want %lld/%lld/%lld/%lld/%lld of "
                  "%lld\n", (long long)n[0], (long long)n[1], (long long)n[2], (long long)n[3],
          (long long)n[4], (long long)n[5], (long long)p, (long long)r, (long long)done,
          (long long)failed, (long long)cancelled, (long long)total);
  return 0;
}

enum { FULL_CAP = 300 };

/* A table of FULL_CAP tasks, two workers: see the test below. No task's
 * status is asked before the counts that cover it are read. */
static void full_table_body(stt_server_t *T) {
  OPEN_RC(c, T->socket);
  /* One hold runs on a worker; the second waits for its turn (serialized):
   * a pending task older than every finished one to come. */
  uint64_t s1 = rk_submit(&c, "hold", "s", 30.0);
  CHECK(rc_wait_info(&c, "tasks.running", 1, 5000) == 0);
  uint64_t s2 = rk_submit(&c, "hold", "s", 30.0);
  CHECK(s1 && s2);
  for (int i = 0; i < FULL_CAP - 2; i++) CHECK(rk_submit(&c, "num", NULL, 0) > 0);
  CHECK(rc_wait_info(&c, "tasks.completed", FULL_CAP - 2, 20000) == 0);
  CHECK(counts_are(&c, 1, 1, FULL_CAP - 2, 0, 0, FULL_CAP));
  /* A build on the other worker: running without a status asked (each new
   * task pushes out the oldest finished one). */
  uint64_t j1 = rk_submit(&c, "share", "s", 2.0);
  CHECK(rc_wait_info(&c, "tasks.running", 2, 5000) == 0);
  CHECK(counts_are(&c, 1, 2, FULL_CAP - 3, 0, 0, FULL_CAP));
  /* A task that joins it (singleflight) runs as soon as it joins. */
  uint64_t j2 = rk_submit(&c, "share", "s", 2.0);
  CHECK(j1 && j2);
  CHECK(counts_are(&c, 1, 3, FULL_CAP - 4, 0, 0, FULL_CAP));
  /* Both workers busy: a new build waits in their queue, pending, and
   * runs once the shared one is done. */
  uint64_t q = rk_submit(&c, "share", "s", 1.0);
  CHECK(q > 0);
  CHECK(counts_are(&c, 2, 3, FULL_CAP - 5, 0, 0, FULL_CAP));
  CHECK(rc_wait_info(&c, "tasks.running", 2, 5000) == 0);   /* hold s1 and q */
  CHECK(counts_are(&c, 1, 2, FULL_CAP - 3, 0, 0, FULL_CAP));
  CHECK(rc_wait_info(&c, "tasks.running", 1, 5000) == 0);
  CHECK(counts_are(&c, 1, 1, FULL_CAP - 2, 0, 0, FULL_CAP));
  /* The waiting hold is cancelled at once, the running one when its sleep
   * sees the flag. */
  msg_t m;
  CHECK(rk_id(&c, "cancel", "task_id", s2, &m) == 1 && !m.error);
  msg_free(&m);
  CHECK(counts_are(&c, 0, 1, FULL_CAP - 2, 0, 1, FULL_CAP));
  CHECK(rk_id(&c, "cancel", "task_id", s1, &m) == 1 && !m.error);
  msg_free(&m);
  CHECK(rc_wait_info(&c, "tasks.cancelled", 2, 5000) == 0);
  CHECK(counts_are(&c, 0, 0, FULL_CAP - 2, 0, 2, FULL_CAP));
  CHECK_STR_EQ(rk_status(&c, j2), "completed");
  CHECK_STR_EQ(rk_status(&c, q), "completed");
  rc_close(&c);
}

/* info's task counts stay right through every change of a full table,
 * without a walk of it: a task of a serialized endpoint running and one
 * waiting for its turn (pending, older than every finished task), a task
 * that joins a running build, one queued behind busy workers that a
 * worker then takes, cancels of a pending and a running task; the counts
 * add up to total each time. */
TEST(info_task_counts_with_the_table_full) {
  stt_server_t T;
  stt_server_init(&T);
  stt_server_config(&T, "workers = 2, tasks = { capacity = 300 },");
  stt_write_endpoint(&T, "num.lua",
                     "return st.endpoint{ name = 'num', build = function() return 7 end }\n");
  stt_write_endpoint(&T, "hold.lua",
                     "return st.endpoint{ name = 'hold', concurrency = 'serialized',\n"
                     "  params = { s = 1 }, build = function(a) st.sleep(a.s); return 1 end }\n");
  stt_write_endpoint(&T, "share.lua",
                     "return st.endpoint{ name = 'share', singleflight = true,\n"
                     "  params = { s = 0.5 }, build = function(a) st.sleep(a.s); return 1 end }\n");
  CHECK(stt_server_run(&T, full_table_body) == 0);
  stt_server_cleanup(&T);
}

static const stt_endpoint_t endpoints[] = {
    {"slow.lua",
     "return st.endpoint{ name = 'slow', params = { s = 0.5 },\n"
     "  build = function(a) local t = st.zeros{256}; st.sleep(a.s); return t end }\n"},
    {"fail.lua",
     "return st.endpoint{ name = 'fail', build = function()\n"
     "  error('nope') end }\n"},
    {"loop.lua",
     "return st.endpoint{ name = 'loop', build = function()\n"
     "  local n = 0\n"
     "  while not st.cancelled() do n = n + 1 end\n"
     "  return n end }\n"},
    {"steps.lua",
     "return st.endpoint{ name = 'steps', params = { n = 4, s = 0.1 },\n"
     "  build = function(a)\n"
     "    for i = 1, a.n do st.sleep(a.s); st.progress(i / a.n, 'step ' .. i) end\n"
     "    return st.arange{3} end }\n"},
    {"mtask.lua",
     "return st.endpoint{ name = 'mtask', execution = 'task', managed = true,\n"
     "  params = { n = 4 }, build = function(a) return st.ones{a.n} end }\n"},
    {"tslow.lua",
     "return st.endpoint{ name = 'tslow', execution = 'task',\n"
     "  build = function() st.sleep(10); return 1 end }\n"},
    {NULL, NULL},
};

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  stt_server_setup(&S, "workers = 2, tasks = { ttl_s = 1.5, capacity = 100 },", endpoints);
  RUN(submit_wait_result_once);
  RUN(result_of_unfinished_failed_and_unknown_tasks);
  RUN(cancel_pending_then_running);
  RUN(cancel_a_body_that_checks_cancelled);
  RUN(wait_timeout_returns_current_info);
  RUN(progress_shows_in_status);
  RUN(task_endpoint_call_and_managed_result);
  RUN(finished_tasks_expire_after_the_ttl);
  RUN(closing_the_caller_cancels_its_task);
  RUN(tasks_come_in_pages);
  RUN(info_counts_a_started_task_behind_finished_ones);
  RUN(info_task_counts_with_the_table_full);
  return stt_server_finish(&S);
}
