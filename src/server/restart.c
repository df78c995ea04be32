/* src/server: published state that survives the process (restart.h):
 * what is written while the server runs (the journal's records and the
 * fd store's descriptors, compaction), the handover of a takeover, and
 * the start and stop around the restore (restore.c). Loop thread only:
 * the key table calls the journal hooks on the loop thread, under its
 * lock.
 *
 * Records (journal.h), each a msgpack map:
 *   ARENA      {n, backend, bytes, cuda, uuid}   arena n is stored as
 *                                                "st-arena-<n>"
 *   ARENA_GONE {n}                               no version holds it now
 *   VERSION    {key, uid, uids, gids, policy, readonly, live, version,
 *               created, value, arenas: [n...], page: n or 0,
 *               origin: [peer, key, version] or nil}
 *   DROP       {key, version}
 *   DELETE     {key}
 *   BUFFER     {name, uid, uids, gids, cuda, dtype, shape, slots, data: n,
 *               page: n}
 *   BUFFER_GONE {name}                           unlinked
 * An ARENA record comes before the first VERSION that names it, and its
 * descriptor is in the store before the record is written; a VERSION is
 * written before the put is acknowledged.
 */
#include "server/restart.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fail.h"
#include "common/log.h"
#include "engine/buffer.h"
#include "engine/keys.h"
#include "mem/arena.h"
#include "proto/proto.h"
#include "server/fdstore.h"
#include "server/holdings.h"
#include "server/journal.h"
#include "server/rpc.h"
#include "server/server.h"
#include "server/restore.h"
#include "server/store_arenas.h"
#include "st/errors.h"
#include "st/wire.h"

/* Compaction once the journal holds this much more than its last
 * snapshot, and more than the snapshot again: each record is rewritten
 * a bounded number of times on average. */
#define COMPACT_SLACK ((uint64_t)1 << 20)

/* ------------------------------------------------------------ writing */

/* Whether the journal grew enough to be rewritten (compact_cb). */
static int compaction_due(const struct st__restart *r) {
  uint64_t grown = r->journal.tail - r->snapshot_bytes;
  return r->compact_due || (grown >= COMPACT_SLACK && grown >= r->snapshot_bytes);
}

/* Appends a packed record; logs nothing (the caller says what failed).
 * Compaction runs before loop 0's poll: with several loops the puts come
 * from the others while loop 0 sleeps, so it is woken once one is due. */
static int append(struct st__restart *r, uint32_t type, const msgpack_sbuffer *sb, char *err,
                  size_t errlen) {
  int rc = st__journal_append(&r->journal, type, sb->data, sb->size, err, errlen);
  st__server_t *srv = r->srv;
  if ((rc != ST_OK || compaction_due(r)) && srv->threaded && srv->loops)
    st__loop_kick(&srv->loops[0]);
  return rc;
}

/* Writes arena a's ARENA record (number n) to the journal. */
static int write_arena(struct st__restart *r, const st__arena_t *a, uint64_t n, char *err,
                       size_t errlen) {
  st__arena_desc_t d;
  st__arena_describe(a, &d);
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 5);
  st__pack_kv_uint(&pk, "n", n);
  st__pack_kv_str(&pk, "backend", d.backend);
  st__pack_kv_uint(&pk, "bytes", d.bytes);
  st__pack_kv_bool(&pk, "cuda", d.cuda);
  st__pack_kv_str(&pk, "uuid", d.uuid);
  int rc = append(r, ST__REC_ARENA, &sb, err, errlen);
  msgpack_sbuffer_destroy(&sb);
  return rc;
}

/* The number arena a is kept under (it is held). */
static uint64_t number_of(struct st__restart *r, const st__arena_t *a) {
  return st__store_arenas_number_of(&r->arenas, a);
}

/* Holds arena a once more for a kept thing: a new allocation gets a
 * number, its descriptor goes into the store, then its ARENA record into
 * the journal. ST_OK, or the reason with nothing held. */
static int keep_arena(struct st__restart *r, const st__arena_t *a, char *err, size_t errlen) {
  st__stored_arena_t *e = st__store_arenas_find(&r->arenas, a);
  if (e)
    return st__store_arenas_hold(&r->arenas, e, a) == ST_OK
               ? ST_OK
               : st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  if (!st__arena_has_fd(a))
    return st__fail(ST_ERR_CAPABILITY, err, errlen,
                    "a legacy CUDA IPC allocation has no descriptor to keep across a restart");
  if (!(e = st__store_arenas_add(&r->arenas, a, 0)))
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory or descriptors");
  char name[64], why[400];
  st__restart_fdname(name, sizeof name, st__stored_arena_number(e));
  int fd = st__arena_dup_fd(a, why, sizeof why);
  int rc = fd < 0 ? fd : st__fdstore_put(&r->store, name, fd, 1, why, sizeof why);
  if (fd >= 0) close(fd);
  int stored = rc == ST_OK;
  if (rc == ST_OK) rc = write_arena(r, a, st__stored_arena_number(e), why, sizeof why);
  if (rc == ST_OK && st__store_arenas_hold(&r->arenas, e, a) != ST_OK)
    rc = st__fail(ST_ERR_OUT_OF_MEMORY, why, sizeof why, "out of memory");
  if (rc != ST_OK) {
    if (stored) st__fdstore_remove(&r->store, name);
    st__store_arenas_drop(&r->arenas, e);
    return st__fail(rc, err, errlen, "keeping arena %" PRIu64 " across restarts: %s",
                    st__arena_id(a), why);
  }
  return ST_OK;
}

/* Arena a is held by one kept thing less: when its allocation is held by
 * none, its ARENA_GONE record, and it leaves the store. */
static void release_arena(struct st__restart *r, const st__arena_t *a) {
  st__stored_arena_t *e = st__store_arenas_release(&r->arenas, a);
  if (!e) return;
  uint64_t n = st__stored_arena_number(e);
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 1);
  st__pack_kv_uint(&pk, "n", n);
  char err[400], name[64];
  if (append(r, ST__REC_ARENA_GONE, &sb, err, sizeof err) != ST_OK) {
    ST_LOG_E("restart", "%s: the journal is rewritten before the next poll", err);
    r->compact_due = 1;
  }
  msgpack_sbuffer_destroy(&sb);
  st__restart_fdname(name, sizeof name, n);
  st__fdstore_remove(&r->store, name);
  st__store_arenas_drop(&r->arenas, e);
}

/* The VERSION record of c. */
static void pack_version(struct st__restart *r, const st__key_change_t *c, msgpack_sbuffer *sb) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 13);
  st__pack_kv_str(&pk, "key", c->name);
  st__pack_kv_uint(&pk, "uid", c->uid);
  st__pack_cstr(&pk, "uids");
  msgpack_pack_array(&pk, c->readers->nuids);
  for (uint32_t i = 0; i < c->readers->nuids; i++) msgpack_pack_uint32(&pk, c->readers->uids[i]);
  st__pack_cstr(&pk, "gids");
  msgpack_pack_array(&pk, c->readers->ngids);
  for (uint32_t i = 0; i < c->readers->ngids; i++) msgpack_pack_uint32(&pk, c->readers->gids[i]);
  st__pack_kv_uint(&pk, "policy", (uint64_t)c->policy);
  st__pack_kv_bool(&pk, "readonly", c->readonly);
  st__pack_kv_bool(&pk, "live", c->live);
  st__pack_kv_uint(&pk, "version", c->version);
  st__pack_kv_double(&pk, "created", c->created_at);
  st__pack_cstr(&pk, "value");
  msgpack_pack_bin(&pk, c->result->value.size);
  msgpack_pack_bin_body(&pk, c->result->value.data, c->result->value.size);
  st__pack_cstr(&pk, "arenas");
  msgpack_pack_array(&pk, (uint32_t)c->result->narenas);
  for (size_t i = 0; i < c->result->narenas; i++)
    msgpack_pack_uint64(&pk, number_of(r, c->result->arenas[i]));
  st__pack_kv_uint(&pk, "page", c->page ? number_of(r, c->page) : 0);
  st__pack_cstr(&pk, "origin");
  if (!c->origin) {
    msgpack_pack_nil(&pk);
  } else {
    msgpack_pack_array(&pk, 3);
    st__pack_cstr(&pk, c->origin->peer);
    st__pack_cstr(&pk, c->origin->key);
    msgpack_pack_uint64(&pk, c->origin->version);
  }
}

/* Makes sure each of the n arenas is in the store and the journal, and
 * counts one kept reference more to each. On failure nothing is held
 * (an arena this call stored leaves the store). */
static int hold_all(struct st__restart *r, const st__arena_t *const *arenas, size_t n, char *err,
                    size_t errlen) {
  for (size_t i = 0; i < n; i++) {
    int rc = keep_arena(r, arenas[i], err, errlen);
    if (rc != ST_OK) {
      while (i-- > 0) release_arena(r, arenas[i]);
      return rc;
    }
  }
  return ST_OK;
}

/* One kept reference less to each of the n arenas (hold_all's undo). */
static void release_all(struct st__restart *r, const st__arena_t *const *arenas, size_t n) {
  for (size_t i = 0; i < n; i++) release_arena(r, arenas[i]);
}

/* Appends record (type, sb), whose n arenas hold_all held; on failure
 * lets go of them, and err says why (`what` first). */
static int append_held(struct st__restart *r, const st__arena_t *const *arenas, size_t n,
                       uint32_t type, const msgpack_sbuffer *sb, const char *what, char *err,
                       size_t errlen) {
  char why[400];
  int rc = append(r, type, sb, why, sizeof why);
  if (rc == ST_OK) return ST_OK;
  release_all(r, arenas, n);
  return st__fail(rc, err, errlen, "%s: the journal: %s", what, why);
}

/* The arenas of version change c (its page last), in *list (malloc'ed). */
static const st__arena_t **arenas_of(const st__key_change_t *c, size_t *n) {
  *n = c->result->narenas + (c->page != NULL);
  const st__arena_t **list = malloc((*n ? *n : 1) * sizeof *list);
  if (!list) return NULL;
  for (size_t i = 0; i < c->result->narenas; i++) list[i] = c->result->arenas[i];
  if (c->page) list[c->result->narenas] = c->page;
  return list;
}

/* The key table's version_added: the arenas into the store, then the
 * VERSION record (which names them by number). */
static int on_version_added(void *ud, const st__key_change_t *c, char *err, size_t errlen) {
  struct st__restart *r = ud;
  size_t n;
  const st__arena_t **list = arenas_of(c, &n);
  if (!list) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  char what[ST__KEY_NAME_MAX + 32];
  snprintf(what, sizeof what, "key '%s'", c->name);
  int rc = hold_all(r, list, n, err, errlen);
  if (rc == ST_OK) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    pack_version(r, c, &sb);
    rc = append_held(r, list, n, ST__REC_VERSION, &sb, what, err, errlen);
    msgpack_sbuffer_destroy(&sb);
  }
  free(list);
  return rc;
}

/* The DROP or DELETE record of key k (version v, or the key). */
static void write_gone(struct st__restart *r, const st__key_t *k, const st__key_version_t *v) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, v ? 2 : 1);
  st__pack_kv_str(&pk, "key", k->name);
  if (v) st__pack_kv_uint(&pk, "version", v->version);
  char err[400];
  if (append(r, v ? ST__REC_DROP : ST__REC_DELETE, &sb, err, sizeof err) != ST_OK) {
    ST_LOG_E("restart", "key '%s': %s: the journal is rewritten before the next poll", k->name,
             err);
    r->compact_due = 1;
  }
  msgpack_sbuffer_destroy(&sb);
}

static void on_version_dropped(void *ud, const st__key_t *k, const st__key_version_t *v) {
  struct st__restart *r = ud;
  write_gone(r, k, v);
  for (size_t i = 0; i < v->result.narenas; i++) release_arena(r, v->result.arenas[i]);
  if (k->page_arena) release_arena(r, k->page_arena);
}

static void on_key_removed(void *ud, const st__key_t *k) {
  struct st__restart *r = ud;
  write_gone(r, k, NULL);
  for (size_t j = 0; j < k->nversions; j++) {
    const st__key_version_t *v = k->versions[j];
    for (size_t i = 0; i < v->result.narenas; i++) release_arena(r, v->result.arenas[i]);
    if (k->page_arena) release_arena(r, k->page_arena);
  }
}

static const st__keys_journal_t hooks = {
    .version_added = on_version_added,
    .version_dropped = on_version_dropped,
    .key_removed = on_key_removed,
};

/* The BUFFER record of b. */
static void pack_buffer(struct st__restart *r, const st__buffer_t *b, msgpack_sbuffer *sb) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 10);
  st__pack_kv_str(&pk, "name", b->named.name);
  st__pack_kv_uint(&pk, "uid", b->named.uid);
  const st__grant_t *g = &b->named.readers;
  st__pack_cstr(&pk, "uids");
  msgpack_pack_array(&pk, g->nuids);
  for (uint32_t i = 0; i < g->nuids; i++) msgpack_pack_uint32(&pk, g->uids[i]);
  st__pack_cstr(&pk, "gids");
  msgpack_pack_array(&pk, g->ngids);
  for (uint32_t i = 0; i < g->ngids; i++) msgpack_pack_uint32(&pk, g->gids[i]);
  st__pack_kv_bool(&pk, "cuda", b->named.device >= 0);
  st__pack_kv_str(&pk, "dtype", st_dtype_name(b->dtype));
  st__pack_cstr(&pk, "shape");
  msgpack_pack_array(&pk, (uint32_t)b->ndim);
  for (int i = 0; i < b->ndim; i++) msgpack_pack_int64(&pk, b->shape[i]);
  st__pack_kv_uint(&pk, "slots", b->slots);
  st__pack_kv_uint(&pk, "data", number_of(r, b->named.data));
  st__pack_kv_uint(&pk, "page", number_of(r, b->named.page_arena));
}

/* See restart.h. Loop thread. */
int st__restart_buffer_created(st__server_t *srv, const st__buffer_t *b, char *err,
                               size_t errlen) {
  struct st__restart *r = srv->restart;
  if (!r || !r->keeping) return ST_OK;
  const st__arena_t *list[2] = {b->named.data, b->named.page_arena};
  char what[ST__NAME_MAX + 32];
  snprintf(what, sizeof what, "buffer '%s'", b->named.name);
  int rc = hold_all(r, list, 2, err, errlen);
  if (rc == ST_OK) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    pack_buffer(r, b, &sb);
    rc = append_held(r, list, 2, ST__REC_BUFFER, &sb, what, err, errlen);
    msgpack_sbuffer_destroy(&sb);
  }
  return rc;
}

/* See restart.h. Loop thread. */
void st__restart_buffer_unlinked(st__server_t *srv, const char *name, size_t len,
                                 const st__arena_t *data, const st__arena_t *page) {
  struct st__restart *r = srv->restart;
  if (!r || !r->keeping || !data || !page) return;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 1);
  st__pack_cstr(&pk, "name");
  msgpack_pack_str(&pk, len);
  msgpack_pack_str_body(&pk, name, len);
  char err[400];
  if (append(r, ST__REC_BUFFER_GONE, &sb, err, sizeof err) != ST_OK) {
    ST_LOG_E("restart", "buffer '%.*s': %s: the journal is rewritten before the next poll",
             (int)len, name, err);
    r->compact_due = 1;
  }
  msgpack_sbuffer_destroy(&sb);
  release_arena(r, data);
  release_arena(r, page);
}

/* --------------------------------------------------------- compaction */

typedef struct arena_walk {
  struct st__restart *r;
  int rc;
  char err[400];
} arena_walk_t;

static void snapshot_arena(st__stored_arena_t *e, void *ud) {
  arena_walk_t *w = ud;
  if (w->rc != ST_OK) return;
  w->rc = write_arena(w->r, st__stored_arena_any(e), st__stored_arena_number(e), w->err,
                      sizeof w->err);
}

/* Writes the whole table (every kept arena, key version and buffer) into
 * a new journal *next of (generation, epoch). ST_OK, or the error in
 * w->err with nothing left open. */
static int write_snapshot(struct st__restart *r, uint64_t generation, uint64_t epoch,
                          st__journal_t *next, arena_walk_t *out) {
  st__journal_t old = r->journal;
  arena_walk_t w = {.r = r, .rc = ST_OK};
  w.rc = st__journal_create(next, generation, epoch, w.err, sizeof w.err);
  if (w.rc == ST_OK) {
    r->journal = *next;
    st__store_arenas_each(&r->arenas, snapshot_arena, &w);
    size_t nkeys = 0;
    st__key_t **keys = st__keys_list(&r->srv->keys, NULL, 0, &nkeys);
    for (size_t i = 0; w.rc == ST_OK && i < nkeys; i++)
      for (size_t j = 0; w.rc == ST_OK && j < keys[i]->nversions; j++) {
        const st__key_change_t c = st__keys_change_of(keys[i], keys[i]->versions[j]);
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        pack_version(r, &c, &sb);
        w.rc = append(r, ST__REC_VERSION, &sb, w.err, sizeof w.err);
        msgpack_sbuffer_destroy(&sb);
      }
    free(keys);
    st__buffers_t *bt = ST__HOLDING_STATE(r->srv, buffers);
    for (st__named_t *e = bt ? bt->named.head : NULL; w.rc == ST_OK && e; e = e->next) {
      msgpack_sbuffer sb;
      msgpack_sbuffer_init(&sb);
      pack_buffer(r, (const st__buffer_t *)e, &sb);
      w.rc = append(r, ST__REC_BUFFER, &sb, w.err, sizeof w.err);
      msgpack_sbuffer_destroy(&sb);
    }
    *next = r->journal;
    r->journal = old;
    if (w.rc != ST_OK) st__journal_close(next);
  }
  *out = w;
  return w.rc;
}

/* Writes the whole table into a new journal (generation `generation`),
 * stores it beside the current one, then removes the current one.
 * ST_OK, or an error logged (the current journal stays). */
static int compact(struct st__restart *r, uint64_t generation, uint64_t epoch) {
  st__journal_t old = r->journal, next = {.fd = -1};
  arena_walk_t w;
  write_snapshot(r, generation, epoch, &next, &w);
  char name[32];
  snprintf(name, sizeof name, "st-journal-%d", 1 - r->slot);
  if (w.rc == ST_OK) w.rc = st__fdstore_put(&r->store, name, next.fd, 1, w.err, sizeof w.err);
  if (w.rc != ST_OK) {
    ST_LOG_E("restart", "writing a new journal: %s (the current one stays)", w.err);
    if (next.fd >= 0) st__journal_close(&next);
    return w.rc;
  }
  if (r->slot_stored) {
    snprintf(name, sizeof name, "st-journal-%d", r->slot);
    st__fdstore_remove(&r->store, name);
  }
  st__journal_close(&old);
  r->slot_stored = 1;
  r->journal = next;
  r->slot = 1 - r->slot;
  r->snapshot_bytes = next.tail;
  r->compact_due = 0;
  r->compactions++;
  ST_LOG_D("restart", "journal generation %" PRIu64 " epoch %" PRIu64 ": %" PRIu64
           " records, %" PRIu64 " bytes", generation, epoch, next.records, next.tail);
  return ST_OK;
}

/* Before a poll: compacts a journal that grew past its slack (or that
 * missed a record). */
static void compact_cb(struct ev_loop *loop, ev_prepare *w, int revents) {
  (void)loop;
  (void)revents;
  struct st__restart *r = w->data;
  if (!r->keeping) return;
  if (!compaction_due(r)) return;
  if (compact(r, r->journal.generation, r->journal.epoch + 1) == ST_OK) return;
  if (!r->compact_due) {
    r->snapshot_bytes = r->journal.tail;   /* the next try after more growth */
    return;
  }
  /* A record is missing and no new journal could be written: a restart
   * must not serve what the journal says now. */
  ST_LOG_E("restart", "the journal misses a change and cannot be rewritten: published state "
           "is no longer kept across restarts");
  r->keeping = 0;
  r->srv->keys.journal = NULL;
  char name[32];
  snprintf(name, sizeof name, "st-journal-%d", r->slot);
  st__fdstore_remove(&r->store, name);
  r->slot_stored = 0;
  st__journal_close(&r->journal);
}

/* ----------------------------------------------------------- takeover */

/* Takes the listening sockets a takeover handed over ("st-listen-<d>"). */
static void claim_listeners(struct st__restart *r) {
  for (size_t i = 0; i < r->store.nreceived; i++) {
    st__fdstore_entry_t *e = &r->store.received[i];
    char *end;
    if (e->fd < 0 || strncmp(e->name, "st-listen-", 10) != 0) continue;
    long d = strtol(e->name + 10, &end, 10);
    if (*end || end == e->name + 10 || d < -1 || d > 4096 || r->nlisteners == ST_MAX_DEVICES)
      continue;   /* left for drop_unclaimed */
    r->listeners[r->nlisteners].device = (int)d;
    r->listeners[r->nlisteners++].fd = e->fd;
    e->fd = -1;
  }
}

/* See restart.h. Loop thread, at start. */
int st__restart_listener(st__server_t *srv, int device) {
  struct st__restart *r = srv->restart;
  for (int i = 0; r && i < r->nlisteners; i++)
    if (r->listeners[i].device == device && r->listeners[i].fd >= 0) {
      int fd = r->listeners[i].fd;
      r->listeners[i].fd = -1;
      return fd;
    }
  return -1;
}

/* Counts arena a into the registry under a new number when it has none
 * (number_all). */
static void number_one(struct st__restart *r, const st__arena_t *a) {
  st__stored_arena_t *e = st__store_arenas_find(&r->arenas, a);
  if (!e) e = st__store_arenas_add(&r->arenas, a, 0);
  if (e) st__store_arenas_hold(&r->arenas, e, a);
}

/* Numbers every arena of the tables for a handover when none is kept
 * (no fd store): the registry is temporary. */
static void number_all(struct st__restart *r) {
  size_t nkeys = 0;
  st__key_t **keys = st__keys_list(&r->srv->keys, NULL, 0, &nkeys);
  for (size_t i = 0; i < nkeys; i++)
    for (size_t j = 0; j < keys[i]->nversions; j++) {
      const st__key_version_t *v = keys[i]->versions[j];
      for (size_t a = 0; a < v->result.narenas; a++) number_one(r, v->result.arenas[a]);
      if (keys[i]->page_arena) number_one(r, keys[i]->page_arena);
    }
  free(keys);
  st__buffers_t *bt = ST__HOLDING_STATE(r->srv, buffers);
  for (st__named_t *b = bt ? bt->named.head : NULL; b; b = b->next) {
    number_one(r, b->data);
    number_one(r, b->page_arena);
  }
  r->temporary = 1;
}

typedef struct handover_walk {
  st__fdstore_entry_t *list;
  size_t n, cap;
  int rc;
  char err[300];
} handover_walk_t;

/* Adds (name, a duplicate of fd) to the handover list. */
static void handover_add(handover_walk_t *h, const char *name, int fd) {
  if (h->rc != ST_OK) return;
  if (fd < 0) {
    h->rc = fd;
    snprintf(h->err, sizeof h->err, "no descriptor for '%s'", name);
    return;
  }
  if (h->n == h->cap) {
    size_t cap = h->cap ? h->cap * 2 : 64;
    st__fdstore_entry_t *grown = realloc(h->list, cap * sizeof *grown);
    if (!grown) {
      close(fd);
      h->rc = ST_ERR_OUT_OF_MEMORY;
      snprintf(h->err, sizeof h->err, "out of memory");
      return;
    }
    h->list = grown;
    h->cap = cap;
  }
  snprintf(h->list[h->n].name, sizeof h->list[h->n].name, "%s", name);
  h->list[h->n++].fd = fd;
}

static void handover_arena(st__stored_arena_t *e, void *ud) {
  handover_walk_t *h = ud;
  if (h->rc != ST_OK) return;
  char name[64];
  st__restart_fdname(name, sizeof name, st__stored_arena_number(e));
  handover_add(h, name, st__arena_dup_fd(st__stored_arena_any(e), h->err, sizeof h->err));
}

/* See restart.h. Loop thread. */
int st__restart_handover(st__server_t *srv, st__fdstore_entry_t **out, size_t *n, char *err,
                         size_t errlen) {
  struct st__restart *r = srv->restart;
  *out = NULL;
  *n = 0;
  if (!r) return st__fail(ST_ERR_INTERNAL, err, errlen, "no restart state");
  if (!r->keeping) number_all(r);
  uint64_t generation = r->keeping ? r->journal.generation : r->from_generation + 1;
  st__journal_t j = {.fd = -1};
  arena_walk_t w;
  if (write_snapshot(r, generation, r->keeping ? r->journal.epoch + 1 : 0, &j, &w) != ST_OK)
    return st__fail(w.rc, err, errlen, "the journal for the new server: %s", w.err);
  handover_walk_t h = {.rc = ST_OK};
  handover_add(&h, "st-journal-0", fcntl(j.fd, F_DUPFD_CLOEXEC, 0));
  st__journal_close(&j);
  st__store_arenas_each(&r->arenas, handover_arena, &h);
  for (int i = 0; i < srv->nlisteners; i++) {
    char name[32];
    snprintf(name, sizeof name, "st-listen-%d", srv->listeners[i].device);
    if (srv->listeners[i].fd >= 0)
      handover_add(&h, name, fcntl(srv->listeners[i].fd, F_DUPFD_CLOEXEC, 0));
  }
  if (h.rc != ST_OK) {
    for (size_t i = 0; i < h.n; i++) close(h.list[i].fd);
    free(h.list);
    return st__fail(h.rc, err, errlen, "%s", h.err);
  }
  *out = h.list;
  *n = h.n;
  return ST_OK;
}

/* See restart.h. Loop thread. */
void st__restart_handover_failed(st__server_t *srv) {
  struct st__restart *r = srv->restart;
  if (!r || !r->temporary) return;
  st__store_arenas_clear(&r->arenas);
  r->temporary = 0;
}

/* After a takeover's restore under a service manager: the arenas this
 * process took from the old one go into its own store too (a descriptor
 * stored twice is kept once). */
static void store_handed(st__stored_arena_t *e, void *ud) {
  struct st__restart *r = ud;
  char name[64], err[300];
  st__restart_fdname(name, sizeof name, st__stored_arena_number(e));
  int fd = st__arena_dup_fd(st__stored_arena_any(e), err, sizeof err);
  if (fd < 0 || st__fdstore_put(&r->store, name, fd, 1, err, sizeof err) != ST_OK)
    ST_LOG_E("restart", "arena '%s' is not in the fd store: %s", name, err);
  if (fd >= 0) close(fd);
}

/* ----------------------------------------------------------- the rest */

/* See restart.h. Loop thread, at start. */
int st__restart_start(st__server_t *srv) {
  struct st__restart *r = calloc(1, sizeof *r);
  if (!r) return ST_ERR_OUT_OF_MEMORY;
  srv->restart = r;
  r->srv = srv;
  r->journal.fd = -1;
  r->slot = 1;   /* the first journal is st-journal-0 */
  st__store_arenas_init(&r->arenas);
  st__fdstore_init(&r->store);
  if (srv->handed) {   /* a takeover: what the old server handed over */
    st__fdstore_adopt(&r->store, srv->handed, srv->nhanded);
    srv->handed = NULL;
    r->handed = 1;
  }
  claim_listeners(r);
  st__restore_run(r);
  if (r->handed) {
    /* Nothing of it is in this process's store yet. */
    r->store.stored = 0;
    if (r->store.enabled) st__store_arenas_each(&r->arenas, store_handed, r);
  } else {
    st__fdstore_drop_unclaimed(&r->store);
  }
  for (size_t i = 0; r->handed && i < r->store.nreceived; i++)
    if (r->store.received[i].fd >= 0) {
      ST_LOG_W("restart", "descriptor '%s' handed over belongs to no restored state: closed",
               r->store.received[i].name);
      close(r->store.received[i].fd);
      r->store.received[i].fd = -1;
    }
  if (!r->store.enabled) {
    if (r->from_generation)
      ST_LOG_W("restart", "no fd store ($NOTIFY_SOCKET and $FDSTORE): what was restored is not "
               "kept for the next restart");
    return ST_OK;
  }
  uint64_t generation = r->from_generation + 1;
  if (compact(r, generation, 0) != ST_OK) {
    ST_LOG_E("restart", "published state is not kept across restarts (no journal)");
    return ST_OK;
  }
  r->keeping = 1;
  srv->keys.journal = &hooks;
  srv->keys.journal_ud = r;
  ev_prepare_init(&r->compact, compact_cb);
  r->compact.data = r;
  ev_prepare_start(srv->loop, &r->compact);
  ev_unref(srv->loop);   /* the watcher alone keeps no loop running */
  ST_LOG_I("restart", "published keys are kept in the service's fd store (at most %" PRIu64
           " descriptors): journal generation %" PRIu64, r->store.max, generation);
  return ST_OK;
}

/* See restart.h. Loop thread, at exit. */
void st__restart_stop(st__server_t *srv) {
  struct st__restart *r = srv->restart;
  if (!r) return;
  srv->keys.journal = NULL;
  if (r->keeping) {
    ev_ref(srv->loop);
    ev_prepare_stop(srv->loop, &r->compact);
  }
  st__journal_close(&r->journal);
  st__store_arenas_clear(&r->arenas);
  st__fdstore_free(&r->store);
  for (int i = 0; i < r->nlisteners; i++)
    if (r->listeners[i].fd >= 0) close(r->listeners[i].fd);
  free(r);
  srv->restart = NULL;
}

/* See restart.h. Loop thread. */
void st__restart_pack_info(const st__server_t *srv, msgpack_packer *pk) {
  const struct st__restart *r = srv->restart;
  msgpack_pack_map(pk, 7);
  st__pack_kv_bool(pk, "kept", r && r->keeping);
  st__pack_kv_uint(pk, "store_max", r ? r->store.max : 0);
  st__pack_kv_uint(pk, "stored", r ? r->store.stored : 0);
  st__pack_kv_uint(pk, "generation", r && r->keeping ? r->journal.generation : 0);
  st__pack_kv_uint(pk, "journal_bytes", r && r->keeping ? r->journal.tail : 0);
  st__pack_kv_uint(pk, "compactions", r ? r->compactions : 0);
  st__pack_cstr(pk, "restored");
  msgpack_pack_map(pk, 7);
  st__pack_kv_uint(pk, "keys", r ? r->keys : 0);
  st__pack_kv_uint(pk, "buffers", r ? r->buffers : 0);
  st__pack_kv_uint(pk, "versions", r ? r->versions : 0);
  st__pack_kv_uint(pk, "bytes", r ? r->bytes : 0);
  st__pack_kv_uint(pk, "from_generation", r ? r->from_generation : 0);
  st__pack_kv_uint(pk, "refused", r ? r->refused : 0);
  st__pack_kv_uint(pk, "torn", r ? r->torn : 0);
}
