/* src/shm: the control page of a hand-off (docs/pool.md, section 5).
 *
 * A leaf header, like the other pages of src/shm: the layout and the few atomic
 * operations that the server (engine/handoff.c: sweeps for a consumer
 * that left) and libstclient (client/handoff.c: acquire, publish, read,
 * acknowledge) both perform on the one page they share. It includes
 * nothing of src/ and links nothing.
 *
 * The page is a memfd of the server's, mapped read-write by the server,
 * the producer and every consumer. Per chunk one 64-bit word holds
 *
 *     bits 63..32  the sequence number of its last publish (never 0 once
 *                  published; wraps after 2^32 publishes)
 *     bit  31      the producer holds it (acquired, not yet published)
 *     bits 30..0   consumers that have not acknowledged that publish
 *
 * so a chunk is free exactly when its low 32 bits are 0. Every change is a
 * compare-and-swap of the whole word: an acknowledgement clears the
 * consumer's own bit only when the sequence number is the one it names,
 * so an ack of a recycled chunk (a stale sequence) or a second ack (the
 * bit is already clear) changes nothing and cannot drive the chunk to
 * free early or touch another consumer's bit. `expected` holds the bits
 * of the consumer slots a publish waits for; the server clears a slot's
 * bit when its connection leaves and clears that bit in every chunk.
 *
 * Futex words (shared futexes: the page is a MAP_SHARED file mapping, so
 * every process waits on the same key): `free_futex` moves whenever a
 * chunk becomes free, `pub_futex` whenever a chunk is published or the
 * flags change. A waker issues FUTEX_WAKE only when the matching
 * `*_waiters` count is not 0, so publishing and acknowledging cost no
 * system call while nobody waits.
 *
 * Nothing in the page is trusted for memory safety: every process knows
 * chunks, stride and the mapping sizes from the server's reply, never
 * from the page; the page's words are data compared with what a process
 * expects.
 */
#ifndef ST_SHM_HANDOFF_PAGE_H
#define ST_SHM_HANDOFF_PAGE_H

#include <stdatomic.h>
#include <stdint.h>

#include "shm/futex.h"

#define ST__HANDOFF_MAGIC 0x46444853u   /* "SHDF" */
#define ST__HANDOFF_VERSION 1u
#define ST__HANDOFF_MAX_CONSUMERS 31u
#define ST__HANDOFF_PRODUCER_BIT 0x80000000u
#define ST__HANDOFF_MASK 0xffffffffu

/* flags */
#define ST__HANDOFF_PRODUCER_GONE 1u   /* the producer's connection left  */
#define ST__HANDOFF_DELETED 2u         /* handoff_delete: the server let go */

typedef struct st__handoff_chunk {
  _Atomic uint64_t word;        /* seq << 32 | producer bit | pending bits */
  _Atomic uint64_t bytes;       /* bytes of the last publish               */
} st__handoff_chunk_t;

typedef struct st__handoff_page {
  uint32_t magic, version;
  uint32_t chunks, consumers;
  uint64_t chunk_bytes, stride;
  _Atomic uint32_t expected;    /* consumer bits a publish waits for       */
  _Atomic uint32_t flags;
  _Atomic uint32_t next_seq;    /* the last sequence number handed out     */
  _Atomic uint32_t free_futex;
  _Atomic uint32_t free_waiters;
  _Atomic uint32_t pub_futex;
  _Atomic uint32_t pub_waiters;
  uint32_t reserved0;
  uint64_t reserved[4];
  st__handoff_chunk_t chunk[];
} st__handoff_page_t;

/* Bytes of the page of `chunks` chunks (before rounding to pages). */
static inline uint64_t st__handoff_page_bytes(uint32_t chunks) {
  return sizeof(st__handoff_page_t) + (uint64_t)chunks * sizeof(st__handoff_chunk_t);
}

static inline uint32_t st__handoff_tag(uint64_t w) { return (uint32_t)(w >> 32); }

/* Clears `bits` of chunk i's pending set, when its sequence number is
 * `tag` (any sequence when any_tag). Returns -1 when the sequence differs,
 * 0 when none of `bits` was set (nothing changed), 1 when they were
 * cleared; *freed is then 1 when the chunk became free (the caller
 * notifies free_futex). */
static inline int st__handoff_clear(st__handoff_page_t *p, uint32_t i, uint32_t bits,
                                    uint32_t tag, int any_tag, int *freed) {
  _Atomic uint64_t *wp = &p->chunk[i].word;
  uint64_t w = atomic_load(wp);
  *freed = 0;
  for (;;) {
    if (!any_tag && st__handoff_tag(w) != tag) return -1;
    if (!((uint32_t)w & bits)) return 0;
    uint64_t nw = w & ~(uint64_t)bits;
    if (atomic_compare_exchange_weak(wp, &w, nw)) {
      *freed = ((uint32_t)nw & ST__HANDOFF_MASK) == 0;
      return 1;
    }
  }
}

/* The next sequence number a publish hands out (never 0: "never"). */
static inline uint32_t st__handoff_next_seq(st__handoff_page_t *p) {
  uint32_t s = atomic_fetch_add(&p->next_seq, 1) + 1;
  if (s == 0) s = atomic_fetch_add(&p->next_seq, 1) + 1;
  return s;
}

/* Publishes chunk i, which the producer holds (its low word is the
 * producer bit), as sequence `tag` with `bytes`: the pending bits become
 * `expected`, and the waiters are woken. A consumer that left between
 * the load of `expected` and the swap was swept before the swap landed:
 * its bit is cleared here (engine/handoff.c, sweep_slot). 0, or -1 when
 * the chunk is not held (nothing changed). The producer's library
 * (tag: st__handoff_next_seq) and a server's mirror of a peer's hand-off
 * (tag: the peer's sequence number) both publish through it. */
static inline int st__handoff_publish_as(st__handoff_page_t *p, uint32_t i, uint64_t bytes,
                                         uint32_t tag) {
  _Atomic uint64_t *wp = &p->chunk[i].word;
  uint64_t w = atomic_load(wp);
  if ((uint32_t)w != ST__HANDOFF_PRODUCER_BIT) return -1;
  atomic_store(&p->chunk[i].bytes, bytes);
  uint32_t expected = atomic_load(&p->expected);
  if (!atomic_compare_exchange_strong(wp, &w, (uint64_t)tag << 32 | expected)) return -1;
  uint32_t left = expected & ~atomic_load(&p->expected);
  int freed = expected == 0;
  if (left) st__handoff_clear(p, i, left, tag, 0, &freed);
  if (freed) st__shm_notify(&p->free_futex, &p->free_waiters);
  st__shm_notify(&p->pub_futex, &p->pub_waiters);
  return 0;
}

/* Takes chunk i for the producer when it is free (low word 0): 1, else
 * 0. */
static inline int st__handoff_take(st__handoff_page_t *p, uint32_t i) {
  _Atomic uint64_t *wp = &p->chunk[i].word;
  uint64_t w = atomic_load(wp);
  return (uint32_t)w == 0 && atomic_compare_exchange_strong(wp, &w, w | ST__HANDOFF_PRODUCER_BIT);
}

/* Gives back chunk i that the producer holds and did not publish: 1, or
 * 0 when it was not held. */
static inline int st__handoff_untake(st__handoff_page_t *p, uint32_t i) {
  _Atomic uint64_t *wp = &p->chunk[i].word;
  uint64_t w = atomic_load(wp);
  if ((uint32_t)w != ST__HANDOFF_PRODUCER_BIT ||
      !atomic_compare_exchange_strong(wp, &w, w & ~(uint64_t)ST__HANDOFF_MASK))
    return 0;
  st__shm_notify(&p->free_futex, &p->free_waiters);
  return 1;
}

#endif
