/* src/client: server objects, leases, cache invalidation and reload
 * (docs/protocol.md, `release` ... `reload`). Thin wrappers over the one
 * request/response path (st__client_method), except ensure_live, which
 * also reconnects a broken connection once so that a dead server is
 * reported at once and clearly. */
#include <stdio.h>
#include <string.h>

#include "client/client_internal.h"

/* Limit of ensure_live when the client has none: it must never hang. */
#define ENSURE_LIVE_TIMEOUT_MS 5000

/* Runs `method` with {object_id: id}. */
static int object_method(st_client_t *c, const char *method, uint64_t id, st_result_t **out) {
  st__cbuf_t b;
  st__client_cbuf_init(&b);
  msgpack_pack_map(&b.pk, 1);
  st__pack_cstr(&b.pk, "object_id");
  msgpack_pack_uint64(&b.pk, id);
  int rc = b.oom ? st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory packing '%s'", method)
                 : st__client_method(c, method, &b, 0, out);
  st__client_cbuf_destroy(&b);
  return rc;
}

static int is_bool(const st_value_t *v) { return v && v->kind == ST_VALUE_BOOL; }
static int is_int(const st_value_t *v) { return v && v->kind == ST_VALUE_INT; }

/* Gives back this connection's lease; see client.h. Thread of the client. */
ST_API int st_client_release(st_client_t *c, uint64_t object_id, int *released, int *destroyed,
                             int64_t *refcount) {
  if (released) *released = 0;
  if (destroyed) *destroyed = 0;
  if (refcount) *refcount = 0;
  if (!c) return ST_ERR_INVALID_ARGUMENT;
  if (!released && !destroyed && !refcount && c->release_notify) {
    /* Nothing asked back: one message, no reply to wait for. */
    st__cbuf_t b;
    st__client_cbuf_init(&b);
    msgpack_pack_map(&b.pk, 1);
    st__pack_cstr(&b.pk, "object_id");
    msgpack_pack_uint64(&b.pk, object_id);
    int rc = b.oom ? st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory packing 'release'")
                   : st__client_notify(c, "release", b.sb.data, b.sb.size);
    st__client_cbuf_destroy(&b);
    return rc;
  }
  st_result_t *r = NULL;
  int rc = object_method(c, "release", object_id, &r);
  if (rc != ST_OK) return rc;
  const st_value_t *v = st_result_value(r);
  const st_value_t *rel = st_value_get(v, "released"), *des = st_value_get(v, "destroyed"),
                   *cnt = st_value_get(v, "refcount");
  if (!is_bool(rel) || !is_bool(des) || !is_int(cnt)) {
    rc = st__client_fail(c, ST_ERR_PROTOCOL,
                         "the release reply is not {released, destroyed, refcount}");
  } else {
    if (released) *released = rel->as.boolean;
    if (destroyed) *destroyed = des->as.boolean;
    if (refcount) *refcount = cnt->as.integer;
  }
  st_result_free(r);
  return rc;
}

/* Object info; see client.h. Thread of the client. */
ST_API int st_client_object_info(st_client_t *c, uint64_t object_id, st_result_t **out) {
  if (out) *out = NULL;
  if (!c || !out) return ST_ERR_INVALID_ARGUMENT;
  return object_method(c, "object_info", object_id, out);
}

/* The ensure_live exchange itself: ST_OK when the server said true. */
static int ask_live(st_client_t *c, uint64_t object_id, const char *server_id) {
  st__cbuf_t b;
  st__client_cbuf_init(&b);
  msgpack_pack_map(&b.pk, 2);
  st__pack_cstr(&b.pk, "object_id");
  msgpack_pack_uint64(&b.pk, object_id);
  st__pack_cstr(&b.pk, "server_id");
  st__pack_cstr(&b.pk, server_id);
  st_result_t *r = NULL;
  int rc = b.oom ? st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory packing 'ensure_live'")
                 : st__client_method(c, "ensure_live", &b, 0, &r);
  st__client_cbuf_destroy(&b);
  if (rc != ST_OK) return rc;
  const st_value_t *v = st_result_value(r);
  if (!is_bool(v))
    rc = st__client_fail(c, ST_ERR_PROTOCOL, "the ensure_live reply is not a boolean");
  else if (!v->as.boolean)
    rc = st__client_fail(c, ST_ERR_STALE_HANDLE, "object %llu is gone",
                         (unsigned long long)object_id);
  st_result_free(r);
  return rc;
}

/* Reconnects after a broken connection; a server that is not there any
 * more is ST_ERR_IO "server at PATH is not running". */
static int reconnect(st_client_t *c, int limit_ms) {
  int rc = st__client_reconnect(c, limit_ms);
  if (rc == ST_ERR_IO) {
    char why[sizeof c->err_msg];
    snprintf(why, sizeof why, "%s", c->err_msg);
    return st__client_fail(c, ST_ERR_IO, "server at %s is not running: %s", c->path, why);
  }
  return rc;
}

/* A server process other than the object's: its handles are stale. */
static int check_same_server(st_client_t *c, uint64_t object_id, const char *server_id) {
  if (strcmp(c->server_id, server_id) == 0) return ST_OK;
  return st__client_fail(c, ST_ERR_STALE_HANDLE,
                         "object %llu belongs to server %s; the server at %s is now %s",
                         (unsigned long long)object_id, server_id, c->path, c->server_id);
}

/* Is the object still there; see client.h. Thread of the client. */
ST_API int st_client_ensure_live(st_client_t *c, uint64_t object_id, const char *server_id) {
  if (!c) return ST_ERR_INVALID_ARGUMENT;
  char want[sizeof c->server_id];
  snprintf(want, sizeof want, "%s", server_id && *server_id ? server_id : c->server_id);
  int keep = c->timeout_ms;
  int limit = keep > 0 ? keep : ENSURE_LIVE_TIMEOUT_MS;
  c->timeout_ms = limit;
  int rc = ST_OK;
  if (c->fd < 0) rc = reconnect(c, limit);
  if (rc == ST_OK) rc = check_same_server(c, object_id, want);
  if (rc == ST_OK) {
    rc = ask_live(c, object_id, want);
    /* The connection broke under the request (the server died or
     * restarted): look once more, on a new connection. */
    if (rc == ST_ERR_IO) {
      rc = reconnect(c, limit);
      if (rc == ST_OK) rc = check_same_server(c, object_id, want);
      if (rc == ST_OK) rc = ask_live(c, object_id, want);
    }
  }
  c->timeout_ms = keep;
  return rc;
}

/* All objects; see client.h. Thread of the client. */
ST_API int st_client_objects(st_client_t *c, st_result_t **out) {
  if (out) *out = NULL;
  if (!c || !out) return ST_ERR_INVALID_ARGUMENT;
  return st__client_method(c, "objects", NULL, 0, out);
}

/* Runs an endpoint method whose reply is a boolean (kind ST_VALUE_BOOL) or
 * a count (ST_VALUE_INT, not negative), read into *out (0 on failure). */
static int endpoint_scalar(st_client_t *c, const char *method, const char *endpoint,
                           const st_args_t *args, int with_args, st_value_kind_t kind,
                           int64_t *out) {
  *out = 0;
  st_result_t *r = NULL;
  int rc = st__client_endpoint_method(c, method, endpoint, args, with_args, 0, &r);
  if (rc != ST_OK) return rc;
  const st_value_t *v = st_result_value(r);
  if (kind == ST_VALUE_BOOL && is_bool(v))
    *out = v->as.boolean;
  else if (kind == ST_VALUE_INT && is_int(v) && v->as.integer >= 0)
    *out = v->as.integer;
  else
    rc = st__client_fail(c, ST_ERR_PROTOCOL, "the %s reply is not %s", method,
                         kind == ST_VALUE_BOOL ? "a boolean" : "a count");
  st_result_free(r);
  return rc;
}

/* Drops one cache entry; see client.h. Thread of the client. */
ST_API int st_client_invalidate_call(st_client_t *c, const char *endpoint, const st_args_t *args,
                                     int *dropped) {
  if (dropped) *dropped = 0;
  if (!c) return ST_ERR_INVALID_ARGUMENT;
  int64_t v;
  int rc = endpoint_scalar(c, "invalidate_call", endpoint, args, 1, ST_VALUE_BOOL, &v);
  if (dropped) *dropped = (int)v;
  return rc;
}

/* Drops every cache entry of an endpoint; see client.h. */
ST_API int st_client_invalidate_endpoint(st_client_t *c, const char *endpoint, int64_t *count) {
  if (count) *count = 0;
  if (!c) return ST_ERR_INVALID_ARGUMENT;
  int64_t v;
  int rc = endpoint_scalar(c, "invalidate_endpoint", endpoint, NULL, 0, ST_VALUE_INT, &v);
  if (count) *count = v;
  return rc;
}

/* Reloads the endpoint files; see client.h. Thread of the client. */
ST_API int st_client_reload(st_client_t *c, st_result_t **out) {
  if (out) *out = NULL;
  if (!c || !out) return ST_ERR_INVALID_ARGUMENT;
  return st__client_method(c, "reload", NULL, 0, out);
}
