/* src/mem: the ledger of what the server's arenas hold (docs/lifecycle.md,
 * "Memory budget"; docs/operations.md).
 *
 * Every arena the server allocates is charged here BEFORE its memory is
 * allocated and discharged when its last reference goes (st__arena_unref):
 *  - bytes, per device (slot 0 "cpu", slot 1+N "cuda:N"): the allocated
 *    size (a memfd's pages, a VMM allocation's granules). Results of plain
 *    endpoints, unfetched task results, objects and a body's temporaries
 *    all count, each from allocation until the server drops it;
 *  - descriptors, all devices together: one per arena that keeps an fd
 *    open (a memfd arena, a tensor argument's received fd). A VMM arena
 *    keeps none: it exports a new one per reply.
 * A charge that does not fit its device's budget (or the descriptor cap)
 * first asks the reclaim hook (the server evicts cached objects nothing
 * else holds) and is refused when it still does not fit: the allocation
 * never starts, so the kernel's OOM killer never has to choose.
 *
 * Budgets, the cap and the hook are set at start, before any worker runs.
 * Threads: any; counters are atomic, nothing locks.
 */
#ifndef ST_MEM_LEDGER_H
#define ST_MEM_LEDGER_H

#include <stddef.h>
#include <stdint.h>

/* Devices the ledger tracks: "cpu" and cuda:0 .. cuda:63. A CUDA ordinal
 * past that is charged to no budget. */
#define ST_LEDGER_SLOTS 65

/* Asked on the allocating thread when a charge does not fit: make room
 * for `bytes` on `device` (-1: the CPU) and `fds` descriptors, then
 * return. Returns nonzero when it freed something (the charge is tried
 * again), 0 when nothing could go. */
typedef int (*st__ledger_reclaim_fn)(void *ctx, int device, uint64_t bytes, unsigned fds);

/* Figures of one device (and the process-wide descriptor figures). */
typedef struct st__ledger_stats {
  uint64_t budget;       /* bytes; 0 = none */
  uint64_t used;         /* bytes charged now */
  uint64_t fds;          /* descriptors charged now (all devices) */
  uint64_t fd_cap;       /* 0 = none */
  uint64_t refusals;     /* charges refused (all devices, bytes and fds) */
} st__ledger_stats_t;

/* The budget of `device` (-1: the CPU, else a CUDA ordinal), 0 = none;
 * and the descriptor cap, 0 = none. At start. */
void st__ledger_set_budget(int device, uint64_t bytes);
void st__ledger_set_fd_cap(uint64_t fds);

/* Installs (fn non-NULL) or removes the reclaim hook. The server sets it
 * at start and removes it before its loop goes away. Any thread. */
void st__ledger_set_reclaim(st__ledger_reclaim_fn fn, void *ctx);

/* Charges `bytes` to `device` and `fds` descriptors, asking the reclaim
 * hook for room when they do not fit. ST_OK, or (nothing charged):
 *   ST_ERR_OUT_OF_MEMORY "<N> bytes on cpu do not fit its memory budget
 *                        (<U> of <B> bytes in use ...; memory_budget.cpu)"
 *   ST_ERR_LIMIT         "<U> of <C> arena descriptors in use ...
 *                        (limits.max_arena_fds)"
 * with the message in err. Any thread; may block while the hook runs. */
int st__ledger_charge(int device, uint64_t bytes, unsigned fds, char *err, size_t errlen);

/* Gives back a charge of st__ledger_charge. Any thread. */
void st__ledger_discharge(int device, uint64_t bytes, unsigned fds);

/* Nonzero when a charge of `bytes` on `device` and `fds` descriptors
 * would fit now. Any thread. */
int st__ledger_fits(int device, uint64_t bytes, unsigned fds);

/* Figures of `device` (-1: the CPU). Any thread. */
void st__ledger_stats(int device, st__ledger_stats_t *out);

/* The memory this process may use at most, in bytes: the physical memory,
 * lowered by the memory limit of its cgroup and of every ancestor (cgroup
 * v2 memory.max and memory.high, v1 memory.limit_in_bytes). `source`
 * (may be NULL) gets "physical memory" or "cgroup <path>". 0 when sysconf
 * cannot tell. Read once; any thread. */
uint64_t st__ledger_host_memory(char *source, size_t len);

#endif
