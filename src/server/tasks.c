/* src/server: tasks (work.h): the table, states and retention, waiters
 * parked by `wait` and by calls of task endpoints, and task info.
 * Loop thread only.
 *
 * Retention: a finished task stays for tasks.ttl_s (a periodic timer drops
 * expired ones, oldest first) and the table holds at most tasks.capacity
 * tasks (a new one pushes out the oldest finished). A result is kept only
 * until it is fetched: fetching a plain result frees it, fetching an
 * object result gives up the task's hold on the object.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/clock.h"
#include "mem/uidq.h"
#include "server/work.h"
#include "st/errors.h"

/* The words of ST__TASK_STATUS_NAMES (work.h), as strings. */
static const char *const status_names[ST_TASK_NSTATES] = {"pending", "running", "completed",
                                                          "failed", "cancelled"};

/* "pending" ... "cancelled" (static). Any thread. */
const char *st__task_status_name(st__task_status_t s) {
  return (unsigned)s < ST_TASK_NSTATES ? status_names[s] : "?";
}

static int finished(const st__task_t *t) {
  return t->status >= ST_TASK_COMPLETED;
}

static void set_status(st__work_t *w, st__task_t *t, st__task_status_t s) {
  w->nstatus[t->status]--;
  t->status = s;
  w->nstatus[s]++;
}

/* Task by id (borrowed) or NULL. Loop thread. */
st__task_t *st__task_find(st__server_t *srv, uint64_t id) {
  return st__smap_get(&srv->work->tasks, ST__ID_KEY(&id));
}

/* ------------------------------------------------------------- removal */

static void free_task(st__server_t *srv, st__task_t *t) {
  if (t->holds_object) {
    st__object_t *o = st__objects_find(&srv->objects, t->object_id);
    if (o) st__objects_unhold(&srv->objects, o);
  }
  st__uidq_uncharge(t->uid, ST__UIDQ_TASKS, 1);
  st__build_result_destroy(&t->result);
  free(t->endpoint);
  free(t->err_msg);
  free(t);
}

/* Drops a finished task (it has no waiters and no build). */
static void expire(st__server_t *srv, st__task_t *t) {
  st__work_t *w = srv->work;
  st__smap_del(&w->tasks, ST__ID_KEY(&t->id));
  if (t->newer) t->newer->older = t->older;
  else w->newest = t->older;
  if (t->older) t->older->newer = t->newer;
  else w->oldest = t->newer;
  if (t->dprev) t->dprev->dnext = t->dnext;
  else w->done_head = t->dnext;
  if (t->dnext) t->dnext->dprev = t->dprev;
  else w->done_tail = t->dprev;
  w->nstatus[t->status]--;
  w->ntasks--;
  srv->counters.tasks_expired++;
  ST_LOG_D("task", "task %llu (%s, %s) dropped", (unsigned long long)t->id, t->endpoint,
           st__task_status_name(t->status));
  free_task(srv, t);
}

/* Timer: finished tasks older than the TTL go. */
void st__tasks_sweep(st__server_t *srv) {
  st__work_t *w = srv->work;
  double now = st__now_mono();
  while (w->done_head && w->done_head->completed_mono + srv->cfg->task_ttl_s <= now)
    expire(srv, w->done_head);
}

/* ------------------------------------------------------------- creation */

/* The oldest finished task of uid, or NULL. */
static st__task_t *oldest_done_of(st__work_t *w, uid_t uid) {
  for (st__task_t *t = w->done_head; t; t = t->dnext)
    if (t->uid == uid) return t;
  return NULL;
}

/* A new pending task (capacity, the uid's quota and TTL applied first);
 * see work.h. A uid at its quota pushes out its own oldest finished task,
 * never another uid's. Loop thread. */
st__task_t *st__task_new(st__server_t *srv, const char *endpoint, uid_t uid, char *err,
                         size_t errlen, int *code) {
  st__work_t *w = srv->work;
  st__tasks_sweep(srv);
  char why[300];
  if (st__uidq_room(uid, ST__UIDQ_TASKS, 1, why, sizeof why) != ST_OK) {
    st__task_t *own = oldest_done_of(w, uid);
    if (!own) {
      snprintf(err, errlen, "%s (tasks pending, running or finished and kept)", why);
      *code = ST_ERR_LIMIT;
      return NULL;
    }
    expire(srv, own);
  }
  if (w->ntasks >= (size_t)srv->cfg->task_capacity) {
    if (!w->done_head) {
      snprintf(err, errlen, "%zu tasks are pending or running (tasks.capacity)", w->ntasks);
      *code = ST_ERR_LIMIT;
      return NULL;
    }
    expire(srv, w->done_head);
  }
  if (st__uidq_charge(uid, ST__UIDQ_TASKS, 1, why, sizeof why) != ST_OK) {
    snprintf(err, errlen, "%s", why);
    *code = ST_ERR_LIMIT;
    return NULL;
  }
  st__task_t *t = calloc(1, sizeof *t);
  if (t) t->endpoint = strdup(endpoint);
  if (!t || !t->endpoint) {
    st__uidq_uncharge(uid, ST__UIDQ_TASKS, 1);
    free(t);
    snprintf(err, errlen, "out of memory");
    *code = ST_ERR_OUT_OF_MEMORY;
    return NULL;
  }
  t->id = ++w->next_task_id;
  t->uid = uid;
  if (st__smap_put(&w->tasks, ST__ID_KEY(&t->id), t) != ST_OK) {
    st__uidq_uncharge(uid, ST__UIDQ_TASKS, 1);
    free(t->endpoint);
    free(t);
    snprintf(err, errlen, "out of memory");
    *code = ST_ERR_OUT_OF_MEMORY;
    return NULL;
  }
  t->status = ST_TASK_PENDING;
  t->created_at = st__now_unix();
  st__build_result_init(&t->result);
  t->older = w->newest;
  if (w->newest) w->newest->newer = t;
  else w->oldest = t;
  w->newest = t;
  w->ntasks++;
  w->nstatus[ST_TASK_PENDING]++;
  return t;
}

/* ------------------------------------------------------------- state */

/* A worker took the task's build: pending becomes running. Loop thread. */
void st__task_started(st__server_t *srv, st__task_t *t, double started_unix) {
  if (t->status != ST_TASK_PENDING) return;
  t->started_at = started_unix;
  set_status(srv->work, t, ST_TASK_RUNNING);
}

/* Current status; pending becomes running once a worker took the job.
 * Loop thread. */
st__task_status_t st__task_status(st__server_t *srv, st__task_t *t) {
  if (t->status == ST_TASK_PENDING && t->build && t->build->state == ST_BUILD_SUBMITTED &&
      st__job_state(t->build->job) != ST_JOB_QUEUED)
    st__task_started(srv, t, t->build->job->started_unix);
  return t->status;
}

/* See work.h. Loop thread. */
void st__tasks_build_submitted(st__work_t *w, st__build_t *b) {
  b->fnext = NULL;
  b->fprev = w->queued_tail;
  if (w->queued_tail) w->queued_tail->fnext = b;
  else w->queued = b;
  w->queued_tail = b;
  b->in_queued = 1;
}

/* See work.h. Each build leaves the list once, so that a refresh costs,
 * over time, one step per submitted build, not a walk of the tasks.
 * Loop thread. */
void st__tasks_refresh(st__server_t *srv) {
  st__work_t *w = srv->work;
  while (w && w->queued && st__job_state(w->queued->job) != ST_JOB_QUEUED) {
    st__build_t *b = w->queued;
    w->queued = b->fnext;
    if (w->queued) w->queued->fprev = NULL;
    else w->queued_tail = NULL;
    b->fprev = b->fnext = NULL;
    b->in_queued = 0;
    for (st__consumer_t *k = b->consumers; k; k = k->next)
      if (k->kind == ST_CONSUMER_TASK) st__task_started(srv, k->task, b->job->started_unix);
  }
}

static void pack_error(msgpack_packer *pk, const st__task_t *t) {
  if (t->status == ST_TASK_FAILED || t->status == ST_TASK_CANCELLED)
    st__pack_error(pk, t->err_code ? t->err_code : ST_ERR_CANCELLED, t->err_msg);
  else
    msgpack_pack_nil(pk);
}

static void pack_time(msgpack_packer *pk, double t) {
  if (t > 0) msgpack_pack_double(pk, t);
  else msgpack_pack_nil(pk);
}

/* Packs task info (docs/protocol.md); progress is read from the running
 * job under its lock. Loop thread. */
void st__pack_task(msgpack_packer *pk, st__server_t *srv, st__task_t *t) {
  st__task_status(srv, t);
  st__progress_t p;
  memset(&p, 0, sizeof p);
  if (t->status == ST_TASK_RUNNING && t->build && t->build->state == ST_BUILD_SUBMITTED)
    st__progress_get(&t->build->job->progress, &p);
  else if (finished(t))
    p = t->progress;
  msgpack_pack_map(pk, 11);
  st__pack_kv_uint(pk, "id", t->id);
  st__pack_kv_uint(pk, "uid", (uint64_t)t->uid);
  st__pack_kv_str(pk, "endpoint", t->endpoint);
  st__pack_kv_str(pk, "status", st__task_status_name(t->status));
  st__pack_cstr(pk, "created_at");
  pack_time(pk, t->created_at);
  st__pack_cstr(pk, "started_at");
  pack_time(pk, t->started_at);
  st__pack_cstr(pk, "completed_at");
  pack_time(pk, t->completed_at);
  st__pack_cstr(pk, "error");
  pack_error(pk, t);
  st__pack_cstr(pk, "progress");
  if (p.set) msgpack_pack_double(pk, p.fraction);
  else msgpack_pack_nil(pk);
  st__pack_kv_str(pk, "note", p.set && p.has_note ? p.note : NULL);
  st__pack_cstr(pk, "object_id");
  if (t->status == ST_TASK_COMPLETED && t->object_id) msgpack_pack_uint64(pk, t->object_id);
  else msgpack_pack_nil(pk);
}

/* Answers request_id with t's info. Loop thread. */
void st__reply_task(st__conn_t *c, uint32_t request_id, st__task_t *t) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, request_id);
  st__pack_task(&pk, c->srv, t);
  st__reply_send(c, request_id, &sb);
}

/* ------------------------------------------------------------- waiters */

static void unlink_waiter(st__server_t *srv, st__waiter_t *x) {
  st__work_t *w = srv->work;
  st__task_t *t = x->task;
  if (x->tprev) x->tprev->tnext = x->tnext;
  else t->waiters = x->tnext;
  if (x->tnext) x->tnext->tprev = x->tprev;
  if (x->gprev) x->gprev->gnext = x->gnext;
  else w->waiters = x->gnext;
  if (x->gnext) x->gnext->gprev = x->gprev;
  ev_timer_stop(srv->loop, &x->timer);
}

/* Answers a waiter (if its connection is still there) and frees it. */
static void answer(st__server_t *srv, st__waiter_t *x) {
  unlink_waiter(srv, x);
  st__conn_t *c = st__conn_find(srv, x->conn_id);
  if (c && !c->dead) {
    if (x->kind == ST_WAIT_RESULT) st__task_reply_result(c, x->request_id, x->task);
    else st__reply_task(c, x->request_id, x->task);
    st__conn_request_done(c);
  }
  free(x);
}

static void on_wait_timeout(struct ev_loop *loop, ev_timer *tm, int revents) {
  (void)loop;
  (void)revents;
  st__waiter_t *x = tm->data;
  answer(x->srv, x);
}

/* Parks a request until t ends; see work.h. */
int st__task_add_waiter(st__server_t *srv, st__task_t *t, st__conn_t *c, uint32_t request_id,
                        st__wait_kind_t kind, double timeout_s) {
  st__work_t *w = srv->work;
  if (finished(t) || (kind == ST_WAIT_INFO && timeout_s <= 0)) {
    if (kind == ST_WAIT_RESULT) st__task_reply_result(c, request_id, t);
    else st__reply_task(c, request_id, t);
    return ST_OK;
  }
  st__waiter_t *x = calloc(1, sizeof *x);
  if (!x) return ST_ERR_OUT_OF_MEMORY;
  x->srv = srv;
  x->task = t;
  x->kind = kind;
  x->conn_id = c->id;
  x->request_id = request_id;
  x->tnext = t->waiters;
  if (t->waiters) t->waiters->tprev = x;
  t->waiters = x;
  x->gnext = w->waiters;
  if (w->waiters) w->waiters->gprev = x;
  w->waiters = x;
  ev_timer_init(&x->timer, on_wait_timeout, timeout_s, 0.);
  x->timer.data = x;
  if (kind == ST_WAIT_INFO) {
    ev_now_update(srv->loop);     /* the timeout counts from now */
    ev_timer_start(srv->loop, &x->timer);
    st__loop_kick(&srv->loops[0]);  /* from another loop's thread */
  }
  c->inflight++;
  return ST_OK;
}

/* Waiters of a closed connection; see work.h. */
size_t st__tasks_conn_closed(st__server_t *srv, uint64_t conn_id, uint64_t *orphans, size_t cap,
                             size_t *more) {
  st__work_t *w = srv->work;
  size_t n = 0;
  st__waiter_t *x = w->waiters;
  while (x) {
    st__waiter_t *next = x->gnext;
    if (x->conn_id == conn_id) {
      if (x->kind == ST_WAIT_RESULT && !finished(x->task)) {
        if (n < cap) orphans[n++] = x->task->id;
        else (*more)++;
      }
      unlink_waiter(srv, x);
      free(x);
    }
    x = next;
  }
  return n;
}

/* ------------------------------------------------------------- ending */

static void finish(st__server_t *srv, st__task_t *t, st__task_status_t s) {
  st__work_t *w = srv->work;
  t->build = NULL;
  set_status(w, t, s);
  if (s == ST_TASK_COMPLETED) srv->counters.tasks_completed++;
  else if (s == ST_TASK_FAILED) srv->counters.tasks_failed++;
  else srv->counters.tasks_cancelled++;
  t->completed_at = st__now_unix();
  if (s == ST_TASK_COMPLETED && !t->started_at) t->started_at = t->completed_at;
  t->completed_mono = st__now_mono();
  t->dprev = w->done_tail;
  t->dnext = NULL;
  if (w->done_tail) w->done_tail->dnext = t;
  else w->done_head = t;
  w->done_tail = t;
  ST_LOG_D("task", "task %llu (%s) %s", (unsigned long long)t->id, t->endpoint,
           st__task_status_name(s));
  while (t->waiters) answer(srv, t->waiters);
}

/* Ends t failed (or cancelled: a CANCELLED code, or a cancel that was
 * requested); message NULL: "task N was cancelled". Loop thread. */
void st__task_finish_error(st__server_t *srv, st__task_t *t, int code, const char *message) {
  if (finished(t)) return;
  if (t->cancel_requested) {
    code = ST_ERR_CANCELLED;
    message = NULL;
  }
  free(t->err_msg);
  if (message) {
    t->err_msg = strdup(message);
  } else {
    char m[96];
    snprintf(m, sizeof m, "task %llu was cancelled", (unsigned long long)t->id);
    t->err_msg = strdup(m);
  }
  t->err_code = code;
  finish(srv, t, code == ST_ERR_CANCELLED ? ST_TASK_CANCELLED : ST_TASK_FAILED);
}

/* Ends t completed with obj, which it holds until fetched. Loop thread. */
void st__task_finish_object(st__server_t *srv, st__task_t *t, st__object_t *obj) {
  if (finished(t)) return;
  if (t->cancel_requested) {
    st__task_finish_error(srv, t, ST_ERR_CANCELLED, NULL);
    return;
  }
  t->object_id = obj->id;
  t->holds_object = 1;
  st__objects_hold(&srv->objects, obj);
  finish(srv, t, ST_TASK_COMPLETED);
}

/* Ends t completed with a plain result (taken from *result). Loop thread. */
void st__task_finish_plain(st__server_t *srv, st__task_t *t, st__build_result_t *result) {
  if (finished(t)) return;
  if (t->cancel_requested) {
    st__task_finish_error(srv, t, ST_ERR_CANCELLED, NULL);
    return;
  }
  t->result = *result;
  st__build_result_init(result);
  finish(srv, t, ST_TASK_COMPLETED);
}

/* ------------------------------------------------------------- result */

/* Answers as `result` would; see work.h. */
void st__task_reply_result(st__conn_t *c, uint32_t request_id, st__task_t *t) {
  st__server_t *srv = c->srv;
  char m[640];
  st__task_status_t s = st__task_status(srv, t);
  if (s == ST_TASK_PENDING || s == ST_TASK_RUNNING) {
    snprintf(m, sizeof m, "task %llu is %s", (unsigned long long)t->id, st__task_status_name(s));
    st__conn_send_error(c, request_id, ST_ERR_TASK, m);
    return;
  }
  if (s != ST_TASK_COMPLETED) {
    st__conn_send_error(c, request_id, t->err_code ? t->err_code : ST_ERR_TASK, t->err_msg);
    return;
  }
  st__object_t *obj = t->object_id ? st__objects_find(&srv->objects, t->object_id) : NULL;
  if (t->taken || (t->object_id && !obj)) {
    snprintf(m, sizeof m, "task %llu: result already taken", (unsigned long long)t->id);
    st__conn_send_error(c, request_id, ST_ERR_TASK, m);
    return;
  }
  if (!obj) {
    if (st__reply_result(c, request_id, t->endpoint, &t->result, NULL, 0) == ST_OK) {
      st__build_result_destroy(&t->result);
      t->taken = 1;
    }
    return;
  }
  int lease = 0;
  if (obj->managed && st__objects_lease(&srv->objects, obj, c->id) == ST_OK) {
    c->leases++;
    lease = 1;
  }
  st__objects_touch(&srv->objects, obj);
  if (st__reply_result(c, request_id, t->endpoint, &obj->result, obj, lease) != ST_OK) {
    /* Nothing was handed over: the task keeps its result. */
    if (lease) st__drop_lease(srv, c, obj);
    return;
  }
  t->taken = 1;
  if (t->holds_object) {
    t->holds_object = 0;
    st__objects_unhold(&srv->objects, obj);
  }
}

/* ------------------------------------------------------------- teardown */

/* Frees every task and waiter. Loop thread, at exit. */
void st__tasks_destroy(st__server_t *srv) {
  st__work_t *w = srv->work;
  while (w->waiters) {
    st__waiter_t *x = w->waiters;
    unlink_waiter(srv, x);
    free(x);
  }
  st__task_t *t = w->newest;
  while (t) {
    st__task_t *older = t->older;
    free_task(srv, t);
    t = older;
  }
  w->newest = w->oldest = w->done_head = w->done_tail = NULL;
  w->ntasks = 0;
}
