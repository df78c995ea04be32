/* src/server: a repeated cache hit answered without the write side of the
 * server lock (rpc.h, "fastcall.c"; docs/pool.md, section 7).
 *
 * A `call` of a cached, plain endpoint whose object the client already
 * holds in full on this connection gets {object, same: true}: no value,
 * no arenas, no descriptors, no lease. Everything it reads (the
 * generation, the devices, the object registry and cache, the stats'
 * endpoint table) is changed only under the write side; what it writes is
 * the connection (its own loop's: the write queue, request count), its
 * loop's counts (loops.c) or, with the write side held or one loop, the
 * server's counters, and the object's use time (a relaxed atomic). Any
 * other request, and any doubt, goes to st__dispatch, with nothing
 * changed here. Either side of the lock, on c's own loop's thread.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/bind.h"
#include "common/clock.h"
#include "engine/objects.h"
#include "engine/smap.h"
#include "server/rpc.h"
#include "server/work.h"
#include "st/errors.h"

/* The `endpoint` and `args` of a call's params when it has nothing
 * else; 0 when it is not such a call. */
static int call_params(const st__message_t *msg, const msgpack_object **endpoint,
                       const msgpack_object **args) {
  if (msg->type != ST_MSG_REQUEST || msg->method_len != 4 || memcmp(msg->method, "call", 4) != 0)
    return 0;
  const msgpack_object *params = NULL;
  char err[64];
  if (st__params_map(&msg->params, &params, err, sizeof err) != ST_OK || !params) return 0;
  *endpoint = *args = NULL;
  for (uint32_t i = 0; i < params->via.map.size; i++) {
    const msgpack_object *k = &params->via.map.ptr[i].key;
    const msgpack_object *v = &params->via.map.ptr[i].val;
    if (k->type != MSGPACK_OBJECT_STR) return 0;
    if (k->via.str.size == 8 && memcmp(k->via.str.ptr, "endpoint", 8) == 0) *endpoint = v;
    else if (k->via.str.size == 4 && memcmp(k->via.str.ptr, "args", 4) == 0) *args = v;
    else return 0;
  }
  return *endpoint && (*endpoint)->type == MSGPACK_OBJECT_STR;
}

/* The place of endpoint stats row `at` (1-based) in this loop's counts
 * under the read side, made when new: -1 when they have no room for
 * another endpoint; 0 when counts go to the server (no read side). */
static int count_slot(uintptr_t at) {
  st__loop_counts_t *k = st__loop_counts();
  if (!k) return 0;
  int e = 0;
  while (e < k->nendpoints && k->endpoint[e] != at) e++;
  if (e < k->nendpoints) return e;
  if (e == ST__LOOP_COUNTED_ENDPOINTS) return -1;
  k->endpoint[e] = (uint16_t)at;
  k->endpoint_ok[e] = 0;
  k->nendpoints++;
  return e;
}

/* Adds one answered hit of endpoint stats row `at` (slot e of
 * count_slot) that took `took` seconds: to this loop's counts under the
 * read side, else to the server's. */
static void count_hit(st__server_t *srv, uintptr_t at, int e, double took) {
  size_t b = 0;
  while (b < ST__STATS_NBUCKETS && took > st__stats_bucket_bounds[b]) b++;
  st__loop_counts_t *k = st__loop_counts();
  if (k) {
    k->dirty = 1;
    k->calls++;
    k->buckets[b]++;
    k->seconds += took;
    k->endpoint_ok[e]++;
    return;
  }
  st__counters_t *t = &srv->counters;
  t->requests++;
  t->calls++;
  t->requests_ok++;
  t->calls_ok++;
  t->cache_hits++;
  st__method_stats_t *m = &srv->stats.methods[srv->stats.call_method];
  m->requests++;
  m->ok++;
  m->buckets[b]++;
  m->seconds += took;
  srv->stats.endpoints[at - 1]->ok++;
}

/* See rpc.h. */
int st__fast_call(st__conn_t *c, const st__message_t *msg) {
  st__server_t *srv = c->srv;
  const msgpack_object *name, *args;
  if (c->dead || c->closing || srv->shutting_down || !srv->workers || srv->stats.call_method < 0 ||
      c->inflight >= srv->cfg->max_inflight || !call_params(msg, &name, &args))
    return 0;
  double accepted = st__now_mono();
  const st__endpoint_decl_t *ep =
      st__generation_find(srv->gen, name->via.str.ptr, name->via.str.size);
  if (!ep || !ep->cache || ep->managed || ep->execution == ST_EXEC_TASK) return 0;
  /* Its stats row exists once it was called (st__stats_endpoint). */
  uintptr_t at = (uintptr_t)st__smap_get(srv->stats.endpoint_index, ep->name, strlen(ep->name));
  if (!at) at = (uintptr_t)st__smap_get(srv->stats.endpoint_index, "", 0);
  if (!at) return 0;
  st__targs_t none;
  memset(&none, 0, sizeof none);
  msgpack_sbuffer bound;
  msgpack_sbuffer_init(&bound);
  char err[512];
  st__call_place_t place;
  memset(&place, 0, sizeof place);
  int hit = st__bind_args(ep, args, &none, &bound, err, sizeof err) == ST_OK &&
            st__build_locate(srv, ep, bound.data, bound.size, c->device, &place, err,
                             sizeof err) == ST_OK &&
            place.cached && st__reply_same_for(c, place.cached, 0);
  msgpack_sbuffer_destroy(&bound);
  free(place.key);
  if (!hit) return 0;
  st__object_t *obj = place.cached;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_pack_same(&sb, &pk, srv, msg->id, obj, 0);
  int e = count_slot(at);
  if (e < 0 || st__conn_queue(c, &sb) != ST_OK) {
    msgpack_sbuffer_destroy(&sb);
    return 0;
  }
  count_hit(srv, at, e, st__now_mono() - accepted);
  st__objects_hit(obj);
  return 1;
}
