/* src/server/page_watch.h: wakes a loop when a shared control page a peer
 * follows changes: the publish futex of a hand-off (handoff_source.c), the
 * update futex of a live key (live_source.c). Their owner then reads the
 * pages and announces what is new at once, not at the next look of a
 * timer.
 *
 * A thread sleeps on every watched futex word at once with futex_waitv
 * (Linux 5.16). It maps each page itself (from a duplicate of its
 * descriptor), counts itself among the word's waiters while it sleeps
 * when the page has such a count (a waker then issues FUTEX_WAKE,
 * src/shm/futex.h), and after each wake reads the words again and only
 * then signals the loop, so that what the loop reads next includes every
 * move that woke it. A timer calls the callback too while pages are
 * watched: every `slow` seconds as a safety net, every `fast` seconds
 * while a page is not watched by the thread (a kernel without
 * futex_waitv, said once in the log; past ST__PWATCH_MAX pages; a page
 * that could not be mapped).
 *
 * Owner: the loop that made it (new, add, remove, free on that loop's
 * thread); the thread owns its mappings and unmaps a removed page itself.
 */
#ifndef ST_SERVER_PAGE_WATCH_H
#define ST_SERVER_PAGE_WATCH_H

#include <ev.h>
#include <stddef.h>
#include <stdint.h>

#define ST__PWATCH_MAX 120
/* `waiters` of a page without a waiter count (its writer always wakes). */
#define ST__PWATCH_NO_WAITERS ((size_t)-1)

typedef struct st__pwatch st__pwatch_t;

/* A watch whose callback `cb(loop, ud)` runs on `loop` (`what` names the
 * pages in the log: "hand-offs followed by peers"); the thread starts
 * when the kernel has futex_waitv. ST_OK or ST_ERR_OUT_OF_MEMORY. */
int st__pwatch_new(struct ev_loop *loop, const char *what, double fast, double slow,
                   void (*cb)(struct ev_loop *loop, void *ud), void *ud, st__pwatch_t **out);

/* Watches the page in descriptor fd (not kept: mapped here), `page_bytes`
 * long: the u32 futex word at byte `word` and its waiter count at byte
 * `waiters` (or ST__PWATCH_NO_WAITERS), under `key` (the caller's,
 * unique). Returns 1 when the thread wakes on it, 0 when the timer reads
 * it every `fast` seconds (the reason logged). */
int st__pwatch_add(st__pwatch_t *w, uint64_t key, int fd, uint64_t page_bytes, size_t word,
                   size_t waiters);

struct st__arena;

/* st__pwatch_add of the page in `arena` (its descriptor duplicated for
 * the mapping; `name` names the page in the log when that fails). */
int st__pwatch_add_arena(st__pwatch_t *w, uint64_t key, const struct st__arena *arena,
                         uint64_t page_bytes, size_t word, size_t waiters, const char *name);

/* Stops watching `key` (nothing when it is not watched). */
void st__pwatch_remove(st__pwatch_t *w, uint64_t key);

/* Stops the thread and the timer and unmaps every page. NULL is a no-op. */
void st__pwatch_free(st__pwatch_t *w);

#endif
