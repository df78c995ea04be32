/* src/server: the methods that describe and steer the server (rpc.h):
 * ping, hello, info, metrics, endpoints, reload. Loop thread only. */
#include <stdio.h>
#include <string.h>

#include "server/pool_conn.h"
#include "common/log.h"
#include "peer/peer.h"
#include "server/holdings.h"
#include "server/rpc.h"
#include "server/work.h"
#include "st/errors.h"
#include "st/wire.h"

/* ping -> "pong". */
void st__rpc_ping(st__rpc_req_t *r) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, r->id);
  st__pack_cstr(&pk, "pong");
  st__reply_send(r->c, r->id, &sb);
}

/* Whether hello's `features` (may be NULL) is nil or an array of
 * strings. */
static int features_valid(const msgpack_object *f) {
  if (!f || f->type == MSGPACK_OBJECT_NIL) return 1;
  if (f->type != MSGPACK_OBJECT_ARRAY) return 0;
  for (uint32_t i = 0; i < f->via.array.size; i++)
    if (f->via.array.ptr[i].type != MSGPACK_OBJECT_STR) return 0;
  return 1;
}

/* hello {protocol?, client?, features?} -> the server's identity and
 * limits; a newer protocol than ours is PROTOCOL. The client's features
 * ("arena_refs", "object_refs", "arg_results", "pool") apply to the connection from the
 * reply on; any hello starts them afresh. */
void st__rpc_hello(st__rpc_req_t *r) {
  st__conn_t *c = r->c;
  const msgpack_object *proto = st__rpc_arg(r, "protocol");
  const msgpack_object *client = st__rpc_arg(r, "client");
  if (proto && proto->via.u64 > ST_PROTOCOL_VERSION) {
    st__rpc_error(r, ST_ERR_PROTOCOL, "client speaks protocol %llu; this server (%s) speaks "
                  "protocol %d", (unsigned long long)proto->via.u64, ST_VERSION_STRING,
                  ST_PROTOCOL_VERSION);
    return;
  }
  const msgpack_object *features = st__rpc_arg(r, "features");
  if (!features_valid(features)) {
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "hello: 'features' must be an array of strings");
    return;
  }
  st__keptset_start(&c->kept_arenas, st__features_has(features, "arena_refs"));
  st__keptset_start(&c->kept_objects, st__features_has(features, "object_refs"));
  c->arg_results = st__features_has(features, "arg_results");
  if (client) {
    size_t n = client->via.str.size < sizeof c->client - 1 ? client->via.str.size
                                                           : sizeof c->client - 1;
    memcpy(c->client, client->via.str.ptr, n);
    c->client[n] = '\0';
    ST_LOG_D("conn", "conn %llu: hello from '%s'", (unsigned long long)c->id, c->client);
  }
  st__pool_conn_hello(c, features);
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, r->id);
  st__describe_hello(&pk, c->srv, c->device);
  st__reply_send(c, r->id, &sb);
}

/* info -> the server's state and counters (describe.c). */
void st__rpc_info(st__rpc_req_t *r) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, r->id);
  st__describe_info(&pk, r->c->srv);
  st__reply_send(r->c, r->id, &sb);
}

/* peers -> one map per configured peer: its link's state, engines,
 * round-trip time and last error (src/peer; docs/protocol.md, "peers"). */
void st__rpc_peers(st__rpc_req_t *r) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, r->id);
  st__peer_pack_peers(&pk, r->c->srv->peer, &r->c->srv->cfg->peer);
  st__reply_send(r->c, r->id, &sb);
}

/* metrics -> the Prometheus text (metrics.c), one string. */
void st__rpc_metrics(st__rpc_req_t *r) {
  msgpack_sbuffer text;
  msgpack_sbuffer_init(&text);
  st__metrics_text(r->c->srv, &text);
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, r->id);
  msgpack_pack_str(&pk, text.size);
  msgpack_pack_str_body(&pk, text.data, text.size);
  msgpack_sbuffer_destroy(&text);
  st__reply_send(r->c, r->id, &sb);
}

/* endpoints -> every declaration of the current generation. */
void st__rpc_endpoints(st__rpc_req_t *r) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, r->id);
  st__describe_endpoints(&pk, r->c->srv->gen);
  st__reply_send(r->c, r->id, &sb);
}

/* Nonzero when uid is in reload_uids. */
static int may_reload(const st__config_t *cfg, uid_t uid) {
  for (int i = 0; i < cfg->nreload_uids; i++)
    if (cfg->reload_uids[i] == uid) return 1;
  return 0;
}

/* Answers a reload request once its load ended (st__reload_done_fn):
 * {ok, generation, error, changed, added, removed}, or the error of a
 * request no load ran for. */
static void reload_answer(st__server_t *srv, uint64_t conn_id, uint32_t request_id,
                          const st__reload_report_t *rep) {
  st__conn_t *c = st__conn_find(srv, conn_id);
  if (!c || c->dead) return;
  if (rep->refused) {
    st__conn_send_error(c, request_id, rep->refused, rep->error ? rep->error : "reload refused");
    st__conn_request_done(c);
    return;
  }
  static const char *const lists[3] = {"changed", "added", "removed"};
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, request_id);
  msgpack_pack_map(&pk, 6);
  st__pack_kv_bool(&pk, "ok", rep->ok);
  st__pack_kv_uint(&pk, "generation", rep->generation);
  st__pack_kv_str(&pk, "error", rep->error);
  for (int k = 0; k < 3; k++) {
    st__pack_cstr(&pk, lists[k]);
    msgpack_pack_array(&pk, rep->counts[k]);
    for (size_t i = 0; i < rep->counts[k]; i++) st__pack_cstr(&pk, rep->names[k][i]);
  }
  st__reply_send(c, request_id, &sb);
  st__conn_request_done(c);
}

/* reload -> {ok, generation, error, changed, added, removed} once the new
 * generation loaded (on a loader thread: the connection is served
 * meanwhile) or failed to. Only the uids of reload_uids may ask. */
void st__rpc_reload(st__rpc_req_t *r) {
  st__conn_t *c = r->c;
  st__server_t *srv = c->srv;
  if (!may_reload(srv->cfg, c->cred.uid)) {
    ST_LOG_W("server", "conn %llu (pid %d, uid %u): reload refused: uid not in reload_uids",
             (unsigned long long)c->id, (int)c->cred.pid, (unsigned)c->cred.uid);
    st__rpc_error(r, ST_ERR_AUTH, "reload: uid %u may not reload the endpoints (reload_uids in "
                  "the server's config.lua)", (unsigned)c->cred.uid);
    return;
  }
  ST_LOG_I("server", "conn %llu: reload requested", (unsigned long long)c->id);
  int rc = st__server_reload(srv, reload_answer, c->id, r->id);
  if (rc == ST_ERR_BUSY)
    st__rpc_error(r, rc, "reload: %d reload requests are already waiting for a load",
                  ST__RELOAD_MAX_WAITING);
  else if (rc == ST_ERR_SHUTTING_DOWN)
    st__rpc_error(r, rc, "the server is shutting down");
  else if (rc != ST_OK)
    st__rpc_error(r, rc, "reload: cannot start a loader thread");
  else
    c->inflight++;   /* answered by reload_answer */
}

/* ------------------------------------------------------------- holdings */

/* The kept sets hello starts (kept.h): what the client keeps mapped from
 * earlier replies on this connection. */
static void kept_arenas_release(st__server_t *srv, st__conn_t *c) {
  (void)srv;
  st__keptset_clear(&c->kept_arenas);
}

static void kept_arenas_count(st__server_t *srv, const st__conn_t *c, st__holding_count_t *n) {
  (void)srv;
  n->items = c->kept_arenas.n;
}

const st__holding_kind_t st__holding_kept_arenas = {
    .name = "kept_arenas", .release = kept_arenas_release, .count = kept_arenas_count};

static void kept_objects_release(st__server_t *srv, st__conn_t *c) {
  (void)srv;
  st__keptset_clear(&c->kept_objects);
}

static void kept_objects_count(st__server_t *srv, const st__conn_t *c, st__holding_count_t *n) {
  (void)srv;
  n->items = c->kept_objects.n;
}

const st__holding_kind_t st__holding_kept_objects = {
    .name = "kept_objects", .release = kept_objects_release, .count = kept_objects_count};
