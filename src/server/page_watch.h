/* src/server/page_watch.h: a thread that sleeps on futex words of shared
 * control pages and wakes a loop when one moves (handoff_source.c: the
 * publish futex of each hand-off a peer follows, so a publish is
 * announced at once rather than at the next look of a timer).
 *
 * The thread maps each watched page itself (from a duplicate of its
 * descriptor), counts itself among the word's waiters while it sleeps (so
 * a waker issues FUTEX_WAKE, src/shm/futex.h), and sleeps on every word
 * at once with futex_waitv (Linux 5.16). After each wake it reads the
 * words again and only then signals the loop, so that what the loop reads
 * next includes every move that woke it. At most ST__PWATCH_MAX words; a
 * kernel without futex_waitv, or more words, leaves the caller's timer as
 * the only look (st__pwatch_add says so).
 *
 * Owner: the loop that made it (add, remove, free on that loop's thread);
 * the thread owns its mappings and unmaps a removed page itself.
 */
#ifndef ST_SERVER_PAGE_WATCH_H
#define ST_SERVER_PAGE_WATCH_H

#include <ev.h>
#include <stddef.h>
#include <stdint.h>

#define ST__PWATCH_MAX 120

typedef struct st__pwatch st__pwatch_t;

/* Starts the thread; `cb(loop, ud)` runs on `loop` after a watched word
 * moved. ST_OK, or an error with the reason. */
int st__pwatch_new(struct ev_loop *loop, void (*cb)(struct ev_loop *loop, void *ud), void *ud,
                   st__pwatch_t **out, char *err, size_t errlen);

/* Watches the page in descriptor fd (not kept: duplicated and mapped
 * here), `page_bytes` long: the u32 futex word at byte `word` and its
 * waiter count at byte `waiters`, under `key` (the caller's, unique).
 * ST_OK, or ST_ERR_LIMIT / ST_ERR_CAPABILITY (no futex_waitv) / an mmap
 * failure with the reason: the caller's timer then reads the page. */
int st__pwatch_add(st__pwatch_t *w, uint64_t key, int fd, uint64_t page_bytes, size_t word,
                   size_t waiters, char *err, size_t errlen);

/* Stops watching `key` (nothing when it is not watched). */
void st__pwatch_remove(st__pwatch_t *w, uint64_t key);

/* Stops the thread and unmaps every page. NULL is a no-op. */
void st__pwatch_free(st__pwatch_t *w);

#endif
