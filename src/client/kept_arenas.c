/* src/client: arenas of objects the server sends once per connection
 * (docs/protocol.md, "Arenas sent once").
 *
 * Our hello asks for the feature "arena_refs"; when the server's reply
 * lists it, a reply's `kept` names the arenas (sent with a descriptor) that
 * the server now counts as mapped here, and later replies on the same
 * connection name them as {ref: id} with no descriptor. So the
 * connection pins each kept mapping (one reference of map.c's entry) and
 * keeps its descriptor: a {ref} is answered from this table alone, never
 * from another connection's or the process-wide open-cache, so nothing a
 * server says can reach memory it did not send on this connection.
 *
 * A kept mapping whose results were all freed (on any thread) keeps its
 * pins while it fits the process's bound of kept arenas (map.c's idle
 * list: st_open_cache_keep), so calling the object again costs neither a
 * descriptor nor an export in the server. When the bound needs room (or a
 * mapping may not be kept) its pins are let go: its id waits for the
 * connection's next request
 * (params.unmapped); the server drops it before handling that request, so
 * the reply to it and every later one send the arena with a descriptor
 * again. A reply can name an arena by id only while a request of this
 * connection is in flight (from packing it until its reply's arenas are
 * resolved): a pin let go outside that window goes at once, so freed
 * memory is not held while the client is idle; one let go inside it stays
 * until the reply is resolved (or, once the server was told, until the
 * reply to the telling request). A reconnect or close drops every pin.
 *
 * The table and its window are kept.c's, shared with kept_objects.c.
 *
 * Threads: the tables of every connection are guarded by the library's
 * process-wide lock (map.c); the rest of a connection belongs to its
 * thread, as everywhere in st_client_t.
 */
#include "client/client_internal.h"

static st_client_t *clients;   /* connections with the feature on */

/* A kept arena's pin is one pin of its mapping (map.c). */
static int mapping_unused(void *m) { return st__client_mapping_only_pinned_locked(m); }
static void *mapping_detach(void *m) { return m; }
static void mapping_unpin(void *m) { st__client_mapping_unpin(m); }
static const st__kept_ops_t ops = {st__client_lock, st__client_unlock, mapping_unused, mapping_detach, mapping_unpin};

/* See client_internal.h. Thread of the client. */
void st__client_kept_arenas_reset(st_client_t *c, int on) {
  st__client_lock();
  for (st_client_t **pp = &clients; *pp; pp = &(*pp)->kept_next) {
    if (*pp == c) {
      *pp = c->kept_next;
      break;
    }
  }
  c->kept_next = NULL;
  c->in_request = 0;
  c->arena_refs = on;
  if (on) {
    c->kept_next = clients;
    clients = c;
  }
  st__client_unlock();
  st__kept_reset(&c->kept_arenas, &ops);
}

/* See client_internal.h. */
int st__client_kept_arenas_is_ref(const st_client_t *c, const msgpack_object *a) {
  return c->arena_refs && a->type == MSGPACK_OBJECT_MAP && a->via.map.size == 1 &&
         st__map_get(a, "ref") != NULL;
}

/* See client_internal.h. Thread of the client. */
int st__client_kept_arenas_find(st_client_t *c, const msgpack_object *a, st__arena_desc_t *d,
                              st__mapping_t **out) {
  *out = NULL;
  const msgpack_object *ref = st__map_get(a, "ref");
  uint64_t id = ref && ref->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? ref->via.u64 : 0;
  st__client_lock();
  st__kept_t *k = id ? st__kept_find(&c->kept_arenas, id) : NULL;
  if (k && k->pin) {
    *d = k->d;
    *out = k->pin;
  }
  st__client_unlock();
  if (!*out)
    return st__client_fail(c, ST_ERR_PROTOCOL,
                           "the reply names arena %llu by id, but it was not sent on this "
                           "connection with 'kept' (or this client let it go)",
                           (unsigned long long)id);
  /* The pin keeps the mapping alive, so taking a reference is safe. */
  st__client_mapping_ref(*out, 0);
  return ST_OK;
}

/* See client_internal.h. Thread of the client. */
void st__client_kept_arenas_keep(st_client_t *c, const st__arena_desc_t *d, st__mapping_t *m) {
  if (!c->arena_refs) return;
  st__client_lock();
  st__kept_t *k = st__kept_find(&c->kept_arenas, d->id);
  /* Sent with a descriptor again while pinned: nothing changes. (After
   * the server was told, it counts it as mapped once more.) */
  if (k && k->pin == m && k->state != ST__KEPT_TOLD) {
    st__client_unlock();
    return;
  }
  void *old = NULL;
  k = st__kept_keep(&c->kept_arenas, d->id, m, &old);
  if (k) k->d = *d;
  st__client_unlock();
  /* Out of memory: not pinned; a later {ref} to it fails the call with
   * PROTOCOL. */
  if (!k) return;
  st__client_mapping_ref(m, 1);
  if (old) st__client_mapping_unpin(old);
}

/* See client_internal.h. Under the lock. */
size_t st__client_kept_arenas_idle_locked(st__mapping_t *m) {
  size_t dropped = 0;
  for (st_client_t *c = clients; c; c = c->kept_next)
    for (size_t i = 0; i < c->kept_arenas.n; i++)
      if (c->kept_arenas.e[i].pin == m)
        dropped += (size_t)st__kept_idle(c, &c->kept_arenas, &c->kept_arenas.e[i]);
  return dropped;
}

/* See client_internal.h. Thread of the client. */
int st__client_kept_arenas_params(st_client_t *c, const void *params, size_t len,
                                st__cbuf_t *out) {
  if (!c->arena_refs) return 0;
  return st__kept_params(c, &c->kept_arenas, &ops, "unmapped", params, len, out);
}

/* See client_internal.h. Thread of the client. */
void st__client_kept_arenas_answered(st_client_t *c, int names_refs) {
  if (c->arena_refs) st__kept_answered(c, &c->kept_arenas, &ops, names_refs);
}

/* See client_internal.h. Thread of the client. */
void st__client_kept_arenas_resolved(st_client_t *c) {
  if (c->arena_refs) st__kept_resolved(c, &c->kept_arenas, &ops);
}
