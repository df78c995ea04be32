/* src/mem: final releases of arenas off the loop threads (docs/keys.md,
 * section 1, "Cost").
 *
 * The last unref of an arena tears it down: for a CUDA arena that is
 * driver work (the close of the last descriptor of an exported
 * allocation, cuMemRelease, cuMemUnmap, cuMemAddressFree: tens of µs
 * each), for a big memfd arena an munmap and a close that free its pages.
 * A put that pushes an old version out, a delete, a connection that goes:
 * all drop arenas on a loop thread, which serves every connection
 * meanwhile. So a loop thread hands those teardowns to one releaser
 * thread per process:
 *
 *   - the server starts the releaser (st__arena_releaser_start) before its
 *     loops run and each loop thread marks itself (st__arena_defer_here);
 *   - st__arena_unref on a marked thread gives an arena whose teardown is
 *     slow (every CUDA arena; a memfd arena of ST__ARENA_DEFER_CPU_BYTES
 *     or more; never a pool's region) to the releaser's queue
 *     (st__arena_release_defer) and returns at once; every other thread,
 *     and every arena when no releaser runs, tears down inline;
 *   - the releaser tears the queued arenas down in order (with the
 *     function arena.c queued them with): their resources, then their ledger charge and
 *     their place in st__arena_stats. So the ledger never counts as free
 *     what the server still holds: a charge that does not fit waits for
 *     the queue (st__arena_release_settle, from the server's reclaim
 *     hook) before it is refused, and the queue can never hold more than
 *     the budgets and the descriptor cap allow;
 *   - the server stops it (st__arena_releaser_stop) after its last arena
 *     went, before the process exits and its CUDA contexts go: the stop
 *     drains the queue.
 *
 * Ownership: a queued arena has no reference left; the queue owns it until
 * the releaser frees it. Threads: as each function says; the queue is
 * under one mutex.
 */
#ifndef ST_MEM_ARENA_RELEASE_H
#define ST_MEM_ARENA_RELEASE_H

#include <stddef.h>
#include <stdint.h>

/* A memfd arena of at least this many allocated bytes is released off a
 * marked thread (a smaller one's munmap and close cost less than the hand
 * off). */
#define ST__ARENA_DEFER_CPU_BYTES (1u << 20)

/* Starts the releaser thread, or counts one more user of the running one
 * (several servers embedded in one process share it). ST_OK, or
 * ST_ERR_INTERNAL when the thread cannot start (with the reason in err;
 * releases then stay inline). Any thread, at a server's start. */
int st__arena_releaser_start(char *err, size_t errlen);

/* Drops one user; the last one drains the queue (every queued arena is
 * torn down) and joins the thread. Releases are inline afterwards. Any
 * thread but the releaser, after the server dropped its arenas. */
void st__arena_releaser_stop(void);

/* Marks (on != 0) or unmarks the calling thread as one whose final
 * releases go to the releaser. A loop thread, when it starts. */
void st__arena_defer_here(int on);

/* Waits until no arena is queued or being torn down, at most `timeout_s`
 * seconds. Returns 1 when one was at the call (the ledger may have room
 * now), else 0. Any thread but the releaser; blocks. */
int st__arena_release_settle(unsigned timeout_s);

/* Arenas queued or being torn down now, and arenas handed to the releaser
 * since the process started. Any thread. */
void st__arena_release_stats(uint64_t *pending, uint64_t *deferred);

/* For st__arena_unref (arena.c): queues teardown(obj) (an arena with no
 * reference left, and the function that releases everything it holds,
 * then its ledger charge and live statistics, and frees it) when the
 * calling thread is marked and the releaser runs. 1 when queued (the
 * releaser owns obj now and calls teardown on its thread), 0 when the
 * caller must tear it down itself. Any thread. */
typedef void (*st__arena_teardown_fn)(void *obj);
int st__arena_release_defer(st__arena_teardown_fn teardown, void *obj);

#endif
