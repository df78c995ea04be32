/* src/client: whole results of objects the server sends once per
 * connection (docs/protocol.md, "Objects sent once").
 *
 * Our hello asks for the feature "object_refs" (unless
 * $ST_CLIENT_KEEP_OBJECTS is 0). A call's reply that carries a cached
 * object in full may say `object_kept`: the server now counts the object
 * as held by this connection, and a later call of it on the same
 * connection is answered {object, same: true}, with no value and no
 * arenas (for a managed object: with the lease that reply gives and the
 * refcount after it, which the kept result then says). So the connection keeps the decoded result of each such reply
 * (st_result_t, which is reference counted) while its user holds it, and
 * a `same` reply is one more reference to it: no descriptor, no decode.
 * A `same` is answered from this connection's table alone: an id it does
 * not hold is PROTOCOL. A caller may have that reference lent rather than
 * given (ST_CALL_LEND_SAME): the connection drops it when its next
 * request starts, before that request's `objects_freed` is packed, so a
 * lent result its user let go is told at once.
 *
 * A kept result counts its references under the library's lock
 * (st_result_ref, st_result_free): when the last user reference goes, its
 * id waits for the connection's next request (params.objects_freed) and
 * the result is freed at once, unless a request is in flight (its reply
 * may say `same` still): then the table holds it (extra_refs -1, "parked")
 * until the request is over, and a `same` in that window revives it
 * (kept.c's rule, shared with kept_arenas.c). At most
 * $ST_CLIENT_KEEP_OBJECTS (default 1024) results per connection are kept:
 * a new one lets the oldest go (it stays valid for its user; the server is
 * told). A reconnect or close lets every one go.
 *
 * Threads: the tables and the references of kept results are guarded by
 * the library's process-wide lock (map.c); results are freed outside it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_internal.h"
#include "client/result.h"

#define KEEP_OBJECTS_DEFAULT 1024

/* A kept result is the table's pin: parked when only the table holds it. */
static int parked(void *r) { return ((st_result_t *)r)->extra_refs < 0; }
static void *detach(void *p) {
  st_result_t *r = p;
  r->keeper = NULL;   /* its user's last free frees it */
  return r->extra_refs < 0 ? r : NULL;
}
static void destroy(void *r) { st__client_result_destroy(r); }
static const st__kept_ops_t ops = {st__client_lock, st__client_unlock, parked, detach, destroy};

/* See client_internal.h. Any thread. */
size_t st__client_kept_objects_max(void) {
  const char *e = getenv("ST_CLIENT_KEEP_OBJECTS");
  return e && *e ? (size_t)strtoull(e, NULL, 10) : KEEP_OBJECTS_DEFAULT;
}

/* See client_internal.h. Thread of the client. */
void st__client_kept_objects_request(st_client_t *c) {
  st_result_t *r = c->lent;
  c->lent = NULL;
  c->reply_same = 0;
  st_result_free(r);
}

/* See client_internal.h. Thread of the client. */
void st__client_kept_objects_lend(st_client_t *c, st_result_t *r) {
  st_result_t *old = c->lent;   /* NULL: the request started by dropping it */
  c->lent = r;
  st_result_free(old);
}

/* See client_internal.h. Thread of the client. */
void st__client_kept_objects_reset(st_client_t *c, int on) {
  st__client_kept_objects_request(c);
  st__kept_reset(&c->kept_objects, &ops);
  c->object_refs = on;
}

/* Lets the oldest result that its user holds go when c keeps its bound
 * already: the entry waits to be told. Under the lock. */
static void make_room(st_client_t *c) {
  st__kepttab_t *t = &c->kept_objects;
  size_t pinned = 0;
  for (size_t i = 0; i < t->n; i++) pinned += t->e[i].pin != NULL;
  for (size_t i = 0; i < t->n && pinned >= c->objects_max; i++) {
    st__kept_t *e = &t->e[i];
    if (e->state != ST__KEPT_USED || !e->pin) continue;
    ((st_result_t *)e->pin)->keeper = NULL;   /* held by its user: not parked */
    e->pin = NULL;
    e->state = ST__KEPT_IDLE;
    t->idle++;
    pinned--;
  }
}

/* See client_internal.h. Thread of the client. */
void st__client_kept_objects_keep(st_client_t *c, st_result_t *r) {
  if (!c->object_refs) return;
  st__client_lock();
  make_room(c);
  void *old = NULL;
  st__kept_t *e = st__kept_keep(&c->kept_objects, r->object.id, r, &old);
  if (e) {
    r->kept = 1;
    r->keeper = c;
  }
  /* Sent in full again after the server was told: the old result is its
   * user's alone now. */
  old = old ? detach(old) : NULL;
  st__client_unlock();
  if (old) destroy(old);
  /* Out of memory: not kept; a later `same` fails the call with PROTOCOL. */
}

/* Whether object map o (a reply's) says what r's object says: all of
 * it, but for a managed object's refcount, which each reply gives anew
 * (each gives a lease: `lease` is true in every one). Its refcount, or
 * -1 when it does not match. */
static int64_t same_header(const msgpack_object *o, const st_result_t *r) {
  const st_object_info_t *i = &r->object;
  const msgpack_object *sid = st__map_get(o, "server_id");
  const msgpack_object *key = st__map_get(o, "cache_key");
  const msgpack_object *refcount = st__map_get(o, "refcount");
  const msgpack_object *bytes = st__map_get(o, "bytes");
  const msgpack_object *cached = st__map_get(o, "cached");
  const msgpack_object *managed = st__map_get(o, "managed");
  const msgpack_object *lease = st__map_get(o, "lease");
  int ok = (sid ? st__str_eq(sid, i->server_id) : !strcmp(i->server_id, r->server_id)) &&
           (key && key->type != MSGPACK_OBJECT_NIL ? st__str_eq(key, i->cache_key)
                                                   : !*i->cache_key) &&
           st__str_eq(st__map_get(o, "device"), i->device) && refcount &&
           refcount->type == MSGPACK_OBJECT_POSITIVE_INTEGER && refcount->via.u64 <= INT64_MAX &&
           bytes && bytes->type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
           bytes->via.u64 == i->bytes && cached && cached->type == MSGPACK_OBJECT_BOOLEAN &&
           cached->via.boolean == i->cached && managed &&
           managed->type == MSGPACK_OBJECT_BOOLEAN && managed->via.boolean == i->managed &&
           lease && lease->type == MSGPACK_OBJECT_BOOLEAN && lease->via.boolean == i->lease;
  if (!ok) return -1;
  if (i->managed) return i->lease && refcount->via.u64 >= 1 ? (int64_t)refcount->via.u64 : -1;
  return refcount->via.u64 == (uint64_t)i->refcount ? i->refcount : -1;
}

/* See client_internal.h. Thread of the client. */
int st__client_kept_objects_same(st_client_t *c, const msgpack_object *result, st_result_t **out) {
  *out = NULL;
  const msgpack_object *o = st__map_get(result, "object");
  const msgpack_object *idv = o ? st__map_get(o, "id") : NULL;
  uint64_t id = idv && idv->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? idv->via.u64 : 0;
  int differs = 0;
  st__client_lock();
  st__kept_t *e = c->object_refs && id ? st__kept_find(&c->kept_objects, id) : NULL;
  st_result_t *r = e ? e->pin : NULL;
  int64_t refcount = r ? same_header(o, r) : -1;
  if (r && refcount < 0) {
    differs = 1;
  } else if (r) {
    /* A managed object's reply gave one more lease: the result says the
     * refcount after the latest reply (atomic: other holders may read it). */
    __atomic_store_n(&r->object.refcount, refcount, __ATOMIC_RELAXED);
    if (r->extra_refs < 0) r->extra_refs = 0;   /* parked: its user's again */
    else r->extra_refs++;
    if (e->state == ST__KEPT_IDLE) {
      e->state = ST__KEPT_USED;
      c->kept_objects.idle--;
    }
    *out = r;
  }
  st__client_unlock();
  if (*out) {
    c->reply_same = 1;
    return ST_OK;
  }
  if (differs)
    return st__client_fail(c, ST_ERR_PROTOCOL,
                           "the reply says object %llu is the same as before, but its object "
                           "map differs from the one this connection received",
                           (unsigned long long)id);
  return st__client_fail(c, ST_ERR_PROTOCOL,
                         "the reply says object %llu is the same as before, but it was not sent "
                         "on this connection with 'object_kept' (or this client let it go)",
                         (unsigned long long)id);
}

/* See client_internal.h. Any thread. */
void st__client_kept_objects_ref(st_result_t *r) {
  st__client_lock();
  r->extra_refs++;
  st__client_unlock();
}

/* See client_internal.h. Any thread. */
int st__client_kept_objects_unref(st_result_t *r) {
  st__client_lock();
  if (r->extra_refs > 0) {
    r->extra_refs--;
    st__client_unlock();
    return 0;
  }
  int free_now = 1;
  st_client_t *c = r->keeper;
  st__kept_t *e = c ? st__kept_find(&c->kept_objects, r->object.id) : NULL;
  if (e && e->pin == r) {
    if (e->state == ST__KEPT_USED && st__kept_idle(c, &c->kept_objects, e)) {
      r->keeper = NULL;
    } else {
      r->extra_refs = -1;   /* a reply in flight may still say `same` */
      free_now = 0;
    }
  } else {
    r->keeper = NULL;
  }
  st__client_unlock();
  return free_now;
}

/* See client_internal.h. Thread of the client. */
int st__client_kept_objects_params(st_client_t *c, const void *params, size_t len,
                              st__cbuf_t *out) {
  if (!c->object_refs) return 0;
  return st__kept_params(c, &c->kept_objects, &ops, "objects_freed", params, len, out);
}

/* See client_internal.h. Thread of the client. */
void st__client_kept_objects_resolved(st_client_t *c) {
  if (c->object_refs) st__kept_resolved(c, &c->kept_objects, &ops);
}

/* See client_internal.h. Thread of the client. */
void st__client_kept_objects_answered(st_client_t *c, int names_by_id) {
  if (c->object_refs) st__kept_answered(c, &c->kept_objects, &ops, names_by_id);
}
