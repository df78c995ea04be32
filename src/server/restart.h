/* src/server: published state that survives the process (docs/lifecycle.md,
 * "Restarts"): every descriptor that holds a published key's memory kept
 * in the service manager's fd store (fdstore.h), the journal of the key
 * table (journal.h) beside them, and the restore of both when a new
 * process starts with them.
 *
 * What is kept: each version of each key (value, arenas, owner uid, read
 * grant, policy, read-only flag, version number, creation time, a
 * replica's origin) and each live key's control page. Arenas are stored
 * once each, named "st-arena-<n>" (n: the journal's own number for the
 * arena, kept across restarts), the journal as "st-journal-0" or
 * "st-journal-1" (a compaction writes the other one, stores it, then
 * removes the first). Connections, leases, tasks, cached objects, buffers
 * and hand-offs are not kept.
 *
 * The restore trusts nothing it reads: the journal is verified whole
 * (journal.h) and every field of every record is checked (names, uids,
 * sizes, arena numbers, every tensor of a value inside its arena); each
 * arena's descriptor is checked as a put's argument is (st__arena_import:
 * a memfd sealed against shrinking and as large as recorded, or an
 * exported CUDA allocation of a visible device). What does not verify is
 * refused with a log line naming it, and the rest is served.
 *
 * Ownership: the server owns its st__restart_t (srv->restart). Loop
 * thread only.
 */
#ifndef ST_SERVER_RESTART_H
#define ST_SERVER_RESTART_H

#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>

typedef struct st__server st__server_t;

/* Takes what the service manager gave (the fd store, LISTEN_FDS),
 * restores the key table from it, and from then on keeps the table in
 * the store when the manager has one. Never fails the start: what cannot
 * be restored or kept is logged. ST_OK or OUT_OF_MEMORY. Loop thread, at
 * start, after the key table, the quotas and the devices are set up and
 * before the sockets open. */
int st__restart_start(st__server_t *srv);

/* Stops keeping the table (the store keeps what it holds: an exit is a
 * restart's first half) and frees srv->restart. Loop thread, at exit,
 * before the key table is freed. */
void st__restart_stop(st__server_t *srv);

struct st__buffer;
struct st__arena;

/* Buffer b was created: its arenas into the store and its record into
 * the journal, before the create is acknowledged. ST_OK (also when
 * nothing is kept), or the reason it cannot be kept (the caller undoes
 * the create). Loop thread. */
int st__restart_buffer_created(st__server_t *srv, const struct st__buffer *b, char *err,
                               size_t errlen);

/* The buffer named (name, len), with arenas data and page (compared by
 * address only: the unlink may have freed them), was unlinked: its
 * record goes and its arenas leave the store. Loop thread. */
void st__restart_buffer_unlinked(st__server_t *srv, const char *name, size_t len,
                                 const struct st__arena *data, const struct st__arena *page);

/* The listening socket of `device` a takeover handed over (owned by the
 * caller from now on), or -1. Loop thread, at start (listen.c). */
int st__restart_listener(st__server_t *srv, int device);

struct st__fdstore_entry;

/* What a takeover hands the new server (takeover.c): a journal of the
 * tables as they are now ("st-journal-0", a new memfd), a descriptor of
 * every arena it names ("st-arena-<n>") and of every listening socket
 * ("st-listen-<device>"), all duplicates the caller owns, in *out
 * (malloc'ed, *n entries). Without an fd store the arenas are numbered
 * for this handover only (st__restart_handover_failed forgets them).
 * ST_OK, or the reason in err with nothing left open. Loop thread, with
 * no connection left that could change the tables. */
int st__restart_handover(st__server_t *srv, struct st__fdstore_entry **out, size_t *n,
                         char *err, size_t errlen);

/* The handover was not taken: numbers made for it alone are forgotten.
 * Loop thread. */
void st__restart_handover_failed(st__server_t *srv);

/* info's "restart" map: {kept, store_max, stored, generation,
 * journal_bytes, compactions, restored: {keys, buffers, versions, bytes,
 * from_generation, refused, torn}}. Loop thread. */
void st__restart_pack_info(const st__server_t *srv, msgpack_packer *pk);

#endif
