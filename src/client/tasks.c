/* src/client: tasks (docs/protocol.md, `submit` ... `tasks`). Thin
 * wrappers: each packs its named parameters and goes through the one
 * request/response path (st__client_method -> st__client_exchange). */
#include <math.h> /* isnan: a macro, no libm */
#include <stdio.h>
#include <string.h>

#include "client/client_internal.h"

/* Packs {task_id: id} into b. */
static void pack_task_id(st__cbuf_t *b, uint64_t id) {
  msgpack_pack_map(&b->pk, 1);
  st__pack_cstr(&b->pk, "task_id");
  msgpack_pack_uint64(&b->pk, id);
}

/* Runs `method` with {task_id: id}; see the public wrappers. */
static int task_method(st_client_t *c, const char *method, uint64_t id, int unwrap,
                       st_result_t **out) {
  st__cbuf_t b;
  st__client_cbuf_init(&b);
  pack_task_id(&b, id);
  int rc = b.oom ? st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory packing '%s'", method)
                 : st__client_method(c, method, &b, unwrap, out);
  st__client_cbuf_destroy(&b);
  return rc;
}

/* Queues a build; see client.h. Thread of the client. */
ST_API int st_client_submit(st_client_t *c, const char *endpoint, const st_args_t *args,
                            uint64_t *task_id) {
  if (task_id) *task_id = 0;
  if (!c || !task_id) return ST_ERR_INVALID_ARGUMENT;
  st_result_t *r = NULL;
  int rc = st__client_endpoint_method(c, "submit", endpoint, args, 1, 0, &r);
  if (rc != ST_OK) return rc;
  if (!st__client_value_u64(st_value_get(st_result_value(r), "task_id"), task_id))
    rc = st__client_fail(c, ST_ERR_PROTOCOL, "the submit reply has no task_id");
  st_result_free(r);
  return rc;
}

/* Task info now; see client.h. Thread of the client. */
ST_API int st_client_task_status(st_client_t *c, uint64_t id, st_result_t **info) {
  if (info) *info = NULL;
  if (!c || !info) return ST_ERR_INVALID_ARGUMENT;
  return task_method(c, "status", id, 0, info);
}

/* Waits for the end of a task or the timeout; see client.h. */
ST_API int st_client_task_wait(st_client_t *c, uint64_t id, double timeout_s,
                               st_result_t **info) {
  if (info) *info = NULL;
  if (!c || !info || isnan(timeout_s)) return ST_ERR_INVALID_ARGUMENT;
  st__cbuf_t b;
  st__client_cbuf_init(&b);
  int with_timeout = timeout_s >= 0;
  msgpack_pack_map(&b.pk, with_timeout ? 2 : 1);
  st__pack_cstr(&b.pk, "task_id");
  msgpack_pack_uint64(&b.pk, id);
  if (with_timeout) {
    st__pack_cstr(&b.pk, "timeout");
    msgpack_pack_double(&b.pk, timeout_s);
  }
  if (b.oom) {
    st__client_cbuf_destroy(&b);
    return st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory packing 'wait'");
  }
  /* The server answers after up to timeout_s (at most 3600 s): the local
   * limit must not fire first. */
  int keep = c->timeout_ms;
  if (keep > 0) {
    double wait_s = with_timeout ? (timeout_s < 3600 ? timeout_s : 3600) : 30;
    c->timeout_ms = keep + (int)(wait_s * 1000) + 1;
  }
  int rc = st__client_method(c, "wait", &b, 0, info);
  c->timeout_ms = keep;
  st__client_cbuf_destroy(&b);
  return rc;
}

/* The task's result, like a call; see client.h. Thread of the client. */
ST_API int st_client_task_result(st_client_t *c, uint64_t id, st_result_t **out) {
  if (out) *out = NULL;
  if (!c || !out) return ST_ERR_INVALID_ARGUMENT;
  return task_method(c, "result", id, 1, out);
}

/* Cancels a task; see client.h. Thread of the client. */
ST_API int st_client_task_cancel(st_client_t *c, uint64_t id, st_result_t **info) {
  if (info) *info = NULL;
  if (!c) return ST_ERR_INVALID_ARGUMENT;
  st_result_t *r = NULL;
  int rc = task_method(c, "cancel", id, 0, &r);
  if (rc == ST_OK && info)
    *info = r;
  else
    st_result_free(r);
  return rc;
}

/* One page of the task list, newest first; see client.h. Thread of the
 * client. */
ST_API int st_client_tasks(st_client_t *c, const char *status, uint64_t before, int limit,
                           st_result_t **out) {
  if (out) *out = NULL;
  if (!c || !out || limit < 0) return ST_ERR_INVALID_ARGUMENT;
  if (!status && !before && !limit) return st__client_method(c, "tasks", NULL, 0, out);
  st__cbuf_t b;
  st__client_cbuf_init(&b);
  msgpack_pack_map(&b.pk, (status ? 1 : 0) + (before ? 1 : 0) + (limit ? 1 : 0));
  if (status) {
    st__pack_cstr(&b.pk, "status");
    st__pack_cstr(&b.pk, status);
  }
  if (before) {
    st__pack_cstr(&b.pk, "before");
    msgpack_pack_uint64(&b.pk, before);
  }
  if (limit) {
    st__pack_cstr(&b.pk, "limit");
    msgpack_pack_uint64(&b.pk, (uint64_t)limit);
  }
  int rc = b.oom ? st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory packing 'tasks'")
                 : st__client_method(c, "tasks", &b, 0, out);
  st__client_cbuf_destroy(&b);
  return rc;
}
