/* Helpers of the integration tests of objects, tasks, budgets and reloads
 * (test_objects.c, test_tasks.c, test_budget.c, test_reload.c): requests
 * with named parameters, the fields of call replies, task polling. Built
 * on raw.h; header-only (static functions), like raw.h. */
#ifndef STT_SERVER_RPC_KIT_H
#define STT_SERVER_RPC_KIT_H

#include <sys/wait.h>

#include "raw.h"

/* [0, id, method, [{n named values}]]: the varargs of pk_kv_va. */
static inline void rq_named(rq_t *r, uint32_t id, const char *method, int n, ...) {
  rq_head(r, id, method);
  msgpack_pack_array(&r->pk, 1);
  va_list ap;
  va_start(ap, n);
  pk_kv_va(&r->pk, n, ap);
  va_end(ap);
}

/* [0, id, method, [{endpoint = ep, args = {n values}}]] (call, submit,
 * invalidate_call). */
static inline void rq_ep_args(rq_t *r, uint32_t id, const char *method, const char *ep, int n,
                              ...) {
  rq_head(r, id, method);
  msgpack_pack_array(&r->pk, 1);
  msgpack_pack_map(&r->pk, 2);
  pk_str(&r->pk, "endpoint");
  pk_str(&r->pk, ep);
  pk_str(&r->pk, "args");
  va_list ap;
  va_start(ap, n);
  pk_kv_va(&r->pk, n, ap);
  va_end(ap);
}

/* Closes every descriptor received so far. */
static inline void rc_drop_fds(rc_t *c) {
  for (int i = 0; i < c->nfds; i++) close(c->fds[i]);
  c->nfds = 0;
}

/* One request with an id-like parameter (task_id, object_id), reply in *m. */
static inline int rk_id(rc_t *c, const char *method, const char *param, uint64_t value,
                        msg_t *m) {
  rq_t r;
  rq_init(&r);
  rq_named(&r, 77, method, 1, param, 'i', (int64_t)value);
  return rc_rpc(c, &r, m);
}

/* call with one integer argument (name NULL: no argument); reply in *m,
 * descriptors dropped. */
static inline int rk_call(rc_t *c, const char *ep, const char *arg, int64_t v, msg_t *m) {
  rq_t r;
  rq_init(&r);
  if (arg) rq_ep_args(&r, 5, "call", ep, 1, arg, 'i', v);
  else rq_ep_args(&r, 5, "call", ep, 0);
  int rc = rc_rpc(c, &r, m);
  rc_drop_fds(c);
  if (rc == 1 && m->error)
    fprintf(stderr, "   call %s: %s: %s\n", ep, msg_errname(m), msg_errmsg(m));
  return rc;
}

/* result.object.<key> of a call reply, as an integer (INT64_MIN if none). */
static inline int64_t obj_field(const msg_t *m, const char *key) {
  return obj_int(obj_get(obj_get(m->result, "object"), key));
}

/* Arena id i of a call reply (INT64_MIN if none). */
static inline int64_t arena_id(const msg_t *m, uint32_t i) {
  const msgpack_object *a = obj_get(m->result, "arenas");
  if (!a || a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size <= i) return INT64_MIN;
  return obj_int(obj_get(&a->via.array.ptr[i], "id"));
}

/* object_info(id).<key> as an integer; INT64_MIN when it fails (for
 * instance STALE_HANDLE). */
static inline int64_t info_field(rc_t *c, uint64_t oid, const char *key) {
  msg_t m;
  if (rk_id(c, "object_info", "object_id", oid, &m) != 1) return INT64_MIN;
  int64_t v = m.error ? INT64_MIN : obj_int(obj_get(m.result, key));
  msg_free(&m);
  return v;
}

/* submit ep with one number argument (name NULL: none; an integral v goes
 * as an integer): the task id, or 0. */
static inline uint64_t rk_submit(rc_t *c, const char *ep, const char *arg, double v) {
  rq_t r;
  rq_init(&r);
  if (!arg) rq_ep_args(&r, 6, "submit", ep, 0);
  else if (v == (double)(int64_t)v) rq_ep_args(&r, 6, "submit", ep, 1, arg, 'i', (int64_t)v);
  else rq_ep_args(&r, 6, "submit", ep, 1, arg, 'd', v);
  msg_t m;
  if (rc_rpc(c, &r, &m) != 1) return 0;
  uint64_t id = 0;
  if (m.error) fprintf(stderr, "   submit %s: %s\n", ep, msg_errmsg(&m));
  else id = (uint64_t)obj_int(obj_get(m.result, "task_id"));
  msg_free(&m);
  return id;
}

/* status of a task ("" when the request fails). */
static inline const char *rk_status(rc_t *c, uint64_t task) {
  msg_t m;
  if (rk_id(c, "status", "task_id", task, &m) != 1) return "";
  const char *s = m.error ? "" : obj_str(obj_get(m.result, "status"));
  msg_free(&m);
  return s;
}

/* Polls status until it is `want` (deadline in ms). 0 or -1. */
static inline int rk_wait_status(rc_t *c, uint64_t task, const char *want, int timeout_ms) {
  double end = stt_now_ms() + timeout_ms;
  while (stt_now_ms() < end) {
    if (strcmp(rk_status(c, task), want) == 0) return 0;
    struct timespec ts = {0, 2 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  fprintf(stderr, "   task %llu: still '%s', not '%s'\n", (unsigned long long)task,
          rk_status(c, task), want);
  return -1;
}

/* Sleeps ms milliseconds; only to space out the requests of a load
 * generator, never to wait for a state (tests poll for those). */
static inline void rk_pause_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* A server that was already sent SIGTERM: waits (10 s at most) for its
 * exit without signalling it again (a second SIGTERM during its teardown
 * would kill it). Returns its exit status, or -1. */
static inline int rk_wait_exit(stt_server_t *s) {
  double end = stt_now_ms() + 10000;
  while (s->pid > 0 && stt_now_ms() < end) {
    int st;
    if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
      s->pid = -1;
      return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    rk_pause_ms(2);
  }
  return -1;
}

#endif
