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
 * When a kept mapping has no reference left but pins (its results were
 * freed, on any thread), its id waits for the connection's next request
 * (params.unmapped); the server drops it before handling that request, so
 * the reply to it and every later one send the arena with a descriptor
 * again. A reply can name an arena by id only while a request of this
 * connection is in flight (from packing it until its reply's arenas are
 * resolved): a pin let go outside that window goes at once, so freed
 * memory is not held while the client is idle; one let go inside it stays
 * until the reply is resolved (or, once the server was told, until the
 * reply to the telling request). A reconnect or close drops every pin.
 *
 * Threads: the tables of every connection are guarded by the library's
 * process-wide lock (map.c); the rest of a connection belongs to its
 * thread, as everywhere in st_client_t.
 */
#include <stdlib.h>
#include <string.h>

#include "client/client_internal.h"

enum { KEPT, IDLE, TOLD };   /* pinned; waiting for `unmapped`; sent in it */

struct st__kept {
  uint64_t id;
  st__mapping_t *m;            /* one pin; NULL once let go (IDLE, TOLD)    */
  st__arena_desc_t d;          /* as received; fd is meaningless            */
  int state;
};

static st_client_t *clients;   /* connections with the feature on */

/* Entry of arena id in c's table, or NULL. Under the lock. */
static struct st__kept *find(st_client_t *c, uint64_t id) {
  for (size_t i = 0; i < c->nkept; i++)
    if (c->kept[i].id == id) return &c->kept[i];
  return NULL;
}

/* See client_internal.h. Thread of the client. */
void st__client_arenarefs_reset(st_client_t *c, int on) {
  st__client_lock();
  for (st_client_t **pp = &clients; *pp; pp = &(*pp)->refs_next) {
    if (*pp == c) {
      *pp = c->refs_next;
      break;
    }
  }
  c->refs_next = NULL;
  struct st__kept *old = c->kept;
  size_t n = c->nkept;
  c->kept = NULL;
  c->nkept = c->kept_cap = c->kept_idle = 0;
  c->in_request = 0;
  c->arena_refs = on;
  if (on) {
    c->refs_next = clients;
    clients = c;
  }
  st__client_unlock();
  for (size_t i = 0; i < n; i++)
    if (old[i].m) st__client_mapping_unpin(old[i].m);
  free(old);
}

/* See client_internal.h. */
int st__client_arenarefs_is_ref(const st_client_t *c, const msgpack_object *a) {
  return c->arena_refs && a->type == MSGPACK_OBJECT_MAP && a->via.map.size == 1 &&
         st__map_get(a, "ref") != NULL;
}

/* See client_internal.h. Thread of the client. */
int st__client_arenarefs_find(st_client_t *c, const msgpack_object *a, st__arena_desc_t *d,
                              st__mapping_t **out) {
  *out = NULL;
  const msgpack_object *ref = st__map_get(a, "ref");
  uint64_t id = ref && ref->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? ref->via.u64 : 0;
  st__client_lock();
  struct st__kept *k = id ? find(c, id) : NULL;
  if (k && k->m) {
    *d = k->d;
    *out = k->m;
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
void st__client_arenarefs_keep(st_client_t *c, const st__arena_desc_t *d, st__mapping_t *m) {
  if (!c->arena_refs) return;
  st__client_lock();
  struct st__kept *k = find(c, d->id);
  if (k) {
    /* Sent with a descriptor again: the server forgot it (it was told),
     * and counts it as mapped once more. */
    if (k->m == m && k->state != TOLD) {
      st__client_unlock();
      return;
    }
  } else if (c->nkept == c->kept_cap) {
    size_t cap = c->kept_cap ? c->kept_cap * 2 : 16;
    struct st__kept *p = realloc(c->kept, cap * sizeof *p);
    if (!p) {
      /* Not pinned: a later {ref} to it fails the call with PROTOCOL. */
      st__client_unlock();
      return;
    }
    c->kept = p;
    c->kept_cap = cap;
  }
  st__mapping_t *old = k ? k->m : NULL;
  if (k && k->state == IDLE) c->kept_idle--;
  if (!k) k = &c->kept[c->nkept++];
  k->id = d->id;
  k->m = m;
  k->d = *d;
  k->state = KEPT;
  st__client_unlock();
  st__client_mapping_ref(m, 1);
  if (old) st__client_mapping_unpin(old);
}

/* See client_internal.h. Under the lock. */
size_t st__client_arenarefs_idle_locked(st__mapping_t *m) {
  size_t dropped = 0;
  for (st_client_t *c = clients; c; c = c->refs_next)
    for (size_t i = 0; i < c->nkept; i++)
      if (c->kept[i].m == m && c->kept[i].state == KEPT) {
        c->kept[i].state = IDLE;
        c->kept_idle++;
        if (!c->in_request) {
          c->kept[i].m = NULL;   /* no reply can name it before it is told */
          dropped++;
        }
      }
  return dropped;
}

/* Lets go of c's pins that wait for `unmapped` and that no result uses;
 * their mappings go into drop (at most max). Under the lock. */
static size_t let_go_idle(st_client_t *c, st__mapping_t **drop, size_t max) {
  size_t n = 0;
  for (size_t i = 0; i < c->nkept && n < max; i++) {
    struct st__kept *k = &c->kept[i];
    if (k->state == IDLE && k->m && st__client_mapping_only_pinned_locked(k->m)) {
      drop[n++] = k->m;
      k->m = NULL;
    }
  }
  return n;
}

/* See client_internal.h. Thread of the client. */
int st__client_arenarefs_params(st_client_t *c, const void *params, size_t len,
                                st__cbuf_t *out) {
  if (!c->arena_refs) return 0;
  st__client_lock();
  c->in_request = 1;   /* until its reply's arenas are resolved */
  size_t n = c->kept_idle;
  uint64_t *ids = n ? malloc(n * sizeof *ids) : NULL;
  if (!ids) {
    st__client_unlock();
    return 0;   /* none, or out of memory: the next request tries again */
  }
  size_t got = 0;
  for (size_t i = 0; i < c->nkept && got < n; i++)
    if (c->kept[i].state == IDLE) ids[got++] = c->kept[i].id;
  int rc = st__client_params_with_ids(params, len, "unmapped", ids, got, out);
  if (rc == 0) {
    for (size_t i = 0; i < c->nkept; i++)
      if (c->kept[i].state == IDLE) c->kept[i].state = TOLD;
    c->kept_idle = 0;
  }
  st__client_unlock();
  free(ids);
  return rc == 0;
}

/* See client_internal.h. Thread of the client. */
void st__client_arenarefs_answered(st_client_t *c, int names_refs) {
  if (!c->arena_refs) return;
  st__mapping_t *drop[64];
  size_t ndrop;
  do {
    ndrop = 0;
    st__client_lock();
    for (size_t i = 0; i < c->nkept && ndrop < 64;) {
      if (c->kept[i].state != TOLD) {
        i++;
        continue;
      }
      if (c->kept[i].m) drop[ndrop++] = c->kept[i].m;
      c->kept[i] = c->kept[--c->nkept];
    }
    if (ndrop < 64 && !names_refs) {
      c->in_request = 0;
      ndrop += let_go_idle(c, drop + ndrop, 64 - ndrop);
    }
    st__client_unlock();
    for (size_t i = 0; i < ndrop; i++) st__client_mapping_unpin(drop[i]);
  } while (ndrop == 64);
}

/* See client_internal.h. Thread of the client. */
void st__client_arenarefs_resolved(st_client_t *c) {
  if (!c->arena_refs) return;
  st__mapping_t *drop[64];
  size_t ndrop;
  do {
    st__client_lock();
    c->in_request = 0;
    ndrop = let_go_idle(c, drop, 64);
    st__client_unlock();
    for (size_t i = 0; i < ndrop; i++) st__client_mapping_unpin(drop[i]);
  } while (ndrop == 64);
}
