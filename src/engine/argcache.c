/* src/engine: the argument cache of tensor arguments (argcache.h). */
#include "engine/argcache.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fail.h"
#include "st/errors.h"

struct st__targ_src {
  atomic_uint refs;
  pthread_mutex_t lock;        /* guards fd, arena, rc and why */
  st__arena_desc_t desc;
  int fd;                      /* until imported (or failed); then -1 */
  st__arena_t *arena;          /* the import: one reference */
  int rc;                      /* ST_OK, or why the import failed */
  atomic_int failed;
  char why[384];
};

/* See argcache.h. Any thread. */
st__targ_src_t *st__targ_src_new(const st__arena_desc_t *d, int fd) {
  st__targ_src_t *s = calloc(1, sizeof *s);
  if (!s) {
    close(fd);
    return NULL;
  }
  atomic_init(&s->refs, 1);
  atomic_init(&s->failed, 0);
  pthread_mutex_init(&s->lock, NULL);
  s->desc = *d;
  s->fd = fd;
  return s;
}

void st__targ_src_ref(st__targ_src_t *s) { atomic_fetch_add(&s->refs, 1); }

void st__targ_src_unref(st__targ_src_t *s) {
  if (!s || atomic_fetch_sub(&s->refs, 1) != 1) return;
  if (s->fd >= 0) close(s->fd);
  st__arena_unref(s->arena);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

const st__arena_desc_t *st__targ_src_desc(const st__targ_src_t *s) { return &s->desc; }

int st__targ_src_failed(const st__targ_src_t *s) { return atomic_load(&s->failed); }

/* See argcache.h. Worker thread. */
int st__targ_src_import(st__targ_src_t *s, st__arena_t **out, char *err, size_t errlen) {
  *out = NULL;
  pthread_mutex_lock(&s->lock);
  if (!s->arena && s->rc == ST_OK) {
    int fd = s->fd;
    s->fd = -1;   /* st__arena_import takes it */
    s->rc = st__arena_import(&s->desc, fd, &s->arena, s->why, sizeof s->why);
    if (s->rc != ST_OK) atomic_store(&s->failed, 1);
  }
  int rc = s->rc;
  if (rc == ST_OK) {
    st__arena_ref(s->arena);
    *out = s->arena;
  } else {
    st__fail(rc, err, errlen, "%s", s->why);
  }
  pthread_mutex_unlock(&s->lock);
  return rc;
}

/* ---------------------------------------------------------------- cache */

struct st__argcache_entry {
  uint64_t arg_id;
  st__targ_src_t *src;              /* one reference */
  st__argcache_entry_t *hnext;      /* bucket chain */
  st__argcache_entry_t *prev, *next; /* use order: prev is more recent */
};

static size_t bucket_of(const st__argcache_t *c, uint64_t id) {
  id ^= id >> 33;
  id *= UINT64_C(0xff51afd7ed558ccd);
  id ^= id >> 33;
  return (size_t)(id & (c->nbuckets - 1));
}

static void lru_unlink(st__argcache_t *c, st__argcache_entry_t *e) {
  if (e->prev) e->prev->next = e->next;
  else c->mru = e->next;
  if (e->next) e->next->prev = e->prev;
  else c->lru = e->prev;
  e->prev = e->next = NULL;
}

static void lru_push_front(st__argcache_t *c, st__argcache_entry_t *e) {
  e->prev = NULL;
  e->next = c->mru;
  if (c->mru) c->mru->prev = e;
  c->mru = e;
  if (!c->lru) c->lru = e;
}

static st__argcache_entry_t *find(const st__argcache_t *c, uint64_t id) {
  if (!c->nbuckets) return NULL;
  for (st__argcache_entry_t *e = c->buckets[bucket_of(c, id)]; e; e = e->hnext)
    if (e->arg_id == id) return e;
  return NULL;
}

/* Unlinks e from its chain and the use order and frees it. */
static void drop(st__argcache_t *c, st__argcache_entry_t *e) {
  st__argcache_entry_t **pp = &c->buckets[bucket_of(c, e->arg_id)];
  while (*pp != e) pp = &(*pp)->hnext;
  *pp = e->hnext;
  lru_unlink(c, e);
  st__targ_src_unref(e->src);
  free(e);
  c->n--;
}

/* Doubles the buckets (16 at first) when entries outnumber them. */
static int grow(st__argcache_t *c) {
  if (c->nbuckets && c->n < c->nbuckets) return ST_OK;
  size_t nb = c->nbuckets ? c->nbuckets * 2 : 16;
  st__argcache_entry_t **b = calloc(nb, sizeof *b);
  if (!b) return ST_ERR_OUT_OF_MEMORY;
  st__argcache_t t = *c;
  c->buckets = b;
  c->nbuckets = nb;
  for (size_t i = 0; i < t.nbuckets; i++) {
    st__argcache_entry_t *e = t.buckets[i];
    while (e) {
      st__argcache_entry_t *next = e->hnext;
      size_t k = bucket_of(c, e->arg_id);
      e->hnext = b[k];
      b[k] = e;
      e = next;
    }
  }
  free(t.buckets);
  return ST_OK;
}

/* See argcache.h. Loop thread. */
st__targ_src_t *st__argcache_get(st__argcache_t *c, uint64_t arg_id) {
  st__argcache_entry_t *e = find(c, arg_id);
  if (!e) return NULL;
  lru_unlink(c, e);
  lru_push_front(c, e);
  return e->src;
}

/* See argcache.h. Loop thread. */
int st__argcache_put(st__argcache_t *c, uint64_t arg_id, st__targ_src_t *s) {
  st__argcache_entry_t *e = find(c, arg_id);
  if (e) {
    st__targ_src_ref(s);
    st__targ_src_unref(e->src);
    e->src = s;
    lru_unlink(c, e);
    lru_push_front(c, e);
    return ST_OK;
  }
  e = calloc(1, sizeof *e);
  if (!e || grow(c) != ST_OK) {
    free(e);
    return ST_ERR_OUT_OF_MEMORY;
  }
  st__targ_src_ref(s);
  e->arg_id = arg_id;
  e->src = s;
  size_t k = bucket_of(c, arg_id);
  e->hnext = c->buckets[k];
  c->buckets[k] = e;
  lru_push_front(c, e);
  c->n++;
  return ST_OK;
}

/* See argcache.h. Loop thread. */
int st__argcache_forget(st__argcache_t *c, uint64_t arg_id) {
  st__argcache_entry_t *e = find(c, arg_id);
  if (!e) return 0;
  drop(c, e);
  return 1;
}

/* See argcache.h. Loop thread. */
int st__argcache_evict_lru(st__argcache_t *c) {
  if (!c->lru) return 0;
  drop(c, c->lru);
  return 1;
}

/* See argcache.h. Loop thread. */
void st__argcache_clear(st__argcache_t *c) {
  while (c->lru) drop(c, c->lru);
  free(c->buckets);
  memset(c, 0, sizeof *c);
}
