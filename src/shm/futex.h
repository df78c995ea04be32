/* src/shm: futex waits and wakes on words of a shared control page.
 *
 * A leaf header shared by the pages of hand-offs (handoff_page.h) and
 * buffers (buffer_page.h), and by the server and libstclient that both
 * map them. The pages are MAP_SHARED file mappings, so these are shared
 * futexes: every process that maps the page waits on the same key. A
 * FUTEX_WAIT only reads the word, so a process that maps the page
 * read-only may wait too.
 */
#ifndef ST_SHM_FUTEX_H
#define ST_SHM_FUTEX_H

#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Wakes every waiter of futex word f. */
static inline void st__shm_futex_wake(_Atomic uint32_t *f) {
  syscall(SYS_futex, (uint32_t *)f, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Waits while *f == seen, at most `ts` (NULL: no limit); returns at a
 * wake, a signal, a timeout or a changed word. */
static inline void st__shm_futex_wait(_Atomic uint32_t *f, uint32_t seen,
                                      const struct timespec *ts) {
  syscall(SYS_futex, (uint32_t *)f, FUTEX_WAIT, seen, ts, NULL, 0);
}

/* Moves a futex word and wakes its waiters, if any. */
static inline void st__shm_notify(_Atomic uint32_t *word, _Atomic uint32_t *waiters) {
  atomic_fetch_add(word, 1);
  if (atomic_load(waiters)) st__shm_futex_wake(word);
}

/* Waits on `word` (its value `seen` read before the caller's last check)
 * until it moves, a wake, or `deadline_ns` (CLOCK_MONOTONIC; -1: none)
 * passes. `waiters` (NULL for a process that maps the page read-only)
 * counts the waiter meanwhile, so that wakers know to wake. Returns 0
 * when the deadline had passed, else 1 (the caller checks again). */
static inline int st__shm_wait(_Atomic uint32_t *word, _Atomic uint32_t *waiters, uint32_t seen,
                               int64_t deadline_ns) {
  struct timespec ts, *tp = NULL;
  if (deadline_ns >= 0) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t left = deadline_ns - ((int64_t)now.tv_sec * 1000000000 + now.tv_nsec);
    if (left <= 0) return 0;
    ts.tv_sec = left / 1000000000;
    ts.tv_nsec = left % 1000000000;
    tp = &ts;
  }
  if (waiters) atomic_fetch_add(waiters, 1);
  st__shm_futex_wait(word, seen, tp);
  if (waiters) atomic_fetch_sub(waiters, 1);
  return 1;
}

#endif
