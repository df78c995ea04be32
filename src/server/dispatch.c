/* src/server: method dispatch (docs/protocol.md, "Methods") and call
 * completions. Loop thread only: hello, ping, info and endpoints are
 * answered here at once; call binds its arguments and queues a job, whose
 * completion comes back through st__dispatch_complete.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "engine/bind.h"
#include "mem/arena.h"
#include "server/conn.h"
#include "st/wire.h"

typedef void (*method_fn)(st__conn_t *c, uint32_t id, const msgpack_object *params);

typedef struct method {
  const char *name;
  method_fn fn;
  const char *const *allowed;   /* parameter names, NULL-terminated */
} method_t;

/* A response with a result: [1, id, nil, <result packed by fill>]. */
static void reply_begin(msgpack_sbuffer *sb, msgpack_packer *pk, uint32_t id) {
  msgpack_sbuffer_init(sb);
  msgpack_packer_init(pk, sb, msgpack_sbuffer_write);
  st__pack_response_head(pk, id);
}

static void reply_send(st__conn_t *c, msgpack_sbuffer *sb) {
  st__conn_send(c, sb, NULL, 0);
  msgpack_sbuffer_destroy(sb);
}

static void do_ping(st__conn_t *c, uint32_t id, const msgpack_object *params) {
  (void)params;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  reply_begin(&sb, &pk, id);
  st__pack_cstr(&pk, "pong");
  reply_send(c, &sb);
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
  reply_begin(&sb, &pk, id);
  st__describe_hello(&pk, c->srv, c->device);
  reply_send(c, &sb);
}

static void do_info(st__conn_t *c, uint32_t id, const msgpack_object *params) {
  (void)params;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  reply_begin(&sb, &pk, id);
  st__describe_info(&pk, c->srv);
  reply_send(c, &sb);
}

static void do_endpoints(st__conn_t *c, uint32_t id, const msgpack_object *params) {
  (void)params;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  reply_begin(&sb, &pk, id);
  st__describe_endpoints(&pk, c->srv->gen);
  reply_send(c, &sb);
}

static void do_call(st__conn_t *c, uint32_t id, const msgpack_object *params) {
  st__server_t *srv = c->srv;
  const msgpack_object *name = st__map_get(params, "endpoint");
  const msgpack_object *args = st__map_get(params, "args");
  if (!name || name->type != MSGPACK_OBJECT_STR) {
    st__conn_send_error(c, id, ST_ERR_INVALID_ARGUMENT, "call: 'endpoint' (a string) is required");
    return;
  }
  if (srv->shutting_down || !srv->pool) {
    st__conn_send_error(c, id, ST_ERR_SHUTTING_DOWN, "the server is shutting down");
    return;
  }
  int nlen = (int)(name->via.str.size > 128 ? 128 : name->via.str.size);
  const st__endpoint_decl_t *ep =
      st__generation_find(srv->gen, name->via.str.ptr, name->via.str.size);
  if (!ep) {
    char msg[256];
    snprintf(msg, sizeof msg, "unknown endpoint '%.*s'", nlen, name->via.str.ptr);
    st__conn_send_error(c, id, ST_ERR_UNKNOWN_ENDPOINT, msg);
    return;
  }
  /* execution = "task", concurrency = "serialized", caching, managed
   * objects and singleflight are declared and validated, and listed by
   * `endpoints`; until they are implemented these endpoints run as direct,
   * parallel calls. */
  msgpack_sbuffer bound;
  msgpack_sbuffer_init(&bound);
  char err[1024];
  int rc = st__bind_args(ep, args, &bound, err, sizeof err);
  if (rc != ST_OK) {
    msgpack_sbuffer_destroy(&bound);
    char msg[1100];
    snprintf(msg, sizeof msg, "%s: %s", ep->name, err);
    st__conn_send_error(c, id, rc, msg);
    return;
  }
  st__job_t *job = st__job_new(c->id, id, srv->gen, ep, bound.data, bound.size);
  msgpack_sbuffer_destroy(&bound);
  if (!job) {
    st__conn_send_error(c, id, ST_ERR_OUT_OF_MEMORY, "out of memory queueing the call");
    return;
  }
  rc = st__pool_submit(srv->pool, job);
  if (rc != ST_OK) {
    st__job_free(job);
    st__conn_send_error(c, id, rc, "the server is shutting down");
    return;
  }
  c->inflight++;
  srv->counters.calls++;
  ST_LOG_D("call", "conn %llu: call %s (id %u) queued", (unsigned long long)c->id, ep->name,
           (unsigned)id);
}

static const char *const no_params[] = {NULL};
static const char *const hello_params[] = {"protocol", "client", NULL};
static const char *const call_params[] = {"endpoint", "args", NULL};

static const method_t methods[] = {
    {"ping", do_ping, no_params},
    {"hello", do_hello, hello_params},
    {"call", do_call, call_params},
    {"info", do_info, no_params},
    {"endpoints", do_endpoints, no_params},
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

/* ------------------------------------------------------------- completion */

/* The reply of a successful call: {value, arenas} with one duplicated
 * descriptor per arena. On failure to duplicate, an error reply instead. */
static void reply_result(st__conn_t *c, st__job_t *job) {
  st__server_t *srv = c->srv;
  st__build_result_t *r = &job->result;
  if (r->narenas > ST_MAX_FDS_PER_MESSAGE) {
    char m[160];
    snprintf(m, sizeof m, "%s: the result uses %zu allocations; at most %d fit in one reply",
             job->ep->name, r->narenas, ST_MAX_FDS_PER_MESSAGE);
    st__conn_send_error(c, job->request_id, ST_ERR_LIMIT, m);
    return;
  }
  int fds[ST_MAX_FDS_PER_MESSAGE];
  int nfds = 0;
  for (size_t i = 0; i < r->narenas; i++) {
    int fd = st__arena_dup_fd(r->arenas[i]);
    if (fd < 0) {
      for (int k = 0; k < nfds; k++) close(fds[k]);
      char m[160];
      snprintf(m, sizeof m, "%s: cannot duplicate an arena descriptor (%s)", job->ep->name,
               st_strerror(fd));
      ST_LOG_E("call", "%s", m);
      st__conn_send_error(c, job->request_id, fd, m);
      return;
    }
    fds[nfds++] = fd;
  }
  msgpack_sbuffer sb;
  msgpack_packer pk;
  reply_begin(&sb, &pk, job->request_id);
  msgpack_pack_map(&pk, 2);
  st__pack_cstr(&pk, "value");
  if (r->value.size) msgpack_sbuffer_write(&sb, r->value.data, r->value.size);
  else msgpack_pack_nil(&pk);
  st__pack_cstr(&pk, "arenas");
  msgpack_pack_array(&pk, r->narenas);
  for (size_t i = 0; i < r->narenas; i++) {
    st__arena_desc_t d;
    memset(&d, 0, sizeof d);
    st__arena_describe(r->arenas[i], &d);
    d.fd = (uint32_t)i;
    st__pack_arena(&pk, &d);
  }
  srv->counters.calls_ok++;
  st__conn_send(c, &sb, fds, nfds);
  msgpack_sbuffer_destroy(&sb);
}

/* Replies to a finished job if its connection is alive, then frees the
 * job (and so the server's arena references). Loop thread. */
void st__dispatch_complete(st__server_t *srv, st__job_t *job) {
  double ms = (job->finished_at - job->queued_at) * 1e3;
  st__conn_t *c = st__conn_find(srv, job->conn_id);
  if (job->status != ST_OK) {
    ST_LOG_W("call", "conn %llu: call %s (id %u) failed after %.1f ms: %s: %s",
             (unsigned long long)job->conn_id, job->ep->name, (unsigned)job->request_id, ms,
             st_err_name(job->status), job->error);
  } else {
    ST_LOG_D("call", "conn %llu: call %s (id %u) done in %.1f ms: %zu arenas, %llu bytes",
             (unsigned long long)job->conn_id, job->ep->name, (unsigned)job->request_id, ms,
             job->result.narenas, (unsigned long long)job->result.bytes);
  }
  if (!c || c->dead) {
    /* The client went away: destroying the job drops the arena
     * references, so nothing of this call stays in memory. */
    srv->counters.calls_dropped++;
    ST_LOG_D("call", "conn %llu is gone: result of %s dropped", (unsigned long long)job->conn_id,
             job->ep->name);
    st__job_free(job);
    return;
  }
  if (job->status == ST_OK) {
    reply_result(c, job);
  } else {
    st__conn_send_error(c, job->request_id, job->status, job->error);
  }
  /* Plain results: the client's descriptors now own the memory; the
   * server's references go with the job. */
  st__job_free(job);
  st__conn_request_done(c);
}
