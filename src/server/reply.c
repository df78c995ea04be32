/* src/server: replies shared by the methods and the scheduler (work.h,
 * "reply.c"): the response head, results with their descriptors, and
 * object maps. Loop thread only. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "mem/arena.h"
#include "server/loopprof.h"
#include "server/pool_conn.h"
#include "server/work.h"
#include "st/wire.h"

/* A response with a result: [1, id, nil, <result packed next>]. */
void st__reply_begin(msgpack_sbuffer *sb, msgpack_packer *pk, uint32_t id) {
  msgpack_sbuffer_init(sb);
  msgpack_packer_init(pk, sb, msgpack_sbuffer_write);
  st__pack_response_head(pk, id);
}

/* Queues the reply (no descriptors) to request `id` and frees the
 * buffer. */
void st__reply_send(st__conn_t *c, uint32_t id, msgpack_sbuffer *sb) {
  if (!c->dead) st__stats_answered(c->srv, &c->open, id, ST_OK);
  st__conn_send(c, sb, NULL, 0);
  msgpack_sbuffer_destroy(sb);
}

/* See work.h. Loop thread. */
void st__reply_true(st__conn_t *c, uint32_t id) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, id);
  msgpack_pack_true(&pk);
  st__reply_send(c, id, &sb);
}

/* The fields that the `object` map of a reply and object info share:
 * OBJECT_FIELDS key/value pairs; callers open the map with their own. */
enum { OBJECT_FIELDS = 8 };
static void pack_object_fields(msgpack_packer *pk, const st__server_t *srv,
                               const st__object_t *o) {
  st__pack_kv_uint(pk, "id", o->id);
  st__pack_kv_str(pk, "server_id", srv->server_id);
  st__pack_cstr(pk, "cache_key");
  if (o->cache_key) {
    msgpack_pack_str(pk, o->cache_key_len);
    msgpack_pack_str_body(pk, o->cache_key, o->cache_key_len);
  } else {
    msgpack_pack_nil(pk);
  }
  st__pack_kv_bool(pk, "cached", o->cached);
  st__pack_kv_bool(pk, "managed", o->managed);
  st__pack_kv_uint(pk, "refcount", o->refcount);
  st__pack_kv_uint(pk, "bytes", o->bytes);
  st__pack_kv_str(pk, "device", o->device);
}

/* The `object` map of a call reply. */
static void pack_object(msgpack_packer *pk, const st__server_t *srv, const st__object_t *o,
                        int lease) {
  msgpack_pack_map(pk, OBJECT_FIELDS + 1);
  pack_object_fields(pk, srv, o);
  st__pack_kv_bool(pk, "lease", lease);
}

/* Gives up a reply that cannot go out: the pool's bookkeeping is undone,
 * and request id gets error rc with message m instead. Returns rc. */
static int refuse(st__conn_t *c, st__pool_reply_t *prp, uint32_t id, int rc, const char *m) {
  st__pool_reply_done(c, prp, 0);
  free(prp);
  st__conn_send_error(c, id, rc, m);
  return rc;
}

/* Packs one object's info (object_info, objects). Loop thread. */
void st__pack_object_info(msgpack_packer *pk, st__server_t *srv, const st__object_t *o) {
  msgpack_pack_map(pk, OBJECT_FIELDS + 4);
  pack_object_fields(pk, srv, o);
  st__pack_kv_str(pk, "endpoint", o->endpoint);
  st__pack_kv_double(pk, "created_at", o->created_at);
  st__pack_kv_double(pk, "last_accessed_at", st__objects_last_use(o));
  /* Not "arenas": a result with that key carries descriptors. */
  st__pack_cstr(pk, "arena_ids");
  msgpack_pack_array(pk, o->result.narenas);
  for (size_t i = 0; i < o->result.narenas; i++)
    msgpack_pack_uint64(pk, st__arena_id(o->result.arenas[i]));
}

/* Whether a call's reply of obj may be the short form for c: the object
 * is one the client may have received in full on this connection with
 * `object_kept`, and the reply's object map would be the same as then but
 * for a managed object's `refcount`. Only a cached object: its id, cache
 * key, bytes and device are the object's for its life, `cached` stays
 * true while it is cached, and a call never receives an object that left
 * the cache (it builds a new one, with a new id). Of a plain endpoint its
 * map never changes (no lease, refcount 0); of a managed one every reply
 * gives a lease (`lease` true) and says the object's refcount after it,
 * which the client takes from the short form. */
static int same_form(const st__object_t *obj, int lease) {
  if (!obj->cached) return 0;
  return obj->managed ? lease : !lease && obj->refcount == 0;
}

/* keep_object: a call's reply, whose object c's client may keep (marked
 * `object_kept` when c's set takes it: docs/protocol.md, "Objects sent
 * once"). */
static int reply_result(st__conn_t *c, uint32_t id, const char *endpoint,
                        const st__build_result_t *r, const st__object_t *obj, int lease,
                        int keep_object, const st__reply_more_t *more,
                        const uint32_t *result_args) {
  st__server_t *srv = c->srv;
  /* An object's arenas, and a key's, may go by id to a client that keeps
   * them mapped from an earlier reply on this connection. */
  int readonly = more && more->readonly;
  int some_readonly = readonly || (more && more->readonly_each);
  int by_id = !some_readonly && (obj != NULL || (more && more->keep_arenas));
  if (r->narenas > ST_MAX_FDS_PER_MESSAGE) {
    char m[200];
    snprintf(m, sizeof m, "%s: the result uses %zu allocations; at most %d fit in one reply",
             endpoint, r->narenas, ST_MAX_FDS_PER_MESSAGE);
    st__conn_send_error(c, id, ST_ERR_LIMIT, m);
    return ST_ERR_LIMIT;
  }
  /* One descriptor per arena that has one: a legacy CUDA IPC arena is
   * described by its handle and takes no slot, a region of the
   * connection's pool by its slab, whose descriptor goes once, and an
   * object's arena this client keeps mapped from an earlier reply on this
   * connection is named by id alone (docs/protocol.md; pool_conn.c,
   * kept.c). Each descriptor keeps its arena alive until the client
   * has read the reply: they count against the connection limits (conn.h)
   * until then. */
  st__pool_reply_t *prp = malloc(sizeof *prp);   /* ~20 KiB: not on the stack */
  if (!prp) {
    st__conn_send_error(c, id, ST_ERR_OUT_OF_MEMORY, "out of memory building a reply");
    return ST_ERR_OUT_OF_MEMORY;
  }
  char why[300];
  int rc = st__pool_reply_prepare(c, r, by_id, prp, why, sizeof why);
  for (size_t i = 0; i < prp->n; i++) {
    prp->readonly[i] = readonly || (more && more->readonly_each && more->readonly_each[i]);
    /* An arena that is one of the request's tensor arguments goes as
     * {arg: i}, no descriptor: the caller holds it (docs/protocol.md,
     * "Tensor arguments"). */
    prp->arg[i] = result_args && !prp->pooled[i] && !prp->own[i] ? result_args[i] : 0;
    if (prp->arg[i]) prp->ref[i] = 1;
  }
  if (rc != ST_OK) {
    free(prp);
    char m[400];
    snprintf(m, sizeof m, "%s: %s", endpoint, why);
    st__conn_send_error(c, id, rc, m);
    return rc;
  }
  int want = 0;
  uint64_t pinned = 0;
  st__pool_reply_count(prp, &want, &pinned);
  if (want > ST_MAX_FDS_PER_MESSAGE ||
      st__conn_reply_room(c, want, pinned, why, sizeof why) != ST_OK) {
    char m[400];
    snprintf(m, sizeof m, "%s: %s", endpoint,
             want > ST_MAX_FDS_PER_MESSAGE ? "too many descriptors for one reply" : why);
    return refuse(c, prp, id, ST_ERR_LIMIT, m);
  }
  int fds[ST_MAX_FDS_PER_MESSAGE];
  int nfds = 0;
  char reason[200] = "";
  int fd = st__pool_reply_fds(c, prp, fds, &nfds, reason, sizeof reason);
  if (fd < 0) {
    for (int k = 0; k < nfds; k++) close(fds[k]);
    char m[300];
    snprintf(m, sizeof m, "%s: cannot make a descriptor for the reply: %s", endpoint,
             reason[0] ? reason : st_strerror(fd));
    ST_LOG_E("call", "%s", m);
    return refuse(c, prp, id, fd, m);
  }
  /* The reply goes out now: an object's arenas sent with a descriptor are
   * remembered for the next replies (listed in `kept`). */
  uint32_t kept[ST_MAX_FDS_PER_MESSAGE];
  uint32_t nkept = 0;
  for (size_t i = 0; by_id && !c->dead && i < prp->n; i++)
    if (!prp->pooled[i] && !prp->ref[i] && st__arena_has_fd(prp->arenas[i]) &&
        st__keptset_add(&c->kept_arenas, st__arena_id(prp->arenas[i])))
      kept[nkept++] = (uint32_t)i;
  int object_kept = keep_object && !c->dead && same_form(obj, lease) &&
                    st__keptset_add(&c->kept_objects, obj->id);
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, id);
  msgpack_pack_map(&pk, 2 + (obj != NULL) + (nkept > 0) + prp->page + object_kept +
                            (more ? more->npairs : 0));
  st__pack_cstr(&pk, "value");
  if (r->value.size) msgpack_sbuffer_write(&sb, r->value.data, r->value.size);
  else msgpack_pack_nil(&pk);
  st__pack_cstr(&pk, "arenas");
  st__pool_reply_pack(c, &pk, prp);
  st__pool_reply_pack_page(c, &pk, prp, (uint32_t)nfds - 1);
  if (nkept) {
    st__pack_cstr(&pk, "kept");
    msgpack_pack_array(&pk, nkept);
    for (uint32_t k = 0; k < nkept; k++) msgpack_pack_uint32(&pk, kept[k]);
  }
  if (obj) {
    st__pack_cstr(&pk, "object");
    pack_object(&pk, srv, obj, lease);
  }
  if (object_kept) st__pack_kv_bool(&pk, "object_kept", 1);
  if (more && more->npairs) more->pack(&pk, more->ud);
  if (!c->dead) st__stats_answered(srv, &c->open, id, ST_OK);
  st__conn_send_pinned(c, &sb, fds, nfds, pinned);
  msgpack_sbuffer_destroy(&sb);
  st__pool_reply_done(c, prp, 1);
  free(prp);
  return ST_OK;
}

/* {value, arenas[, object]} with one descriptor per arena that is not a
 * legacy CUDA IPC arena, in the order of the arenas; see work.h. */
int st__reply_result(st__conn_t *c, uint32_t id, const char *endpoint,
                     const st__build_result_t *r, const st__object_t *obj, int lease) {
  st__prof_begin(ST_PROF_PACK);
  int rc = reply_result(c, id, endpoint, r, obj, lease, 0, NULL, NULL);
  st__prof_end();
  return rc;
}

/* A call's plain result, its arguments' arenas named {arg: i} to a
 * client that asked for it; see work.h. */
int st__reply_call_result(st__conn_t *c, uint32_t id, const char *endpoint,
                          const st__build_result_t *r, const uint32_t *result_args) {
  st__prof_begin(ST_PROF_PACK);
  int rc = reply_result(c, id, endpoint, r, NULL, 0, 0, NULL, c->arg_results ? result_args : NULL);
  st__prof_end();
  return rc;
}

/* A result with more pairs (a published key's); see work.h. */
int st__reply_more(st__conn_t *c, uint32_t id, const char *what, const st__build_result_t *r,
                   const st__reply_more_t *more) {
  st__prof_begin(ST_PROF_PACK);
  int rc = reply_result(c, id, what, r, NULL, 0, 0, more, NULL);
  st__prof_end();
  return rc;
}

/* See work.h. Reads only: either side of the server lock. */
int st__reply_same_for(const st__conn_t *c, const st__object_t *obj, int lease) {
  return same_form(obj, lease) && st__keptset_has(&c->kept_objects, obj->id);
}

/* See work.h. Reads only: either side of the server lock. */
void st__reply_pack_same(msgpack_sbuffer *sb, msgpack_packer *pk, const st__server_t *srv,
                         uint32_t id, const st__object_t *obj, int lease) {
  st__reply_begin(sb, pk, id);
  msgpack_pack_map(pk, 2);
  st__pack_cstr(pk, "object");
  pack_object(pk, srv, obj, lease);
  st__pack_kv_bool(pk, "same", 1);
}

/* A call's reply of obj: {object, same: true} when c's client holds it
 * from an earlier reply on this connection (a managed object's with the
 * lease this reply gives), else in full; see work.h. */
int st__reply_object(st__conn_t *c, uint32_t id, const st__object_t *obj, int lease) {
  st__prof_begin(ST_PROF_PACK);
  int rc = ST_OK;
  if (st__reply_same_for(c, obj, lease)) {
    msgpack_sbuffer sb;
    msgpack_packer pk;
    st__reply_pack_same(&sb, &pk, c->srv, id, obj, lease);
    st__reply_send(c, id, &sb);
  } else {
    rc = reply_result(c, id, obj->endpoint, &obj->result, obj, lease, 1, NULL, NULL);
  }
  st__prof_end();
  return rc;
}

/* A read-only reply of obj; see work.h. */
int st__reply_object_readonly(st__conn_t *c, uint32_t id, const st__object_t *obj, int lease) {
  st__prof_begin(ST_PROF_PACK);
  st__reply_more_t more = {.readonly = 1};
  int rc = reply_result(c, id, obj->endpoint, &obj->result, obj, lease, 0, &more, NULL);
  st__prof_end();
  return rc;
}

/* A call's reply of obj seen through a view; see work.h. */
int st__reply_object_view(st__conn_t *c, uint32_t id, const st__build_result_t *r,
                          const st__object_t *obj, int lease, int readonly) {
  st__prof_begin(ST_PROF_PACK);
  st__reply_more_t more = {.readonly = 1};
  int rc = reply_result(c, id, obj->endpoint, r, obj, lease, 0, readonly ? &more : NULL, NULL);
  st__prof_end();
  return rc;
}

/* A lease whose reply failed goes back; see work.h. */
void st__drop_lease(st__server_t *srv, st__conn_t *c, st__object_t *obj) {
  /* The object is held by its caller (cache, hold or a delivery that
   * collects afterwards), so releasing cannot destroy it under us... */
  st__objects_hold(&srv->objects, obj);
  int released, destroyed;
  uint32_t refcount;
  st__objects_release(&srv->objects, obj->id, c->id, &released, &destroyed, &refcount);
  st__objects_unhold_keep(&srv->objects, obj);   /* ...and the caller collects it when it is done. */
  if (released) {
    c->leases--;
    srv->counters.leases_dropped++;
  }
}
