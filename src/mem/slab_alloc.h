/* src/mem: the allocator of a pool's slabs and the slot table of its
 * regions (docs/pool.md, sections 1 and 2). Pure bookkeeping: no memory
 * is mapped or touched here, no locks are taken (the pool's mutex guards
 * every call), so it is tested on its own (tests/mem/test_slab_alloc.c).
 *
 * A slab is `size` bytes (a multiple of ST__SLAB_PAGE). Regions are whole
 * pages: two regions never share a page. The free list is kept sorted by
 * offset and neighbours coalesce on give; take is best fit. A page bitmap
 * records what is handed out, so that giving back a range that is not
 * wholly handed out is refused instead of corrupting the list.
 *
 * The slot table names the live regions of a pool for the client's
 * control page: each live region has a slot and the generation it was
 * handed out with (never 0, so that a zeroed page frees nothing). A region
 * is taken back only when both sides are done with it: the server's last
 * reference is gone (st__slots_server_done) and, if it was handed to the
 * client (st__slots_hand_out), the client stored its generation into
 * freed[slot] (st__slots_scan). */
#ifndef ST_MEM_SLAB_ALLOC_H
#define ST_MEM_SLAB_ALLOC_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define ST__SLAB_PAGE 4096u

typedef struct st__slab_block {
  uint64_t off, len;
} st__slab_block_t;

typedef struct st__slab_alloc {
  uint64_t size;              /* bytes, a multiple of ST__SLAB_PAGE     */
  st__slab_block_t *free;     /* sorted by offset, never adjacent       */
  size_t nfree, cap;
  uint64_t free_bytes;
  uint8_t *pages;             /* bit per page: 1 = handed out           */
} st__slab_alloc_t;

/* An empty allocator of `size` bytes (rounded down to whole pages; at
 * least one). ST_OK or ST_ERR_OUT_OF_MEMORY. */
int st__slab_alloc_init(st__slab_alloc_t *s, uint64_t size);
void st__slab_alloc_destroy(st__slab_alloc_t *s);

/* Takes a region of at least `bytes` (rounded up to whole pages, one page
 * for 0): *off and *len (the rounded size). ST_ERR_OUT_OF_MEMORY when no
 * free block is large enough. */
int st__slab_alloc_take(st__slab_alloc_t *s, uint64_t bytes, uint64_t *off, uint64_t *len);

/* Gives back [off, off + len): ST_OK, or ST_ERR_INVALID_ARGUMENT (nothing
 * changes) when the range is not page-aligned, leaves the slab, or any of
 * its pages is not handed out (a double or forged give). */
int st__slab_alloc_give(st__slab_alloc_t *s, uint64_t off, uint64_t len);

/* 1 when every page of [off, off + len) is handed out, 0 when none is,
 * -1 when some are (tests). */
int st__slab_alloc_held(const st__slab_alloc_t *s, uint64_t off, uint64_t len);

/* ------------------------------------------------------------ slots */

typedef struct st__slot {
  uint32_t gen;               /* generation of the current or next use  */
  uint8_t live;               /* a region holds the slot                */
  uint8_t handed;             /* the client was given it                */
  uint8_t server_done;        /* the server's last reference is gone    */
  uint8_t client_freed;       /* the page said so, for this gen         */
  uint32_t slab;              /* where the region is                    */
  uint64_t off, len;
} st__slot_t;

typedef struct st__slots {
  uint32_t n;
  st__slot_t *slot;
  uint32_t *free_ids;         /* stack of unused slots                  */
  uint32_t nfree;
  uint32_t seen_count;        /* the page's freed_count at the last scan */
} st__slots_t;

int st__slots_init(st__slots_t *t, uint32_t n);
void st__slots_destroy(st__slots_t *t);

/* A free slot for a region at (slab, off, len): its index, or -1 when all
 * n are live. */
int64_t st__slots_take(st__slots_t *t, uint32_t slab, uint64_t off, uint64_t len);

/* The client was given slot i (loop thread, at reply time). */
void st__slots_hand_out(st__slots_t *t, uint32_t i);

/* The server's last reference to slot i's region is gone. Returns 1 when
 * the region may be taken back now (never handed out, or the client freed
 * it): the caller gives its pages back and calls st__slots_release. */
int st__slots_server_done(st__slots_t *t, uint32_t i);

/* Compares `freed_count` with the last one seen; when it moved, reads each
 * live, handed-out slot's freed[] word once and marks the ones that equal
 * their generation. Writes into out[] (room for t->n) the slots that may
 * be taken back now; returns their count. `freed` has t->n words written
 * by the client: any value is only compared. */
uint32_t st__slots_scan(st__slots_t *t, const _Atomic uint32_t *freed, uint32_t freed_count,
                        uint32_t *out);

/* Frees slot i for reuse with the next generation. */
void st__slots_release(st__slots_t *t, uint32_t i);

#endif
