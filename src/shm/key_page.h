/* src/shm: the control page of a live key (docs/views.md, section 3).
 *
 * A leaf header, like buffer_page.h: the layout and the atomic operations
 * that the server (engine/keys.c: creation, the publisher leaving,
 * delete) and libstclient (client/live.c: updates, versions, waits,
 * consistent reads) both perform on the one page they share. It includes
 * nothing of src/ but the leaf header futex.h.
 *
 * A seqlock over the key's memory, updated in place: `seq` is 2v while
 * version v is complete, 2v+1 while the update to v+1 runs. Only the
 * publisher (the connection the server named in `owner`) writes the
 * memory and moves `seq`; it maps the page read-write, readers map it
 * read-only. The end of an update stores `version`, makes `seq` even,
 * moves `futex` and wakes every waiter (readers cannot count themselves
 * in a page they map read-only, so the publisher always wakes: one
 * system call per update).
 *
 * Nothing in the page is trusted for memory safety: sizes and addresses
 * come from the server's reply; the page's words are compared, never
 * used as sizes or offsets.
 */
#ifndef ST_SHM_KEY_PAGE_H
#define ST_SHM_KEY_PAGE_H

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "shm/futex.h"

#define ST__KEY_PAGE_MAGIC 0x59454b53u   /* "SKEY" */
#define ST__KEY_PAGE_LAYOUT 1u
#define ST__KEY_PAGE_BYTES 4096u

/* flags, set by the server (TORN is cleared by the next complete update) */
#define ST__KEY_TORN 1u       /* the publisher left in the middle of an update */
#define ST__KEY_DELETED 2u    /* the key was deleted                          */

typedef struct st__key_page {
  uint32_t magic, layout;          /* server, once                         */
  _Atomic uint32_t flags;          /* ST__KEY_TORN, ST__KEY_DELETED        */
  uint32_t reserved0;
  _Atomic uint64_t seq;            /* 2v: version v complete; odd: updating */
  _Atomic uint64_t version;        /* the last complete version            */
  _Atomic int64_t update_time;     /* its CLOCK_REALTIME, ns               */
  _Atomic uint64_t owner;          /* the publisher's connection id; 0: none
                                      (server)                             */
  _Atomic uint32_t futex;          /* moves at every complete update and
                                      when the server sets a flag          */
  uint32_t reserved1;
  uint64_t reserved[9];
} st__key_page_t;

_Static_assert(sizeof(st__key_page_t) == 128, "the page's words are two cache lines");

static inline int64_t st__key_page_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The server's initialization: version 1 complete, published by `owner`. */
static inline void st__key_page_init(st__key_page_t *p, uint64_t owner) {
  p->magic = ST__KEY_PAGE_MAGIC;
  p->layout = ST__KEY_PAGE_LAYOUT;
  atomic_store(&p->version, 1);
  atomic_store(&p->update_time, st__key_page_now_ns());
  atomic_store(&p->owner, owner);
  atomic_store(&p->seq, 2);
}

/* Sets flag f (server) and wakes every waiter. */
static inline void st__key_page_flag(st__key_page_t *p, uint32_t f) {
  atomic_fetch_or(&p->flags, f);
  atomic_fetch_add(&p->futex, 1);
  st__shm_futex_wake(&p->futex);
}

/* Begins an update: `seq` odd (an odd one, left by a publisher that died
 * mid-update, stays as it is), then a full fence, so that the odd word is
 * visible before any byte of the memory changes. Returns the odd word. */
static inline uint64_t st__key_page_begin(st__key_page_t *p) {
  uint64_t s = atomic_load(&p->seq);
  if (!(s & 1)) atomic_store_explicit(&p->seq, ++s, memory_order_relaxed);
  atomic_thread_fence(memory_order_seq_cst);
  return s;
}

/* Ends the update begun with odd word s (every write to the memory is
 * complete, device writes included): TORN cleared (while `seq` is still
 * odd, so no reader sees a complete version marked torn), the next
 * version, `seq` even (release: the memory's bytes before the even word),
 * the futex moved and the waiters woken. Returns the new version. */
static inline uint64_t st__key_page_end(st__key_page_t *p, uint64_t s) {
  uint64_t v = (s + 1) / 2;
  if (atomic_load_explicit(&p->flags, memory_order_relaxed) & ST__KEY_TORN)
    atomic_fetch_and(&p->flags, ~ST__KEY_TORN);
  atomic_store_explicit(&p->update_time, st__key_page_now_ns(), memory_order_relaxed);
  atomic_store_explicit(&p->version, v, memory_order_release);
  atomic_store_explicit(&p->seq, s + 1, memory_order_release);
  atomic_fetch_add(&p->futex, 1);
  st__shm_futex_wake(&p->futex);
  return v;
}

/* Whether `seq` is odd now: an update runs, or its publisher died in it. */
static inline int st__key_page_updating(st__key_page_t *p) {
  return (int)(atomic_load(&p->seq) & 1);
}

#endif
