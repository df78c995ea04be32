/* src/engine: named hand-offs between processes (docs/pool.md, section 5;
 * docs/protocol.md, "Hand-offs").
 *
 * A hand-off is one allocation of `chunks` chunks (a memfd arena on the
 * CPU, a VMM arena on CUDA) and a control page (shm/handoff_page.h, a
 * memfd arena), created by a producer connection and opened by consumer
 * connections of the creator's uid, each of which gets a slot (one bit of
 * the page). Per request nothing reaches the server: the producer
 * acquires, fills and publishes chunks and the consumers acknowledge them
 * in the page. The server acts only when a connection attaches or leaves:
 * a consumer that leaves (handoff_close, or its connection closed) has
 * its bit cleared from `expected` and from every chunk, which is every
 * acknowledgement it still owed; a producer that leaves sets
 * PRODUCER_GONE. The last connection to leave, or handoff_delete, drops
 * the server's references (the budget charge goes with them; the clients'
 * mappings stay valid until they unmap).
 *
 * The table knows no server: the caller passes connection ids, uids and
 * limits. Loop thread only.
 */
#ifndef ST_ENGINE_HANDOFF_H
#define ST_ENGINE_HANDOFF_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "shm/handoff_page.h"
#include "engine/named.h"
#include "mem/arena.h"

/* Longest name (engine/named.h). */
#define ST__HANDOFF_NAME_MAX ST__NAME_MAX

typedef struct st__handoff {
  st__named_t named;            /* name, uid, device, data, page (first) */
  uint64_t chunk_bytes, stride;
  uint32_t chunks, consumers;
  st__handoff_page_t *page;     /* named.page                             */
  uint64_t producer;            /* connection id; 0 once it left          */
  uint64_t slots[ST__HANDOFF_MAX_CONSUMERS];   /* connection ids; 0: free */
  uint32_t used;                /* bits of the slots opened at least once  */
  uint64_t serial;              /* unique in the table's life: a name that
                                   comes back names another hand-off      */
} st__handoff_t;

typedef struct st__handoffs {
  st__named_list_t list;
  uint64_t serials;
} st__handoffs_t;

/* What handoff_create asks for. */
typedef struct st__handoff_spec {
  const char *name;
  size_t name_len;
  int device;                   /* -1 or a CUDA ordinal the server has     */
  uint64_t chunk_bytes;
  uint64_t chunks;
  uint64_t consumers;
  uint64_t max_chunks;          /* limits.max_handoff_chunks               */
  int max_per_connection;       /* limits.max_handoffs_per_connection      */
  const st__grant_t *readers;   /* may be NULL: uids and gids that may open
                                   it as consumers                          */
  int mirror;                   /* a server's mirror of a peer's hand-off
                                   (server/handoff_mirror.c): the name is
                                   "name@peer", made by the server         */
} st__handoff_spec_t;

/* Creates hand-off s->name for connection `conn` (the producer) of uid
 * `uid`: checks the name, the geometry and the limits, allocates the data
 * arena and the page (charged to the memory budgets) and initializes the
 * page. On ST_OK *out is the new entry (borrowed from the table). Errors
 * with a message in err: INVALID_ARGUMENT (name, chunk_bytes, consumers),
 * LIMIT (chunks past max_chunks, the connection's count, the uid's
 * quotas.handoffs, fds, pinned_bytes), the arena's
 * OUT_OF_MEMORY / LIMIT / CAPABILITY, and INVALID_ARGUMENT when the name
 * is taken. Loop thread. */
int st__handoff_create(st__handoffs_t *t, const st__handoff_spec_t *s, uint64_t conn, uid_t uid,
                       st__handoff_t **out, char *err, size_t errlen);

/* Attaches connection `conn` of `who` (its creator's uid, a reader it
 * granted, an admin: named.h) to hand-off `name` as a
 * consumer: the lowest free slot. A slot never opened before has counted
 * since creation (what was published before waits for this consumer); a
 * slot used before is swept again and counts from this open on. On ST_OK
 * *out and *slot say which.
 * Errors: NOT_FOUND (no such name, or not visible to who), LIMIT (every slot
 * taken, the connection's count), INVALID_ARGUMENT (already attached).
 * Loop thread. */
int st__handoff_open(st__handoffs_t *t, const char *name, size_t name_len, uint64_t conn,
                     const st__who_t *who, int max_per_connection, st__handoff_t **out, uint32_t *slot,
                     char *err, size_t errlen);

/* Detaches `conn` from hand-off `name` (see the top). ST_OK, or NOT_FOUND
 * when the connection does not use it. Loop thread. */
int st__handoff_close(st__handoffs_t *t, const char *name, size_t name_len, uint64_t conn,
                      char *err, size_t errlen);

/* Removes hand-off `name` at once: the name goes, every connection is
 * detached, the page says DELETED and the server's references go. Its
 * creator's uid may, and an admin with force (named.h). ST_OK, NOT_FOUND,
 * AUTH. Loop thread. */
int st__handoff_delete(st__handoffs_t *t, const char *name, size_t name_len,
                       const st__who_t *who, int force, char *err, size_t errlen);

/* Hand-off `name` when it is still the one of `serial` (0: any), else
 * NULL. No access check: for the server's own use. Loop thread. */
st__handoff_t *st__handoff_find(const st__handoffs_t *t, const char *name, uint64_t serial);

/* Marks h's producer gone (PRODUCER_GONE, its waiters woken): waits for a
 * publish fail, what was published stays. */
void st__handoff_producer_gone(st__handoff_t *h);

/* Whether any consumer slot of h is open. */
int st__handoff_has_consumers(const st__handoff_t *h);

/* Hand-offs connection `conn` uses (as producer or consumer): what
 * limits.max_handoffs_per_connection counts. Loop thread. */
int st__handoff_conn_count(const st__handoffs_t *t, uint64_t conn);

/* Connection `conn` closed: detaches it from every hand-off. Loop thread. */
void st__handoff_conn_closed(st__handoffs_t *t, uint64_t conn);

/* Frees every hand-off (server exit). Loop thread. */
void st__handoff_free_all(st__handoffs_t *t);

#endif
