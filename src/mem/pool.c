/* src/mem: per-connection pools (contracts in pool.h; design in
 * docs/pool.md). */
#include "mem/pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "mem/cuda.h"
#include "mem/ledger.h"
#include "mem/slab_alloc.h"
#include "st/errors.h"

/* A slab index with arena NULL is empty: never used, or retired. A
 * retired slab whose descriptor the owner got keeps its index until the
 * owner clears the index's bit in the page's `retired` word (it let its
 * mapping go); one it never got frees the index at once. */
typedef struct slab {
  st__arena_t *arena;         /* memfd or VMM arena, one reference     */
  st__slab_alloc_t alloc;
  int device;                 /* -1: the CPU, else a CUDA ordinal      */
  uint64_t size;              /* what the allocator manages            */
  int sent;                   /* the owner was sent its descriptor     */
  uint32_t live;              /* regions in it (slots live)            */
  uint64_t idle_since;        /* ns (monotonic) since live became 0    */
  uint64_t serial;            /* order of making: the oldest is kept   */
} slab_t;

struct st__mpool {
  pthread_mutex_t mu;
  atomic_int refs;
  st__mpool_cfg_t cfg;
  st__mpool_t *reg_prev, *reg_next;   /* every pool: trim_all (reg_mu) */
  slab_t slabs[ST__MPOOL_MAX_SLABS];
  uint32_t nslabs;            /* indices used so far (live or empty)   */
  uint64_t next_serial;
  _Atomic uint64_t bytes;     /* live slabs, every device              */
  _Atomic uint32_t live_slabs;
  uint64_t last_alloc;        /* ns (monotonic) of the last allocation */
  st__slots_t slots;
  uint32_t *reclaim;          /* scratch of slots.n for st__slots_scan */
  st__arena_t *page;          /* control page arena                    */
  int page_sent;
  int warned;                 /* the fallback was logged               */
};

static atomic_uint_fast64_t n_pools, n_slabs, n_regions, n_fallbacks, n_retired;

/* Every pool, for st__mpool_trim_all. Order: reg_mu, then a pool's mu
 * (only tried), then the owner's account. */
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static st__mpool_t *reg_head;
/* Slab bytes per device: [0] the CPU, [1 + N] cuda:N. */
static atomic_uint_fast64_t n_dev_bytes[1 + ST__MPOOL_MAX_DEVICES];

static atomic_uint_fast64_t *dev_bytes(int device) {
  return &n_dev_bytes[device < 0 ? 0 : 1 + (device % ST__MPOOL_MAX_DEVICES)];
}

/* The page's fields, in the server's mapping. */
static _Atomic uint32_t *page_word(st__mpool_t *p, size_t byte_off) {
  return (_Atomic uint32_t *)((char *)st__arena_base(p->page) + byte_off);
}

int st__mpool_new(const st__mpool_cfg_t *cfg, st__mpool_t **out, char *err, size_t errlen) {
  *out = NULL;
  st__mpool_t *p = calloc(1, sizeof *p);
  if (!p) {
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  p->cfg = *cfg;
  if (p->cfg.max_regions == 0) p->cfg.max_regions = 1;
  int rc = st__slots_init(&p->slots, p->cfg.max_regions);
  p->reclaim = malloc(p->cfg.max_regions * sizeof *p->reclaim);
  if (rc != ST_OK || !p->reclaim) {
    snprintf(err, errlen, "out of memory");
    rc = ST_ERR_OUT_OF_MEMORY;
    goto fail;
  }
  /* The page is made with the first slab (grow): a connection that never
   * gets a pooled result holds no descriptor and no memory for it. */
  pthread_mutex_init(&p->mu, NULL);
  atomic_init(&p->refs, 1);
  atomic_fetch_add(&n_pools, 1);
  pthread_mutex_lock(&reg_mu);
  p->reg_next = reg_head;
  if (reg_head) reg_head->reg_prev = p;
  reg_head = p;
  pthread_mutex_unlock(&reg_mu);
  *out = p;
  return ST_OK;
fail:
  st__slots_destroy(&p->slots);
  free(p->reclaim);
  free(p);
  return rc;
}

static void pool_unref(st__mpool_t *p) {
  if (atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) != 1) return;
  pthread_mutex_lock(&reg_mu);   /* after a trim that looks at p now */
  if (p->reg_prev) p->reg_prev->reg_next = p->reg_next;
  else reg_head = p->reg_next;
  if (p->reg_next) p->reg_next->reg_prev = p->reg_prev;
  pthread_mutex_unlock(&reg_mu);
  for (uint32_t i = 0; i < p->nslabs; i++) {
    if (!p->slabs[i].arena) continue;
    st__arena_unref(p->slabs[i].arena);
    st__slab_alloc_destroy(&p->slabs[i].alloc);
    atomic_fetch_sub(dev_bytes(p->slabs[i].device), p->slabs[i].size);
    atomic_fetch_sub(&n_slabs, 1);
    if (p->cfg.account)
      p->cfg.account(p->cfg.account_ctx, p->slabs[i].device, -(int64_t)p->slabs[i].size);
  }
  if (p->cfg.account_drop) p->cfg.account_drop(p->cfg.account_ctx);
  atomic_fetch_sub(&n_pools, 1);
  if (p->page) st__arena_unref(p->page);
  st__slots_destroy(&p->slots);
  free(p->reclaim);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

void st__mpool_ref(st__mpool_t *p) { atomic_fetch_add(&p->refs, 1); }

void st__mpool_close(st__mpool_t *p) {
  if (p) pool_unref(p);
}

static int region_source(void *ctx, const st__arena_spec_t *spec, st__arena_t **out);
static void region_release(void *owner, uint32_t slot);

void st__mpool_use(st__mpool_t *p) { st__arena_use_source(p ? region_source : NULL, p); }

/* Gives slot i's pages back and frees the slot; its slab is idle from now
 * when that was its last region. Under mu. */
static void take_back(st__mpool_t *p, uint32_t i) {
  st__slot_t *s = &p->slots.slot[i];
  slab_t *sl = s->slab < p->nslabs ? &p->slabs[s->slab] : NULL;
  if (sl && sl->arena) {
    st__slab_alloc_give(&sl->alloc, s->off, s->len);
    if (sl->live > 0 && --sl->live == 0) sl->idle_since = (uint64_t)st__now_mono_ns();
  }
  st__slots_release(&p->slots, i);
  atomic_fetch_sub(&n_regions, 1);
}

/* The cap of the slabs of `device` together: pool.max_bytes_per_connection
 * for the CPU (the server applied its budget), pool.cuda_max_bytes
 * capped at a quarter of the device's budget for a CUDA device. */
static uint64_t device_cap(const st__mpool_t *p, int device) {
  if (device < 0) return p->cfg.max_bytes;
  st__ledger_stats_t l;
  st__ledger_stats(device, &l);
  uint64_t cap = p->cfg.cuda_max_bytes;
  if (l.budget && cap > l.budget / 4) cap = l.budget / 4;
  return cap;
}

/* Bytes of the live slabs of `device` and the size of its largest (0:
 * none). */
static uint64_t device_slabs(const st__mpool_t *p, int device, uint64_t *largest) {
  uint64_t bytes = 0;
  *largest = 0;
  for (uint32_t i = 0; i < p->nslabs; i++) {
    const slab_t *s = &p->slabs[i];
    if (!s->arena || s->device != device) continue;
    bytes += s->size;
    if (s->size > *largest) *largest = s->size;
  }
  return bytes;
}

/* An index for a new slab: an empty one whose retirement the owner saw
 * (its bit in the page's `retired` word is clear), else the next unused;
 * -1 when all ST__MPOOL_MAX_SLABS are taken. Under mu. */
static int free_index(st__mpool_t *p) {
  uint32_t retired = atomic_load_explicit(page_word(p, ST__MPOOL_PAGE_RETIRED),
                                          memory_order_acquire);
  for (uint32_t i = 0; i < p->nslabs; i++)
    if (!p->slabs[i].arena && !(retired & (1u << i))) return (int)i;
  return p->nslabs < ST__MPOOL_MAX_SLABS ? (int)p->nslabs : -1;
}

/* Drops slab i (no region lives in it): its allocation goes (its bytes
 * leave the ledger, the budget and pool_bytes); the owner, when it was
 * sent the slab, is told by bit i of the page's `retired` word. Under
 * mu. */
static void retire(st__mpool_t *p, uint32_t i) {
  slab_t *s = &p->slabs[i];
  ST_LOG_D("pool", "slab %llu (%llu bytes on device %d) retired after %.1f s idle",
           (unsigned long long)st__arena_id(s->arena), (unsigned long long)s->size, s->device,
           p->cfg.idle_ns / 1e9);
  /* A CPU slab's pages go now, not when the owner lets its mapping go
   * (at its next request, which an idle client may never send): no
   * region of it is live, so this drops nothing the owner still uses. */
  if (s->device < 0) (void)madvise(st__arena_base(s->arena), (size_t)s->size, MADV_REMOVE);
  st__arena_unref(s->arena);
  st__slab_alloc_destroy(&s->alloc);
  atomic_fetch_sub(dev_bytes(s->device), s->size);
  atomic_fetch_sub(&n_slabs, 1);
  atomic_fetch_add(&n_retired, 1);
  atomic_fetch_sub(&p->bytes, s->size);
  atomic_fetch_sub(&p->live_slabs, 1);
  if (p->cfg.account) p->cfg.account(p->cfg.account_ctx, s->device, -(int64_t)s->size);
  if (s->sent)
    atomic_fetch_or_explicit(page_word(p, ST__MPOOL_PAGE_RETIRED), 1u << i,
                             memory_order_release);
  memset(s, 0, sizeof *s);
}

/* Retires every slab with no live region for idle_ns. keep_oldest: not
 * the oldest live slab of each device (the connection is calling: its
 * next call needs no new slab); else, the pool made no allocation for
 * idle_ns, every idle slab goes. Costs a look at each slab. Under mu. */
static void retire_idle(st__mpool_t *p, uint64_t now, int keep_oldest) {
  if (!p->cfg.idle_ns || atomic_load_explicit(&p->live_slabs, memory_order_relaxed) == 0)
    return;
  for (uint32_t i = 0; i < p->nslabs; i++) {
    slab_t *s = &p->slabs[i];
    if (!s->arena || s->live || now - s->idle_since < p->cfg.idle_ns) continue;
    int older = !keep_oldest;
    for (uint32_t k = 0; k < p->nslabs && !older; k++)
      older = k != i && p->slabs[k].arena && p->slabs[k].device == s->device &&
              p->slabs[k].serial < s->serial;
    if (older) retire(p, i);
  }
}

/* The control page, made with the first slab: a connection that never
 * gets a pooled result holds no descriptor and no memory for it. */
static int page_ready(st__mpool_t *p) {
  if (p->page) return 1;
  char why[256];
  if (st__arena_new_cpu(ST__MPOOL_PAGE_HEADER + 4ull * p->cfg.max_regions, &p->page, why,
                        sizeof why) != ST_OK) {
    ST_LOG_D("pool", "no control page: %s", why);
    p->page = NULL;
    return 0;
  }
  atomic_store(page_word(p, 0), ST__MPOOL_PAGE_MAGIC);
  atomic_store(page_word(p, 4), ST__MPOOL_PAGE_VERSION);
  atomic_store(page_word(p, 8), p->cfg.max_regions);
  return 1;
}

/* The size of a new slab on `device` for a result of `len` bytes, given
 * the device's largest live slab (0: none) and the unit (a page; a CUDA
 * device's allocation granularity), in whole units. CPU: the smallest
 * power of two that holds max(ST__MPOOL_MIN_SLAB, len) for the first,
 * twice the largest after that (more while len needs it), never more
 * than slab_bytes unless len alone needs more. CUDA: cuda_slab_bytes
 * for the first, twice the largest after that, at least len. */
static uint64_t slab_size(const st__mpool_t *p, int device, uint64_t len, uint64_t largest,
                          uint64_t unit) {
  uint64_t size;
  if (device < 0) {
    uint64_t top = p->cfg.slab_bytes;
    size = largest ? 2 * largest : ST__MPOOL_MIN_SLAB;
    while (size < len && size < top) size *= 2;
    if (size > top) size = top;
  } else {
    size = largest ? 2 * largest : p->cfg.cuda_slab_bytes;
  }
  if (size < len) size = len;
  return (size + unit - 1) / unit * unit;
}

/* A new slab on `device` big enough for `len` bytes, within the device's
 * cap and the owner's account: its index, or -1 (-2: the account
 * refused). Sizes: slab_size; the allocator manages the whole memfd or
 * VMM allocation. Under mu (the memfd or VMM allocation is made under it:
 * a worker waits for its own pool only). */
static int grow(st__mpool_t *p, int device, uint64_t len) {
  if (!page_ready(p)) return -1;
  int idx = free_index(p);
  if (idx < 0) return -1;
  uint64_t unit = ST__SLAB_PAGE;
  if (device >= 0 && (st__cuda_granularity(device, &unit, NULL, 0) != ST_OK || unit == 0 ||
                      unit % ST__SLAB_PAGE))
    return -1;
  uint64_t largest;
  uint64_t have = device_slabs(p, device, &largest), cap = device_cap(p, device) / unit * unit;
  uint64_t size = slab_size(p, device, len, largest, unit);
  uint64_t need = (len + unit - 1) / unit * unit;
  if (have + size > cap) {
    if (have + need > cap) return -1;
    size = cap - have;
  }
  if (p->cfg.account && p->cfg.account(p->cfg.account_ctx, device, (int64_t)size) != 0)
    return -2;
  char why[256];
  slab_t *s = &p->slabs[idx];
  int rc = device < 0 ? st__arena_new_cpu(size, &s->arena, why, sizeof why)
                      : st__arena_new_cuda(device, size, &s->arena, why, sizeof why);
  if (rc == ST_OK && st__slab_alloc_init(&s->alloc, size) != ST_OK) {
    st__arena_unref(s->arena);
    rc = ST_ERR_OUT_OF_MEMORY;
    snprintf(why, sizeof why, "out of memory");
  }
  if (rc != ST_OK) {
    s->arena = NULL;
    if (p->cfg.account) p->cfg.account(p->cfg.account_ctx, device, -(int64_t)size);
    ST_LOG_D("pool", "no new slab of %llu bytes on device %d: %s", (unsigned long long)size,
             device, why);
    return -1;
  }
  s->device = device;
  s->size = size;
  s->sent = 0;
  s->live = 0;
  s->idle_since = (uint64_t)st__now_mono_ns();
  s->serial = p->next_serial++;
  atomic_fetch_add(&p->bytes, size);
  atomic_fetch_add(&p->live_slabs, 1);
  atomic_fetch_add(&n_slabs, 1);
  atomic_fetch_add(dev_bytes(device), size);
  if ((uint32_t)idx == p->nslabs) p->nslabs++;
  return idx;
}

/* Takes back what the client freed since the last look. Under mu. */
static void collect(st__mpool_t *p) {
  if (!p->page) return;   /* no slab yet: nothing was handed out */
  uint32_t count = atomic_load_explicit(page_word(p, 12), memory_order_acquire);
  uint32_t n = st__slots_scan(&p->slots, page_word(p, ST__MPOOL_PAGE_HEADER), count, p->reclaim);
  for (uint32_t k = 0; k < n; k++) take_back(p, p->reclaim[k]);
}

/* The region's bytes read as zeros: a memset, or a fill queued on the
 * spec's stream. ST_OK or the driver's error. */
static int zero_region(const st__arena_spec_t *spec, char *base, uint64_t len) {
  if (spec->device < 0) {
    memset(base, 0, (size_t)len);
    return ST_OK;
  }
  return st__cuda_zero((uint64_t)(uintptr_t)base, len, spec->device, spec->stream, NULL, 0);
}

/* st__arena_new's source while a pool is current (st__mpool_use). */
static int region_source(void *ctx, const st__arena_spec_t *spec, st__arena_t **out) {
  st__mpool_t *p = ctx;
  *out = NULL;
  int device = spec->device;
  uint64_t bytes = spec->bytes;
  if (!p) return ST_ERR_NOT_FOUND;
  uint64_t max = device < 0 ? p->cfg.max_result_bytes : p->cfg.cuda_max_result_bytes;
  if (bytes > max || (device >= 0 && spec->ipc != ST__CUDA_IPC_VMM) ||
      device >= ST__MPOOL_MAX_DEVICES || st__arena_check_limit(bytes, NULL, 0) != ST_OK)
    return ST_ERR_NOT_FOUND;
  pthread_mutex_lock(&p->mu);
  collect(p);
  uint64_t now = (uint64_t)st__now_mono_ns();
  retire_idle(p, now, 1);
  p->last_alloc = now;
  uint64_t off = 0, len = 0;
  int slab = -1, refused = 0;
  for (uint32_t i = 0; i < p->nslabs && slab < 0; i++)
    if (p->slabs[i].arena && p->slabs[i].device == device &&
        st__slab_alloc_take(&p->slabs[i].alloc, bytes, &off, &len) == ST_OK)
      slab = (int)i;
  if (slab < 0 && p->slots.nfree > 0) {
    slab = grow(p, device, bytes ? bytes : 1);
    refused = slab == -2;
    if (slab >= 0 && st__slab_alloc_take(&p->slabs[slab].alloc, bytes, &off, &len) != ST_OK)
      slab = -1;
  }
  int64_t slot = -1;
  if (slab >= 0) {
    slot = st__slots_take(&p->slots, (uint32_t)slab, off, len);
    if (slot < 0) st__slab_alloc_give(&p->slabs[slab].alloc, off, len);
    else p->slabs[slab].live++;
  }
  if (slot < 0) {
    int warn = !p->warned;
    p->warned = 1;
    uint64_t cap = device_cap(p, device);
    uint64_t have = atomic_load(&p->bytes);
    pthread_mutex_unlock(&p->mu);
    atomic_fetch_add(&n_fallbacks, 1);
    if (warn && refused)
      ST_LOG_W("pool", "a connection's result pool may not grow (%llu bytes in %u slabs): its "
               "owner's pools hold all that %s allows; its results get arenas of their own "
               "until some slab is retired",
               (unsigned long long)have, p->nslabs,
               p->cfg.account_limit ? p->cfg.account_limit : "its account");
    else if (warn)
      ST_LOG_W("pool", "a connection's result pool is full (%llu bytes in %u slabs, %llu bytes "
               "allowed on %s: %s, %u regions: pool.max_regions): its results get arenas of "
               "their own until it frees some",
               (unsigned long long)have, p->nslabs, (unsigned long long)cap,
               device < 0 ? "the cpu" : "this CUDA device",
               device < 0 ? "pool.max_bytes_per_connection"
                          : "pool.cuda_max_bytes_per_connection, at most a quarter of its budget",
               p->cfg.max_regions);
    return ST_ERR_LIMIT;
  }
  char *base = (char *)st__arena_base(p->slabs[slab].arena) + off;
  atomic_fetch_add(&p->refs, 1);
  pthread_mutex_unlock(&p->mu);
  /* A recycled region reads as a fresh arena, unless its maker writes
   * every byte (the slab itself was zero-filled when it was made). */
  if ((!spec->no_zero_fill && zero_region(spec, base, len) != ST_OK) ||
      !(*out = st__arena_adopt_region(region_release, p, (uint32_t)slot, device, base, bytes,
                                      len))) {
    region_release(p, (uint32_t)slot);
    return ST_ERR_LIMIT;
  }
  atomic_fetch_add(&n_regions, 1);
  return ST_OK;
}

/* The server's last reference to a region is gone. Any thread. */
static void region_release(void *owner, uint32_t slot) {
  st__mpool_t *p = owner;
  pthread_mutex_lock(&p->mu);
  if (st__slots_server_done(&p->slots, slot)) take_back(p, slot);
  pthread_mutex_unlock(&p->mu);
  pool_unref(p);
}

int st__mpool_describe(st__mpool_t *p, const st__arena_t *a, st__mpool_desc_t *d) {
  void *owner;
  uint32_t slot;
  if (!st__arena_region(a, &owner, &slot) || owner != p) return 0;
  pthread_mutex_lock(&p->mu);
  st__slot_t *s = &p->slots.slot[slot];
  int ok = s->live && !s->handed && s->slab < p->nslabs && p->slabs[s->slab].arena;
  if (ok) {
    slab_t *sl = &p->slabs[s->slab];
    d->slab = sl->arena;
    d->slab_index = s->slab;
    d->slab_id = st__arena_id(sl->arena);
    d->slab_bytes = sl->size;
    d->offset = s->off;
    d->size = s->len;
    d->slot = slot;
    d->gen = s->gen;
    d->send_slab = !sl->sent;
  }
  pthread_mutex_unlock(&p->mu);
  return ok;
}

void st__mpool_handed(st__mpool_t *p, const st__arena_t *a) {
  void *owner;
  uint32_t slot;
  if (!st__arena_region(a, &owner, &slot) || owner != p) return;
  pthread_mutex_lock(&p->mu);
  st__slots_hand_out(&p->slots, slot);
  st__slot_t *s = &p->slots.slot[slot];
  if (s->slab < p->nslabs) p->slabs[s->slab].sent = 1;
  pthread_mutex_unlock(&p->mu);
}

const st__arena_t *st__mpool_page(st__mpool_t *p, int *sent) {
  *sent = p->page_sent;
  return p->page;
}

void st__mpool_page_sent(st__mpool_t *p) { p->page_sent = 1; }

uint32_t st__mpool_slots(const st__mpool_t *p) { return p->cfg.max_regions; }

int st__mpool_copy_out(const st__arena_t *a, st__arena_t **out, char *err, size_t errlen) {
  int device = st__arena_device(a);
  uint64_t bytes = st__arena_bytes(a);
  if (device < 0) {
    int rc = st__arena_new_cpu(bytes, out, err, errlen);
    if (rc == ST_OK) memcpy(st__arena_base(*out), st__arena_base(a), (size_t)bytes);
    return rc;
  }
  int rc = st__arena_new_cuda(device, bytes, out, err, errlen);
  if (rc == ST_OK && bytes)
    rc = st__cuda_copy_dtod((uint64_t)(uintptr_t)st__arena_base(*out),
                            (uint64_t)(uintptr_t)st__arena_base(a), bytes, device, err, errlen);
  if (rc != ST_OK) {
    st__arena_unref(*out);
    *out = NULL;
  }
  return rc;
}

void st__mpool_trim_all(void) {
  pthread_mutex_lock(&reg_mu);
  uint64_t now = (uint64_t)st__now_mono_ns();
  for (st__mpool_t *p = reg_head; p; p = p->reg_next) {
    if (!p->cfg.idle_ns || atomic_load_explicit(&p->live_slabs, memory_order_relaxed) == 0)
      continue;
    if (pthread_mutex_trylock(&p->mu) != 0) continue;   /* a worker allocates */
    collect(p);
    retire_idle(p, now, now - p->last_alloc < p->cfg.idle_ns);
    pthread_mutex_unlock(&p->mu);
  }
  pthread_mutex_unlock(&reg_mu);
}

uint64_t st__mpool_bytes(const st__mpool_t *p, uint32_t *slabs) {
  if (slabs) *slabs = atomic_load_explicit(&p->live_slabs, memory_order_relaxed);
  return atomic_load_explicit(&p->bytes, memory_order_relaxed);
}

void st__mpool_stats(st__mpool_stats_t *s) {
  s->pools = atomic_load(&n_pools);
  s->slabs = atomic_load(&n_slabs);
  s->bytes = atomic_load(&n_dev_bytes[0]);
  s->cuda_bytes = 0;
  for (int i = 1; i <= ST__MPOOL_MAX_DEVICES; i++) s->cuda_bytes += atomic_load(&n_dev_bytes[i]);
  s->regions = atomic_load(&n_regions);
  s->fallbacks = atomic_load(&n_fallbacks);
  s->retired = atomic_load(&n_retired);
}

uint64_t st__mpool_device_bytes(int device) {
  return device < ST__MPOOL_MAX_DEVICES ? atomic_load(dev_bytes(device)) : 0;
}
