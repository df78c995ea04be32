/* src/server: the task methods (rpc.h; docs/protocol.md, "status" ...
 * "tasks"): task info, waiting, results and cancelling of the tasks of
 * tasks.c. Loop thread only. */
#include <stdio.h>

#include "server/rpc.h"
#include "common/log.h"
#include "mem/uidq.h"
#include "server/holdings.h"
#include "server/work.h"
#include "st/errors.h"

#define WAIT_DEFAULT_S 30.0

/* Whether the caller may see task t: its submitter, root and the
 * server's own uid (mem/uidq.h, st__uidq_exempt). */
static int may_see(const st__conn_t *c, const st__task_t *t) {
  return t->uid == c->cred.uid || st__uidq_exempt(c->cred.uid);
}

/* The task named by the task_id parameter, or NULL after a NOT_FOUND
 * reply: another uid's task is NOT_FOUND too, word for word (its
 * existence is not told). */
static st__task_t *task_of(st__rpc_req_t *r) {
  uint64_t tid = st__rpc_u64(r, "task_id", 0);
  st__task_t *t = st__task_find(r->c->srv, tid);
  if (t && !may_see(r->c, t)) t = NULL;
  if (!t)
    st__rpc_error(r, ST_ERR_NOT_FOUND,
                  "%s: task %llu not found (unknown, or dropped after tasks.ttl_s)",
                  r->method->name, (unsigned long long)tid);
  return t;
}

/* status {task_id} -> task info. */
void st__rpc_status(st__rpc_req_t *r) {
  st__task_t *t = task_of(r);
  if (t) st__reply_task(r->c, r->id, t);
}

/* wait {task_id, timeout?} -> task info when it ends or at the timeout. */
void st__rpc_wait(st__rpc_req_t *r) {
  double timeout = st__rpc_seconds(r, "timeout", WAIT_DEFAULT_S);
  st__task_t *t = task_of(r);
  if (!t) return;
  if (st__task_add_waiter(r->c->srv, t, r->c, r->id, ST_WAIT_INFO, timeout) != ST_OK)
    st__rpc_error(r, ST_ERR_OUT_OF_MEMORY, "wait: out of memory");
}

/* result {task_id} -> like call's reply. */
void st__rpc_result(st__rpc_req_t *r) {
  st__task_t *t = task_of(r);
  if (t) st__task_reply_result(r->c, r->id, t);
}

/* cancel {task_id} -> task info after the request. */
void st__rpc_cancel(st__rpc_req_t *r) {
  st__task_t *t = task_of(r);
  if (!t) return;
  st__task_cancel(r->c->srv, t);
  st__reply_task(r->c, r->id, t);
}

/* The newest task older than the cursor `before` (a task id; 0: the
 * newest task of all). The cursor's task may be gone (fetched, expired):
 * then the list is walked. */
static st__task_t *page_start(st__server_t *srv, uint64_t before) {
  if (!before) return srv->work->newest;
  st__task_t *t = st__task_find(srv, before);
  if (t) return t->older;
  for (t = srv->work->newest; t && t->id >= before; t = t->older) {}
  return t;
}

/* tasks {status?, limit?, before?} -> task info, newest first, of the
 * caller's uid (root and the server's uid: of every uid): at most
 * `limit` (default ST__TASKS_PAGE_DEFAULT, at most ST__TASKS_PAGE_MAX)
 * of the tasks whose id is below `before` (a cursor: the last id of the
 * previous page). */
void st__rpc_tasks(st__rpc_req_t *r) {
  st__server_t *srv = r->c->srv;
  int want = st__rpc_word(r, "status", -1);
  uint64_t limit = st__rpc_u64(r, "limit", ST__TASKS_PAGE_DEFAULT);
  if (limit < 1 || limit > ST__TASKS_PAGE_MAX) {
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "tasks: 'limit' must be in 1..%d, got %llu",
                  ST__TASKS_PAGE_MAX, (unsigned long long)limit);
    return;
  }
  st__task_t *page[ST__TASKS_PAGE_MAX];
  size_t n = 0;
  for (st__task_t *t = page_start(srv, st__rpc_u64(r, "before", 0)); t && n < limit; t = t->older)
    if (may_see(r->c, t) && (want < 0 || (int)st__task_status(srv, t) == want)) page[n++] = t;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, r->id);
  msgpack_pack_array(&pk, n);
  for (size_t i = 0; i < n; i++) st__pack_task(&pk, srv, page[i]);
  st__reply_send(r->c, r->id, &sb);
}

/* ------------------------------------------------------------- holdings */

/* The connection closed: its waits end, and a task its call started has
 * nobody to answer any more (cancelled). Runs after the "calls" row, and
 * like it only when the connection had requests in flight. */
static void tasks_release(st__server_t *srv, st__conn_t *c) {
  if (!srv->work || c->inflight <= 0) return;
  uint64_t orphans[64];
  size_t more = 0;
  size_t n = st__tasks_conn_closed(srv, c->id, orphans, 64, &more);
  for (size_t i = 0; i < n; i++) {
    st__task_t *t = st__task_find(srv, orphans[i]);
    if (t) st__task_cancel(srv, t);
  }
  if (more)
    ST_LOG_W("task", "conn %llu: %zu more tasks of its calls keep running",
             (unsigned long long)c->id, more);
}

/* The connection's waiters (wait, and calls of task endpoints). */
static void tasks_count(st__server_t *srv, const st__conn_t *c, st__holding_count_t *n) {
  if (!srv->work || c->inflight <= 0) return;   /* each wait counts in c->inflight */
  for (const st__waiter_t *x = srv->work->waiters; x; x = x->gnext)
    n->items += x->conn_id == c->id;
}

static int tasks_none(st__server_t *srv) { return !srv->work || !srv->work->waiters; }

const st__holding_kind_t st__holding_tasks = {
    .name = "tasks", .release = tasks_release, .count = tasks_count, .none = tasks_none};
