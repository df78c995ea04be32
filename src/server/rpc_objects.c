/* src/server: the object and invalidation methods (rpc.h;
 * docs/protocol.md, "release" ... "invalidate_endpoint"). Loop thread
 * only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

#include "engine/bind.h"
#include "engine/cachekey.h"
#include "server/holdings.h"
#include "server/rpc.h"
#include "server/work.h"
#include "st/errors.h"

static void stale(st__rpc_req_t *r, uint64_t oid) {
  st__rpc_error(r, ST_ERR_STALE_HANDLE, "%s: object %llu is gone (released, invalidated or evicted)",
                r->method->name, (unsigned long long)oid);
}

/* Gives back c's lease on object `oid`, counted; what st__objects_release
 * says. */
static void release_lease(st__conn_t *c, uint64_t oid, int *released, int *destroyed,
                          uint32_t *refcount) {
  st__objects_release(&c->srv->objects, oid, c->id, released, destroyed, refcount);
  if (*released) {
    c->leases--;
    c->srv->counters.releases++;
  }
}

/* release {object_id} -> {released, destroyed, refcount}. */
void st__rpc_release(st__rpc_req_t *r) {
  st__conn_t *c = r->c;
  int released, destroyed;
  uint32_t refcount;
  release_lease(c, st__rpc_u64(r, "object_id", 0), &released, &destroyed, &refcount);
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, r->id);
  msgpack_pack_map(&pk, 3);
  st__pack_kv_bool(&pk, "released", released);
  st__pack_kv_bool(&pk, "destroyed", destroyed);
  st__pack_kv_uint(&pk, "refcount", refcount);
  st__reply_send(c, r->id, &sb);
}

/* See rpc.h. */
void st__notified(st__conn_t *c, const st__message_t *msg) {
  c->srv->counters.notifications++;
  if (msg->method_len != 7 || memcmp(msg->method, "release", 7) != 0) return;
  const msgpack_object *params = NULL, *oid = NULL;
  char err[128];
  if (st__params_map(&msg->params, &params, err, sizeof err) == ST_OK && params)
    oid = st__map_get(params, "object_id");
  if (!oid || oid->type != MSGPACK_OBJECT_POSITIVE_INTEGER || params->via.map.size != 1) {
    ST_LOG_D("conn", "conn %llu: a release notification without one object_id; ignored",
             (unsigned long long)c->id);
    return;
  }
  int released, destroyed;
  uint32_t refcount;
  release_lease(c, oid->via.u64, &released, &destroyed, &refcount);
}

/* object_info {object_id} -> object info, or STALE_HANDLE. */
void st__rpc_object_info(st__rpc_req_t *r) {
  uint64_t oid = st__rpc_u64(r, "object_id", 0);
  st__object_t *o = st__objects_find(&r->c->srv->objects, oid);
  if (!o) {
    stale(r, oid);
    return;
  }
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, r->id);
  st__pack_object_info(&pk, r->c->srv, o);
  st__reply_send(r->c, r->id, &sb);
}

/* ensure_live {object_id, server_id?} -> true, or STALE_HANDLE. */
void st__rpc_ensure_live(st__rpc_req_t *r) {
  st__server_t *srv = r->c->srv;
  const msgpack_object *sid = st__rpc_arg(r, "server_id");
  uint64_t oid = st__rpc_u64(r, "object_id", 0);
  if (sid && !st__str_eq(sid, srv->server_id)) {
    char shown[300];
    st__rpc_error(r, ST_ERR_STALE_HANDLE,
                  "ensure_live: object %llu belongs to server %s; this is server %s",
                  (unsigned long long)oid,
                  st__wire_shown(sid->via.str.ptr, sid->via.str.size, shown, sizeof shown),
                  srv->server_id);
    return;
  }
  if (!st__objects_find(&srv->objects, oid)) {
    stale(r, oid);
    return;
  }
  st__reply_true(r->c, r->id);
}

/* objects -> every object's info, by id. */
void st__rpc_objects(st__rpc_req_t *r) {
  st__objects_t *all = &r->c->srv->objects;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, r->id);
  msgpack_pack_array(&pk, all->count);
  for (st__object_t *o = all->all_head; o; o = o->all_next)
    st__pack_object_info(&pk, r->c->srv, o);
  st__reply_send(r->c, r->id, &sb);
}

/* invalidate_call {endpoint, args?} -> whether an entry was dropped. */
void st__rpc_invalidate_call(st__rpc_req_t *r) {
  st__server_t *srv = r->c->srv;
  const st__endpoint_decl_t *ep = st__rpc_endpoint(r);
  if (!ep) return;
  msgpack_sbuffer bound;
  msgpack_sbuffer_init(&bound);
  char err[1024];
  int rc = st__bind_args(ep, st__rpc_arg(r, "args"), NULL, &bound, err, sizeof err);
  char *key = NULL;
  size_t klen = 0;
  if (rc == ST_OK && ep->cache)
    rc = st__cache_key(ep, bound.data, bound.size, &key, &klen, err, sizeof err);
  msgpack_sbuffer_destroy(&bound);
  if (rc != ST_OK) {
    st__rpc_error(r, rc, "invalidate_call: %s: %s", ep->name, err);
    return;
  }
  int dropped = 0;
  if (key) {
    dropped = st__objects_uncache(&srv->objects, ep->name, key, klen);
    st__builds_forget(srv, ep->name, key, klen);
    free(key);
  }
  srv->counters.invalidations += (uint64_t)dropped;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, r->id);
  st__pack_bool(&pk, dropped);
  st__reply_send(r->c, r->id, &sb);
}

/* invalidate_endpoint {endpoint} -> number of entries dropped. */
void st__rpc_invalidate_endpoint(st__rpc_req_t *r) {
  st__server_t *srv = r->c->srv;
  const st__endpoint_decl_t *ep = st__rpc_endpoint(r);
  if (!ep) return;
  size_t n = st__objects_uncache_endpoint(&srv->objects, ep->name);
  st__builds_forget(srv, ep->name, NULL, 0);
  srv->counters.invalidations += n;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, r->id);
  msgpack_pack_uint64(&pk, n);
  st__reply_send(r->c, r->id, &sb);
}

/* ------------------------------------------------------------- holdings */

/* The connection closed: its leases go back. */
static void leases_release(st__server_t *srv, st__conn_t *c) {
  if (c->leases) {
    srv->counters.leases_dropped += st__objects_release_conn(&srv->objects, c->id);
    c->leases = 0;
  }
}

static void leases_count(st__server_t *srv, const st__conn_t *c, st__holding_count_t *n) {
  (void)srv;
  n->items = c->leases;
}

static int leases_none(st__server_t *srv) { return !srv->objects.leases; }

const st__holding_kind_t st__holding_leases = {
    .name = "leases", .release = leases_release, .count = leases_count, .none = leases_none};
