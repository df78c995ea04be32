/* src/server: room for an allocation that does not fit (mem/ledger.h).
 *
 * Arenas are allocated on worker threads and charged to the ledger before
 * their memory exists; the cache that could give room back belongs to the
 * loop thread. When a charge does not fit, the ledger calls the hook
 * installed here on the allocating thread: it hands the request to the
 * loop (an ev_async), which evicts cached objects nothing else holds
 * (st__objects_reclaim) and answers; the worker then tries the charge
 * again. On the loop thread itself the hook evicts directly. A worker
 * waits at most ST__RECLAIM_WAIT_S, and not at all once the loop stopped
 * serving (st__reclaim_stop), so the loop never waits for a worker that
 * waits for the loop.
 */
#ifndef ST_SERVER_RECLAIM_H
#define ST_SERVER_RECLAIM_H

#include <stdint.h>

struct st__server;

/* Seconds a worker waits for the loop to answer before its charge is
 * refused. */
#define ST__RECLAIM_WAIT_S 10.0

/* Sets the ledger's budgets and descriptor cap from the server's config
 * (the cpu budget and limits.max_arena_fds; CUDA budgets come with the
 * devices), starts the watcher and installs the hook. ST_OK or
 * ST_ERR_OUT_OF_MEMORY. Loop thread (the thread that runs the loop), at
 * start. */
int st__reclaim_start(struct st__server *srv);

/* Removes the hook and wakes every waiting worker (their charges are
 * refused): call when the loop stopped serving, before the workers are
 * joined. Loop thread. */
void st__reclaim_stop(struct st__server *srv);

/* Frees the state once no worker can be inside the hook (after the workers
 * were joined). Loop thread. */
void st__reclaim_free(struct st__server *srv);

/* The descriptor cap limits.max_arena_fds gives (0 there: half of the
 * RLIMIT_NOFILE soft limit, at least 64), and the RLIMIT_NOFILE soft limit
 * it was derived from into *nofile (may be NULL). Any thread. */
uint64_t st__reclaim_fd_cap(uint64_t configured, uint64_t *nofile);

#endif
