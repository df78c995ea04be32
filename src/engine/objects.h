/* src/engine: server objects, the result cache, leases and the memory
 * budget (docs/protocol.md, "Objects, leases and caching";
 * docs/lifecycle.md).
 *
 * An object is a build result the server keeps a reference to: the value
 * bytes and the arenas they name. It lives while any of these holds it:
 *  - the cache (`cached`: an entry under (endpoint, cache key));
 *  - leases (`refcount`): counted per connection, given by replies of
 *    managed endpoints and taken back by release or when the connection
 *    closes;
 *  - holds: finished tasks whose result was not fetched yet.
 * With none left the object is destroyed: its arena references go, and
 * memory that clients still map stays theirs.
 *
 * Budget: every device ("cpu", "cuda:N") has a budget in bytes (0 =
 * none), kept by the ledger (mem/ledger.h), which charges every arena the
 * server allocates from allocation on: objects, and also plain results,
 * task results and a body's temporaries, which are no objects. When an
 * allocation does not fit (bytes of its device, or the ledger's
 * descriptor cap), the server calls st__objects_reclaim on the loop
 * thread: cached objects that nothing else holds (no lease, no hold) are
 * evicted, least recently used first, until it fits. Here each object
 * also counts what its arenas are charged, per device, for info.
 *
 * Threads: loop thread only; nothing here locks.
 */
#ifndef ST_ENGINE_OBJECTS_H
#define ST_ENGINE_OBJECTS_H

#include <stddef.h>
#include <stdint.h>

#include "engine/result.h"
#include "engine/smap.h"

#define ST_OBJ_DEVICE_LEN 16
#define ST_OBJ_MAX_BUDGETS 17

typedef struct st__lease {
  uint64_t conn_id;
  uint32_t count;             /* leases this connection holds on the object */
} st__lease_t;

/* Bytes an object charges to one device (index into budgets[]). */
typedef struct st__charge {
  int budget;
  uint64_t bytes;
} st__charge_t;

typedef struct st__object {
  uint64_t id;                /* unique within the process, never reused */
  char *endpoint;             /* owned */
  char *cache_key;            /* owned; NULL when the endpoint has no key */
  size_t cache_key_len;
  uint64_t fingerprint;       /* of the declaration that built it */
  int cached;                 /* in the cache now */
  int managed;
  int readonly;               /* its endpoint says readonly: every reply of
                                 it maps read-only (docs/keys.md) */
  uint32_t refcount;          /* leases, all connections together */
  uint32_t holds;             /* unfetched task results */
  st__lease_t *leases;        /* owned, nleases used */
  size_t nleases, cap_leases;
  uint64_t bytes;             /* its arenas' sizes (CPU: usable, CUDA:
                                 allocated), as info and replies show it */
  unsigned fds;               /* descriptors its arenas keep open */
  char device[ST_OBJ_DEVICE_LEN];   /* "cpu", or its first CUDA device */
  st__charge_t charges[ST_OBJ_MAX_BUDGETS];  /* per device; at least one */
  int ncharges;
  double created_at;          /* unix seconds */
  double last_accessed_at;    /* unix seconds: last reply that handed it out */
  st__build_result_t result;  /* owned: value bytes and arena references */
  char *slot;                 /* owned cache slot key (endpoint NUL key) */
  size_t slot_len;
  struct st__object *lru_prev, *lru_next;  /* cached objects, oldest use first */
  struct st__object *all_prev, *all_next;  /* every object, by id */
  uint64_t lru_ns;            /* monotonic ns of its place in the LRU order */
  /* Monotonic ns of its last use by st__objects_hit (0: none): a relaxed
   * atomic, written by loop threads that hold only the read side of the
   * server lock; st__objects_reclaim puts such objects in their place. */
  uint64_t hit_ns;
  int counted;                /* the part of its budgets' bytes it counts in
                                 now (objects.c: ST__OBJ_CACHED ...), 0:
                                 none yet */
} st__object_t;

/* Where an object's charges count in its budgets (st__budget_t.part):
 * only the cache holds it (evictable), a lease holds it, or neither
 * (a hold: a finished task's unfetched result). */
enum { ST__OBJ_CACHED = 1, ST__OBJ_LEASED = 2, ST__OBJ_TASK = 3 };

/* A device objects are counted on (its budget is the ledger's). */
typedef struct st__budget {
  char device[ST_OBJ_DEVICE_LEN];
  int ordinal;                /* -1: the CPU; for the ledger */
  uint64_t bytes;             /* bytes of this device's objects */
  uint64_t objects;
  uint64_t part[4];           /* those bytes by where they count
                                 (ST__OBJ_CACHED ...; [0] unused), kept up
                                 to date as objects change (objects.c) */
} st__budget_t;

typedef struct st__objects {
  st__smap_t by_id;           /* id -> object */
  st__smap_t cache;           /* slot (endpoint NUL key) -> object */
  st__object_t *lru_head, *lru_tail;
  st__object_t *all_head, *all_tail;
  size_t count;
  uint64_t next_id;
  uint64_t leases;            /* sum of refcounts */
  uint64_t leases_granted;    /* leases given since start: leases_granted -
                                 leases = the leases given back */
  uint64_t evictions;         /* cache entries evicted for the budget or
                                 the descriptor cap */
  uint64_t created, destroyed;
  uint64_t bytes;             /* every object's `bytes` */
  st__budget_t budgets[ST_OBJ_MAX_BUDGETS];
  int nbudgets;
} st__objects_t;

/* What a new object is. Strings are borrowed (copied by st__objects_add). */
typedef struct st__object_spec {
  const char *endpoint;
  const char *cache_key;      /* NULL: no key */
  size_t cache_key_len;
  uint64_t fingerprint;
  int cache;                  /* put it in the cache (replaces an entry) */
  int managed;
  int readonly;
  const char *where;          /* NULL, or the device the call built on: part
                                 of the cache slot, so that one endpoint and
                                 key cache one object per device */
} st__object_spec_t;

/* Per-device figures for info: object_bytes = cached_bytes +
 * leased_bytes + task_bytes, each object's charge on the device counted
 * in exactly one of the three. */
typedef struct st__budget_stats {
  uint64_t budget;
  uint64_t used_bytes;        /* everything the server holds on the device
                                 (the ledger: objects, results, replies) */
  uint64_t object_bytes;      /* the objects' charges on the device */
  uint64_t cached_bytes;      /* objects only the cache holds (evictable) */
  uint64_t leased_bytes;      /* objects with at least one lease */
  uint64_t task_bytes;        /* objects without a lease that something
                                 else keeps: a finished task until its
                                 result is fetched */
  uint64_t objects;
} st__budget_stats_t;

void st__objects_init(st__objects_t *r);

/* Destroys every object (dropping their arena references). */
void st__objects_free(st__objects_t *r);

/* Sets the budget of `device` ("cpu", "cuda:0") in the ledger and lists
 * the device in the stats; 0 = none. ST_OK, or ST_ERR_LIMIT when too many
 * devices are named or the name is neither. At start. */
int st__objects_set_budget(st__objects_t *r, const char *device, uint64_t bytes);

/* Registers the result as a new object (refcount 0, no hold) and moves
 * *result into it (*result is left empty). Its arenas were charged to the
 * ledger when they were allocated: nothing is evicted here. On failure
 * nothing is registered, *result is untouched, and err says why
 * (ST_ERR_OUT_OF_MEMORY: malloc). The new object is borrowed by the
 * caller, who must give it a lease, a hold or leave it cached, then call
 * st__objects_collect. */
int st__objects_add(st__objects_t *r, const st__object_spec_t *spec, st__build_result_t *result,
                    st__object_t **out, char *err, size_t errlen);

/* Evicts cached objects nothing else holds, least recently used first,
 * that hold bytes on `device` (-1: the CPU) or descriptors (when `fds`),
 * until the ledger fits a charge of `bytes` there and `fds` descriptors
 * (st__ledger_fits) or none is left. Returns how many it evicted. */
size_t st__objects_reclaim(st__objects_t *r, int device, uint64_t bytes, unsigned fds);

/* Object by id (borrowed) or NULL. */
st__object_t *st__objects_find(st__objects_t *r, uint64_t id);

/* The cached object of (endpoint, key) built on `where` (as in the spec;
 * NULL matches only objects added without one), or NULL. Does not touch
 * it. st__objects_lookup is st__objects_lookup_on with where NULL. */
st__object_t *st__objects_lookup_on(const st__objects_t *r, const char *endpoint,
                                    const char *where, const char *key, size_t key_len);
st__object_t *st__objects_lookup(st__objects_t *r, const char *endpoint, const char *key,
                                 size_t key_len);

/* Marks a cached object as just handed out by a thread that may not
 * change the registry (the read side of the server lock): a relaxed
 * atomic store of its use time, which st__objects_reclaim (the LRU order)
 * and st__objects_last_use (last_accessed_at) take into account. Any
 * thread. */
void st__objects_hit(st__object_t *o);

/* Unix seconds of o's last use, st__objects_hit included. */
double st__objects_last_use(const st__object_t *o);

/* Marks an object as just handed out: last_accessed_at, and the most
 * recently used end of the LRU order. */
void st__objects_touch(st__objects_t *r, st__object_t *o);

/* Gives conn_id one more lease. ST_OK or ST_ERR_OUT_OF_MEMORY. */
int st__objects_lease(st__objects_t *r, st__object_t *o, uint64_t conn_id);

/* Takes one lease of conn_id on object `id` back. Fills *released (0 when
 * conn_id held none), *destroyed (the object is gone, also when it was
 * unknown) and *refcount (leases left). */
void st__objects_release(st__objects_t *r, uint64_t id, uint64_t conn_id, int *released,
                         int *destroyed, uint32_t *refcount);

/* Takes back every lease of conn_id (its connection closed); returns how
 * many. Objects nothing holds any more are destroyed. */
size_t st__objects_release_conn(st__objects_t *r, uint64_t conn_id);

/* Holds for unfetched task results; unhold may destroy the object.
 * unhold_keep gives a hold back and leaves the object for the caller to
 * collect (a hold taken only for the length of a step). Holds, leases
 * and cache entries change through these functions only: each one moves
 * the object's bytes to the part of the budget stats it counts in. */
void st__objects_hold(st__objects_t *r, st__object_t *o);
void st__objects_unhold(st__objects_t *r, st__object_t *o);
void st__objects_unhold_keep(st__objects_t *r, st__object_t *o);

/* Destroys the object if nothing holds it (no lease, hold or cache
 * entry); returns 1 when it did (the pointer is then dead). */
int st__objects_collect(st__objects_t *r, st__object_t *o);

/* Drops the cache entries of (endpoint, key), whatever device they were
 * built on: 1 if there was one. */
int st__objects_uncache(st__objects_t *r, const char *endpoint, const char *key, size_t key_len);

/* Drops every cache entry of an endpoint; returns how many. */
size_t st__objects_uncache_endpoint(st__objects_t *r, const char *endpoint);

/* Figures of one device (zeros for a device with neither budget nor
 * objects). */
void st__objects_stats(const st__objects_t *r, const char *device, st__budget_stats_t *out);

#endif
