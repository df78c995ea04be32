/* src/mem: per-connection pools of result memory (docs/pool.md, sections
 * 1-3). A pool owns up to ST__MPOOL_MAX_SLABS slabs, per device it is
 * used on (CPU: sealed memfd arenas; CUDA: VMM arenas of
 * st__arena_new_cuda; each charged to the ledger and its device's budget
 * like any arena) and a control page (a
 * small sealed memfd arena the client maps read-write to say which
 * regions it is done with). Results are sub-allocated as regions: an
 * arena of kind "pool" (arena.c) whose base is inside a slab; a region
 * is taken back when the server's last reference to its arena is gone
 * and, once it was handed to the client, the client stored its
 * generation into the page (slab_alloc.h).
 *
 * Slabs follow use: the first CPU slab is the smallest power of two
 * that holds max(ST__MPOOL_MIN_SLAB, the result), each next doubles the
 * largest live one, up to cfg.slab_bytes a slab (a single result larger
 * than that gets a slab of its own size); the first slab of a CUDA
 * device is cuda_slab_bytes, each next doubles. The slabs of a device
 * together stay within max_bytes
 * (cuda_max_bytes). A slab with no live region for cfg.idle_ns is
 * retired, when a worker next allocates from the pool (never the oldest
 * live slab of its device then: the connection is calling) or at
 * st__mpool_trim_all (the oldest too, once the pool made no allocation
 * for idle_ns: an idle connection ends up holding no slab). Its
 * allocation goes (a CPU slab's pages are dropped at once, even while
 * the owner still maps it), and the owner learns it from the slab's bit
 * in the page's `retired` word, which it clears once it let its mapping
 * go; only then may a new slab take the index.
 *
 * A worker allocates from the pool that st__mpool_use made current on its
 * thread (st__arena_new asks it first); anything that does
 * not fit (the pool's cap, its slots, a result larger than
 * max_result_bytes) falls back to an arena of its own.
 *
 * Threads: one mutex per pool guards everything; any thread. The pool is
 * reference counted: its owner (the connection) holds one, every live
 * region another; slabs and the page go with the last. */
#ifndef ST_MEM_POOL_H
#define ST_MEM_POOL_H

#include <stdint.h>

#include "mem/arena.h"

#define ST__MPOOL_MAX_SLABS 32
#define ST__MPOOL_PAGE_MAGIC 0x4c505453u   /* "STPL" little-endian */
#define ST__MPOOL_PAGE_VERSION 1u
#define ST__MPOOL_PAGE_HEADER 64u          /* freed[] starts here */
#define ST__MPOOL_PAGE_RETIRED 16u         /* u32: bit per slab index */
#define ST__MPOOL_MIN_SLAB (64u << 10)     /* the smallest first slab   */

typedef struct st__mpool st__mpool_t;

typedef struct st__mpool_cfg {
  uint64_t slab_bytes;        /* the largest CPU slab (the first is sized
                                 to its result, each next doubles)        */
  uint64_t max_bytes;         /* all CPU slabs of the pool together      */
  uint64_t max_result_bytes;  /* larger CPU arenas are not pooled        */
  uint64_t cuda_slab_bytes;   /* the first slab on a CUDA device; each
                                 next doubles                            */
  uint64_t cuda_max_bytes;    /* the slabs of one CUDA device together;
                                 never more than a quarter of its budget
                                 (the ledger's) when it has one          */
  uint64_t cuda_max_result_bytes; /* larger CUDA arenas are not pooled   */
  uint32_t max_regions;       /* live regions (slots of the page)        */
  uint64_t idle_ns;           /* a slab with no live region this long is
                                 retired, unless it is its device's
                                 oldest while the pool is used (0: never) */
  /* Optional: the owner's account of slab bytes (a per-uid quota).
   * account(ctx, device, +n) is asked before a slab of n bytes is made
   * (nonzero: refused, the result gets an arena of its own) and told
   * (ctx, device, -n) when one goes; account_drop(ctx) once, when the
   * pool is freed. Under the pool's mutex, any thread. */
  int (*account)(void *ctx, int device, int64_t bytes);
  void (*account_drop)(void *ctx);
  void *account_ctx;
  const char *account_limit;  /* the limit's name, for the log           */
} st__mpool_cfg_t;

/* A new pool with its control page (no slab yet). *out holds the owner's
 * reference. ST_OK, or the error of st__arena_new_cpu with the reason. */
int st__mpool_new(const st__mpool_cfg_t *cfg, st__mpool_t **out, char *err, size_t errlen);

/* One more reference (a job that allocates from p). Any thread. */
void st__mpool_ref(st__mpool_t *p);

/* Drops one reference (the owner's when the connection closed, a job's);
 * regions the server still uses keep the slabs until they go. NULL is a
 * no-op. Any thread. */
void st__mpool_close(st__mpool_t *p);

/* Makes p the pool st__arena_new allocates arenas from on this thread
 * (NULL: none). The thread keeps no reference: the caller keeps p alive
 * while it is current. Worker thread. */
void st__mpool_use(st__mpool_t *p);

/* Made current (st__mpool_use), a pool gives st__arena_new a region for
 * a CPU or CUDA (VMM, not legacy) arena of up to its device's
 * max_result_bytes, from a slab of that device: zero-filled unless the
 * spec says `written` (CPU: memset; CUDA: cuMemsetD8Async on the spec's
 * stream, or synchronous without one). Skipping the fill shows the
 * region's last contents, which only ever belonged to the same
 * connection. A full pool (its cap, its slots) gives nothing: counted in
 * pool_fallbacks and logged once per pool, and the arena is one of its
 * own. */

/* How a pool arena travels in one reply (st__mpool_hand_out). */
typedef struct st__mpool_desc {
  const st__arena_t *slab;    /* borrowed: dup its fd when send_slab      */
  uint64_t slab_id, slab_bytes, offset, size;
  uint32_t slab_index;        /* its bit in the page's `retired` word     */
  uint32_t slot, gen;
  int send_slab;              /* the connection has not got the slab yet  */
} st__mpool_desc_t;

/* 1 when `a` is a region of pool p, free to go to p's owner (never handed
 * out before); fills *d. 0 when it is not a region of p or was handed out
 * already: the reply must not describe it as pooled. Loop thread. */
int st__mpool_describe(st__mpool_t *p, const st__arena_t *a, st__mpool_desc_t *d);

/* The reply carrying `a` (described by st__mpool_describe) was queued:
 * the client holds the region now, and has the slab. Loop thread. */
void st__mpool_handed(st__mpool_t *p, const st__arena_t *a);

/* The control page: its arena (borrowed), and whether the owner has it
 * already; st__mpool_page_sent records that it has. Loop thread. */
const st__arena_t *st__mpool_page(st__mpool_t *p, int *sent);
void st__mpool_page_sent(st__mpool_t *p);
uint32_t st__mpool_slots(const st__mpool_t *p);

/* An arena of its own with a copy of a pool arena's bytes, on the same
 * device (for a reply that may not carry the region: another connection,
 * a second reply). *out holds one reference. Errors of st__arena_new_cpu
 * / st__arena_new_cuda and of the copy. Any thread. */
int st__mpool_copy_out(const st__arena_t *a, st__arena_t **out, char *err, size_t errlen);

/* Retires the idle slabs of every pool (the rules above; a pool that a
 * worker holds at the moment is left for its next look), after taking
 * back what the owners freed. Any thread (the server's sweep timer). */
void st__mpool_trim_all(void);

/* The slab bytes of p, every device, and how many slabs (lock-free
 * reads: info). Any thread. */
uint64_t st__mpool_bytes(const st__mpool_t *p, uint32_t *slabs);

/* Process-wide figures for info and metrics (bytes: CPU slabs; cuda_bytes:
 * the slabs of every CUDA device). Any thread. */
typedef struct st__mpool_stats {
  uint64_t pools, slabs, bytes, cuda_bytes, regions, fallbacks, retired;
} st__mpool_stats_t;
void st__mpool_stats(st__mpool_stats_t *s);

/* Slab bytes of all pools on `device` (-1: the CPU, else a CUDA ordinal
 * below ST__MPOOL_MAX_DEVICES; 0 for others). Any thread. */
#define ST__MPOOL_MAX_DEVICES 64
uint64_t st__mpool_device_bytes(int device);

#endif
