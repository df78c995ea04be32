/* src/client: result pools (docs/pool.md, sections 1-3).
 *
 * A connection that asked for the hello feature "pool" receives results
 * the server does not keep as regions of per-connection slabs: memfds,
 * and VMM allocations on the CUDA devices its results were built on.
 * Each slab's descriptor comes once, with the first reply that uses it:
 * the connection maps it (map.c, a mapping in no list; a CUDA slab is
 * imported like any VMM arena) and holds it for its life. A region is a
 * mapping of its own, a view into its slab, counted by the results that
 * use it (their tensors and DLPack exports hold the result). When its
 * last reference goes, on any thread, the region's generation is stored
 * into the control page's freed[slot] and freed_count bumped: the server
 * takes the region back before its next allocation from the pool and may
 * write it at once. For a CUDA region that means the device work on it
 * must be complete when it is freed: st_result_free from C leaves that
 * to the caller (client.h); a region whose tensor a DLPack consumer
 * released (torch, whose kernels on it may still be queued) is freed
 * later: an event is recorded on its device's legacy default stream and
 * the free, with the region's slab reference, waits in the page's
 * deferred list until the event completed. The connection writes the
 * frees whose events completed before each request it sends (never
 * blocking), a free past POOL_DEFER_MAX waiting ones waits for the
 * oldest, and the close waits for them all before the slabs go. The list
 * has its own lock: frees come from any thread (torch drops tensors on
 * its own threads), and none of this touches the socket.
 *
 * Slabs the server retired (a slab with no live region for pool.idle_s,
 * docs/pool.md) are named by their bit in the page's `retired` word, the
 * slab's index of its region entries: before each request the connection
 * lets go of its mapping of each (unmapped once nothing of this process
 * refers to it) and clears the bit, which lets the server give the index
 * to a new slab. A region this process still holds cannot be in a retired
 * slab (the server retires only slabs whose regions were all freed): one
 * that is anyway (a server that breaks the rule) is not let go: it stays
 * mapped, with its bit set, until a request after its last region went.
 *
 * The control page ("STPL" v1: freed_count at byte 12, retired at 16,
 * freed[] from byte 64) comes once, mapped read-write. It is counted: the connection holds
 * one reference and each live region one, so a region freed after the
 * connection closed or reconnected writes into a page that is still
 * mapped (the server no longer reads it), never into memory that now
 * belongs to something else.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/client_internal.h"
#include "common/fail.h"

#define PAGE_MAGIC 0x4c505453u   /* "STPL" little-endian */
#define PAGE_HEADER 64u          /* freed[] starts here  */
#define PAGE_COUNT 12u           /* freed_count          */
#define PAGE_RETIRED 16u         /* bit per slab index   */
#define NO_INDEX UINT32_MAX      /* a slab of a server that names none */
/* Deferred CUDA frees a page lets wait before a new one waits for the
 * oldest. */
#define POOL_DEFER_MAX 64

/* A CUDA region's free waiting for its event. */
typedef struct deferred {
  st__client_event_t *ev;
  st__mapping_t *slab;           /* the region's slab reference  */
  uint32_t slot, gen;
} deferred_t;

struct st__pool_page {
  int refs;                      /* atomic                       */
  void *base;
  size_t len;
  uint32_t nslots;
  pid_t pid;                     /* the process that mapped it   */
  pthread_mutex_t lock;          /* guards the four below        */
  int detached;                  /* the connection let it go     */
  deferred_t *defer;             /* oldest first                 */
  size_t ndefer, defer_cap;      /* ndefer: atomic reads outside */
};

typedef struct slab {
  uint64_t id;
  uint32_t index;                /* its bit in `retired`         */
  st__mapping_t *m;              /* the connection's reference   */
} slab_t;

struct st__client_pool {
  struct st__pool_page *page;    /* one reference, or NULL       */
  slab_t *slabs;
  size_t nslabs, cap;
};

static void page_unref(struct st__pool_page *pg) {
  if (!pg || __atomic_sub_fetch(&pg->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
  munmap(pg->base, pg->len);
  free(pg->defer);
  pthread_mutex_destroy(&pg->lock);
  free(pg);
}

/* Drops the region's references on the slab and the page and writes the
 * free of (slot, gen) into the page. The slab reference goes first: once
 * the server can see the free it may retire the slab, and the connection
 * then finds only its own reference left (pool_let_go_retired). */
static void write_free(struct st__pool_page *pg, uint32_t slot, uint32_t gen,
                       st__mapping_t *slab) {
  uint32_t *w = (uint32_t *)pg->base;
  st__client_mapping_release(slab);
  /* The slot was checked against nslots when the region was made; the
   * server never hands out generation 0. */
  if (gen) {
    __atomic_store_n(&w[PAGE_HEADER / 4 + slot], gen, __ATOMIC_RELEASE);
    __atomic_add_fetch(&w[PAGE_COUNT / 4], 1, __ATOMIC_RELEASE);
  }
  page_unref(pg);
}

/* Frees n deferred entries taken off a page (no lock held): waits for
 * each event first when `wait`, else they completed. */
static void finish(struct st__pool_page *pg, deferred_t *d, size_t n, int wait) {
  for (size_t i = 0; i < n; i++) {
    if (wait) st__client_event_wait(d[i].ev);
    st__client_event_put(d[i].ev);
    write_free(pg, d[i].slot, d[i].gen, d[i].slab);
  }
}

/* Moves the first n deferred entries of pg into out. Lock held. */
static void take_first(struct st__pool_page *pg, size_t n, deferred_t *out) {
  memcpy(out, pg->defer, n * sizeof *out);
  memmove(pg->defer, pg->defer + n, (pg->ndefer - n) * sizeof *pg->defer);
  __atomic_store_n(&pg->ndefer, pg->ndefer - n, __ATOMIC_RELAXED);
}

/* How many leading deferred entries of pg completed. Lock held. */
static size_t count_done(const struct st__pool_page *pg) {
  size_t n = 0;
  while (n < pg->ndefer && st__client_event_done(pg->defer[n].ev)) n++;
  return n;
}

/* Appends d to pg's deferred list; 0, or -1 when the page was let go or
 * memory is short (d is then the caller's). *over gets the oldest entry
 * when the list is past POOL_DEFER_MAX (*nover 1), once the completed
 * ones are taken out into done[] (*ndone of them, at most
 * POOL_DEFER_MAX + 1). Lock taken here. */
static int defer_push(struct st__pool_page *pg, const deferred_t *d, deferred_t *done,
                      size_t *ndone, deferred_t *over, size_t *nover) {
  *ndone = *nover = 0;
  pthread_mutex_lock(&pg->lock);
  int rc = -1;
  if (!pg->detached && pg->ndefer == pg->defer_cap) {
    size_t cap = pg->defer_cap ? 2 * pg->defer_cap : 16;
    deferred_t *q = realloc(pg->defer, cap * sizeof *q);
    if (q) {
      pg->defer = q;
      pg->defer_cap = cap;
    }
  }
  if (!pg->detached && pg->ndefer < pg->defer_cap) {
    pg->defer[pg->ndefer] = *d;
    __atomic_store_n(&pg->ndefer, pg->ndefer + 1, __ATOMIC_RELAXED);
    rc = 0;
    if (pg->ndefer > POOL_DEFER_MAX) {
      size_t n = count_done(pg);
      if (n > POOL_DEFER_MAX + 1) n = POOL_DEFER_MAX + 1;
      take_first(pg, n, done);
      *ndone = n;
      if (pg->ndefer > POOL_DEFER_MAX) {
        take_first(pg, 1, over);
        *nover = 1;
      }
    }
  }
  pthread_mutex_unlock(&pg->lock);
  return rc;
}

/* The last reference of a region went: stores gen into freed[slot] and
 * bumps freed_count (release order; gen 0, a region inherited by a forked
 * child, writes nothing), then drops the region's references on the page
 * and on `slab`. With ordinal >= 0 (a CUDA region a device may still
 * read) it records an event on that device's legacy default stream and
 * does all that once the event completed: the connection checks before
 * each request (st__client_pool_poll), more than POOL_DEFER_MAX waiting
 * frees wait for the oldest here, and the connection's close waits for
 * all; a page the connection already let go waits here. A region whose
 * event cannot be recorded is never written free (the server takes it
 * back with the connection) and keeps its slab mapped in this process.
 * Any thread; never touches the socket. */
static void pool_freed(struct st__pool_page *pg, uint32_t slot, uint32_t gen,
                       st__mapping_t *slab, int ordinal) {
  if (!gen || ordinal < 0) {
    write_free(pg, slot, gen, slab);
    return;
  }
  deferred_t d = {NULL, slab, slot, gen};
  if (st__client_event_record(ordinal, &d.ev) != ST_OK) {
    /* Whether the device still reads it is unknown: the region is never
     * given back, and its slab reference is kept (the slab stays mapped
     * in this process) so that nothing is unmapped under a kernel. */
    page_unref(pg);
    return;
  }
  deferred_t done[POOL_DEFER_MAX + 1], over;
  size_t ndone, nover;
  if (defer_push(pg, &d, done, &ndone, &over, &nover) != 0) {
    finish(pg, &d, 1, 1);   /* the page was let go, or no memory: wait here */
    return;
  }
  finish(pg, done, ndone, 0);
  finish(pg, &over, nover, 1);
}

/* Writes the deferred frees whose events completed. Thread of the
 * client. */
static void poll_deferred(struct st__pool_page *pg) {
  deferred_t done[POOL_DEFER_MAX + 1];
  pthread_mutex_lock(&pg->lock);
  size_t n = count_done(pg);
  if (n > POOL_DEFER_MAX + 1) n = POOL_DEFER_MAX + 1;
  take_first(pg, n, done);
  pthread_mutex_unlock(&pg->lock);
  finish(pg, done, n, 0);
}

/* Lets go of the slabs the server retired (bits set in the page's
 * `retired` word): the connection's mapping of each goes, and its bit is
 * cleared. A slab that something of this process still refers to (a
 * server that retired it breaks the rule) keeps its mapping and its bit;
 * it is let go at a request after its last region went. Thread of the
 * client. */
static void pool_let_go_retired(struct st__client_pool *p, uint32_t bits) {
  uint32_t *w = (uint32_t *)p->page->base;
  for (size_t i = 0; i < p->nslabs;) {
    slab_t *s = &p->slabs[i];
    if (s->index == NO_INDEX || !(bits & (1u << s->index))) {
      i++;
      continue;
    }
    bits &= ~(1u << s->index);
    if (st__client_mapping_refs(s->m) > 1) {
      i++;
      continue;
    }
    uint32_t bit = 1u << s->index;
    st__client_mapping_release(s->m);
    *s = p->slabs[--p->nslabs];
    __atomic_and_fetch(&w[PAGE_RETIRED / 4], ~bit, __ATOMIC_RELEASE);
  }
  /* Bits of slabs this connection was never sent: nothing to let go. */
  if (bits) __atomic_and_fetch(&w[PAGE_RETIRED / 4], ~bits, __ATOMIC_RELEASE);
}

/* See client_internal.h. Thread of the client. */
void st__client_pool_poll(st_client_t *c) {
  struct st__pool_page *pg = c->pool ? c->pool->page : NULL;
  if (!pg) return;
  uint32_t retired = __atomic_load_n((uint32_t *)pg->base + PAGE_RETIRED / 4, __ATOMIC_ACQUIRE);
  if (__atomic_load_n(&pg->ndefer, __ATOMIC_RELAXED) == 0 && retired == 0) return;
  if (pg->pid != getpid()) return;
  if (__atomic_load_n(&pg->ndefer, __ATOMIC_RELAXED) > 0) poll_deferred(pg);
  /* After the deferred frees: one written now lets its slab go at the
   * next request, when the server saw it. */
  if (retired) pool_let_go_retired(c->pool, retired);
}

/* The connection lets pg go: later deferred frees wait where they are
 * made, and those waiting now are waited for here (before the
 * connection's slab references go). A child that inherited the page
 * touches neither its lock nor the driver. */
static void page_detach(struct st__pool_page *pg) {
  if (!pg || pg->pid != getpid()) return;
  pthread_mutex_lock(&pg->lock);
  pg->detached = 1;
  deferred_t *d = pg->defer;
  size_t n = pg->ndefer;
  pg->defer = NULL;
  pg->defer_cap = 0;
  __atomic_store_n(&pg->ndefer, 0, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&pg->lock);
  finish(pg, d, n, 1);
  free(d);
}

/* See client_internal.h. Any thread. */
int st__client_pool_disabled(void) {
  const char *e = getenv("ST_CLIENT_POOL");
  return e && strcmp(e, "0") == 0;
}

/* See client_internal.h. Thread of the client. */
void st__client_pool_reset(st_client_t *c, int on) {
  struct st__client_pool *p = c->pool;
  if (p) {
    page_detach(p->page);
    for (size_t i = 0; i < p->nslabs; i++) st__client_mapping_release(p->slabs[i].m);
    free(p->slabs);
    page_unref(p->page);
    free(p);
    c->pool = NULL;
  }
  if (on) c->pool = calloc(1, sizeof *c->pool);   /* none: arenas as before */
}

/* See client_internal.h. */
int st__client_pool_is_region(const msgpack_object *a) {
  return a->type == MSGPACK_OBJECT_MAP && st__map_get(a, "pool") != NULL;
}

/* See client_internal.h. */
int st__client_pool_has_fd(const msgpack_object *a) { return st__map_get(a, "fd") != NULL; }

/* map[key] as an unsigned integer of at most `max`; -1 when absent or
 * not one. */
static int get_u64(const msgpack_object *map, const char *key, uint64_t max, uint64_t *out) {
  const msgpack_object *o = map ? st__map_get(map, key) : NULL;
  if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > max) return -1;
  *out = o->via.u64;
  return 0;
}

/* Takes descriptor `index` out of fds. -1 when missing or taken. */
static int take_fd(int *fds, size_t nfds, uint64_t index) {
  if (index >= nfds || fds[index] < 0) return -1;
  int fd = fds[index];
  fds[index] = -1;
  return fd;
}

/* See client_internal.h. Thread of the client. */
int st__client_pool_take_page(st_client_t *c, const msgpack_object *pp, int *fds, size_t nfds) {
  if (!pp || pp->type == MSGPACK_OBJECT_NIL) return ST_OK;
  struct st__client_pool *p = c->pool;
  uint64_t fdi, bytes, slots, id;
  if (!p || p->page || pp->type != MSGPACK_OBJECT_MAP || get_u64(pp, "fd", UINT32_MAX, &fdi) ||
      get_u64(pp, "bytes", SIZE_MAX, &bytes) || get_u64(pp, "slots", 1u << 20, &slots) ||
      get_u64(pp, "id", UINT64_MAX, &id) || bytes < PAGE_HEADER + 4 * slots)
    return st__client_fail(c, ST_ERR_PROTOCOL, "bad or unexpected 'pool_page' in the reply");
  int fd = take_fd(fds, nfds, fdi);
  if (fd < 0)
    return st__client_fail(c, ST_ERR_PROTOCOL, "pool_page names descriptor %llu, which is "
                           "missing or taken", (unsigned long long)fdi);
  st__arena_desc_t d;
  memset(&d, 0, sizeof d);
  d.id = id;
  d.bytes = bytes;
  char why[200] = "";
  struct stat st;
  int rc = fstat(fd, &st) == 0 ? st__client_check_memfd(&d, fd, &st, why, sizeof why)
                               : st__fail(ST_ERR_IO, why, sizeof why, "fstat of the pool page failed");
  /* Written by every free: checked (fdcheck.c) and mapped read-write. */
  void *base = MAP_FAILED;
  if (rc == ST_OK) base = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (rc != ST_OK) return st__client_fail(c, rc, "pool page: %s", why);
  if (base == MAP_FAILED)
    return st__client_fail(c, e == EACCES || e == EPERM ? ST_ERR_PROTOCOL : ST_ERR_IO,
                           "pool page: mmap read-write failed: %s", strerror(e));
  if (*(const uint32_t *)base != PAGE_MAGIC) {
    munmap(base, (size_t)bytes);
    return st__client_fail(c, ST_ERR_PROTOCOL, "pool page: not an STPL page");
  }
  struct st__pool_page *pg = calloc(1, sizeof *pg);
  if (!pg) {
    munmap(base, (size_t)bytes);
    return st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory");
  }
  pg->refs = 1;
  pg->pid = getpid();
  pthread_mutex_init(&pg->lock, NULL);
  pg->base = base;
  pg->len = (size_t)bytes;
  pg->nslots = (uint32_t)slots;
  p->page = pg;
  return ST_OK;
}

/* The connection's mapping of slab `id`, or NULL. */
static st__mapping_t *slab_find(const struct st__client_pool *p, uint64_t id) {
  for (size_t i = 0; i < p->nslabs; i++)
    if (p->slabs[i].id == id) return p->slabs[i].m;
  return NULL;
}

/* Maps slab `d` that entry `a` sends (its descriptor from fds) and keeps
 * it for the connection as slab `index` (NO_INDEX: the server names
 * none). An index this connection still holds a slab at is a PROTOCOL
 * error: the server gives it to a new slab only once the old one was let
 * go. */
static int slab_add(st_client_t *c, const msgpack_object *a, const st__arena_desc_t *d,
                    uint32_t index, int *fds, size_t nfds, st__mapping_t **out) {
  struct st__client_pool *p = c->pool;
  uint64_t fdi = d->fd;
  for (size_t i = 0; i < p->nslabs && index != NO_INDEX; i++)
    if (p->slabs[i].index == index)
      return st__client_fail(c, ST_ERR_PROTOCOL, "pool slab %llu comes as slab %u, which slab "
                             "%llu still is here", (unsigned long long)d->id, index,
                             (unsigned long long)p->slabs[i].id);
  /* A pooled result is the caller's to write (docs/keys.md, section 5). */
  if (d->readonly)
    return st__client_fail(c, ST_ERR_PROTOCOL, "pool slab %llu comes read-only: a pooled result "
                           "is the caller's to write", (unsigned long long)d->id);
  int fd = take_fd(fds, nfds, fdi);
  if (fd < 0)
    return st__client_fail(c, ST_ERR_PROTOCOL, "pool slab %llu: descriptor %llu missing or "
                           "taken", (unsigned long long)d->id, (unsigned long long)fdi);
  if (p->nslabs == p->cap) {
    size_t cap = p->cap ? 2 * p->cap : 4;
    slab_t *s = realloc(p->slabs, cap * sizeof *s);
    if (!s) {
      close(fd);
      return st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory");
    }
    p->slabs = s;
    p->cap = cap;
  }
  char why[300] = "";
  int rc = st__client_map_slab(d, fd, out, why, sizeof why);
  if (rc != ST_OK) return st__client_fail(c, rc, "pool slab: %s", why);
  p->slabs[p->nslabs].id = d->id;
  p->slabs[p->nslabs].index = index;
  p->slabs[p->nslabs++].m = *out;
  return ST_OK;
}

/* See client_internal.h. Thread of the client. */
int st__client_pool_region(st_client_t *c, const msgpack_object *a, int *fds, size_t nfds,
                           st__arena_desc_t *d, st__mapping_t **out) {
  *out = NULL;
  struct st__client_pool *p = c->pool;
  const msgpack_object *po = st__map_get(a, "pool");
  uint64_t off, size, slot, gen, index = NO_INDEX;
  if (!p || !p->page)
    return st__client_fail(c, ST_ERR_PROTOCOL, "the reply has a pool region but this "
                           "connection has no pool page");
  char why[256];
  if (st__parse_pool_slab(a, d, why, sizeof why) != ST_OK)
    return st__client_fail(c, ST_ERR_PROTOCOL, "bad pool region in the reply: %s", why);
  if (po->type != MSGPACK_OBJECT_MAP || get_u64(po, "offset", UINT64_MAX, &off) ||
      get_u64(po, "size", UINT64_MAX, &size) ||
      get_u64(po, "slot", p->page->nslots - 1u, &slot) || get_u64(po, "gen", UINT32_MAX, &gen) ||
      (st__map_get(po, "slab") && get_u64(po, "slab", 31, &index)))
    return st__client_fail(c, ST_ERR_PROTOCOL, "bad pool region in the reply");
  st__mapping_t *slab = slab_find(p, d->id);
  int rc = ST_OK;
  if (!d->no_fd) {
    rc = slab ? st__client_fail(c, ST_ERR_PROTOCOL, "pool slab %llu sent twice",
                                (unsigned long long)d->id)
              : slab_add(c, a, d, (uint32_t)index, fds, nfds, &slab);
  } else if (!slab) {
    rc = st__client_fail(c, ST_ERR_PROTOCOL, "the reply names pool slab %llu, which this "
                         "connection was never sent", (unsigned long long)d->id);
  } else if (!st__client_mapping_is(slab, d)) {
    rc = st__client_fail(c, ST_ERR_PROTOCOL, "the reply names pool slab %llu on another device "
                         "than it was sent on", (unsigned long long)d->id);
  }
  if (rc != ST_OK) return rc;
  __atomic_add_fetch(&p->page->refs, 1, __ATOMIC_RELAXED);
  rc = st__client_map_region(slab, off, size, pool_freed, p->page, (uint32_t)slot,
                             (uint32_t)gen, out);
  if (rc != ST_OK) {
    page_unref(p->page);
    return st__client_fail(c, rc, "pool region at %llu (+%llu) is outside slab %llu",
                           (unsigned long long)off, (unsigned long long)size,
                           (unsigned long long)d->id);
  }
  d->bytes = size;
  return ST_OK;
}
