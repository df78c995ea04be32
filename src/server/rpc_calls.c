/* src/server: call and submit (rpc.h; docs/protocol.md, "call" and
 * "submit"): bind the arguments, then hand the build to the scheduler
 * (builds.c) for a call or for a new task. Loop thread only. */
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "engine/bind.h"
#include "server/loopprof.h"
#include "server/rpc.h"
#include "server/views.h"
#include "server/work.h"
#include "st/errors.h"

/* Finds and binds: ep and the bound map, or NULL after an error reply.
 * `call`: the request is a call, counted by endpoint from here on. */
static const st__endpoint_decl_t *resolve(st__rpc_req_t *r, msgpack_sbuffer *bound, int call) {
  st__server_t *srv = r->c->srv;
  if (srv->shutting_down || !srv->workers) {
    st__rpc_error(r, ST_ERR_SHUTTING_DOWN, "the server is shutting down");
    return NULL;
  }
  const st__endpoint_decl_t *ep = st__rpc_endpoint(r);
  if (!ep) return NULL;
  if (call) st__stats_endpoint(srv, &r->c->open, r->id, ep->name);
  msgpack_sbuffer_init(bound);
  char err[1024];
  int rc = st__bind_args(ep, st__rpc_arg(r, "args"), r->c->targs, bound, err, sizeof err);
  if (rc != ST_OK) {
    msgpack_sbuffer_destroy(bound);
    st__rpc_error(r, rc, "%s: %s", ep->name, err);
    return NULL;
  }
  return ep;
}

/* A new task whose build has started (or that already ended, on a cache
 * hit). NULL when it could not start: an error reply was sent. `waiter`:
 * the request waits for the result (call of a task endpoint). */
static st__task_t *start_task(st__rpc_req_t *r, const st__endpoint_decl_t *ep,
                              const msgpack_sbuffer *bound, int waiter) {
  st__conn_t *c = r->c;
  st__server_t *srv = c->srv;
  char err[512];
  int code = ST_OK;
  st__task_t *t = st__task_new(srv, ep->name, c->cred.uid, err, sizeof err, &code);
  if (!t) {
    st__rpc_error(r, code, "%s", err);
    return NULL;
  }
  srv->counters.tasks_submitted++;
  if (waiter && st__task_add_waiter(srv, t, c, r->id, ST_WAIT_RESULT, 0) != ST_OK) {
    st__task_finish_error(srv, t, ST_ERR_OUT_OF_MEMORY, "out of memory");
    st__rpc_error(r, ST_ERR_OUT_OF_MEMORY, "out of memory");
    return NULL;
  }
  /* conn_id: the submitter, whose result pool the build may use. */
  st__consumer_t who = {.kind = ST_CONSUMER_TASK, .conn_id = c->id, .task = t};
  int rc = st__build_start(srv, ep, bound->data, bound->size, c->targs, &who, c->device, err,
                           sizeof err);
  if (rc != ST_OK) {
    char msg[700];
    snprintf(msg, sizeof msg, "%s: %s", ep->name, err);
    /* A waiting call gets the error through its task; submit replies. */
    st__task_finish_error(srv, t, rc, msg);
    if (!waiter) st__rpc_error(r, rc, "%s", msg);
    return NULL;
  }
  ST_LOG_D("task", "conn %llu: task %llu (%s) submitted", (unsigned long long)c->id,
           (unsigned long long)t->id, ep->name);
  return t;
}

/* call {endpoint, args?, arenas?}: binds, then answers from the cache,
 * joins a build in flight, starts a build, or (execution = "task") runs
 * it as a task and answers when it ends. */
void st__rpc_call(st__rpc_req_t *r) {
  st__conn_t *c = r->c;
  st__server_t *srv = c->srv;
  msgpack_sbuffer bound;
  const st__endpoint_decl_t *ep = resolve(r, &bound, 1);
  if (!ep) return;
  if (ep->execution == ST_EXEC_TASK) {
    if (st__rpc_arg(r, "view")) {
      msgpack_sbuffer_destroy(&bound);
      st__rpc_error(r, ST_ERR_INVALID_ARGUMENT,
                    "%s: 'view' is not available for an execution = \"task\" endpoint "
                    "(get its task's result instead)",
                    ep->name);
      return;
    }
    start_task(r, ep, &bound, 1);
    msgpack_sbuffer_destroy(&bound);
    return;
  }
  st__viewspec_t *view = NULL;
  if (st__views_param(r, &view) != ST_OK) {
    msgpack_sbuffer_destroy(&bound);
    return;
  }
  st__consumer_t who = {.kind = ST_CONSUMER_CALL, .conn_id = c->id, .request_id = r->id,
                        .readonly = st__rpc_bool(r, "readonly", 0), .view = view ? view->text : NULL,
                        .view_len = view ? view->text_len : 0};
  char err[512];
  st__prof_begin(ST_PROF_CACHE);
  int rc = st__build_start(srv, ep, bound.data, bound.size, c->targs, &who, c->device, err,
                           sizeof err);
  st__prof_end();
  st__viewspec_free(view);
  msgpack_sbuffer_destroy(&bound);
  if (rc != ST_OK) {
    st__rpc_error(r, rc, "%s: %s", ep->name, err);
    return;
  }
  ST_LOG_D("call", "conn %llu: call %s (id %u) accepted", (unsigned long long)c->id, ep->name,
           (unsigned)r->id);
}

/* submit {endpoint, args?, arenas?}: a task of any endpoint; replies
 * {task_id} at once. */
void st__rpc_submit(st__rpc_req_t *r) {
  msgpack_sbuffer bound;
  const st__endpoint_decl_t *ep = resolve(r, &bound, 0);
  if (!ep) return;
  st__task_t *t = start_task(r, ep, &bound, 0);
  msgpack_sbuffer_destroy(&bound);
  if (!t) return;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, r->id);
  msgpack_pack_map(&pk, 1);
  st__pack_kv_uint(&pk, "task_id", t->id);
  st__reply_send(r->c, r->id, &sb);
}
