/* src/shm: the control page of a named buffer (docs/streams.md).
 *
 * A leaf header, like handoff_page.h: the layout and the few atomic
 * operations that the server (engine/buffer.c: attach, leave, unlink) and
 * libstclient (client/buffer_io.c: write, read, read_new, the writer
 * lock) both perform on the one page they share. It includes nothing of
 * src/ but the other leaf header futex.h.
 *
 * Per slot a seqlock word: 2w-1 (odd) while write number w fills the
 * slot, 2w once it is complete, 0 before any write. Write w goes to slot
 * (w-1) % slots, so with slots > 1 the slot being written is never the
 * one the newest complete write lies in. A reader takes write_sequence
 * w, checks that slot's word is 2w, copies, and checks the word again:
 * any change means a writer touched the slot meanwhile and the copy is
 * thrown away. The writer lock word holds the owner's connection id (0:
 * free); only the holder writes, so writes never overlap.
 *
 * Nothing in the page is trusted for memory safety: every process knows
 * slots, stride and the mapping sizes from the server's reply, and a slot
 * index is always computed modulo its own `slots`; the page's words are
 * data compared with what a process expects.
 */
#ifndef ST_SHM_BUFFER_PAGE_H
#define ST_SHM_BUFFER_PAGE_H

#include <stdatomic.h>
#include <stdint.h>

#include "shm/futex.h"

#define ST__BUFFER_MAGIC 0x46554253u   /* "SBUF" */
#define ST__BUFFER_VERSION 1u
#define ST__BUFFER_MAX_SLOTS 1024u

/* flags */
#define ST__BUFFER_UNLINKED 1u          /* buffer_unlink: the name is gone */

typedef struct st__buffer_slot {
  _Atomic uint64_t seq;         /* 2w-1 while write w fills it, 2w after */
  _Atomic int64_t time_ns;      /* CLOCK_REALTIME of the write it holds   */
  uint64_t reserved[6];         /* one cache line per slot                */
} st__buffer_slot_t;

/* What the server wrote at creation; never read as sizes. */
typedef struct st__buffer_geometry {
  uint32_t magic, version;
  uint32_t slots, reserved0;
  uint64_t frame_bytes, stride;
} st__buffer_geometry_t;

typedef struct st__buffer_page {
  st__buffer_geometry_t geometry;
  _Atomic uint64_t write_sequence;   /* the last complete write; 0: none   */
  _Atomic int64_t write_time;        /* its CLOCK_REALTIME, ns             */
  _Atomic uint64_t lock;             /* the owner's connection id; 0: free */
  _Atomic int32_t lock_pid;          /* the owner's pid, as it says        */
  _Atomic uint32_t flags;            /* set by the server                  */
  _Atomic uint32_t write_futex;      /* moves at every complete write      */
  _Atomic uint32_t write_waiters;    /* read-write handles in read_new     */
  _Atomic uint32_t lock_futex;       /* moves whenever the lock is freed   */
  _Atomic uint32_t lock_waiters;
  _Atomic uint32_t readonly_handles; /* kept by the server: read-only
                                        handles cannot count themselves  */
  uint32_t reserved1;
  uint64_t reserved[5];
  st__buffer_slot_t slot[];          /* at 128: one cache line each       */
} st__buffer_page_t;

_Static_assert(sizeof(st__buffer_slot_t) == 64, "a slot's words are one cache line");
_Static_assert(sizeof(st__buffer_page_t) == 128, "slots start at byte 128 (docs/streams.md)");

/* Bytes of the page of `slots` slots (before rounding to pages). */
#define ST__BUFFER_PAGE_BYTES(slots) \
  (sizeof(st__buffer_page_t) + (uint64_t)(slots) * sizeof(st__buffer_slot_t))

/* The slot write number w lies in (w 0: slot 0, never written). */
static inline uint32_t st__buffer_slot_of(uint64_t w, uint32_t slots) {
  return w ? (uint32_t)((w - 1) % slots) : 0;
}

/* Frees the writer lock when `owner` holds it and wakes whoever waits
 * for it. Returns 1 when it did. */
static inline int st__buffer_unlock(st__buffer_page_t *p, uint64_t owner) {
  uint64_t want = owner;
  if (!owner || atomic_load(&p->lock) != owner) return 0;
  atomic_store(&p->lock_pid, 0);
  if (!atomic_compare_exchange_strong(&p->lock, &want, 0)) return 0;
  st__shm_notify(&p->lock_futex, &p->lock_waiters);
  return 1;
}

#endif
