/* src/server: the state of published state's survival (restart.c) and
 * the restore that fills it at start (restore.c): the journal's record
 * types, the names in the fd store, and struct st__restart.
 *
 * Ownership: the server owns its st__restart_t (srv->restart, restart.c
 * makes and frees it). Loop thread only.
 */
#ifndef ST_SERVER_RESTORE_H
#define ST_SERVER_RESTORE_H

#include <ev.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>

#include "server/config.h"
#include "server/fdstore.h"
#include "server/journal.h"
#include "server/store_arenas.h"
#include "st/wire.h"

typedef struct st__server st__server_t;

/* The journal's record types (restart.c says what each holds). */
enum {
  ST__REC_ARENA = 1, ST__REC_ARENA_GONE = 2, ST__REC_VERSION = 3, ST__REC_DROP = 4, ST__REC_DELETE = 5,
  ST__REC_BUFFER = 6, ST__REC_BUFFER_GONE = 7
};

/* Arena numbers recorded are below this (a bound on what is read). */
#define ST__RESTART_MAX_ARENA ((uint64_t)1 << 48)

/* Published state kept across restarts: the fd store, the journal, the
 * arenas in the store, and what the start restored. */
struct st__restart {
  st__server_t *srv;
  st__fdstore_t store;
  int keeping;                /* the journal is written, the hooks set     */
  st__journal_t journal;
  int slot;                   /* the journal is stored as st-journal-<slot> */
  int slot_stored;            /* ... and that name is in the store now     */
  st__store_arenas_t arenas;  /* the arenas in the store (store_arenas.h)  */
  uint64_t snapshot_bytes;    /* the journal's tail after its snapshot     */
  int compact_due;            /* a record could not be written: rewrite   */
  uint64_t compactions;       /* journals rewritten since start            */
  ev_prepare compact;         /* compactions run before a poll            */
  /* What the start restored. */
  uint64_t from_generation, keys, versions, bytes, refused, torn, buffers;
  int handed;                 /* the start took a takeover's descriptors   */
  struct { int device, fd; } listeners[ST_MAX_DEVICES]; /* handed over    */
  int nlisteners;
  int temporary;              /* `arenas` was numbered for a handover only */
};

/* "st-arena-<n>": arena n's name in the fd store. */
static inline void st__restart_fdname(char *out, size_t cap, uint64_t n) {
  snprintf(out, cap, "st-arena-%" PRIu64, n);
}

/* Restores the key table and the buffers from the journal and the
 * arenas r->store received (the fd store's, or a takeover's): the
 * journal of the highest generation that verifies, every record checked,
 * every arena imported with the checks of a put's argument, what does not
 * verify refused with a log line; r->arenas then holds the arenas the
 * restored tables keep, the counts of r what was restored. Loop thread,
 * at start, before the hooks are set. */
void st__restore_run(struct st__restart *r);

#endif
