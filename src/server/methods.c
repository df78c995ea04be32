/* src/server: the task, object, invalidation and reload methods
 * (docs/protocol.md, "status" ... "reload"). Loop thread only. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "engine/bind.h"
#include "engine/cachekey.h"
#include "server/work.h"
#include "st/errors.h"

#define WAIT_DEFAULT_S 30.0
#define WAIT_MAX_S 3600.0

/* ------------------------------------------------------------- tasks */

/* The task named by params.task_id, or NULL after an error reply. */
static st__task_t *task_param(st__conn_t *c, uint32_t id, const char *method,
                              const msgpack_object *params) {
  uint64_t tid = 0;
  int r = st__param_u64(c, id, method, params, "task_id", &tid);
  if (r < 0) return NULL;
  if (r == 0) {
    st__param_missing(c, id, method, "task_id");
    return NULL;
  }
  st__task_t *t = st__task_find(c->srv, tid);
  if (!t) {
    char m[160];
    snprintf(m, sizeof m, "%s: task %llu not found (unknown, or dropped after tasks.ttl_s)",
             method, (unsigned long long)tid);
    st__conn_send_error(c, id, ST_ERR_NOT_FOUND, m);
  }
  return t;
}

/* status {task_id} -> task info. */
void st__method_status(st__conn_t *c, uint32_t id, const msgpack_object *params) {
  st__task_t *t = task_param(c, id, "status", params);
  if (t) st__reply_task(c, id, t);
}

/* wait {task_id, timeout} -> task info when it ends or at the timeout. */
void st__method_wait(st__conn_t *c, uint32_t id, const msgpack_object *params) {
  double timeout = WAIT_DEFAULT_S;
  const msgpack_object *to = st__map_get(params, "timeout");
  if (to && to->type != MSGPACK_OBJECT_NIL) {
    if (to->type == MSGPACK_OBJECT_POSITIVE_INTEGER) timeout = (double)to->via.u64;
    else if (to->type == MSGPACK_OBJECT_FLOAT32 || to->type == MSGPACK_OBJECT_FLOAT64)
      timeout = to->via.f64;
    else timeout = -1;
    if (!(timeout >= 0 && timeout <= WAIT_MAX_S)) {
      char m[128];
      snprintf(m, sizeof m, "wait: 'timeout' must be a number of seconds in 0..%g",
               WAIT_MAX_S);
      st__conn_send_error(c, id, ST_ERR_INVALID_ARGUMENT, m);
      return;
    }
  }
  st__task_t *t = task_param(c, id, "wait", params);
  if (!t) return;
  if (st__task_add_waiter(c->srv, t, c, id, ST_WAIT_INFO, timeout) != ST_OK)
    st__conn_send_error(c, id, ST_ERR_OUT_OF_MEMORY, "wait: out of memory");
}

/* result {task_id} -> like call's reply. */
void st__method_result(st__conn_t *c, uint32_t id, const msgpack_object *params) {
  st__task_t *t = task_param(c, id, "result", params);
  if (t) st__task_reply_result(c, id, t);
}

/* cancel {task_id} -> task info after the request. */
void st__method_cancel(st__conn_t *c, uint32_t id, const msgpack_object *params) {
  st__task_t *t = task_param(c, id, "cancel", params);
  if (!t) return;
  st__task_cancel(c->srv, t);
  st__reply_task(c, id, t);
}

/* tasks {status?} -> task info, newest first. */
void st__method_tasks(st__conn_t *c, uint32_t id, const msgpack_object *params) {
  st__server_t *srv = c->srv;
  const msgpack_object *f = st__map_get(params, "status");
  int want = -1;
  if (f && f->type != MSGPACK_OBJECT_NIL) {
    if (f->type == MSGPACK_OBJECT_STR) want = st__task_status_parse(f->via.str.ptr, f->via.str.size);
    if (want < 0) {
      st__conn_send_error(c, id, ST_ERR_INVALID_ARGUMENT,
                          "tasks: 'status' must be one of pending, running, completed, "
                          "failed, cancelled");
      return;
    }
  }
  size_t n = 0;
  for (st__task_t *t = srv->work->newest; t; t = t->older)
    if (want < 0 || (int)st__task_status(srv, t) == want) n++;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, id);
  msgpack_pack_array(&pk, n);
  for (st__task_t *t = srv->work->newest; t; t = t->older)
    if (want < 0 || (int)t->status == want) st__pack_task(&pk, srv, t);
  st__reply_send(c, &sb);
}

/* ------------------------------------------------------------- objects */

/* params.object_id: 1 found, 0 after an error reply. */
static int object_param(st__conn_t *c, uint32_t id, const char *method,
                        const msgpack_object *params, uint64_t *oid) {
  int r = st__param_u64(c, id, method, params, "object_id", oid);
  if (r == 0) st__param_missing(c, id, method, "object_id");
  return r == 1;
}

static void stale(st__conn_t *c, uint32_t id, const char *method, uint64_t oid) {
  char m[200];
  snprintf(m, sizeof m, "%s: object %llu is gone (released, invalidated or evicted)", method,
           (unsigned long long)oid);
  st__conn_send_error(c, id, ST_ERR_STALE_HANDLE, m);
}

/* release {object_id} -> {released, destroyed, refcount}. */
void st__method_release(st__conn_t *c, uint32_t id, const msgpack_object *params) {
  uint64_t oid;
  if (!object_param(c, id, "release", params, &oid)) return;
  int released, destroyed;
  uint32_t refcount;
  st__objects_release(&c->srv->objects, oid, c->id, &released, &destroyed, &refcount);
  if (released) {
    c->leases--;
    c->srv->counters.releases++;
  }
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, id);
  msgpack_pack_map(&pk, 3);
  st__pack_cstr(&pk, "released");
  st__pack_bool(&pk, released);
  st__pack_cstr(&pk, "destroyed");
  st__pack_bool(&pk, destroyed);
  st__pack_cstr(&pk, "refcount");
  msgpack_pack_uint32(&pk, refcount);
  st__reply_send(c, &sb);
}

/* object_info {object_id} -> object info, or STALE_HANDLE. */
void st__method_object_info(st__conn_t *c, uint32_t id, const msgpack_object *params) {
  uint64_t oid;
  if (!object_param(c, id, "object_info", params, &oid)) return;
  st__object_t *o = st__objects_find(&c->srv->objects, oid);
  if (!o) {
    stale(c, id, "object_info", oid);
    return;
  }
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, id);
  st__pack_object_info(&pk, c->srv, o);
  st__reply_send(c, &sb);
}

/* ensure_live {object_id, server_id?} -> true, or STALE_HANDLE. */
void st__method_ensure_live(st__conn_t *c, uint32_t id, const msgpack_object *params) {
  st__server_t *srv = c->srv;
  const msgpack_object *sid = st__map_get(params, "server_id");
  if (sid && sid->type != MSGPACK_OBJECT_NIL && sid->type != MSGPACK_OBJECT_STR) {
    st__conn_send_error(c, id, ST_ERR_INVALID_ARGUMENT, "ensure_live: 'server_id' must be a string");
    return;
  }
  uint64_t oid;
  if (!object_param(c, id, "ensure_live", params, &oid)) return;
  if (sid && sid->type == MSGPACK_OBJECT_STR && !st__str_eq(sid, srv->server_id)) {
    char m[256];
    snprintf(m, sizeof m, "ensure_live: object %llu belongs to server %.*s; this is server %s",
             (unsigned long long)oid, (int)(sid->via.str.size > 64 ? 64 : sid->via.str.size),
             sid->via.str.ptr, srv->server_id);
    st__conn_send_error(c, id, ST_ERR_STALE_HANDLE, m);
    return;
  }
  if (!st__objects_find(&srv->objects, oid)) {
    stale(c, id, "ensure_live", oid);
    return;
  }
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, id);
  msgpack_pack_true(&pk);
  st__reply_send(c, &sb);
}

/* objects -> every object's info, by id. */
void st__method_objects(st__conn_t *c, uint32_t id, const msgpack_object *params) {
  (void)params;
  st__objects_t *r = &c->srv->objects;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, id);
  msgpack_pack_array(&pk, r->count);
  for (st__object_t *o = r->all_head; o; o = o->all_next) st__pack_object_info(&pk, c->srv, o);
  st__reply_send(c, &sb);
}

/* ------------------------------------------------------------- invalidation */

/* invalidate_call {endpoint, args} -> whether an entry was dropped. */
void st__method_invalidate_call(st__conn_t *c, uint32_t id, const msgpack_object *params) {
  st__server_t *srv = c->srv;
  const st__endpoint_decl_t *ep = st__param_endpoint(c, id, "invalidate_call", params);
  if (!ep) return;
  msgpack_sbuffer bound;
  msgpack_sbuffer_init(&bound);
  char err[1024], m[1200];
  int rc = st__bind_args(ep, st__map_get(params, "args"), NULL, &bound, err, sizeof err);
  char *key = NULL;
  size_t klen = 0;
  if (rc == ST_OK && ep->cache) rc = st__cache_key(ep, bound.data, bound.size, &key, &klen, err,
                                                   sizeof err);
  msgpack_sbuffer_destroy(&bound);
  if (rc != ST_OK) {
    snprintf(m, sizeof m, "invalidate_call: %s: %s", ep->name, err);
    st__conn_send_error(c, id, rc, m);
    return;
  }
  int dropped = 0;
  if (key) {
    dropped = st__objects_uncache(&srv->objects, ep->name, key, klen);
    st__builds_forget(srv, ep->name, key, klen);
    free(key);
  }
  srv->counters.invalidations += (uint64_t)dropped;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, id);
  st__pack_bool(&pk, dropped);
  st__reply_send(c, &sb);
}

/* invalidate_endpoint {endpoint} -> number of entries dropped. */
void st__method_invalidate_endpoint(st__conn_t *c, uint32_t id, const msgpack_object *params) {
  st__server_t *srv = c->srv;
  const st__endpoint_decl_t *ep = st__param_endpoint(c, id, "invalidate_endpoint", params);
  if (!ep) return;
  size_t n = st__objects_uncache_endpoint(&srv->objects, ep->name);
  st__builds_forget(srv, ep->name, NULL, 0);
  srv->counters.invalidations += n;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, id);
  msgpack_pack_uint64(&pk, n);
  st__reply_send(c, &sb);
}

/* ------------------------------------------------------------- reload */

/* reload -> {ok, generation, error, changed, added, removed}. */
void st__method_reload(st__conn_t *c, uint32_t id, const msgpack_object *params) {
  (void)params;
  st__server_t *srv = c->srv;
  if (srv->shutting_down) {
    st__conn_send_error(c, id, ST_ERR_SHUTTING_DOWN, "the server is shutting down");
    return;
  }
  ST_LOG_I("server", "conn %llu: reload requested", (unsigned long long)c->id);
  st__reload_report_t rep;
  st__server_reload(srv, &rep);
  static const char *const lists[3] = {"changed", "added", "removed"};
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, id);
  msgpack_pack_map(&pk, 6);
  st__pack_cstr(&pk, "ok");
  st__pack_bool(&pk, rep.ok);
  st__pack_cstr(&pk, "generation");
  msgpack_pack_uint64(&pk, rep.generation);
  st__pack_cstr(&pk, "error");
  st__pack_cstr(&pk, rep.error);
  for (int k = 0; k < 3; k++) {
    st__pack_cstr(&pk, lists[k]);
    msgpack_pack_array(&pk, rep.counts[k]);
    for (size_t i = 0; i < rep.counts[k]; i++) st__pack_cstr(&pk, rep.names[k][i]);
  }
  st__reload_report_free(&rep);
  st__reply_send(c, &sb);
}
