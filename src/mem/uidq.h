/* src/mem: the per-uid ledger of quotas (docs/security.md, finding 3;
 * docs/operations.md, "Quotas").
 *
 * What one uid holds of each counted kind (keys, key versions, buffers,
 * hand-offs, tasks, arena descriptors, pinned bytes, pool bytes), and the
 * limit config.lua's `quotas` table sets for every uid. A charge that
 * would pass the uid's quota is refused with ST_ERR_LIMIT naming the
 * quota, what the uid uses and the limit; nothing is charged then. The
 * global limits (keys.max_keys, limits.max_buffers, ...) stay and are
 * checked by their kinds; a quota is set below them (config.c derives
 * each default as a quarter of its global limit), so one uid never
 * exhausts a global limit.
 *
 * Root and the server's own uid are exempt: they are charged (their use
 * shows) but never refused by a quota; the operator's own work is bounded
 * by the global limits only. Pool bytes bind them too: a refusal there
 * only gives results arenas of their own (mem/pool.c).
 *
 * Threads: any; one mutex guards the table. A kind charges n when it
 * takes something on a uid's behalf and uncharges the same n when that
 * goes, from whichever thread does either.
 */
#ifndef ST_MEM_UIDQ_H
#define ST_MEM_UIDQ_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef enum {
  ST__UIDQ_KEYS = 0,          /* published keys it owns                     */
  ST__UIDQ_VERSIONS,          /* key versions kept of its keys              */
  ST__UIDQ_BUFFERS,           /* named buffers it created (unlinked ones
                                 still open count until they go)            */
  ST__UIDQ_HANDOFFS,          /* hand-offs it created                       */
  ST__UIDQ_TASKS,             /* tasks it submitted that the table keeps    */
  ST__UIDQ_FDS,               /* arena descriptors the server keeps for its
                                 keys, buffers and hand-offs                */
  ST__UIDQ_PINNED_BYTES,      /* arena bytes of its keys, buffers and
                                 hand-offs (all devices)                    */
  ST__UIDQ_POOL_BYTES,        /* slab bytes of its connections' result
                                 pools (all devices)                        */
  ST__UIDQ_NKINDS
} st__uidq_kind_t;

/* "keys", "versions", ... : the kind's key in config.lua's `quotas`
 * table and in info's "quotas". */
const char *st__uidq_name(st__uidq_kind_t kind);

/* Sets every kind's quota (limits[kind]; 0: none) and the exempt uids
 * (root and `server_uid`). Uses charged so far stay. Any thread; at start
 * and at a reload. */
void st__uidq_configure(const uint64_t limits[ST__UIDQ_NKINDS], uid_t server_uid);

/* The quota of `kind` now (0: none). */
uint64_t st__uidq_limit(st__uidq_kind_t kind);

/* Whether uid is exempt from quotas (root, the server's uid). */
int st__uidq_exempt(uid_t uid);

/* Charges n of `kind` to uid: ST_OK, or ST_ERR_LIMIT with nothing charged
 * and "uid U uses X <kind>; N more would pass quotas.<kind> = Q" in err
 * (err may be NULL). ST_ERR_OUT_OF_MEMORY when the table cannot grow. */
int st__uidq_charge(uid_t uid, st__uidq_kind_t kind, uint64_t n, char *err, size_t errlen);

/* ST_OK when a charge of n would fit now (nothing is charged), else as
 * st__uidq_charge. */
int st__uidq_room(uid_t uid, st__uidq_kind_t kind, uint64_t n, char *err, size_t errlen);

/* Charges n of `kind` to uid without a check: for a kind that asked
 * st__uidq_room about a net change first (a put that retires a version
 * as it adds one). Out of memory for a new uid's entry: nothing charged
 * (its uncharge is then clamped). */
void st__uidq_add(uid_t uid, st__uidq_kind_t kind, uint64_t n);

/* Gives back n of `kind` charged to uid (clamped at 0). */
void st__uidq_uncharge(uid_t uid, st__uidq_kind_t kind, uint64_t n);

/* What uid holds of `kind` now. */
uint64_t st__uidq_used(uid_t uid, st__uidq_kind_t kind);

/* Calls fn once per uid that holds anything, with its uses (an array of
 * ST__UIDQ_NKINDS), under the table's lock (fn must not charge). */
void st__uidq_each(void (*fn)(uid_t uid, const uint64_t used[ST__UIDQ_NKINDS], void *ud),
                   void *ud);

/* Forgets every use (tests, and the server's end). */
void st__uidq_reset(void);

#endif
