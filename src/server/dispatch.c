/* src/server: from a decoded message to its method's handler (rpc.h):
 * the tensor arguments' descriptors, the in-flight limit, the method's row
 * (methods.c) and its parameter checks (rpc.c). Loop thread only.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "engine/targs.h"
#include "server/rpc.h"
#include "st/wire.h"

static void dispatch_request(st__conn_t *c, const st__message_t *msg,
                             const st__rpc_method_t *method, uint32_t id, int prc,
                             const msgpack_object *params, const char *err);

/* Descriptors of a request closed on arrival at a descriptor limit
 * (conn.h: -1 in fds): the others are closed too and the request gets
 * LIMIT; the connection stays. Returns 1 then, else 0. */
static int refused_on_arrival(st__conn_t *c, uint32_t id, const int *fds, uint32_t n) {
  uint32_t refused = 0;
  for (uint32_t i = 0; i < n; i++) refused += fds[i] < 0;
  if (!refused) return 0;
  for (uint32_t i = 0; i < n; i++)
    if (fds[i] >= 0) close(fds[i]);
  const st__config_t *cfg = c->srv->cfg;
  char m[300];
  snprintf(m, sizeof m,
           "%u of the request's %u descriptors were closed on arrival: this connection "
           "(limits.max_fds_per_connection = %d) or all connections together "
           "(limits.max_fds_all_connections = %d) held as many as allowed",
           (unsigned)refused, (unsigned)n, cfg->max_fds_per_connection,
           cfg->max_fds_all_connections);
  st__conn_send_error(c, id, ST_ERR_LIMIT, m);
  return 1;
}

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
  if (refused_on_arrival(c, id, fds, n)) return 1;
  char err[320];
  if (st__targs_take(t, list, fds, n, err, sizeof err) != ST_OK) {
    st__conn_send_error(c, id, ST_ERR_INVALID_ARGUMENT, err);
    return 1;
  }
  return 0;
}

/* Handles one message of c (borrowed); see rpc.h. Loop thread. */
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
    st__conn_send_fault(c, msg->id, ST_ERR_PROTOCOL,
                        "the server sends no requests: a response message is not expected");
    st__conn_close_after_flush(c, "protocol error");
    return;
  }
  uint32_t id = msg->id;
  /* Counted and owed an answer from here on (stats.c). */
  const st__rpc_method_t *method = st__rpc_method_find(msg->method, msg->method_len);
  if (st__stats_open(srv, &c->open, id, method ? st__rpc_method_index(method) : ST__STATS_NMETHODS) !=
      ST_OK) {
    st__conn_send_fault(c, id, ST_ERR_OUT_OF_MEMORY, "out of memory accepting the request");
    return;
  }
  const msgpack_object *params = NULL;
  char err[256];
  int prc = st__params_map(&msg->params, &params, err, sizeof err);
  st__targs_t targs;
  memset(&targs, 0, sizeof targs);
  if (take_arenas(c, id, prc == ST_OK ? params : NULL, &targs) != 0) return;
  c->targs = &targs;
  dispatch_request(c, msg, method, id, prc, params, err);
  c->targs = NULL;
  st__targs_clear(&targs);   /* what call/submit did not take */
}

/* The rest of st__dispatch for a request whose arenas were taken: its
 * method's row (NULL: unknown); `prc` and `err` say whether params was a
 * map of named parameters. */
static void dispatch_request(st__conn_t *c, const st__message_t *msg,
                             const st__rpc_method_t *method, uint32_t id, int prc,
                             const msgpack_object *params, const char *err) {
  st__server_t *srv = c->srv;
  if (c->inflight >= srv->cfg->max_inflight) {
    srv->counters.busy++;
    char m[160];
    snprintf(m, sizeof m, "%d requests already in flight on this connection (max_inflight)",
             c->inflight);
    st__conn_send_error(c, id, ST_ERR_BUSY, m);
    return;
  }
  st__rpc_req_t r = {.c = c, .id = id, .params = params, .method = method};
  if (!r.method) {
    char m[128];
    int mlen = (int)(msg->method_len > 64 ? 64 : msg->method_len);
    snprintf(m, sizeof m, "unknown method '%.*s'", mlen, msg->method);
    st__conn_send_error(c, id, ST_ERR_UNKNOWN_METHOD, m);
    return;
  }
  if (prc != ST_OK) {
    st__rpc_error(&r, prc, "%s: %s", r.method->name, err);
    return;
  }
  if (st__rpc_check(&r) != ST_OK) return;
  r.method->handler(&r);
}
