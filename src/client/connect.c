/* src/client: connecting: connect + hello, reconnect, close, and the
 * accessors of the connection (errors, timeout, the server's identity).
 * Socket paths and connecting by device: sockpath.c; the request/reply
 * exchange of calls and methods: call.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/client_internal.h"

#define CLIENT_NAME "libstclient/" ST_VERSION_STRING

static void copy_str(char *dst, size_t cap, const msgpack_object *o) {
  if (o && o->type == MSGPACK_OBJECT_STR)
    snprintf(dst, cap, "%.*s", (int)o->via.str.size, o->via.str.ptr);
  else
    dst[0] = '\0';
}

static int64_t int_of(const msgpack_object *o, int64_t dflt) {
  if (!o) return dflt;
  if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX)
    return (int64_t)o->via.u64;
  if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) return o->via.i64;
  return dflt;
}

/* Exchanges hello by `deadline` and keeps the server's identity. */
static int hello(st_client_t *c, int64_t deadline, int features) {
  st_args_t *a = st_args_new();
  if (!a) return st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory");
  st__cbuf_t b;
  st__client_cbuf_init(&b);
  int rc = st_args_int(a, "protocol", ST_PROTOCOL_VERSION);
  if (rc == ST_OK) rc = st_args_string(a, "client", CLIENT_NAME);
  /* What this client does beyond protocol 1's first form: arenas of
   * objects named by id after the first reply (kept_arenas.c), results of
   * cached objects named by id after the first reply unless
   * ST_CLIENT_KEEP_OBJECTS=0 (kept_objects.c), a call's result that is
   * one of its tensor arguments named by the argument's index (arg_results.c),
   * results as regions of
   * per-connection pools unless ST_CLIENT_POOL=0 (pool.c). */
  size_t keep_objects = features ? st__client_kept_objects_max() : 0;
  if (rc == ST_OK && features) {
    rc = st_args_begin_list(a, "features");
    if (rc == ST_OK) rc = st_args_string(a, NULL, "arena_refs");
    if (rc == ST_OK && keep_objects) rc = st_args_string(a, NULL, "object_refs");
    if (rc == ST_OK) rc = st_args_string(a, NULL, "arg_results");
    if (rc == ST_OK && !st__client_pool_disabled()) rc = st_args_string(a, NULL, "pool");
    if (rc == ST_OK) rc = st_args_end(a);
  }
  if (rc == ST_OK) st__client_args_pack(&b.pk, a);
  st_args_free(a);
  if (rc != ST_OK || b.oom) {
    st__client_cbuf_destroy(&b);
    return st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory");
  }
  st__message_t m;
  int *fds;
  size_t nfds;
  rc = st__client_exchange_until(c, "hello", b.sb.data, b.sb.size, NULL, 0, deadline, &m, &fds,
                                 &nfds);
  st__client_cbuf_destroy(&b);
  if (rc == ST_ERR_TIMEOUT)
    return st__client_fail(c, ST_ERR_TIMEOUT,
                           "the server at %s accepted the connection but did not answer hello "
                           "within %d ms (the connect timeout)",
                           c->path, c->timeout_ms);
  if (rc != ST_OK) return rc;
  for (size_t i = 0; i < nfds; i++) close(fds[i]);
  free(fds);

  const msgpack_object *r = &m.result;
  rc = ST_OK;
  if (r->type != MSGPACK_OBJECT_MAP) {
    rc = st__client_fail(c, ST_ERR_PROTOCOL, "the hello reply is not a map");
  } else {
    const msgpack_object *sid = st__map_get(r, "server_id");
    int64_t proto = int_of(st__map_get(r, "protocol"), -1);
    if (!sid || sid->type != MSGPACK_OBJECT_STR || sid->via.str.size == 0) {
      rc = st__client_fail(c, ST_ERR_PROTOCOL, "the hello reply has no server_id");
    } else if (proto < ST_PROTOCOL_VERSION) {
      rc = st__client_fail(c, ST_ERR_PROTOCOL,
                           "the server speaks protocol %lld, this client needs %d",
                           (long long)proto, ST_PROTOCOL_VERSION);
    } else {
      copy_str(c->server_id, sizeof c->server_id, sid);
      copy_str(c->server_version, sizeof c->server_version, st__map_get(r, "version"));
      c->server_pid = (int)int_of(st__map_get(r, "pid"), 0);
      c->device = (int)int_of(st__map_get(r, "device"), 0);
      const msgpack_object *f = st__map_get(r, "features");
      c->release_notify = st__features_has(f, "release_notify");
      st__client_argcache_reset(c, st__features_has(f, "arg_cache"));
      st__client_kept_arenas_reset(c, features && st__features_has(f, "arena_refs"));
      /* The server marks what it counts as kept (`object_kept`): a server
       * that does not know the feature never does. */
      st__client_kept_objects_reset(c, keep_objects > 0);
      c->objects_max = keep_objects;
      st__client_pool_reset(c, features && !st__client_pool_disabled() &&
                                   st__features_has(f, "pool"));
    }
  }
  st__message_destroy(&m);
  if (rc != ST_OK) st__client_conn_shutdown(c, c->err_msg);
  return rc;
}

/* Connects c to `path` and says hello, both within limit_ms (> 0) from
 * now: one deadline for the whole connect. c->timeout_ms is limit_ms while
 * it runs (messages name it) and is restored after. ST_OK or a recorded
 * failure. Thread of the client. */
static int open_and_hello(st_client_t *c, const char *path, int limit_ms) {
  int64_t deadline = st__client_deadline(limit_ms);
  int rc = st__client_conn_open(c, path, deadline, limit_ms);
  if (rc != ST_OK) return rc;
  int keep = c->timeout_ms;
  c->timeout_ms = limit_ms;
  rc = hello(c, deadline, 1);
  /* A server older than `features` refuses the parameter and stays
   * connected: ask again without it. */
  if (rc == ST_ERR_INVALID_ARGUMENT && c->fd >= 0 && strstr(c->err_msg, "features"))
    rc = hello(c, deadline, 0);
  c->timeout_ms = keep;
  return rc;
}

/* Every option at its default; see client.h. Any thread. */
ST_API void st_client_options_init(st_client_options_t *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->server_uid = ST_SERVER_UID_DEFAULT;
}

/* The uid the server must run as (client.h): opts->server_uid, else
 * $SHARED_TENSOR_SERVER_UID, else -1 (this process's uid or root). ST_OK,
 * or ST_ERR_INVALID_ARGUMENT with a message in err. */
static int expected_server_uid(const st_client_options_t *opts, int64_t *uid, char *err,
                               size_t errlen) {
  const int64_t max = (int64_t)UINT32_MAX - 1; /* (uid_t)-1 names nobody */
  *uid = opts ? opts->server_uid : ST_SERVER_UID_DEFAULT;
  if (*uid != ST_SERVER_UID_DEFAULT) {
    if (*uid >= 0 && *uid <= max) return ST_OK;
    if (err && errlen)
      snprintf(err, errlen, "server_uid %lld is not a uid (0 to %lld, or -1 for the default)",
               (long long)*uid, (long long)max);
    return ST_ERR_INVALID_ARGUMENT;
  }
  const char *v = getenv(ST_ENV_SERVER_UID);
  if (!v || !*v) return ST_OK;
  int64_t n = 0;
  const char *p = v;
  while (*p >= '0' && *p <= '9' && n <= max) n = n * 10 + (*p++ - '0');
  if (*p || n > max) {
    if (err && errlen)
      snprintf(err, errlen, "$%s is '%.40s', not a uid (a decimal number from 0 to %lld)",
               ST_ENV_SERVER_UID, v, (long long)max);
    return ST_ERR_INVALID_ARGUMENT;
  }
  *uid = n;
  return ST_OK;
}

/* Connects to `path` and says hello; see client.h. Any thread. */
ST_API int st_client_connect_opts(const char *path, const st_client_options_t *opts,
                                  st_client_t **out, char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (!out) return ST_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (!path) {
    if (err && errlen) snprintf(err, errlen, "no socket path given");
    return ST_ERR_INVALID_ARGUMENT;
  }
  int64_t server_uid;
  int rc = expected_server_uid(opts, &server_uid, err, errlen);
  if (rc != ST_OK) return rc;
  int timeout_ms = opts && opts->timeout_ms > 0 ? opts->timeout_ms : 0;
  st_client_t *c = calloc(1, sizeof *c);
  if (!c) {
    if (err && errlen) snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  c->fd = -1;
  c->next_id = 1;
  c->server_uid = server_uid;
  snprintf(c->closed_why, sizeof c->closed_why, "not connected");
  rc = st__reader_init(&c->reader, ST_CLIENT_MAX_REPLY);
  if (rc != ST_OK) {
    free(c);
    if (err && errlen) snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  c->reader_ready = 1;
  rc = open_and_hello(c, path, timeout_ms ? timeout_ms : ST_CLIENT_CONNECT_TIMEOUT_MS);
  c->timeout_ms = timeout_ms;
  if (rc != ST_OK) {
    if (err && errlen) snprintf(err, errlen, "%s", c->err_msg);
    st_client_close(c);
    return rc;
  }
  st__client_clear_error(c);
  *out = c;
  return ST_OK;
}

/* st_client_connect_opts with the defaults; see client.h. Any thread. */
ST_API int st_client_connect(const char *path, st_client_t **out, char *err, size_t errlen) {
  return st_client_connect_opts(path, NULL, out, err, errlen);
}

/* Drops the connection (if any) and connects again to the same path with
 * a new hello, waiting at most timeout_ms (> 0) for connect and hello.
 * ST_OK, or a recorded failure as st_client_connect reports it. Thread of
 * the client. */
int st__client_reconnect(st_client_t *c, int timeout_ms) {
  st__client_conn_shutdown(c, "reconnecting");
  st__client_argcache_reset(c, 0);   /* a new connection holds nothing */
  st__client_kept_arenas_reset(c, 0);
  st__client_kept_objects_reset(c, 0);
  st__client_pool_reset(c, 0);
  if (c->reader_ready) st__reader_destroy(&c->reader);
  c->reader_ready = 0;
  if (st__reader_init(&c->reader, ST_CLIENT_MAX_REPLY) != ST_OK)
    return st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory");
  c->reader_ready = 1;
  c->reply_pending = 0;
  char path[sizeof c->path];
  snprintf(path, sizeof path, "%s", c->path);
  int rc = open_and_hello(c, path, timeout_ms);
  if (rc == ST_OK) st__client_clear_error(c);
  else if (c->fd < 0)
    snprintf(c->closed_why, sizeof c->closed_why, "%.*s", (int)sizeof c->closed_why - 1,
             c->err_msg);
  return rc;
}

/* Closes the connection and frees the client; results stay valid. */
ST_API void st_client_close(st_client_t *c) {
  if (!c) return;
  st__client_conn_shutdown(c, "closed");
  st__client_argcache_reset(c, 0);
  st__client_kept_arenas_reset(c, 0);
  st__client_kept_objects_reset(c, 0);
  st__client_pool_reset(c, 0);
  if (c->into_reset) c->into_reset(c);
  free(c->fifo);
  free(c->marshal_buf);
  if (c->reader_ready) st__reader_destroy(&c->reader);
  free(c);
}

/* Last failure's message, "" if none; borrowed from c (NULL gives ""). */
ST_API const char *st_client_error(const st_client_t *c) { return c ? c->err_msg : ""; }

/* Last failure's stable name, "" if none; borrowed from c. */
ST_API const char *st_client_error_name(const st_client_t *c) {
  return c && c->err ? c->err_name : "";
}

/* Limit for each exchange in ms; 0 or less: none. Thread of the client. */
ST_API void st_client_set_timeout(st_client_t *c, int timeout_ms) {
  if (c) c->timeout_ms = timeout_ms > 0 ? timeout_ms : 0;
}

/* Identity from the hello reply; borrowed from c. */
ST_API const char *st_client_server_id(const st_client_t *c) { return c ? c->server_id : ""; }

ST_API const char *st_client_server_version(const st_client_t *c) {
  return c ? c->server_version : "";
}

ST_API int st_client_server_pid(const st_client_t *c) { return c ? c->server_pid : 0; }
