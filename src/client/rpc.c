/* src/client: one synchronous request/response exchange.
 *
 * A client has at most one request outstanding, so the next response must
 * carry its id. Other shapes are handled thus:
 *   - a response with id 0 and an error: the server refused the connection
 *     as a whole (AUTH, LIMIT, PROTOCOL) and closes it; the error is the
 *     call's error;
 *   - a response with any other id: PROTOCOL (the stream is out of step);
 *   - notifications: ignored (protocol version 1 defines none);
 *   - requests from the server: PROTOCOL.
 * Every failure that leaves the stream out of step closes the connection
 * (later calls fail fast with ST_ERR_IO).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/client_internal.h"

/* How long to look for a refusal the server sent before it closed the
 * connection under a request we were still writing. */
#define REFUSAL_GRACE_MS 1000

/* Server error {code, name, message} -> recorded failure; returns it. */
static int record_server_error(st_client_t *c, const msgpack_object *e) {
  const msgpack_object *code = st__map_get(e, "code");
  const msgpack_object *name = st__map_get(e, "name");
  const msgpack_object *msg = st__map_get(e, "message");
  const msgpack_object *uncached = st__map_get(e, "uncached");
  const char *nm = NULL, *ms = NULL;
  size_t nl = 0, ml = 0;
  if (name && name->type == MSGPACK_OBJECT_STR) {
    nm = name->via.str.ptr;
    nl = name->via.str.size;
  }
  if (msg && msg->type == MSGPACK_OBJECT_STR) {
    ms = msg->via.str.ptr;
    ml = msg->via.str.size;
  }
  int err = 0;
  if (code && code->type == MSGPACK_OBJECT_POSITIVE_INTEGER && code->via.u64 >= 1 &&
      code->via.u64 <= (uint64_t)-ST_ERR_MIN)
    err = -(int)code->via.u64;
  char tmp[32];
  if (!err && nm && nl < sizeof tmp && !memchr(nm, '\0', nl)) {
    memcpy(tmp, nm, nl);
    tmp[nl] = '\0';
    err = st_err_from_name(tmp);
  }
  if (!err)
    return st__client_fail(c, ST_ERR_PROTOCOL,
                           "the server's error has no known code or name (code %s, name %s)",
                           code && code->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? "out of range"
                                                                                 : "missing",
                           nm ? "unknown" : "missing");
  if (!ms) {
    ms = st_strerror(err);
    ml = strlen(ms);
  }
  int rc = st__client_fail_remote(c, err, nm, nl, ms, ml);
  c->uncached = err == ST_ERR_INVALID_ARGUMENT && uncached &&
                uncached->type == MSGPACK_OBJECT_ARRAY;
  return rc;
}

/* Number of descriptors a successful result carries: its arenas that are
 * not legacy CUDA IPC arenas (0 if none). */
static size_t arena_count(const st_client_t *c, const msgpack_object *result) {
  const msgpack_object *a = st__map_get(result, "arenas");
  if (!a || a->type != MSGPACK_OBJECT_ARRAY) return 0;
  /* One descriptor per arena, except legacy CUDA IPC arenas, arenas
   * named by id that this connection keeps (kept_arenas.c) and the
   * call's own tensor arguments (arg_results.c): none. */
  /* A pool region carries its slab's only the first time, and the pool
   * page comes once, after the arenas' (pool.c). */
  size_t n = st__map_get(result, "pool_page") != NULL;
  for (uint32_t i = 0; i < a->via.array.size; i++) {
    const msgpack_object *e = &a->via.array.ptr[i];
    if (st__client_pool_is_region(e)) n += (size_t)st__client_pool_has_fd(e);
    else if (!st__str_eq(st__map_get(e, "backend"), "legacy") &&
             !st__client_kept_arenas_is_ref(c, e) && !st__client_arg_result_is(e))
      n++;
  }
  return n;
}

/* Whether a reply's result names arenas ({ref}: kept_arenas.c) or its
 * object (`same`: kept_objects.c) by id. */
static int names_by_id(const st_client_t *c, const st__message_t *reply) {
  if (reply->error.type != MSGPACK_OBJECT_NIL) return 0;
  if (c->object_refs && st__map_get(&reply->result, "same")) return 1;
  if (!c->arena_refs) return 0;
  const msgpack_object *a = st__map_get(&reply->result, "arenas");
  if (!a || a->type != MSGPACK_OBJECT_ARRAY) return 0;
  for (uint32_t i = 0; i < a->via.array.size; i++)
    if (st__client_kept_arenas_is_ref(c, &a->via.array.ptr[i])) return 1;
  return 0;
}

/* Reads messages until the response to `id`. ST_OK with *reply filled, or
 * a recorded failure. */
static int read_reply(st_client_t *c, uint32_t id, int64_t deadline, st__message_t *reply) {
  char why[256];
  for (;;) {
    st__message_t m;
    memset(&m, 0, sizeof m);
    why[0] = '\0';
    int rc = st__reader_next(&c->reader, &m, why, sizeof why);
    if (rc < 0) {
      if (rc == ST_ERR_OUT_OF_MEMORY)
        return st__client_fail(c, rc, "out of memory decoding a reply");
      return st__client_fail(c, rc == ST_ERR_LIMIT ? ST_ERR_LIMIT : ST_ERR_PROTOCOL,
                             "bad reply from the server: %s", why[0] ? why : st_strerror(rc));
    }
    if (rc == 0) {
      rc = st__client_conn_fill(c, deadline);
      if (rc != ST_OK) return rc;
      continue;
    }
    if (m.type == ST_MSG_NOTIFICATION) {
      st__message_destroy(&m);
      continue;
    }
    if (m.type != ST_MSG_RESPONSE) {
      st__message_destroy(&m);
      return st__client_fail(c, ST_ERR_PROTOCOL, "the server sent a request to a client");
    }
    if (m.id != id) {
      if (m.id == 0 && m.error.type == MSGPACK_OBJECT_MAP) {
        rc = record_server_error(c, &m.error);
        st__message_destroy(&m);
        return rc;
      }
      uint32_t got = m.id;
      st__message_destroy(&m);
      return st__client_fail(c, ST_ERR_PROTOCOL,
                             "the server answered request %u while request %u was waiting", got,
                             id);
    }
    *reply = m;
    return ST_OK;
  }
}

/* See client_internal.h. Thread of the client. */
int st__client_notify(st_client_t *c, const char *method, const void *params, size_t params_len) {
  if (c->fd < 0)
    return st__client_fail(c, ST_ERR_IO, "the connection is closed (%s)", c->closed_why);
  st__client_clear_error(c);
  st__cbuf_t b;
  st__client_cbuf_init(&b);
  msgpack_pack_array(&b.pk, 3);
  msgpack_pack_uint8(&b.pk, ST_MSG_NOTIFICATION);
  st__pack_cstr(&b.pk, method);
  msgpack_pack_array(&b.pk, 1);
  st__client_cbuf_raw(&b.pk, params, params_len);
  int rc = b.oom ? st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory packing '%s'", method)
                 : st__client_conn_send(c, b.sb.data, b.sb.size, NULL, 0,
                                        st__client_deadline(c->timeout_ms));
  st__client_cbuf_destroy(&b);
  if (rc != ST_OK && rc != ST_ERR_OUT_OF_MEMORY) st__client_conn_shutdown(c, c->err_msg);
  return rc;
}

/* Sends one request and waits for its reply (see client_internal.h for
 * ownership). Thread of the client. */
int st__client_exchange(st_client_t *c, const char *method, const void *params,
                        size_t params_len, const int *req_fds, size_t req_nfds,
                        st__message_t *reply, int **fds, size_t *nfds) {
  return st__client_exchange_until(c, method, params, params_len, req_fds, req_nfds,
                                   st__client_deadline(c->timeout_ms), reply, fds, nfds);
}

/* See client_internal.h. Thread of the client. */
int st__client_exchange_until(st_client_t *c, const char *method, const void *params,
                              size_t params_len, const int *req_fds, size_t req_nfds,
                              int64_t deadline, st__message_t *reply, int **fds, size_t *nfds) {
  *fds = NULL;
  *nfds = 0;
  /* The last reply is over: what was lent of it goes before this request
   * packs `objects_freed` (kept_objects.c). */
  st__client_kept_objects_request(c);
  if (c->fd < 0)
    return st__client_fail(c, ST_ERR_IO, "the connection is closed (%s)", c->closed_why);
  st__client_clear_error(c);
  uint32_t id = c->next_id++;
  if (id == 0) id = c->next_id++;
  /* CUDA regions whose deferred frees completed go back before the server
   * allocates for this request (pool.c). */
  st__client_pool_poll(c);

  st__cbuf_t b, withforget, withunmapped, withfreed;
  st__client_cbuf_init(&b);
  st__client_cbuf_init(&withforget);
  st__client_cbuf_init(&withunmapped);
  st__client_cbuf_init(&withfreed);
  /* Tensor arguments freed since the last request ride along (argcache.c),
   * and so do the kept arenas let go (kept_arenas.c) and the kept objects'
   * results freed (kept_objects.c); never on hello, which starts a connection
   * with nothing held. */
  if (strcmp(method, "hello") != 0) {
    if (st__client_argcache_params(c, params, params_len, &withforget)) {
      params = withforget.sb.data;
      params_len = withforget.sb.size;
    }
    if (st__client_kept_arenas_params(c, params, params_len, &withunmapped)) {
      params = withunmapped.sb.data;
      params_len = withunmapped.sb.size;
    }
    if (st__client_kept_objects_params(c, params, params_len, &withfreed)) {
      params = withfreed.sb.data;
      params_len = withfreed.sb.size;
    }
  }
  st__pack_request_head(&b.pk, id, method);
  if (params) {
    msgpack_pack_array(&b.pk, 1);
    st__client_cbuf_raw(&b.pk, params, params_len);
  } else {
    msgpack_pack_array(&b.pk, 0);
  }
  int oom = b.oom || withforget.oom || withunmapped.oom || withfreed.oom;
  st__client_cbuf_destroy(&withforget);
  st__client_cbuf_destroy(&withunmapped);
  st__client_cbuf_destroy(&withfreed);
  if (oom) {
    st__client_cbuf_destroy(&b);
    return st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory packing '%s'", method);
  }
  int rc = st__client_conn_send(c, b.sb.data, b.sb.size, req_fds, req_nfds, deadline);
  st__client_cbuf_destroy(&b);
  if (rc == ST_ERR_IO) {
    /* The server may have refused us (AUTH, LIMIT) and closed before our
     * bytes arrived: its answer is still in our receive queue. */
    char keep[sizeof c->err_msg];
    snprintf(keep, sizeof keep, "%s", c->err_msg);
    int64_t grace = st__client_deadline(REFUSAL_GRACE_MS);
    if (read_reply(c, id, grace, reply) == ST_OK) {
      st__message_destroy(reply);
      st__client_fail(c, ST_ERR_IO, "%s", keep);
    } else if (c->err == ST_ERR_IO || c->err == ST_ERR_TIMEOUT) {
      st__client_fail(c, ST_ERR_IO, "%s", keep);
    }
    st__client_conn_shutdown(c, c->err_msg);
    return c->err;
  }
  if (rc != ST_OK) {
    st__client_conn_shutdown(c, c->err_msg);
    return rc;
  }

  c->reply_pending = 1;
  rc = read_reply(c, id, deadline, reply);
  c->reply_pending = 0;
  if (rc != ST_OK) {
    st__client_conn_shutdown(c, c->err_msg);
    return rc;
  }
  /* The server read this request's `unmapped` and `objects_freed`:
   * nothing it sends from now on names those arenas or objects by id. */
  int by_id = names_by_id(c, reply);
  st__client_kept_arenas_answered(c, by_id);
  st__client_kept_objects_answered(c, by_id);
  if (reply->error.type != MSGPACK_OBJECT_NIL) {
    int is_map = reply->error.type == MSGPACK_OBJECT_MAP;
    rc = is_map ? record_server_error(c, &reply->error)
                : st__client_fail(c, ST_ERR_PROTOCOL, "the reply's error is not a map");
    st__message_destroy(reply);
    if (!is_map) st__client_conn_shutdown(c, c->err_msg);
    return rc;
  }
  size_t n = arena_count(c, &reply->result);
  if (n == 0) return ST_OK;
  int *got = malloc(n * sizeof(int));
  if (!got) {
    /* The descriptors stay queued and are closed with the connection:
     * the stream cannot be kept in step without taking them. */
    st__message_destroy(reply);
    st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory taking %zu descriptors", n);
    st__client_conn_shutdown(c, c->err_msg);
    return ST_ERR_OUT_OF_MEMORY;
  }
  if (st__client_fifo_take(c, got, n) != ST_OK) {
    size_t have = c->fifo_len;
    free(got);
    st__message_destroy(reply);
    st__client_fail(c, ST_ERR_PROTOCOL, "the reply names %zu arenas but carries %zu descriptors",
                    n, have);
    st__client_conn_shutdown(c, c->err_msg);
    return ST_ERR_PROTOCOL;
  }
  *fds = got;
  *nfds = n;
  return ST_OK;
}
