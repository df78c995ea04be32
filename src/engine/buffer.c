/* src/engine: named buffers and streams (buffer.h). Loop thread only. */
#include "engine/buffer.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/fail.h"
#include "common/log.h"
#include "mem/ledger.h"
#include "st/errors.h"

/* Slots start on a multiple of this: any dtype is aligned, and two slots
 * never share a cache line. */
#define SLOT_ALIGN 256u
#define PAGE_ALIGN 4096u

static uint64_t round_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

static st__buffer_t *first(const st__named_list_t *l) { return (st__buffer_t *)l->head; }
static st__buffer_t *next_of(const st__buffer_t *b) { return (st__buffer_t *)b->named.next; }

static int handles_in(const st__named_list_t *l, uint64_t conn) {
  int n = 0;
  for (const st__buffer_t *b = first(l); b; b = next_of(b))
    for (size_t i = 0; i < b->nhandles; i++) n += b->handles[i].conn == conn;
  return n;
}

/* See buffer.h. Loop thread. */
int st__buffer_conn_handles(const st__buffers_t *t, uint64_t conn) {
  return handles_in(&t->named, conn) + handles_in(&t->unlinked, conn);
}

static int handles_ok(const st__buffers_t *t, uint64_t conn, int max, char *err, size_t errlen) {
  int n = st__buffer_conn_handles(t, conn);
  return st__named_room(n, max, "buffer handles", "max_buffer_handles_per_connection", err,
                        errlen);
}

/* Drops the server's references; the clients' mappings keep the memory. */
static void destroy(st__named_list_t *l, st__buffer_t *b) {
  st__named_release(l, &b->named);
  free(b->handles);
  free(b);
}

/* Adds a handle of `conn`. ST_OK or OUT_OF_MEMORY. */
static int add_handle(st__buffers_t *t, st__buffer_t *b, uint64_t conn, int readonly,
                      st__buffer_handle_t *out, char *err, size_t errlen) {
  if (b->nhandles == b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 4;
    st__buffer_handle_t *h = realloc(b->handles, cap * sizeof *h);
    if (!h) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
    b->handles = h;
    b->cap = cap;
  }
  st__buffer_handle_t *h = &b->handles[b->nhandles++];
  h->id = ++t->next_handle;
  h->conn = conn;
  h->readonly = readonly;
  if (readonly) atomic_fetch_add(&b->page->readonly_handles, 1);
  *out = *h;
  return ST_OK;
}

/* Handle i leaves. When its connection has no read-write handle of b
 * left, a writer lock it held is freed (so a connection that dies in the
 * middle of a write never leaves the lock taken). Destroys an unlinked b
 * whose last handle this was. Returns 1 when b was destroyed. */
static int drop_handle(st__buffers_t *t, st__buffer_t *b, size_t i) {
  st__buffer_handle_t h = b->handles[i];
  b->handles[i] = b->handles[--b->nhandles];
  if (h.readonly) atomic_fetch_sub(&b->page->readonly_handles, 1);
  int writer_left = 0;
  for (size_t k = 0; k < b->nhandles; k++)
    writer_left |= b->handles[k].conn == h.conn && !b->handles[k].readonly;
  if (!writer_left && st__buffer_unlock(b->page, h.conn))
    ST_LOG_I("buffer", "buffer '%s': the writer lock of connection %" PRIu64 " was freed as it "
             "left", b->named.name, h.conn);
  if (b->unlinked && b->nhandles == 0) {
    destroy(&t->unlinked, b);
    return 1;
  }
  return 0;
}

/* The bytes one buffer may hold on `device`: limits.max_buffer_bytes, or
 * when 0 a quarter of that device's memory budget (no cap without a
 * budget). */
static uint64_t buffer_max_bytes(const st__buffer_limits_t *l, int device) {
  if (l->max_bytes) return l->max_bytes;
  st__ledger_stats_t s;
  st__ledger_stats(device, &s);
  return s.budget ? s.budget / 4 : UINT64_MAX;
}

static int check_spec(const st__buffers_t *t, const st__buffer_spec_t *s,
                      const st__buffer_limits_t *l, uint64_t conn, uint64_t *frame_bytes,
                      char *err, size_t errlen) {
  int rc = st__named_check("buffer", s->name, s->name_len, err, errlen);
  if (rc != ST_OK) return rc;
  size_t esize = st_dtype_size(s->dtype);
  if (s->dtype == ST_DTYPE_INVALID || esize == 0)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "'dtype' is not a dtype");
  if (s->ndim < 0 || s->ndim > ST_MAX_NDIM)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "'shape' has %d dimensions; at most %d",
                    s->ndim, ST_MAX_NDIM);
  uint64_t n = esize;
  for (int i = 0; i < s->ndim; i++) {
    if (s->shape[i] <= 0)
      return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                      "'shape' dimension %d is %" PRId64 "; a buffer's dimensions are >= 1", i,
                      s->shape[i]);
    if ((uint64_t)s->shape[i] > (UINT64_C(1) << 48) / n)
      return st__fail(ST_ERR_LIMIT, err, errlen, "'shape' is too large (more than 2^48 bytes)");
    n *= (uint64_t)s->shape[i];
  }
  if (s->slots < 1 || s->slots > ST__BUFFER_MAX_SLOTS)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "'slots' must be 1 to %u",
                    ST__BUFFER_MAX_SLOTS);
  uint64_t total = round_up(n, SLOT_ALIGN) * s->slots, max = buffer_max_bytes(l, s->device);
  if (total > max)
    return st__fail(ST_ERR_LIMIT, err, errlen,
                    "%" PRIu64 " slots of %" PRIu64 " bytes pass limits.max_buffer_bytes = %" PRIu64
                    "%s",
                    s->slots, n, max, l->max_bytes ? "" : " (derived: a quarter of the "
                                                          "device's memory_budget)");
  size_t count = t->named.count + t->unlinked.count;
  if (count >= l->max_buffers)
    return st__fail(ST_ERR_LIMIT, err, errlen,
                    "%zu buffers exist (unlinked ones still open included); 1 more would pass "
                    "limits.max_buffers = %" PRIu64,
                    count, l->max_buffers);
  *frame_bytes = n;
  return handles_ok(t, conn, l->max_handles, err, errlen);
}


/* A buffer of spec s with frames of frame_bytes (slots at SLOT_ALIGN
 * strides), nothing shared yet; NULL when out of memory. Owned by the
 * caller until it joins the table. */
static st__buffer_t *buffer_new(const st__buffer_spec_t *s, uint64_t frame_bytes) {
  st__buffer_t *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  b->dtype = s->dtype;
  b->ndim = s->ndim;
  memcpy(b->shape, s->shape, sizeof b->shape);
  b->slots = (uint32_t)s->slots;
  b->frame_bytes = frame_bytes;
  b->stride = round_up(frame_bytes, SLOT_ALIGN);
  return b;
}
/* See buffer.h. Loop thread. */
int st__buffer_create(st__buffers_t *t, const st__buffer_spec_t *s,
                      const st__buffer_limits_t *l, uint64_t conn, uid_t uid, st__buffer_t **out,
                      st__buffer_handle_t *handle, char *err, size_t errlen) {
  *out = NULL;
  uint64_t frame_bytes = 0;
  int rc = check_spec(t, s, l, conn, &frame_bytes, err, errlen);
  if (rc == ST_OK) rc = st__named_unused(&t->named, "buffer", s->name, s->name_len, err, errlen);
  if (rc != ST_OK) return rc;
  st__buffer_t *b = buffer_new(s, frame_bytes);
  if (!b) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  rc = st__named_init(&b->named, s->name, s->name_len, uid, s->device, b->stride * b->slots,
                      round_up(ST__BUFFER_PAGE_BYTES(b->slots), PAGE_ALIGN), err, errlen);
  if (rc == ST_OK && s->device >= 0 && !st__arena_has_fd(b->named.data))
    rc = st__fail(ST_ERR_CAPABILITY, err, errlen,
                  "CUDA buffers need VMM arenas; this server makes legacy CUDA IPC ones");
  if (rc == ST_OK) {
    if (s->readers) b->named.readers = *s->readers;
    rc = st__named_charge(&b->named, ST__UIDQ_BUFFERS, err, errlen);
  }
  if (rc == ST_OK) {
    b->page = b->named.page;
    b->page->geometry = (st__buffer_geometry_t){ST__BUFFER_MAGIC, ST__BUFFER_VERSION, b->slots,
                                                 0, b->frame_bytes, b->stride};
    rc = add_handle(t, b, conn, 0, handle, err, errlen);
  }
  if (rc != ST_OK) {
    destroy(NULL, b);
    return rc;
  }
  st__named_add(&t->named, &b->named);
  *out = b;
  return ST_OK;
}

/* See buffer.h. Loop thread. */
int st__buffer_restore(st__buffers_t *t, const st__buffer_spec_t *s,
                       const st__buffer_limits_t *l, uid_t uid, st__arena_t *data,
                       st__arena_t *page, st__buffer_t **out, char *err, size_t errlen) {
  *out = NULL;
  uint64_t frame_bytes = 0;
  int rc = check_spec(t, s, l, 0, &frame_bytes, err, errlen);
  if (rc == ST_OK) rc = st__named_unused(&t->named, "buffer", s->name, s->name_len, err, errlen);
  if (rc != ST_OK) return rc;
  uint64_t stride = round_up(frame_bytes, SLOT_ALIGN);
  if (st__arena_device(data) != s->device || st__arena_bytes(data) < stride * s->slots)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "buffer '%.*s': its data arena is not %" PRIu64 " slots of %" PRIu64
                    " bytes on its device", (int)s->name_len, s->name, s->slots, stride);
  st__buffer_t *b = buffer_new(s, frame_bytes);
  if (!b) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  rc = st__named_adopt(&b->named, s->name, s->name_len, uid, data, page,
                       round_up(ST__BUFFER_PAGE_BYTES(b->slots), PAGE_ALIGN), err, errlen);
  if (rc == ST_OK) {
    b->page = b->named.page;
    const st__buffer_geometry_t *g = &b->page->geometry;
    if (g->magic != ST__BUFFER_MAGIC || g->version != ST__BUFFER_VERSION ||
        g->slots != b->slots || g->frame_bytes != b->frame_bytes || g->stride != b->stride)
      rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "buffer '%.*s': its control page describes another buffer",
                    (int)s->name_len, s->name);
  }
  if (rc == ST_OK) {
    if (s->readers) b->named.readers = *s->readers;
    rc = st__named_charge(&b->named, ST__UIDQ_BUFFERS, err, errlen);
  }
  if (rc != ST_OK) {
    destroy(NULL, b);
    return rc;
  }
  uint64_t owner = atomic_load(&b->page->lock);
  if (owner && st__buffer_unlock(b->page, owner))
    ST_LOG_I("buffer", "buffer '%s': the writer lock of connection %" PRIu64 " (before the "
             "restart) was freed", b->named.name, owner);
  atomic_store(&b->page->readonly_handles, 0);
  st__named_add(&t->named, &b->named);
  *out = b;
  return ST_OK;
}

/* See buffer.h. Loop thread. */
int st__buffer_open(st__buffers_t *t, const char *name, size_t name_len, int readonly,
                    int max_handles, uint64_t conn, const st__who_t *who, st__buffer_t **out,
                    st__buffer_handle_t *handle, char *err, size_t errlen) {
  *out = NULL;
  st__named_t *e = NULL;
  int rc = st__named_lookup(&t->named, "buffer", name, name_len, who,
                            readonly ? ST__USE_READ : ST__USE_WRITE, 0, &e, err, errlen);
  st__buffer_t *b = (st__buffer_t *)e;
  if (rc == ST_OK) rc = handles_ok(t, conn, max_handles, err, errlen);
  if (rc == ST_OK) rc = add_handle(t, b, conn, readonly, handle, err, errlen);
  if (rc == ST_OK) *out = b;
  return rc;
}

/* See buffer.h. Loop thread. */
int st__buffer_close(st__buffers_t *t, const char *name, size_t name_len, uint64_t handle,
                     uint64_t conn, char *err, size_t errlen) {
  st__named_list_t *lists[2] = {&t->named, &t->unlinked};
  for (int k = 0; k < 2; k++)
    for (st__buffer_t *b = first(lists[k]); b; b = next_of(b)) {
      if (strlen(b->named.name) != name_len || memcmp(b->named.name, name, name_len))
        continue;
      for (size_t i = 0; i < b->nhandles; i++)
        if (b->handles[i].id == handle && b->handles[i].conn == conn) {
          drop_handle(t, b, i);
          return ST_OK;
        }
    }
  return st__fail(ST_ERR_NOT_FOUND, err, errlen,
                  "this connection has no handle %" PRIu64 " of a buffer named '%.*s'", handle,
                  (int)(name_len > ST__NAME_MAX ? ST__NAME_MAX : name_len), name);
}

/* See buffer.h. Loop thread. */
int st__buffer_unlink(st__buffers_t *t, const char *name, size_t name_len, const st__who_t *who,
                      int force, char *err, size_t errlen) {
  st__named_t *e = NULL;
  int rc = st__named_lookup(&t->named, "buffer", name, name_len, who, ST__USE_REMOVE, force, &e,
                            err, errlen);
  if (rc != ST_OK) return rc;
  st__buffer_t *b = (st__buffer_t *)e;
  /* The page's flag tells the clients; the server trusts only its own. */
  b->unlinked = 1;
  atomic_fetch_or(&b->page->flags, ST__BUFFER_UNLINKED);
  st__named_remove(&t->named, e);   /* out of the names; kept while handles hold it */
  if (b->nhandles == 0) destroy(NULL, b);
  else st__named_add(&t->unlinked, e);
  return ST_OK;
}

/* Closes conn's handles of the buffers of l. */
static void conn_closed_in(st__buffers_t *t, st__named_list_t *l, uint64_t conn) {
  st__buffer_t *b = first(l);
  while (b) {
    st__buffer_t *next = next_of(b);
    for (size_t i = b->nhandles; i-- > 0;)
      if (i < b->nhandles && b->handles[i].conn == conn && drop_handle(t, b, i)) break;
    b = next;
  }
}

/* See buffer.h. Loop thread. */
void st__buffer_conn_closed(st__buffers_t *t, uint64_t conn) {
  conn_closed_in(t, &t->named, conn);
  conn_closed_in(t, &t->unlinked, conn);
}

/* See buffer.h. Loop thread. */
void st__buffer_free_all(st__buffers_t *t) {
  while (first(&t->named)) destroy(&t->named, first(&t->named));
  while (first(&t->unlinked)) destroy(&t->unlinked, first(&t->unlinked));
}
