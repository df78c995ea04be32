/* src/mem: the slab allocator and slot table (contracts in slab_alloc.h). */
#include "mem/slab_alloc.h"

#include <stdlib.h>
#include <string.h>

#include "st/errors.h"

static uint64_t pages_of(uint64_t bytes) {
  return bytes ? (bytes + ST__SLAB_PAGE - 1) / ST__SLAB_PAGE : 1;
}

/* Marks pages [off, off + len) handed out (v 1) or free (v 0). */
static void mark(st__slab_alloc_t *s, uint64_t off, uint64_t len, int v) {
  for (uint64_t p = off / ST__SLAB_PAGE; p < (off + len) / ST__SLAB_PAGE; p++) {
    if (v) s->pages[p / 8] |= (uint8_t)(1u << (p % 8));
    else s->pages[p / 8] &= (uint8_t)~(1u << (p % 8));
  }
}

int st__slab_alloc_init(st__slab_alloc_t *s, uint64_t size) {
  memset(s, 0, sizeof *s);
  uint64_t npages = size / ST__SLAB_PAGE;
  if (npages == 0) npages = 1;
  s->size = npages * ST__SLAB_PAGE;
  s->pages = calloc((size_t)(npages + 7) / 8, 1);
  s->free = malloc(8 * sizeof *s->free);
  if (!s->pages || !s->free) {
    st__slab_alloc_destroy(s);
    return ST_ERR_OUT_OF_MEMORY;
  }
  s->cap = 8;
  s->free[0] = (st__slab_block_t){0, s->size};
  s->nfree = 1;
  s->free_bytes = s->size;
  return ST_OK;
}

void st__slab_alloc_destroy(st__slab_alloc_t *s) {
  free(s->free);
  free(s->pages);
  memset(s, 0, sizeof *s);
}

int st__slab_alloc_take(st__slab_alloc_t *s, uint64_t bytes, uint64_t *off, uint64_t *len) {
  if (bytes > s->size) return ST_ERR_OUT_OF_MEMORY;
  uint64_t want = pages_of(bytes) * ST__SLAB_PAGE;
  size_t best = s->nfree;
  for (size_t i = 0; i < s->nfree; i++) {
    if (s->free[i].len < want) continue;
    if (best == s->nfree || s->free[i].len < s->free[best].len) best = i;
    if (s->free[i].len == want) break;
  }
  if (best == s->nfree) return ST_ERR_OUT_OF_MEMORY;
  st__slab_block_t *b = &s->free[best];
  *off = b->off;
  *len = want;
  b->off += want;
  b->len -= want;
  if (b->len == 0) {
    memmove(b, b + 1, (s->nfree - best - 1) * sizeof *b);
    s->nfree--;
  }
  s->free_bytes -= want;
  mark(s, *off, want, 1);
  return ST_OK;
}

int st__slab_alloc_held(const st__slab_alloc_t *s, uint64_t off, uint64_t len) {
  uint64_t held = 0, n = len / ST__SLAB_PAGE;
  for (uint64_t p = off / ST__SLAB_PAGE; p < (off + len) / ST__SLAB_PAGE; p++)
    held += (s->pages[p / 8] >> (p % 8)) & 1u;
  return held == n ? 1 : held == 0 ? 0 : -1;
}

int st__slab_alloc_give(st__slab_alloc_t *s, uint64_t off, uint64_t len) {
  if (len == 0 || off % ST__SLAB_PAGE || len % ST__SLAB_PAGE || off > s->size ||
      len > s->size - off || st__slab_alloc_held(s, off, len) != 1)
    return ST_ERR_INVALID_ARGUMENT;
  /* The first free block after the range. */
  size_t i = 0;
  while (i < s->nfree && s->free[i].off < off) i++;
  int left = i > 0 && s->free[i - 1].off + s->free[i - 1].len == off;
  int right = i < s->nfree && off + len == s->free[i].off;
  if (left && right) {
    s->free[i - 1].len += len + s->free[i].len;
    memmove(&s->free[i], &s->free[i + 1], (s->nfree - i - 1) * sizeof *s->free);
    s->nfree--;
  } else if (left) {
    s->free[i - 1].len += len;
  } else if (right) {
    s->free[i].off = off;
    s->free[i].len += len;
  } else {
    if (s->nfree == s->cap) {
      st__slab_block_t *g = realloc(s->free, 2 * s->cap * sizeof *g);
      if (!g) return ST_ERR_OUT_OF_MEMORY;
      s->free = g;
      s->cap *= 2;
    }
    memmove(&s->free[i + 1], &s->free[i], (s->nfree - i) * sizeof *s->free);
    s->free[i] = (st__slab_block_t){off, len};
    s->nfree++;
  }
  s->free_bytes += len;
  mark(s, off, len, 0);
  return ST_OK;
}

/* ------------------------------------------------------------ slots */

int st__slots_init(st__slots_t *t, uint32_t n) {
  memset(t, 0, sizeof *t);
  t->slot = calloc(n ? n : 1, sizeof *t->slot);
  t->free_ids = malloc((n ? n : 1) * sizeof *t->free_ids);
  if (!t->slot || !t->free_ids) {
    st__slots_destroy(t);
    return ST_ERR_OUT_OF_MEMORY;
  }
  t->n = n;
  for (uint32_t i = 0; i < n; i++) {
    t->slot[i].gen = 1;
    t->free_ids[i] = n - 1 - i;   /* slot 0 is taken first */
  }
  t->nfree = n;
  return ST_OK;
}

void st__slots_destroy(st__slots_t *t) {
  free(t->slot);
  free(t->free_ids);
  memset(t, 0, sizeof *t);
}

int64_t st__slots_take(st__slots_t *t, uint32_t slab, uint64_t off, uint64_t len) {
  if (t->nfree == 0) return -1;
  uint32_t i = t->free_ids[--t->nfree];
  st__slot_t *s = &t->slot[i];
  s->live = 1;
  s->handed = s->server_done = s->client_freed = 0;
  s->slab = slab;
  s->off = off;
  s->len = len;
  return i;
}

void st__slots_hand_out(st__slots_t *t, uint32_t i) {
  if (i < t->n && t->slot[i].live) t->slot[i].handed = 1;
}

int st__slots_server_done(st__slots_t *t, uint32_t i) {
  if (i >= t->n || !t->slot[i].live) return 0;
  st__slot_t *s = &t->slot[i];
  s->server_done = 1;
  return !s->handed || s->client_freed;
}

uint32_t st__slots_scan(st__slots_t *t, const _Atomic uint32_t *freed, uint32_t freed_count,
                        uint32_t *out) {
  if (freed_count == t->seen_count) return 0;
  t->seen_count = freed_count;
  uint32_t n = 0;
  for (uint32_t i = 0; i < t->n; i++) {
    st__slot_t *s = &t->slot[i];
    if (!s->live || !s->handed || s->client_freed) continue;
    if (atomic_load_explicit(&freed[i], memory_order_acquire) != s->gen) continue;
    s->client_freed = 1;
    if (s->server_done) out[n++] = i;
  }
  return n;
}

void st__slots_release(st__slots_t *t, uint32_t i) {
  if (i >= t->n || !t->slot[i].live) return;
  st__slot_t *s = &t->slot[i];
  s->live = 0;
  if (++s->gen == 0) s->gen = 1;   /* 0 never matches: a zeroed page frees nothing */
  t->free_ids[t->nfree++] = i;
}
