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
 * A replication's reader (a process outside the publisher's that copies
 * the memory to another host as one version: docs/multihost.md, "Live
 * replication") takes the page's `fence` around its read; an update
 * begun meanwhile gives way until the fence drops or its deadline
 * passes (st__key_page_begin_fenced, st__key_page_fence_raise). A replica's
 * page is published by its server's transfer helper, under the source's
 * version numbers (st__key_page_end_as).
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
  _Atomic uint32_t fence;          /* replication reads in progress (0 in
                                      pages of servers before them)        */
  _Atomic int64_t fence_until;     /* CLOCK_MONOTONIC ns by which the last
                                      fence taken promised to drop         */
  uint64_t reserved[8];
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

static inline int64_t st__key_page_mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The longest an update gives way to a fence, whatever the page says. */
#define ST__KEY_FENCE_MAX_NS (60ll * 1000000000)

/* st__key_page_begin that first gives way to replication reads: while a
 * fence is up, `seq` goes back to its even word (waking the readers that
 * saw it odd) and the update waits for the fence to drop, until the
 * fence's deadline or ST__KEY_FENCE_MAX_NS from now, whichever is first;
 * past it, the update goes ahead (*overran set: the fence holder's
 * st__key_page_fence_check then fails). The odd word and the fence are
 * each a sequentially consistent store followed by a load of the other,
 * so of an update and a fence raised at once, at least one sees the other
 * (st__key_page_fence_settled). Returns the odd word. */
static inline uint64_t st__key_page_begin_fenced(st__key_page_t *p, int *overran) {
  int64_t cap = st__key_page_mono_ns() + ST__KEY_FENCE_MAX_NS;
  *overran = 0;
  for (;;) {
    uint64_t s = atomic_load(&p->seq);
    if (s & 1) {   /* left odd by a publisher that died mid-update */
      atomic_thread_fence(memory_order_seq_cst);
      return s;
    }
    /* A fence already up is waited for without touching `seq`: a
     * holder's check (st__key_page_fence_check) then never sees the odd
     * word of an update that gives way. */
    uint32_t f = atomic_load(&p->fence);
    if (f == 0) {
      atomic_store(&p->seq, s + 1);
      f = atomic_load(&p->fence);
      if (f == 0) return s + 1;
      atomic_store(&p->seq, s);
      atomic_fetch_add(&p->futex, 1);
      st__shm_futex_wake(&p->futex);
    }
    int64_t until = atomic_load(&p->fence_until), now = st__key_page_mono_ns();
    if (until > cap) until = cap;
    if (now >= until) {
      *overran = 1;
      atomic_store(&p->seq, s + 1);
      return s + 1;
    }
    int64_t left = until - now;
    struct timespec ts = {left / 1000000000, left % 1000000000};
    st__shm_futex_wait(&p->fence, f, &ts);
  }
}

/* Raises a fence for a read of the memory as one version that promises
 * to end by `until` (CLOCK_MONOTONIC ns): from here no update begins
 * (each gives way, st__key_page_begin_fenced) until the fence drops or
 * `until` passes; an update that began before goes on to its end.
 * Several holders may hold it at once. Then st__key_page_fence_settled. */
static inline void st__key_page_fence_raise(st__key_page_t *p, int64_t until) {
  if (atomic_load(&p->fence_until) < until) atomic_store(&p->fence_until, until);
  atomic_fetch_add(&p->fence, 1);
}

/* After st__key_page_fence_raise: 1 and *version when `seq` is even (the
 * memory is that version, and stays so while the fence is up), 0 while
 * an update that began before the fence runs (ask again). The fence's
 * increment and this read of `seq`, and an update's odd store and its
 * read of the fence, are each sequentially consistent: of the two, at
 * least one sees the other. */
static inline int st__key_page_fence_settled(st__key_page_t *p, uint64_t *version) {
  uint64_t s = atomic_load(&p->seq);
  if (s & 1) return 0;
  *version = s / 2;
  return 1;
}

/* Lets go of a fence; the last one wakes an update that gives way. */
static inline void st__key_page_fence_drop(st__key_page_t *p) {
  if (atomic_fetch_sub(&p->fence, 1) == 1) st__shm_futex_wake(&p->fence);
}

/* Clears every fence (the server, when no holder can be left: a restored
 * page, whose lends went with the server before) and wakes an update
 * that gives way. */
static inline void st__key_page_fence_clear(st__key_page_t *p) {
  atomic_store(&p->fence_until, 0);
  atomic_store(&p->fence, 0);
  st__shm_futex_wake(&p->fence);
}

/* A fence for a holder that does not wait: raised and settled at once
 * (1 and *version), or dropped again when an update runs (0). */
static inline int st__key_page_fence_take(st__key_page_t *p, int64_t until, uint64_t *version) {
  st__key_page_fence_raise(p, until);
  if (st__key_page_fence_settled(p, version)) return 1;
  st__key_page_fence_drop(p);
  return 0;
}

/* Whether what was read under a fence taken at `version` is that version
 * whole: no update began since (one that overran the fence did). Read
 * after the reads themselves are complete. */
static inline int st__key_page_fence_check(st__key_page_t *p, uint64_t version) {
  atomic_thread_fence(memory_order_acquire);
  return atomic_load(&p->seq) == 2 * version;
}

/* Ends the update begun with odd word s as version v (> the version
 * before it; a replica takes its source's numbers, which may skip): every
 * write to the memory is complete, device writes included; TORN cleared
 * (while `seq` is still odd, so no reader sees a complete version marked
 * torn), the version, `seq` 2v (release: the memory's bytes before the
 * even word), the futex moved and the waiters woken. */
static inline void st__key_page_end_as(st__key_page_t *p, uint64_t s, uint64_t v) {
  (void)s;
  if (atomic_load_explicit(&p->flags, memory_order_relaxed) & ST__KEY_TORN)
    atomic_fetch_and(&p->flags, ~ST__KEY_TORN);
  atomic_store_explicit(&p->update_time, st__key_page_now_ns(), memory_order_relaxed);
  atomic_store_explicit(&p->version, v, memory_order_release);
  atomic_store_explicit(&p->seq, 2 * v, memory_order_release);
  atomic_fetch_add(&p->futex, 1);
  st__shm_futex_wake(&p->futex);
}

/* Ends the update begun with odd word s as the next version; returns it
 * (st__key_page_end_as). */
static inline uint64_t st__key_page_end(st__key_page_t *p, uint64_t s) {
  uint64_t v = (s + 1) / 2;
  st__key_page_end_as(p, s, v);
  return v;
}

/* Whether `seq` is odd now: an update runs, or its publisher died in it. */
static inline int st__key_page_updating(st__key_page_t *p) {
  return (int)(atomic_load(&p->seq) & 1);
}

#endif
