/* src/engine: named hand-offs (handoff.h). Loop thread only. */
#include "engine/handoff.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/fail.h"
#include "engine/named.h"
#include "st/errors.h"

/* Chunks start on their own page: a CPU chunk never shares a page with
 * its neighbour, and CUDA chunks stay aligned for any dtype. */
#define CHUNK_ALIGN 4096u
/* chunk_bytes at most this (the arena cap and the budget bound the total). */
#define MAX_CHUNK_BYTES (UINT64_C(1) << 40)

static st__handoff_t *first(const st__handoffs_t *t) { return (st__handoff_t *)t->list.head; }
static st__handoff_t *next_of(const st__handoff_t *h) { return (st__handoff_t *)h->named.next; }

static int attached(const st__handoff_t *h, uint64_t conn) {
  if (h->producer == conn) return 1;
  for (uint32_t i = 0; i < h->consumers; i++)
    if (h->slots[i] == conn) return 1;
  return 0;
}

/* See handoff.h. Loop thread. */
int st__handoff_conn_count(const st__handoffs_t *t, uint64_t conn) {
  int n = 0;
  for (const st__handoff_t *h = first(t); h; h = next_of(h)) n += attached(h, conn);
  return n;
}

static int count_ok(const st__handoffs_t *t, uint64_t conn, int max, char *err, size_t errlen) {
  return st__named_room(st__handoff_conn_count(t, conn), max, "hand-offs", "max_handoffs_per_connection", err,
                        errlen);
}

/* Drops the server's references; the clients' mappings keep the memory. */
static void destroy(st__handoffs_t *t, st__handoff_t *h) {
  st__named_release(&t->list, &h->named);
  free(h);
}

/* Consumer slot i left: it owes no acknowledgement any more. `expected`
 * first, then the chunks: a publish that read the old `expected` either
 * lands before this sweep (cleared here) or re-reads `expected` after its
 * own swap and clears the bit itself (client/handoff.c). */
static void sweep_slot(st__handoff_t *h, uint32_t i) {
  st__handoff_page_t *p = h->page;
  uint32_t bit = 1u << i;
  atomic_fetch_and(&p->expected, ~bit);
  int any_freed = 0;
  for (uint32_t k = 0; k < h->chunks; k++) {
    int freed;
    if (st__handoff_clear(p, k, bit, 0, 1, &freed) == 1 && freed) any_freed = 1;
  }
  if (any_freed) st__shm_notify(&p->free_futex, &p->free_waiters);
}

static int in_use(const st__handoff_t *h) {
  if (h->producer) return 1;
  for (uint32_t i = 0; i < h->consumers; i++)
    if (h->slots[i]) return 1;
  return 0;
}

/* Detaches conn; destroys h when nobody is left. Returns 1 when it was
 * attached. */
static int detach(st__handoffs_t *t, st__handoff_t *h, uint64_t conn) {
  int was = 0;
  if (h->producer == conn) {
    h->producer = 0;
    st__handoff_producer_gone(h);
    was = 1;
  }
  for (uint32_t i = 0; i < h->consumers; i++) {
    if (h->slots[i] != conn) continue;
    h->slots[i] = 0;
    sweep_slot(h, i);
    was = 1;
  }
  if (was && !in_use(h)) destroy(t, h);
  return was;
}

static int check_spec(const st__handoffs_t *t, const st__handoff_spec_t *s, uint64_t conn,
                      char *err, size_t errlen) {
  int rc = s->mirror ? ST_OK : st__named_check("hand-off", s->name, s->name_len, err, errlen);
  if (rc != ST_OK) return rc;
  if (s->chunk_bytes == 0 || s->chunk_bytes > MAX_CHUNK_BYTES)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "'chunk_bytes' must be 1 to %" PRIu64, MAX_CHUNK_BYTES);
  if (s->chunks == 0)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "'chunks' must be at least 1");
  if (s->chunks > s->max_chunks)
    return st__fail(ST_ERR_LIMIT, err, errlen,
                    "%" PRIu64 " chunks pass limits.max_handoff_chunks = %" PRIu64, s->chunks,
                    s->max_chunks);
  if (s->consumers == 0 || s->consumers > ST__HANDOFF_MAX_CONSUMERS)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "'consumers' must be 1 to %u",
                    ST__HANDOFF_MAX_CONSUMERS);
  return count_ok(t, conn, s->max_per_connection, err, errlen);
}

static void page_init(st__handoff_t *h) {
  st__handoff_page_t *p = h->page;
  p->magic = ST__HANDOFF_MAGIC;
  p->version = ST__HANDOFF_VERSION;
  p->chunks = h->chunks;
  p->consumers = h->consumers;
  p->chunk_bytes = h->chunk_bytes;
  p->stride = h->stride;
  /* Every slot counts from the start: a publish made before a consumer
   * opened waits for it. */
  atomic_store(&p->expected, h->consumers >= 32 ? ST__HANDOFF_MASK : (1u << h->consumers) - 1u);
}

/* See handoff.h. Loop thread. */
int st__handoff_create(st__handoffs_t *t, const st__handoff_spec_t *s, uint64_t conn, uid_t uid,
                       st__handoff_t **out, char *err, size_t errlen) {
  *out = NULL;
  int rc = check_spec(t, s, conn, err, errlen);
  if (rc == ST_OK) rc = st__named_unused(&t->list, "hand-off", s->name, s->name_len, err, errlen);
  if (rc != ST_OK) return rc;
  st__handoff_t *h = calloc(1, sizeof *h);
  if (!h) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  h->chunk_bytes = s->chunk_bytes;
  h->stride = (s->chunk_bytes + CHUNK_ALIGN - 1) / CHUNK_ALIGN * CHUNK_ALIGN;
  h->chunks = (uint32_t)s->chunks;
  h->consumers = (uint32_t)s->consumers;
  uint64_t page_bytes =
      (st__handoff_page_bytes(h->chunks) + CHUNK_ALIGN - 1) / CHUNK_ALIGN * CHUNK_ALIGN;
  rc = st__named_init(&h->named, s->name, s->name_len, uid, s->device, h->stride * h->chunks,
                      page_bytes, err, errlen);
  if (rc != ST_OK) {
    free(h);
    return rc;
  }
  if (s->readers) h->named.readers = *s->readers;
  rc = st__named_charge(&h->named, ST__UIDQ_HANDOFFS, err, errlen);
  if (rc != ST_OK) {
    st__named_release(NULL, &h->named);
    free(h);
    return rc;
  }
  h->page = h->named.page;
  page_init(h);
  h->producer = conn;
  h->serial = ++t->serials;
  st__named_add(&t->list, &h->named);
  *out = h;
  return ST_OK;
}

/* The hand-off `name` that who wants to `use` (named.h). */
static int lookup(st__handoffs_t *t, const char *name, size_t n, const st__who_t *who,
                  st__use_t use, int force, st__handoff_t **out, char *err, size_t errlen) {
  st__named_t *e = NULL;
  int rc = st__named_lookup(&t->list, "hand-off", name, n, who, use, force, &e, err, errlen);
  *out = (st__handoff_t *)e;
  return rc;
}

/* See handoff.h. Loop thread. */
int st__handoff_open(st__handoffs_t *t, const char *name, size_t name_len, uint64_t conn,
                     const st__who_t *who, int max_per_connection, st__handoff_t **out,
                     uint32_t *slot, char *err, size_t errlen) {
  *out = NULL;
  st__handoff_t *h = NULL;
  int rc = lookup(t, name, name_len, who, ST__USE_READ, 0, &h, err, errlen);
  if (rc != ST_OK) return rc;
  if (attached(h, conn))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "this connection already uses hand-off '%s'", h->named.name);
  rc = count_ok(t, conn, max_per_connection, err, errlen);
  if (rc != ST_OK) return rc;
  for (uint32_t i = 0; i < h->consumers; i++) {
    if (h->slots[i]) continue;
    /* A slot never opened has counted since creation: what was
     * published before this open waits for this consumer (its bit is
     * still pending). A slot used before left and was swept: any
     * publish that raced with that sweep is swept again before the
     * slot counts once more, from now on. */
    if (h->used & (1u << i)) {
      sweep_slot(h, i);
      atomic_fetch_or(&h->page->expected, 1u << i);
    }
    h->used |= 1u << i;
    h->slots[i] = conn;
    *out = h;
    *slot = i;
    return ST_OK;
  }
  return st__fail(ST_ERR_LIMIT, err, errlen,
                  "hand-off '%s' has %u consumer slots and all are open (its 'consumers')",
                  h->named.name, h->consumers);
}

/* See handoff.h. Loop thread. */
int st__handoff_close(st__handoffs_t *t, const char *name, size_t name_len, uint64_t conn,
                      char *err, size_t errlen) {
  st__handoff_t *h = (st__handoff_t *)st__named_find(&t->list, name, name_len);
  if (!h || !detach(t, h, conn))
    return st__fail(ST_ERR_NOT_FOUND, err, errlen, "this connection does not use a hand-off "
                    "named '%.*s'", (int)name_len, name);
  return ST_OK;
}

/* See handoff.h. Loop thread. */
int st__handoff_delete(st__handoffs_t *t, const char *name, size_t name_len,
                       const st__who_t *who, int force, char *err, size_t errlen) {
  st__handoff_t *h = NULL;
  int rc = lookup(t, name, name_len, who, ST__USE_REMOVE, force, &h, err, errlen);
  if (rc != ST_OK) return rc;
  atomic_fetch_or(&h->page->flags, ST__HANDOFF_DELETED);
  st__shm_notify(&h->page->pub_futex, &h->page->pub_waiters);
  st__shm_notify(&h->page->free_futex, &h->page->free_waiters);
  destroy(t, h);
  return ST_OK;
}

/* See handoff.h. Loop thread. */
st__handoff_t *st__handoff_find(const st__handoffs_t *t, const char *name, uint64_t serial) {
  st__handoff_t *h = (st__handoff_t *)st__named_find(&t->list, name, strlen(name));
  return h && (!serial || h->serial == serial) ? h : NULL;
}

/* See handoff.h. */
void st__handoff_producer_gone(st__handoff_t *h) {
  atomic_fetch_or(&h->page->flags, ST__HANDOFF_PRODUCER_GONE);
  st__shm_notify(&h->page->pub_futex, &h->page->pub_waiters);
}

/* See handoff.h. */
int st__handoff_has_consumers(const st__handoff_t *h) {
  for (uint32_t i = 0; i < h->consumers; i++)
    if (h->slots[i]) return 1;
  return 0;
}

/* See handoff.h. Loop thread. */
void st__handoff_conn_closed(st__handoffs_t *t, uint64_t conn) {
  st__handoff_t *h = first(t);
  while (h) {
    st__handoff_t *next = next_of(h);
    detach(t, h, conn);
    h = next;
  }
}

/* See handoff.h. Loop thread. */
void st__handoff_free_all(st__handoffs_t *t) {
  while (first(t)) destroy(t, first(t));
}
