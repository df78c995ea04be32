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

static void dispatch_request(st__conn_t *c, st__message_t *msg,
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

/* Answers request `id` with INVALID_ARGUMENT for tensor arguments named
 * by ids the connection's cache does not hold: the error map has
 * `uncached: [ids]`, which tells the client to send those descriptors
 * again (docs/protocol.md, "Tensor arguments"). */
static void send_uncached(st__conn_t *c, uint32_t id, const char *message, const uint64_t *ids,
                          size_t n) {
  if (c->dead) return;
  st__stats_answered(c->srv, &c->open, id, ST_ERR_INVALID_ARGUMENT);
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  st__pack_error_response_head(&pk, id, ST_ERR_INVALID_ARGUMENT, message, 1);
  st__pack_cstr(&pk, "uncached");
  msgpack_pack_array(&pk, n);
  for (size_t i = 0; i < n; i++) msgpack_pack_uint64(&pk, ids[i]);
  msgpack_pack_nil(&pk);
  st__conn_send(c, &sb, NULL, 0);
  msgpack_sbuffer_destroy(&sb);
}

/* The descriptors of a request that lists params.arenas (docs/protocol.md,
 * "Tensor arguments") go into *t, whatever the method: a request that is
 * refused still consumes them. Arenas named by arg_id come from the
 * connection's cache, and those sent with one are kept there. Returns 0
 * (t filled or empty), 1 when an INVALID_ARGUMENT reply was sent (a
 * malformed arena, an id not cached; the connection stays), -1 when the
 * descriptors and the requests no longer match (a PROTOCOL reply was sent
 * and the connection closes). */
static int take_arenas(st__conn_t *c, uint32_t id, const msgpack_object *params,
                       st__targs_t *t) {
  const msgpack_object *list = params ? st__map_get(params, "arenas") : NULL;
  if (!list) return 0;
  const char *why = NULL;
  char m[200];
  int fds[ST_MAX_FDS_PER_MESSAGE];
  uint32_t n = list->type == MSGPACK_OBJECT_ARRAY ? list->via.array.size : 0;
  if (list->type == MSGPACK_OBJECT_ARRAY && n <= ST_MAX_FDS_PER_MESSAGE)
    n = (uint32_t)st__targs_count_fds(list);
  if (list->type != MSGPACK_OBJECT_ARRAY || list->via.array.size > ST_MAX_FDS_PER_MESSAGE) {
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
  uint64_t uncached[ST_MAX_FDS_PER_MESSAGE];
  size_t nuncached = 0;
  if (st__targs_take(t, list, fds, n, &c->argcache, uncached, &nuncached, err, sizeof err) !=
      ST_OK) {
    if (nuncached) send_uncached(c, id, err, uncached, nuncached);
    else st__conn_send_error(c, id, ST_ERR_INVALID_ARGUMENT, err);
    return 1;
  }
  st__conn_argcache_keep(c, t);
  return 0;
}

/* Handles one message of c (borrowed); see rpc.h. Loop thread. */
void st__dispatch(st__conn_t *c, st__message_t *msg) {
  st__server_t *srv = c->srv;
  if (msg->type == ST_MSG_NOTIFICATION) {
    st__notified(c, msg);
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
  /* Forgotten tensor arguments go first, whatever happens to the request;
   * a malformed forget still lets the request's descriptors be taken. */
  char ferr[128];
  int frc = prc == ST_OK ? st__conn_argcache_forget(c, params, ferr, sizeof ferr) : ST_OK;
  /* So do the arenas the client unmapped and the objects it freed: a
   * reply of this request sends them in full again. */
  if (frc == ST_OK && prc == ST_OK)
    frc = st__keptset_drop_listed(&c->kept_arenas, params, "unmapped", "arena ids", ferr, sizeof ferr);
  if (frc == ST_OK && prc == ST_OK)
    frc = st__keptset_drop_listed(&c->kept_objects, params, "objects_freed", "object ids", ferr,
                                sizeof ferr);
  st__targs_t targs;
  memset(&targs, 0, sizeof targs);
  if (take_arenas(c, id, prc == ST_OK ? params : NULL, &targs) != 0) return;
  if (frc != ST_OK) {
    st__targs_clear(&targs);
    st__conn_send_error(c, id, frc, ferr);
    return;
  }
  c->targs = &targs;
  dispatch_request(c, msg, method, id, prc, params, err);
  c->targs = NULL;
  st__targs_clear(&targs);   /* what call/submit did not take */
}

/* The rest of st__dispatch for a request whose arenas were taken: its
 * method's row (NULL: unknown); `prc` and `err` say whether params was a
 * map of named parameters. */
static void dispatch_request(st__conn_t *c, st__message_t *msg,
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
  st__rpc_req_t r = {.c = c, .id = id, .params = params, .method = method, .msg = msg};
  if (!r.method) {
    char m[320], shown[300];
    snprintf(m, sizeof m, "unknown method '%s'",
             st__wire_shown(msg->method, msg->method_len, shown, sizeof shown));
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
