/* src/server: method dispatch (docs/protocol.md, "Methods"). Loop thread
 * only: hello, ping, info and endpoints are answered here at once; the
 * methods of builds, tasks and objects live in builds.c and methods.c
 * (work.h).
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
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
static const char *const call_params[] = {"endpoint", "args", NULL};
static const char *const task_params[] = {"task_id", NULL};
static const char *const wait_params[] = {"task_id", "timeout", NULL};
static const char *const tasks_params[] = {"status", NULL};
static const char *const object_params[] = {"object_id", NULL};
static const char *const live_params[] = {"object_id", "server_id", NULL};
static const char *const endpoint_params[] = {"endpoint", NULL};

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
    {"invalidate_call", st__method_invalidate_call, call_params},
    {"invalidate_endpoint", st__method_invalidate_endpoint, endpoint_params},
    {"reload", st__method_reload, no_params},
};

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
  const msgpack_object *params = NULL;
  char err[256];
  int rc = st__params_map(&msg->params, &params, err, sizeof err);
  if (rc == ST_OK) rc = st__params_check(params, method->allowed, err, sizeof err);
  if (rc != ST_OK) {
    char m[320];
    snprintf(m, sizeof m, "%s: %s", method->name, err);
    st__conn_send_error(c, id, rc, m);
    return;
  }
  method->fn(c, id, params);
}
