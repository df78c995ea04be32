/* src/server: the client methods of live replication (rpc.h;
 * docs/protocol.md, "unsubscribe" and "replicas"): a replica's
 * subscription ended, and who follows what. Loop thread, the write side
 * of the server lock. */
#include <stdio.h>
#include <string.h>

#include "engine/keys.h"
#include "server/live_source.h"
#include "server/replica.h"
#include "server/rpc.h"
#include "server/work.h"
#include "st/errors.h"

/* The key a client names, as a C string in out; 0 when it is no key name
 * (an error was sent). */
static int key_of(st__rpc_req_t *rq, char *out, size_t cap, const char *method) {
  if (st__wire_cstr(st__rpc_arg(rq, "key"), out, cap) <= 0) {
    st__rpc_error(rq, ST_ERR_INVALID_ARGUMENT, "%s: key must be a key name", method);
    return 0;
  }
  return 1;
}

/* unsubscribe {key} -> {key, version}: key's subscription ends; the key
 * stays with the version it holds. Its uid's, or an admin's. */
void st__rpc_unsubscribe(st__rpc_req_t *rq) {
  st__server_t *srv = rq->c->srv;
  char as[ST__KEY_NAME_MAX + 1], err[400];
  if (!key_of(rq, as, sizeof as, "unsubscribe")) return;
  st__who_t who;
  st__rpc_who(rq, &who);
  uint64_t version = 0;
  int rc = st__replica_unsubscribe(srv, as, &who, &version, err, sizeof err);
  if (rc != ST_OK) {
    st__rpc_error(rq, rc, "unsubscribe: %s", err);
    return;
  }
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, rq->id);
  msgpack_pack_map(&pk, 2);
  st__pack_kv_str(&pk, "key", as);
  st__pack_kv_uint(&pk, "version", version);
  st__reply_send(rq->c, rq->id, &sb);
}

/* replicas {key} -> {key, subscribers: [{peer, version, since}], source:
 * {peer, key, version, updates, torn, lost, why} | nil}: who follows this
 * server's live key, and what this server's replica follows. */
void st__rpc_replicas(st__rpc_req_t *rq) {
  st__server_t *srv = rq->c->srv;
  char name[ST__KEY_NAME_MAX + 1];
  if (!key_of(rq, name, sizeof name, "replicas")) return;
  const st__key_t *k = st__smap_get(&srv->keys.by_name, name, strlen(name));
  st__who_t who;
  st__rpc_who(rq, &who);
  if (!k || !st__keys_visible(k, &who)) {
    st__rpc_error(rq, ST_ERR_NOT_FOUND, "replicas: no key '%s'", name);
    return;
  }
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, rq->id);
  msgpack_pack_map(&pk, 3);
  st__pack_kv_str(&pk, "key", name);
  st__pack_cstr(&pk, "subscribers");
  st__live_source_pack(&pk, srv, name);
  st__pack_cstr(&pk, "source");
  st__replica_pack(&pk, srv, name);
  st__reply_send(rq->c, rq->id, &sb);
}
