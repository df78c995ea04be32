/* src/server: the registry of what a connection holds (holdings.c;
 * docs/architecture.md, "Adding a shared-state kind").
 *
 * Each kind of per-connection holding is one row: a release hook, called
 * once when the connection closes, and a count of what the connection
 * holds of it now (items, descriptors, bytes). The row lives next to the
 * kind's own code as one `const st__holding_kind_t st__holding_<name>`;
 * ST__HOLDING_KINDS below names every row, in the order a closing
 * connection releases them. Closing a connection walks the rows
 * (st__holdings_release), info's per-connection view packs their counts
 * (st__holdings_pack: the kinds some connection may hold, by their
 * `none`, for each open connection), and limits.max_fds_per_connection
 * reads the descriptors of the rows that hold some (st__holdings_fds).
 *
 * Adding a kind: its row next to its code, and its name in the list.
 * Loop threads, the write side of the server lock held (conn.h, "Loops").
 */
#ifndef ST_SERVER_HOLDINGS_H
#define ST_SERVER_HOLDINGS_H

#include <msgpack.h>
#include <stdint.h>

typedef struct st__conn st__conn_t;
typedef struct st__server st__server_t;

/* What a connection holds of one kind now. */
typedef struct st__holding_count {
  uint64_t items;             /* leases, handles, entries, waiters ...       */
  uint64_t fds;               /* descriptors the server keeps open for it    */
  uint64_t bytes;             /* arena bytes it pins                         */
} st__holding_count_t;

typedef struct st__holding_kind {
  const char *name;           /* its key in info's "holdings"                */
  /* The connection closed (c->dead, out of the id table): gives back all
   * it holds of this kind. */
  void (*release)(st__server_t *srv, st__conn_t *c);
  /* Fills *n (zeroed by the caller). */
  void (*count)(st__server_t *srv, const st__conn_t *c, st__holding_count_t *n);
  int limits_fds;             /* its descriptors count against
                                 limits.max_fds_per_connection (keep count
                                 cheap: it runs on every reply)             */
  /* Optional: nonzero when no connection holds any of this kind now, by a
   * server-wide look that walks nothing (no build in flight, no live key
   * ...); info's holdings then counts the kind for no connection. NULL:
   * it is counted for each one. */
  int (*none)(st__server_t *srv);
  /* Optional: the kind's server-wide state (its table), state_bytes of
   * zeroes made when the server starts (st__holdings_start) and read with
   * ST__HOLDING_STATE; at the server's end, after the workers stopped,
   * stop (may be NULL) frees what the state holds and the registry frees
   * the state. A kind keeps its table here, so that server.h and
   * lifecycle.c need no line for it. */
  size_t state_bytes;
  void (*stop)(st__server_t *srv, void *state);
} st__holding_kind_t;

/* Every kind, in release order, and the file its row lives in. */
#define ST__HOLDING_KINDS(X)                                                                     \
  X(replies)          /* holdings.c: descriptors and bytes of unread replies */                  \
  X(received)         /* holdings.c: received descriptors no request claimed */                  \
  X(argument_cache)   /* argcache.c: the argument cache */                                       \
  X(kept_arenas)      /* rpc_admin.c: arenas sent once (kept.h) */                               \
  X(kept_objects)     /* rpc_admin.c: objects sent once (kept.h) */                              \
  X(result_pool)      /* pool_conn.c: the connection's result pool */                            \
  X(calls)            /* builds.c: calls waiting for a build */                                  \
  X(tasks)            /* rpc_tasks.c: waits, and the tasks its calls wait for */                 \
  X(handoffs)         /* rpc_handoff.c: producer and consumer seats */                           \
  X(buffers)          /* rpc_buffer.c: buffer handles and writer locks */                        \
  X(keys)             /* rpc_keys.c: live keys it publishes */                                   \
  X(leases)           /* rpc_objects.c: leases on objects */

/* ST__HOLDING_IDX_<name>: a kind's place in the list; ST__HOLDING_NKINDS. */
#define ST__HOLDING_INDEX(name) ST__HOLDING_IDX_##name,
enum { ST__HOLDING_KINDS(ST__HOLDING_INDEX) ST__HOLDING_NKINDS };
#undef ST__HOLDING_INDEX

/* The server-wide state of kind `name` (its row's state_bytes), e.g.
 * `st__buffers_t *b = ST__HOLDING_STATE(srv, buffers);`. */
#define ST__HOLDING_STATE(srv, name) st__holdings_state((srv), ST__HOLDING_IDX_##name)

#define ST__HOLDING_DECLARE(name) extern const st__holding_kind_t st__holding_##name;
ST__HOLDING_KINDS(ST__HOLDING_DECLARE)
#undef ST__HOLDING_DECLARE

/* The server walks every row above through srv->holding_kinds (server.h),
 * which lifecycle.c sets at start, so that holdings.c depends on no kind. */

/* Makes the state of every kind that has one (state_bytes). ST_OK or
 * ST_ERR_OUT_OF_MEMORY (what was made is freed by st__holdings_stop).
 * Loop thread, at start. */
int st__holdings_start(st__server_t *srv);

/* Stops and frees every kind's state, in list order. Loop thread, at the
 * end, after the workers stopped. */
void st__holdings_stop(st__server_t *srv);

/* The state of the kind at `index` (ST__HOLDING_IDX_*); NULL before
 * st__holdings_start or for a kind without state. Loop threads. */
void *st__holdings_state(st__server_t *srv, int index);

/* Connection c closed: every kind releases what c holds, in list order.
 * The connections' close hook (server.h, on_conn_closed). */
void st__holdings_release(st__server_t *srv, st__conn_t *c);

/* Descriptors c holds in the kinds whose limits_fds is set. */
uint64_t st__holdings_fds(const st__conn_t *c);

/* info's "holdings" (docs/protocol.md): one map per open connection that
 * holds anything, {conn, pid, client, <kind>: {items, fds, bytes} for
 * each kind it holds some of}. */
void st__holdings_pack(msgpack_packer *pk, st__server_t *srv);

#endif
