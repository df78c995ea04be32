/* src/client: what a server sends in full once per connection and names
 * by id alone afterwards (client_internal.h, "kept"): arenas of objects
 * (kept_arenas.c) and whole results of objects (kept_objects.c).
 *
 * The rule both follow (docs/protocol.md, "Arenas sent once"): an entry
 * pins what the server may name by id until the server was told that the
 * client let it go. Telling rides on the connection's next request; the
 * server drops the ids before anything else of that request happens, so
 * only a reply packed before, i.e. the reply of a request in flight, can
 * still name them. So an entry used no more (IDLE) keeps its pin only
 * while a request is in flight (c->in_request: from packing it until its
 * reply's names by id are resolved); once told (TOLD) the entry goes with
 * the reply to the telling request. A reconnect or close empties the
 * tables.
 *
 * Threads: the tables are guarded by the library's process-wide lock
 * (map.c, passed in the ops: this file uses nothing above it); pins are
 * released outside it.
 */
#include <stdlib.h>
#include <string.h>

#include "client/client_internal.h"

/* Pins released per pass: collected under the lock, released after. */
#define DROP_BATCH 64

/* See client_internal.h. Under the lock. */
st__kept_t *st__kept_find(st__kepttab_t *t, uint64_t id) {
  for (size_t i = 0; i < t->n; i++)
    if (t->e[i].id == id) return &t->e[i];
  return NULL;
}

/* See client_internal.h. Under the lock. */
st__kept_t *st__kept_keep(st__kepttab_t *t, uint64_t id, void *pin, void **old) {
  st__kept_t *e = st__kept_find(t, id);
  if (!e) {
    if (t->n == t->cap) {
      size_t cap = t->cap ? t->cap * 2 : 16;
      st__kept_t *p = realloc(t->e, cap * sizeof *p);
      if (!p) return NULL;
      t->e = p;
      t->cap = cap;
    }
    e = &t->e[t->n++];
    memset(e, 0, sizeof *e);
    e->id = id;
  }
  if (e->state == ST__KEPT_IDLE) t->idle--;
  *old = e->pin;
  e->pin = pin;
  e->state = ST__KEPT_USED;
  return e;
}

/* See client_internal.h. Under the lock. */
int st__kept_idle(const st_client_t *c, st__kepttab_t *t, st__kept_t *e) {
  if (e->state != ST__KEPT_USED) return 0;
  e->state = ST__KEPT_IDLE;
  t->idle++;
  if (c->in_request) return 0;
  e->pin = NULL;   /* no reply can name it before the server is told */
  return 1;
}

/* See client_internal.h. Thread of the client. */
int st__kept_params(st_client_t *c, st__kepttab_t *t, const st__kept_ops_t *ops,
                    const char *key, const void *params, size_t len, st__cbuf_t *out) {
  ops->lock();
  c->in_request = 1;   /* until its reply's names by id are resolved */
  size_t n = t->idle;
  uint64_t *ids = n ? malloc(n * sizeof *ids) : NULL;
  if (!ids) {
    ops->unlock();
    return 0;   /* none, or out of memory: the next request tries again */
  }
  size_t got = 0;
  for (size_t i = 0; i < t->n && got < n; i++)
    if (t->e[i].state == ST__KEPT_IDLE) ids[got++] = t->e[i].id;
  int rc = st__client_params_with_ids(params, len, key, ids, got, out);
  if (rc == 0) {
    for (size_t i = 0; i < t->n; i++)
      if (t->e[i].state == ST__KEPT_IDLE) t->e[i].state = ST__KEPT_TOLD;
    t->idle = 0;
  }
  ops->unlock();
  free(ids);
  return rc == 0;
}

/* Size of the msgpack map header at p (len bytes) in *hdr and its count
 * in *count; 0, or -1 when p is not a map. */
static int map_header(const unsigned char *p, size_t len, size_t *hdr, uint32_t *count) {
  if (len >= 1 && p[0] >= 0x80 && p[0] <= 0x8f) {
    *hdr = 1;
    *count = p[0] & 0x0f;
  } else if (len >= 3 && p[0] == 0xde) {
    *hdr = 3;
    *count = (uint32_t)p[1] << 8 | p[2];
  } else if (len >= 5 && p[0] == 0xdf) {
    *hdr = 5;
    *count = (uint32_t)p[1] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 8 | p[4];
  } else {
    return -1;
  }
  return 0;
}

/* See client_internal.h. Any thread. */
int st__client_params_with_ids(const void *params, size_t len, const char *key,
                               const uint64_t *ids, size_t nids, st__cbuf_t *out) {
  static const unsigned char empty_map = 0x80;
  const unsigned char *p = params ? params : &empty_map;
  if (!params) len = 1;
  size_t hdr;
  uint32_t count;
  if (map_header(p, len, &hdr, &count) != 0 || count == UINT32_MAX) return -1;
  msgpack_pack_map(&out->pk, count + 1);
  st__pack_cstr(&out->pk, key);
  msgpack_pack_array(&out->pk, nids);
  for (size_t i = 0; i < nids; i++) msgpack_pack_uint64(&out->pk, ids[i]);
  st__client_cbuf_raw(&out->pk, p + hdr, len - hdr);
  return 0;
}

/* Moves the pins of t's idle entries that nothing else uses into drop (at
 * most max; detached), leaving the entries to be told. Under the lock. */
static size_t let_go_idle(st__kepttab_t *t, const st__kept_ops_t *ops, void **drop, size_t max) {
  size_t n = 0;
  for (size_t i = 0; i < t->n && n < max; i++) {
    st__kept_t *e = &t->e[i];
    if (e->state == ST__KEPT_IDLE && e->pin && ops->unused(e->pin)) {
      void *p = ops->detach(e->pin);
      e->pin = NULL;
      if (p) drop[n++] = p;
    }
  }
  return n;
}

/* Releases n pins. Without the lock. */
static void release_all(const st__kept_ops_t *ops, void **drop, size_t n) {
  for (size_t i = 0; i < n; i++) ops->release(drop[i]);
}

/* See client_internal.h. Thread of the client. */
void st__kept_answered(st_client_t *c, st__kepttab_t *t, const st__kept_ops_t *ops,
                       int names_by_id) {
  void *drop[DROP_BATCH];
  size_t ndrop;
  do {
    ndrop = 0;
    ops->lock();
    size_t keep = 0, i = 0;
    for (; i < t->n && ndrop < DROP_BATCH; i++) {
      st__kept_t *e = &t->e[i];
      if (e->state != ST__KEPT_TOLD) {
        t->e[keep++] = *e;
        continue;
      }
      void *p = e->pin ? ops->detach(e->pin) : NULL;
      if (p) drop[ndrop++] = p;
    }
    /* Entries not looked at this pass keep their order behind. */
    memmove(&t->e[keep], &t->e[i], (t->n - i) * sizeof *t->e);
    t->n = keep + (t->n - i);
    if (ndrop < DROP_BATCH && !names_by_id) {
      c->in_request = 0;
      ndrop += let_go_idle(t, ops, drop + ndrop, DROP_BATCH - ndrop);
    }
    ops->unlock();
    release_all(ops, drop, ndrop);
  } while (ndrop == DROP_BATCH);
}

/* See client_internal.h. Thread of the client. */
void st__kept_resolved(st_client_t *c, st__kepttab_t *t, const st__kept_ops_t *ops) {
  void *drop[DROP_BATCH];
  size_t ndrop;
  do {
    ops->lock();
    c->in_request = 0;
    ndrop = let_go_idle(t, ops, drop, DROP_BATCH);
    ops->unlock();
    release_all(ops, drop, ndrop);
  } while (ndrop == DROP_BATCH);
}

/* See client_internal.h. Thread of the client. */
void st__kept_reset(st__kepttab_t *t, const st__kept_ops_t *ops) {
  ops->lock();
  st__kept_t *old = t->e;
  size_t n = t->n;
  for (size_t i = 0; i < n; i++)
    old[i].pin = old[i].pin ? ops->detach(old[i].pin) : NULL;
  memset(t, 0, sizeof *t);
  ops->unlock();
  for (size_t i = 0; i < n; i++)
    if (old[i].pin) ops->release(old[i].pin);
  free(old);
}
