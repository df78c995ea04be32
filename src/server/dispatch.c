/* src/server: method dispatch (docs/protocol.md, "Methods"). Loop thread
 * only: hello, ping, info and endpoints are answered here at once; the
 * methods of builds, tasks and objects live in builds.c and methods.c
 * (work.h).
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "engine/targs.h"
#include "server/work.h"
#include "st/wire.h"

typedef void (*method_fn)(st__conn_t *c, uint32_t id, const msgpack_object *params);

typedef struct method {
  const char *name;
  method_fn fn;
  const char *const *allowed;   /* parameter names, NULL-terminated */
} method_t;

static void do_ping(st__conn_t *c, uint32_t id, const msgpack_object *params) {
  (void)params;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, id);
  st__pack_cstr(&pk, "pong");
  st__reply_send(c, &sb);
}

static void do_hello(st__conn_t *c, uint32_t id, const msgpack_object *params) {
  const msgpack_object *proto = st__map_get(params, "protocol");
  const msgpack_object *client = st__map_get(params, "client");
  if (proto && proto->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
    st__conn_send_error(c, id, ST_ERR_INVALID_ARGUMENT, "hello: 'protocol' must be an integer >= 0");
    return;
  }
  if (client && client->type != MSGPACK_OBJECT_STR) {
    st__conn_send_error(c, id, ST_ERR_INVALID_ARGUMENT, "hello: 'client' must be a string");
    return;
  }
  if (proto && proto->via.u64 > ST_PROTOCOL_VERSION) {
    char msg[160];
    snprintf(msg, sizeof msg,
             "client speaks protocol %llu; this server (%s) speaks protocol %d",
             (unsigned long long)proto->via.u64, ST_VERSION_STRING, ST_PROTOCOL_VERSION);
    st__conn_send_error(c, id, ST_ERR_PROTOCOL, msg);
    return;
  }
  if (client) {
    size_t n = client->via.str.size < sizeof c->client - 1 ? client->via.str.size
                                                           : sizeof c->client - 1;
    memcpy(c->client, client->via.str.ptr, n);
    c->client[n] = '\0';
    ST_LOG_D("conn", "conn %llu: hello from '%s'", (unsigned long long)c->id, c->client);
  }
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, id);
  st__describe_hello(&pk, c->srv, c->device);
  st__reply_send(c, &sb);
}

static void do_info(st__conn_t *c, uint32_t id, const msgpack_object *params) {
  (void)params;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, id);
  st__describe_info(&pk, c->srv);
  st__reply_send(c, &sb);
}

static void do_endpoints(st__conn_t *c, uint32_t id, const msgpack_object *params) {
  (void)params;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, id);
  st__describe_endpoints(&pk, c->srv->gen);
  st__reply_send(c, &sb);
}

static const char *const no_params[] = {NULL};
static const char *const hello_params[] = {"protocol", "client", NULL};
static const char *const call_params[] = {"endpoint", "args", "arenas", NULL};
static const char *const invalidate_params[] = {"endpoint", "args", NULL};
static const char *const task_params[] = {"task_id", NULL};
static const char *const wait_params[] = {"task_id", "timeout", NULL};
static const char *const tasks_params[] = {"status", NULL};
static const char *const object_params[] = {"object_id", NULL};
static const char *const live_params[] = {"object_id", "server_id", NULL};
static const char *const endpoint_params[] = {"endpoint", NULL};

static void dispatch_request(st__conn_t *c, const st__message_t *msg, uint32_t id, int mlen,
                             int prc, const msgpack_object *params, char *err, size_t errlen);

static const method_t methods[] = {
    {"ping", do_ping, no_params},
    {"hello", do_hello, hello_params},
    {"call", st__method_call, call_params},
    {"info", do_info, no_params},
    {"endpoints", do_endpoints, no_params},
    {"submit", st__method_submit, call_params},
    {"status", st__method_status, task_params},
    {"wait", st__method_wait, wait_params},
    {"result", st__method_result, task_params},
    {"cancel", st__method_cancel, task_params},
    {"tasks", st__method_tasks, tasks_params},
    {"release", st__method_release, object_params},
    {"object_info", st__method_object_info, object_params},
    {"ensure_live", st__method_ensure_live, live_params},
    {"objects", st__method_objects, no_params},
    {"invalidate_call", st__method_invalidate_call, invalidate_params},
    {"invalidate_endpoint", st__method_invalidate_endpoint, endpoint_params},
    {"reload", st__method_reload, no_params},
};

/* The descriptors of a request that lists params.arenas (docs/protocol.md,
 * "Tensor arguments") go into *t, whatever the method: a request that is
 * refused still consumes them. Returns 0 (t filled or empty), 1 when an
 * INVALID_ARGUMENT reply was sent (a malformed arena; the connection
 * stays), -1 when the descriptors and the requests no longer match (a
 * PROTOCOL reply was sent and the connection closes). */
static int take_arenas(st__conn_t *c, uint32_t id, const msgpack_object *params,
                       st__targs_t *t) {
  const msgpack_object *list = params ? st__map_get(params, "arenas") : NULL;
  if (!list) return 0;
  const char *why = NULL;
  char m[200];
  int fds[ST_MAX_FDS_PER_MESSAGE];
  uint32_t n = list->type == MSGPACK_OBJECT_ARRAY ? list->via.array.size : 0;
  if (list->type != MSGPACK_OBJECT_ARRAY || n > ST_MAX_FDS_PER_MESSAGE) {
    why = "params.arenas must be an array of at most 253 arena maps";
  } else if (st__conn_take_fds(c, fds, n) != 0) {
    snprintf(m, sizeof m, "the request lists %u arenas but %zu descriptors arrived with it",
             (unsigned)n, c->rx_nfds);
    why = m;
  }
  if (why) {
    c->srv->counters.protocol_errors++;
    ST_LOG_W("conn", "conn %llu (pid %d): %s; closing", (unsigned long long)c->id,
             (int)c->cred.pid, why);
    st__conn_send_error(c, id, ST_ERR_PROTOCOL, why);
    st__conn_close_after_flush(c, "protocol error");
    return -1;
  }
  char err[320];
  if (st__targs_take(t, list, fds, n, err, sizeof err) != ST_OK) {
    st__conn_send_error(c, id, ST_ERR_INVALID_ARGUMENT, err);
    return 1;
  }
  return 0;
}

/* Handles one message of c (borrowed); see conn.h. Loop thread. */
void st__dispatch(st__conn_t *c, const st__message_t *msg) {
  st__server_t *srv = c->srv;
  if (msg->type == ST_MSG_NOTIFICATION) {
    srv->counters.notifications++;
    return;
  }
  if (msg->type != ST_MSG_REQUEST) {
    srv->counters.protocol_errors++;
    ST_LOG_W("conn", "conn %llu (pid %d): sent a response message; closing",
             (unsigned long long)c->id, (int)c->cred.pid);
    st__conn_send_error(c, msg->id, ST_ERR_PROTOCOL,
                        "the server sends no requests: a response message is not expected");
    st__conn_close_after_flush(c, "protocol error");
    return;
  }
  srv->counters.requests++;
  uint32_t id = msg->id;
  int mlen = (int)(msg->method_len > 64 ? 64 : msg->method_len);
  const msgpack_object *params = NULL;
  char err[256];
  int prc = st__params_map(&msg->params, &params, err, sizeof err);
  st__targs_t targs;
  memset(&targs, 0, sizeof targs);
  if (take_arenas(c, id, prc == ST_OK ? params : NULL, &targs) != 0) return;
  c->targs = &targs;
  dispatch_request(c, msg, id, mlen, prc, params, err, sizeof err);
  c->targs = NULL;
  st__targs_clear(&targs);   /* what call/submit did not take */
}

/* The rest of st__dispatch for a request whose arenas were taken. */
static void dispatch_request(st__conn_t *c, const st__message_t *msg, uint32_t id, int mlen,
                             int prc, const msgpack_object *params, char *err, size_t errlen) {
  st__server_t *srv = c->srv;
  if (c->inflight >= srv->cfg->max_inflight) {
    srv->counters.busy++;
    char m[160];
    snprintf(m, sizeof m, "%d requests already in flight on this connection (max_inflight)",
             c->inflight);
    st__conn_send_error(c, id, ST_ERR_BUSY, m);
    return;
  }
  const method_t *method = NULL;
  for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
    if (strlen(methods[i].name) == msg->method_len &&
        memcmp(methods[i].name, msg->method, msg->method_len) == 0) {
      method = &methods[i];
      break;
    }
  }
  if (!method) {
    char m[128];
    snprintf(m, sizeof m, "unknown method '%.*s'", mlen, msg->method);
    st__conn_send_error(c, id, ST_ERR_UNKNOWN_METHOD, m);
    return;
  }
  int rc = prc;
  if (rc == ST_OK) rc = st__params_check(params, method->allowed, err, errlen);
  if (rc != ST_OK) {
    char m[320];
    snprintf(m, sizeof m, "%s: %s", method->name, err);
    st__conn_send_error(c, id, rc, m);
    return;
  }
  method->fn(c, id, params);
}
