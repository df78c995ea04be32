/* src/engine: the key table, tensors clients published by name
 * (docs/keys.md; wire: docs/protocol.md, "Published keys").
 *
 * A key has versions 1, 2, ...: each `put` makes the next one from the
 * tensor arguments of its request. A version is a build result (the value
 * bytes, whose tensors name arenas by index, and one reference to each
 * arena): the arenas are the client's allocations as the server imported
 * them, adopted without a copy, so the memory lives while the server keeps
 * the version, whatever happens to the publisher. The server keeps the
 * last `max_versions` of a key; an older one goes at the next put (its
 * arena references are dropped; clients' mappings stay valid, as for
 * objects: the kernel keeps memory while any mapping or descriptor lives).
 *
 * Budget: each version charges the ledger its arenas' bytes on their
 * devices (an imported allocation is otherwise charged nothing) from put
 * until it goes. Versions of `evictable` keys go under the memory budget
 * (st__keys_reclaim, least recently used first); `pinned` ones stay until
 * deleted.
 *
 * Threads: the loop thread makes every change and reads without a lock;
 * workers read through st__keys_read only. Changes take the table's lock
 * (never across a ledger charge, whose reclaim may evict versions), and
 * so does st__keys_read.
 */
#ifndef ST_ENGINE_KEYS_H
#define ST_ENGINE_KEYS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "shm/key_page.h"
#include "engine/named.h"
#include "engine/result.h"
#include "engine/smap.h"

/* Names: 1 to ST__KEY_NAME_MAX of A-Z a-z 0-9 . _ - / : */
#define ST__KEY_NAME_MAX 128

typedef enum { ST__KEY_PINNED = 0, ST__KEY_EVICTABLE = 1 } st__key_policy_t;
#define ST__KEY_POLICY_NAMES "pinned|evictable"

/* Where a replica came from (docs/multihost.md): the peer server's id,
 * the key's name there and the version it copied. */
typedef struct st__key_origin {
  char peer[256];
  char key[ST__KEY_NAME_MAX + 1];
  uint64_t version;
} st__key_origin_t;

typedef struct st__key_version {
  uint64_t version;
  st__build_result_t result;  /* owned: value and arena references */
  uint64_t bytes;             /* charged to the ledger (its arenas' bytes) */
  int device;                 /* -1: cpu; else the CUDA ordinal of its first
                                 CUDA arena */
  double created_at;          /* unix seconds */
  double last_used;           /* monotonic seconds: put or last get */
  int charged;                /* the table charged `bytes` to the ledger
                                 (0: its arenas carry their own charge,
                                 made when the server allocated them)   */
  int has_origin;             /* a replica: origin says of what          */
  st__key_origin_t origin;
} st__key_version_t;

typedef struct st__key {
  char name[ST__KEY_NAME_MAX + 1];
  uid_t uid;                  /* the publisher's (who may use it: named.h) */
  st__grant_t readers;        /* uids and gids it granted read            */
  uint64_t owner_conn;        /* the connection of the last put */
  st__key_policy_t policy;    /* of the last put */
  int readonly;               /* the last put asked that readers other than
                                 its connection map it read-only */
  uint64_t last_version;      /* versions made so far */
  st__key_version_t **versions;  /* owned, oldest first, nversions used */
  size_t nversions;
  uint64_t bytes;             /* of its versions */
  /* A live key (docs/views.md, section 3): one version whose memory is
   * updated in place, and its control page (owned memfd arena, mapped at
   * `page`). owner_conn is the publisher's connection, 0 once it left. */
  int live;
  st__arena_t *page_arena;
  st__key_page_t *page;
  struct st__key *live_prev, *live_next;   /* the table's live keys */
} st__key_t;

struct st__key_put;

/* A version as the journal records it (server/restart.c): what makes it
 * again after a restart. Every pointer is borrowed for the call. */
typedef struct st__key_change {
  const char *name;
  uid_t uid;
  const st__grant_t *readers;
  st__key_policy_t policy;
  int readonly;
  int live;
  uint64_t version;
  double created_at;
  const st__build_result_t *result;
  const st__arena_t *page;    /* a live key's control page, else NULL     */
  const st__key_origin_t *origin;  /* a replica's, else NULL              */
} st__key_change_t;

/* What the table tells its journal (server/restart.c), under the table's
 * lock, before the change is visible or acknowledged. version_added may
 * refuse (the put then fails with its code and err, nothing changed);
 * the others are told after the fact and cannot. */
typedef struct st__keys_journal {
  int (*version_added)(void *ud, const st__key_change_t *c, char *err, size_t errlen);
  void (*version_dropped)(void *ud, const st__key_t *k, const st__key_version_t *v);
  void (*key_removed)(void *ud, const st__key_t *k);
} st__keys_journal_t;

/* The change version v of key k is (for a journal's compaction). */
st__key_change_t st__keys_change_of(const st__key_t *k, const st__key_version_t *v);

typedef struct st__keys {
  const st__keys_journal_t *journal;  /* borrowed; NULL: none (st__keys_free
                                 runs without it: an exit keeps the state) */
  void *journal_ud;
  pthread_mutex_t lock;       /* changes (loop thread) vs st__keys_read */
  st__smap_t by_name;         /* name -> st__key_t */
  size_t count;
  size_t live;                /* live keys among them */
  st__key_t *live_keys;       /* those, listed: a connection's are counted
                                 without a walk of every key */
  size_t versions;            /* the versions they keep, all together */
  uint64_t bytes;             /* every version's bytes, all devices */
  size_t max_keys;            /* keys.max_keys */
  uint64_t max_bytes;         /* keys.max_bytes; 0 = the budgets alone */
  unsigned max_versions;      /* keys.max_versions kept per key */
  uint64_t puts, evictions;   /* versions made, versions evicted */
} st__keys_t;

/* An empty table with its limits. */
void st__keys_init(st__keys_t *t, size_t max_keys, uint64_t max_bytes, unsigned max_versions);

/* Drops every key (their arena references and charges). */
void st__keys_free(st__keys_t *t);

/* Makes t the table st__keys_read reads (one per process: the server's).
 * At start, before any worker runs; st__keys_free of t stops it. */
void st__keys_serve(st__keys_t *t);

/* For endpoints (st.key, src/lua/keys.c): a copy of version `version`
 * (0: the latest; a live key's: 0 or its current one, as st__keys_get)
 * of key `name` of the served table, whoever published it: its value
 * bytes and one new reference to each of its arenas in *out (the caller
 * destroys it: st__build_result_destroy), its version in *got (may be
 * NULL; a live key's page version). NOT_FOUND, STALE_HANDLE (a torn live
 * key), INVALID_ARGUMENT (name), OUT_OF_MEMORY. Any thread. */
int st__keys_read(const char *name, size_t len, uint64_t version, st__build_result_t *out,
                  uint64_t *got, char *err, size_t errlen);

/* ST_OK when (name, len) is a valid key name, else ST_ERR_INVALID_ARGUMENT
 * with the reason in err. */
int st__keys_name_ok(const char *name, size_t len, char *err, size_t errlen);

/* What a put makes. `result` moves into the new version on success
 * (it is left empty); on failure the caller still owns it. */
typedef struct st__key_put {
  const char *name;
  size_t len;
  uid_t uid;
  uint64_t conn;
  st__key_policy_t policy;
  int readonly;
  int live;                   /* a live key (docs/views.md, section 3) */
  const st__grant_t *readers; /* NULL: the key's grant stays (none for a
                                 new key); else it replaces it            */
  int precharged;             /* the arenas were allocated by the server
                                 and charged to the ledger then (a
                                 replica's): the version charges nothing
                                 more, and gives nothing back when it goes */
  const st__key_origin_t *origin; /* a replica's origin, or NULL         */
  /* A restore (server/restart.c) only: the version's number (above the
   * key's last one), its creation time, and a live key's control page as
   * it was (a reference is taken; the page is not initialized again).
   * The journal is not told. 0 / NULL: a put. */
  uint64_t version;
  double created_at;
  st__arena_t *page;
} st__key_put_t;

/* Makes the next version of key p->name (a new key when absent) from
 * *result, charging its arenas' bytes to the ledger (which may evict
 * cached objects and evictable key versions), then drops the versions
 * past max_versions. Fills *version. A new live key (p->live) gets its
 * control page (version 1, p->conn its publisher). Errors (nothing
 * changed): INVALID_ARGUMENT (name; live and not live mixed; live and
 * evictable), AUTH (the key belongs to another uid), LIMIT
 * (keys.max_keys, keys.max_bytes, the uid's quotas.keys, versions, fds,
 * pinned_bytes), OUT_OF_MEMORY (the budget, malloc),
 * with the reason in err. A put into an existing live key is
 * st__keys_take, not this. */
int st__keys_put(st__keys_t *t, const st__key_put_t *p, st__build_result_t *result,
                 uint64_t *version, char *err, size_t errlen);

/* The key (borrowed) and its version `version` (0: the latest) for who
 * (its publisher, a reader it granted, an admin: named.h): marks the
 * version used. A live key has one version, its current one
 * (st__keys_version_of): 0 or that number. NOT_FOUND ("no key 'x'" also
 * for a key who may not see, "key 'x' has no version 1 (kept: 3..4)",
 * "live key 'x' has only its current version 5 (asked: 1; ...)"),
 * INVALID_ARGUMENT (name). */
int st__keys_get(st__keys_t *t, const char *name, size_t len, const st__who_t *who,
                 uint64_t version, st__key_t **key, st__key_version_t **out, char *err,
                 size_t errlen);

/* Whether who may see (get) key k. */
int st__keys_visible(const st__key_t *k, const st__who_t *who);

/* Deletes key `name` for who (its publisher; an admin with force:
 * named.h): every version goes. NOT_FOUND, AUTH, INVALID_ARGUMENT. */
int st__keys_delete(st__keys_t *t, const char *name, size_t len, const st__who_t *who,
                    int force, char *err, size_t errlen);

/* Every key whose name starts with (prefix, plen), by name (borrowed
 * pointers in a new array the caller frees; *n counts them). NULL with *n
 * = 0 when there is none or out of memory. */
st__key_t **st__keys_list(st__keys_t *t, const char *prefix, size_t plen, size_t *n);

/* A put of `value` (the request's, unpacked) into the live key p->name:
 * when value's tensors match the key's (the same names, each with its
 * dtype and shape, contiguous), p->conn becomes its publisher (the
 * memory stays; the client copies the values in with an update). value
 * NULL: st__keys_take_check found them matching already (for the key of
 * the same page). *key is the key (borrowed). Errors change nothing:
 * NOT_FOUND when p->name is no live key, AUTH for another uid,
 * INVALID_ARGUMENT naming the first tensor that differs. Linear in the
 * tensors. Loop thread. */
int st__keys_take(st__keys_t *t, const st__key_put_t *p, const msgpack_object *value,
                  st__key_t **key, char *err, size_t errlen);

/* The check of st__keys_take alone, for a worker: whether `value`
 * matches live key `name` as long as it is the key of control page
 * `page` (held by the caller, so that no other key can have it). The
 * key's value is copied under the table's lock, and compared without it.
 * ST_OK, INVALID_ARGUMENT naming the first difference, NOT_FOUND when
 * `name` is no longer the live key of `page`, OUT_OF_MEMORY. Any
 * thread. */
int st__keys_take_check(st__keys_t *t, const char *name, size_t len, const st__arena_t *page,
                        const msgpack_object *value, char *err, size_t errlen);

/* Whether `name` is still the live key of control page `page`: neither
 * deleted nor replaced by another key of that name (a torn key still
 * is). Loop thread (the table's changes run there). */
int st__keys_live_page_is(st__keys_t *t, const char *name, const st__arena_t *page);

/* Whether live key k is torn (its publisher left in the middle of an
 * update, and no update completed since): reads the page. */
int st__keys_torn(const st__key_t *k);

/* The version a reply of k names: a live key's page version (whatever
 * v; the table's number of its one version is never shown), else the
 * version v's. The one source of every version a get, keys, put or
 * st.key reports. Any thread: a read of the page. */
uint64_t st__keys_version_of(const st__key_t *k, const st__key_version_t *v);

/* Live key k has no publisher any more (its connection closed, or the
 * server restarted): one left in the middle of an update (an odd
 * sequence) is marked TORN in its page. Loop thread. */
void st__keys_live_orphaned(st__key_t *k);

/* Whether arena `page` can be a live key's control page (a restore's
 * check of a page it did not make): a CPU arena of a page's size whose
 * words say key page, of this layout. Any thread. */
int st__keys_page_valid(const st__arena_t *page);

/* Live keys connection `conn` publishes now. Loop thread. */
uint64_t st__keys_conn_live(st__keys_t *t, uint64_t conn);

/* Connection `conn` closed: the live keys it published have no publisher
 * any more; one left in the middle of an update (an odd sequence) is
 * marked TORN in its page (readers get STALE_HANDLE until the next
 * complete update). Loop thread. */
void st__keys_conn_closed(st__keys_t *t, uint64_t conn);

/* Evicts versions of evictable keys that hold bytes on `device` (-1: the
 * CPU; any device when `fds`), least recently used first, until the
 * ledger fits `bytes` and `fds` there or none is left. A key whose last
 * version goes leaves the table. Returns how many versions went. */
size_t st__keys_reclaim(st__keys_t *t, int device, uint64_t bytes, unsigned fds);

#endif
