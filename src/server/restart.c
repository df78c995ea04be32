/* src/server: published state that survives the process (restart.h).
 * Loop thread only: the key table calls the journal hooks on the loop
 * thread, under its lock.
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
#include "server/store_arenas.h"
#include "st/errors.h"
#include "st/wire.h"

enum {
  REC_ARENA = 1, REC_ARENA_GONE = 2, REC_VERSION = 3, REC_DROP = 4, REC_DELETE = 5,
  REC_BUFFER = 6, REC_BUFFER_GONE = 7
};

/* Compaction once the journal holds this much more than its last
 * snapshot, and more than the snapshot again: each record is rewritten
 * a bounded number of times on average. */
#define COMPACT_SLACK ((uint64_t)1 << 20)
/* Arena numbers recorded are below this (a bound on what is read). */
#define MAX_ARENA_NUMBER ((uint64_t)1 << 48)

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

static void fdname_arena(char *out, size_t cap, uint64_t n) {
  snprintf(out, cap, "st-arena-%" PRIu64, n);
}

/* ------------------------------------------------------------ writing */

/* Packs the records' common shapes. */
static void pack_key(msgpack_packer *pk, const char *k) {
  st__pack_cstr(pk, k);
}

/* Appends a packed record; logs nothing (the caller says what failed). */
static int append(struct st__restart *r, uint32_t type, const msgpack_sbuffer *sb, char *err,
                  size_t errlen) {
  return st__journal_append(&r->journal, type, sb->data, sb->size, err, errlen);
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
  int rc = append(r, REC_ARENA, &sb, err, errlen);
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
  fdname_arena(name, sizeof name, st__stored_arena_number(e));
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
  if (append(r, REC_ARENA_GONE, &sb, err, sizeof err) != ST_OK) {
    ST_LOG_E("restart", "%s: the journal is rewritten before the next poll", err);
    r->compact_due = 1;
  }
  msgpack_sbuffer_destroy(&sb);
  fdname_arena(name, sizeof name, n);
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
    pack_key(&pk, c->origin->peer);
    pack_key(&pk, c->origin->key);
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
    rc = append_held(r, list, n, REC_VERSION, &sb, what, err, errlen);
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
  if (append(r, v ? REC_DROP : REC_DELETE, &sb, err, sizeof err) != ST_OK) {
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
    rc = append_held(r, list, 2, REC_BUFFER, &sb, what, err, errlen);
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
  if (append(r, REC_BUFFER_GONE, &sb, err, sizeof err) != ST_OK) {
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
        w.rc = append(r, REC_VERSION, &sb, w.err, sizeof w.err);
        msgpack_sbuffer_destroy(&sb);
      }
    free(keys);
    st__buffers_t *bt = ST__HOLDING_STATE(r->srv, buffers);
    for (st__named_t *e = bt ? bt->named.head : NULL; w.rc == ST_OK && e; e = e->next) {
      msgpack_sbuffer sb;
      msgpack_sbuffer_init(&sb);
      pack_buffer(r, (const st__buffer_t *)e, &sb);
      w.rc = append(r, REC_BUFFER, &sb, w.err, sizeof w.err);
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
  uint64_t grown = r->journal.tail - r->snapshot_bytes;
  if (!r->compact_due && (grown < COMPACT_SLACK || grown < r->snapshot_bytes)) return;
  if (compact(r, r->journal.generation, r->journal.epoch + 1) == ST_OK || !r->compact_due)
    return;
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

/* ----------------------------------------------------------- restoring */

/* An arena the journal names. */
typedef struct old_arena {
  uint64_t n;
  st__arena_desc_t desc;
  int gone;                   /* ARENA_GONE came                           */
  int tried;
  st__arena_t *arena;         /* imported (one reference), or NULL         */
  char why[300];              /* why the import failed                     */
} old_arena_t;

/* A VERSION record still standing. */
typedef struct old_version {
  char *payload;              /* owned copy of the record                  */
  size_t len;
  char key[ST__KEY_NAME_MAX + 1];
  uint64_t version;
  int dropped;
} old_version_t;

/* A BUFFER record still standing. */
typedef struct old_buffer {
  char *payload;              /* owned copy of the record; NULL: unlinked  */
  size_t len;
  char name[ST__NAME_MAX + 1];
} old_buffer_t;

typedef struct replay {
  st__smap_t arenas;          /* decimal n -> old_arena_t                  */
  old_buffer_t *buffers;      /* in record order                           */
  size_t nbuffers, bcap;
  st__smap_t buffer_names;    /* name -> index + 1 of its standing record  */
  old_version_t *versions;
  size_t nversions, cap;
  st__smap_t latest;          /* "key" -> index + 1 of its last version    */
} replay_t;

/* A string field (NUL-free, at most cap-1 bytes) of map m. */
static int field_str(const msgpack_object *m, const char *k, char *out, size_t cap) {
  const msgpack_object *o = st__map_get(m, k);
  if (!o || o->type != MSGPACK_OBJECT_STR || o->via.str.size >= cap ||
      memchr(o->via.str.ptr, 0, o->via.str.size))
    return 0;
  memcpy(out, o->via.str.ptr, o->via.str.size);
  out[o->via.str.size] = '\0';
  return 1;
}

static int field_uint(const msgpack_object *m, const char *k, uint64_t max, uint64_t *out) {
  const msgpack_object *o = st__map_get(m, k);
  if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > max) return 0;
  *out = o->via.u64;
  return 1;
}

static int field_bool(const msgpack_object *m, const char *k, int *out) {
  const msgpack_object *o = st__map_get(m, k);
  if (!o || o->type != MSGPACK_OBJECT_BOOLEAN) return 0;
  *out = o->via.boolean;
  return 1;
}

static old_arena_t *old_arena(replay_t *p, uint64_t n) {
  char k[24];
  int len = snprintf(k, sizeof k, "%" PRIu64, n);
  return st__smap_get(&p->arenas, k, (size_t)len);
}

/* Keeps an ARENA record. */
static int replay_arena(replay_t *p, const msgpack_object *m, char *err, size_t errlen) {
  old_arena_t a;
  memset(&a, 0, sizeof a);
  int cuda = 0;
  if (!field_uint(m, "n", MAX_ARENA_NUMBER, &a.n) || a.n == 0 ||
      !field_str(m, "backend", a.desc.backend, sizeof a.desc.backend) ||
      !field_uint(m, "bytes", UINT64_MAX, &a.desc.bytes) || !field_bool(m, "cuda", &cuda) ||
      !field_str(m, "uuid", a.desc.uuid, sizeof a.desc.uuid))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "an arena record lacks a valid field");
  a.desc.cuda = cuda;
  if (old_arena(p, a.n))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "arena %" PRIu64 " recorded twice",
                    a.n);
  old_arena_t *e = malloc(sizeof *e);
  char k[24];
  int len = snprintf(k, sizeof k, "%" PRIu64, a.n);
  if (!e || (*e = a, st__smap_put(&p->arenas, k, (size_t)len, e)) != ST_OK) {
    free(e);
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  }
  return ST_OK;
}

/* Keeps a VERSION record (a copy), checking its key and number. */
static int replay_version(replay_t *p, const msgpack_object *m, const char *payload, size_t len,
                          char *err, size_t errlen) {
  old_version_t v;
  memset(&v, 0, sizeof v);
  if (!field_str(m, "key", v.key, sizeof v.key) ||
      st__keys_name_ok(v.key, strlen(v.key), NULL, 0) != ST_OK ||
      !field_uint(m, "version", UINT64_MAX, &v.version) || v.version == 0)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "a version record has no valid key "
                    "and version");
  uintptr_t last = (uintptr_t)st__smap_get(&p->latest, v.key, strlen(v.key));
  if (last && !p->versions[last - 1].dropped && p->versions[last - 1].version >= v.version)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "key '%s': version %" PRIu64 " recorded after version %" PRIu64, v.key,
                    v.version, p->versions[last - 1].version);
  if (p->nversions == p->cap) {
    size_t cap = p->cap ? p->cap * 2 : 64;
    old_version_t *grown = realloc(p->versions, cap * sizeof *grown);
    if (!grown) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
    p->versions = grown;
    p->cap = cap;
  }
  v.payload = malloc(len ? len : 1);
  if (!v.payload) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  memcpy(v.payload, payload, len);
  v.len = len;
  p->versions[p->nversions++] = v;
  if (st__smap_put(&p->latest, v.key, strlen(v.key), (void *)(uintptr_t)p->nversions) != ST_OK)
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  return ST_OK;
}

/* DROP (version) or DELETE (every version) of key. */
static int replay_gone(replay_t *p, const msgpack_object *m, int drop, char *err,
                       size_t errlen) {
  char key[ST__KEY_NAME_MAX + 1];
  uint64_t version = 0;
  if (!field_str(m, "key", key, sizeof key) ||
      (drop && !field_uint(m, "version", UINT64_MAX, &version)))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "a %s record lacks a valid field",
                    drop ? "drop" : "delete");
  for (size_t i = p->nversions; i-- > 0;) {
    old_version_t *v = &p->versions[i];
    if (v->dropped || strcmp(v->key, key) != 0) continue;
    if (!drop || v->version == version) {
      v->dropped = 1;
      free(v->payload);
      v->payload = NULL;
      if (drop) break;
    }
  }
  return ST_OK;
}

/* Keeps a BUFFER record (a copy), or drops one for BUFFER_GONE. */
static int replay_buffer(replay_t *p, const msgpack_object *m, const char *payload, size_t len,
                         int gone, char *err, size_t errlen) {
  char name[ST__NAME_MAX + 1];
  if (!field_str(m, "name", name, sizeof name) ||
      st__named_check("buffer", name, strlen(name), NULL, 0) != ST_OK)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "a buffer record has no valid name");
  uintptr_t at = (uintptr_t)st__smap_get(&p->buffer_names, name, strlen(name));
  if (gone) {
    if (!at)
      return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "buffer '%s' unlinked, never made",
                      name);
    free(p->buffers[at - 1].payload);
    p->buffers[at - 1].payload = NULL;
    st__smap_del(&p->buffer_names, name, strlen(name));
    return ST_OK;
  }
  if (at)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "buffer '%s' made twice", name);
  if (p->nbuffers == p->bcap) {
    size_t cap = p->bcap ? p->bcap * 2 : 16;
    old_buffer_t *grown = realloc(p->buffers, cap * sizeof *grown);
    if (!grown) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
    p->buffers = grown;
    p->bcap = cap;
  }
  old_buffer_t *b = &p->buffers[p->nbuffers];
  memset(b, 0, sizeof *b);
  memcpy(b->name, name, strlen(name) + 1);
  if (!(b->payload = malloc(len ? len : 1)))
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  memcpy(b->payload, payload, len);
  b->len = len;
  p->nbuffers++;
  if (st__smap_put(&p->buffer_names, name, strlen(name), (void *)(uintptr_t)p->nbuffers) != ST_OK)
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  return ST_OK;
}

/* st__journal_read's callback: one verified record into the replay. */
static int replay_record(void *ud, uint32_t type, const char *payload, size_t len, char *err,
                         size_t errlen) {
  replay_t *p = ud;
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  int rc = ST_OK;
  if (msgpack_unpack_next(&u, payload, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len ||
      u.data.type != MSGPACK_OBJECT_MAP) {
    rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "a record of type %u is no map", type);
  } else if (type == REC_ARENA) {
    rc = replay_arena(p, &u.data, err, errlen);
  } else if (type == REC_ARENA_GONE) {
    uint64_t n;
    old_arena_t *a = field_uint(&u.data, "n", MAX_ARENA_NUMBER, &n) ? old_arena(p, n) : NULL;
    if (a) a->gone = 1;
    else rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "the end of an unknown arena");
  } else if (type == REC_VERSION) {
    rc = replay_version(p, &u.data, payload, len, err, errlen);
  } else if (type == REC_DROP || type == REC_DELETE) {
    rc = replay_gone(p, &u.data, type == REC_DROP, err, errlen);
  } else if (type == REC_BUFFER || type == REC_BUFFER_GONE) {
    rc = replay_buffer(p, &u.data, payload, len, type == REC_BUFFER_GONE, err, errlen);
  } else {
    rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "a record of unknown type %u", type);
  }
  msgpack_unpacked_destroy(&u);
  return rc;
}

/* Arena n imported from the store (once): the reference the replay
 * holds, or NULL with the reason in err. */
static st__arena_t *import_arena(struct st__restart *r, replay_t *p, uint64_t n, char *err,
                                 size_t errlen) {
  old_arena_t *a = old_arena(p, n);
  if (!a || a->gone) {
    st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "it names arena %" PRIu64 ", which the "
             "journal %s", n, a ? "says was let go of" : "never recorded");
    return NULL;
  }
  if (!a->tried) {
    a->tried = 1;
    char name[64];
    fdname_arena(name, sizeof name, n);
    int fd = st__fdstore_claim(&r->store, name);
    if (fd < 0) {
      snprintf(a->why, sizeof a->why, "its descriptor '%s' is not in the store", name);
    } else {
      st__arena_desc_t d = a->desc;
      if (st__arena_import(&d, fd, &a->arena, a->why, sizeof a->why) != ST_OK) {
        a->arena = NULL;
        st__fdstore_remove(&r->store, name);
      }
    }
  }
  if (!a->arena)
    st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "arena %" PRIu64 ": %s", n, a->why);
  return a->arena;
}

/* Checks every tensor of value o against the arenas of res: a valid
 * descriptor whose arena index is res's and whose bytes lie inside it. */
static int check_tensors(const msgpack_object *o, const st__build_result_t *res, int depth,
                         char *err, size_t errlen) {
  if (depth > ST_MAX_DEPTH + 2)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "the value nests too deep");
  if (o->type == MSGPACK_OBJECT_ARRAY) {
    for (uint32_t i = 0; i < o->via.array.size; i++) {
      int rc = check_tensors(&o->via.array.ptr[i], res, depth + 1, err, errlen);
      if (rc != ST_OK) return rc;
    }
  } else if (o->type == MSGPACK_OBJECT_MAP) {
    for (uint32_t i = 0; i < o->via.map.size; i++) {
      int rc = check_tensors(&o->via.map.ptr[i].val, res, depth + 1, err, errlen);
      if (rc != ST_OK) return rc;
    }
  } else if (o->type == MSGPACK_OBJECT_EXT && o->via.ext.type == ST_EXT_TENSOR) {
    st__tensor_desc_t d;
    uint64_t lo, hi;
    int rc = st__parse_tensor(o, &d, err, errlen);
    if (rc != ST_OK) return rc;
    if (d.arena >= res->narenas || st__tensor_extent(&d, &lo, &hi) != ST_OK ||
        hi > st__arena_bytes(res->arenas[d.arena]))
      return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                      "a tensor lies outside the arenas it was recorded with");
  } else if (o->type == MSGPACK_OBJECT_EXT && o->via.ext.type == ST_EXT_MODULE) {
    msgpack_unpacked payload;
    const msgpack_object *tensors, *metadata;
    msgpack_unpacked_init(&payload);
    int rc = st__parse_module(o, &payload, &tensors, &metadata, err, errlen);
    if (rc == ST_OK) rc = check_tensors(tensors, res, depth + 1, err, errlen);
    msgpack_unpacked_destroy(&payload);
    return rc == ST_OK ? ST_OK : ST_ERR_INVALID_ARGUMENT;
  }
  return ST_OK;
}

/* A grant list field (at most ST__GRANT_MAX ids). */
static int field_ids(const msgpack_object *m, const char *k, uint32_t *n, uint32_t *ids) {
  const msgpack_object *o = st__map_get(m, k);
  if (!o || o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > ST__GRANT_MAX) return 0;
  for (uint32_t i = 0; i < o->via.array.size; i++) {
    const msgpack_object *e = &o->via.array.ptr[i];
    if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.u64 > UINT32_MAX) return 0;
    ids[i] = (uint32_t)e->via.u64;
  }
  *n = o->via.array.size;
  return 1;
}

/* Makes version record v again in the table: every field checked, the
 * arenas imported, the value's tensors checked against them. */
static int restore_version(struct st__restart *r, replay_t *p, const old_version_t *v, char *err,
                           size_t errlen) {
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  msgpack_unpack_next(&u, v->payload, v->len, &off);   /* verified by the replay */
  const msgpack_object *m = &u.data;
  st__grant_t readers;
  memset(&readers, 0, sizeof readers);
  uint32_t uids[ST__GRANT_MAX], gids[ST__GRANT_MAX];
  uint64_t uid, policy, page_n;
  int readonly, live, rc = ST_OK;
  const msgpack_object *created = st__map_get(m, "created"), *value = st__map_get(m, "value"),
                       *arenas = st__map_get(m, "arenas"), *origin = st__map_get(m, "origin");
  if (!field_uint(m, "uid", UINT32_MAX - 1, &uid) || !field_uint(m, "policy", 1, &policy) ||
      !field_bool(m, "readonly", &readonly) || !field_bool(m, "live", &live) ||
      !field_uint(m, "page", MAX_ARENA_NUMBER, &page_n) ||
      !field_ids(m, "uids", &readers.nuids, uids) || !field_ids(m, "gids", &readers.ngids, gids) ||
      !created || (created->type != MSGPACK_OBJECT_FLOAT64 && created->type != MSGPACK_OBJECT_FLOAT32) ||
      !value || value->type != MSGPACK_OBJECT_BIN || !arenas ||
      arenas->type != MSGPACK_OBJECT_ARRAY || arenas->via.array.size > ST_MAX_FDS_PER_MESSAGE * 64 ||
      !origin || (origin->type != MSGPACK_OBJECT_NIL && origin->type != MSGPACK_OBJECT_ARRAY) ||
      (live && (policy != ST__KEY_PINNED || page_n == 0)) || (!live && page_n)) {
    msgpack_unpacked_destroy(&u);
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "a field is missing or out of range");
  }
  for (uint32_t i = 0; i < readers.nuids; i++) readers.uids[i] = (uid_t)uids[i];
  for (uint32_t i = 0; i < readers.ngids; i++) readers.gids[i] = (gid_t)gids[i];
  st__key_origin_t org;
  memset(&org, 0, sizeof org);
  if (origin->type == MSGPACK_OBJECT_ARRAY) {
    const msgpack_object *e = origin->via.array.ptr;
    if (origin->via.array.size != 3 || e[0].type != MSGPACK_OBJECT_STR ||
        e[0].via.str.size >= sizeof org.peer || e[1].type != MSGPACK_OBJECT_STR ||
        e[1].via.str.size >= sizeof org.key || e[2].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
      rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "its origin is malformed");
    else {
      memcpy(org.peer, e[0].via.str.ptr, e[0].via.str.size);
      memcpy(org.key, e[1].via.str.ptr, e[1].via.str.size);
      org.version = e[2].via.u64;
    }
  }
  st__build_result_t res;
  st__build_result_init(&res);
  uint32_t na = rc == ST_OK ? arenas->via.array.size : 0;
  if (na && !(res.arenas = calloc(na, sizeof *res.arenas)))
    rc = st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  for (uint32_t i = 0; rc == ST_OK && i < na; i++) {
    const msgpack_object *e = &arenas->via.array.ptr[i];
    st__arena_t *a = e->type == MSGPACK_OBJECT_POSITIVE_INTEGER
                         ? import_arena(r, p, e->via.u64, err, errlen)
                         : NULL;
    if (!a) {
      if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "an arena number is no integer");
      rc = ST_ERR_INVALID_ARGUMENT;
      break;
    }
    for (size_t k = 0; k < res.narenas; k++)
      if (res.arenas[k] == a) rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                                            "it names arena %" PRIu64 " twice", e->via.u64);
    if (rc != ST_OK) break;
    st__arena_ref(a);
    res.arenas[res.narenas++] = a;
    res.bytes += st__arena_bytes(a);
  }
  st__arena_t *page = NULL;
  if (rc == ST_OK && live && (page = import_arena(r, p, page_n, err, errlen)) == NULL)
    rc = ST_ERR_INVALID_ARGUMENT;
  if (rc == ST_OK && page && !st__keys_page_valid(page))
    rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "its control page is no key page");
  if (rc == ST_OK) {
    msgpack_unpacked val;
    msgpack_unpacked_init(&val);
    size_t voff = 0;
    if (msgpack_unpack_next(&val, value->via.bin.ptr, value->via.bin.size, &voff) !=
            MSGPACK_UNPACK_SUCCESS || voff != value->via.bin.size)
      rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "its value is no msgpack value");
    else if ((rc = st__check_value(&val.data, 1, err, errlen)) == ST_OK)
      rc = check_tensors(&val.data, &res, 0, err, errlen);
    if (rc != ST_OK) rc = ST_ERR_INVALID_ARGUMENT;
    msgpack_unpacked_destroy(&val);
  }
  if (rc == ST_OK && msgpack_sbuffer_write(&res.value, value->via.bin.ptr, value->via.bin.size))
    rc = st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  if (rc == ST_OK) {
    const st__key_put_t kp = {.name = v->key, .len = strlen(v->key), .uid = (uid_t)uid,
                              .conn = 0, .policy = (st__key_policy_t)policy,
                              .readonly = readonly, .live = live, .readers = &readers,
                              .origin = origin->type == MSGPACK_OBJECT_ARRAY ? &org : NULL,
                              .version = v->version, .created_at = created->via.f64,
                              .page = page};
    uint64_t got;
    rc = st__keys_put(&r->srv->keys, &kp, &res, &got, err, errlen);
    if (rc == ST_OK && live) {
      st__key_t *k = st__smap_get(&r->srv->keys.by_name, v->key, strlen(v->key));
      st__keys_live_orphaned(k);
      r->torn += st__keys_torn(k);
    }
  }
  st__build_result_destroy(&res);
  msgpack_unpacked_destroy(&u);
  return rc;
}

/* Makes buffer record b again: every field checked, its arenas
 * imported, then st__buffer_restore's checks of them. */
static int restore_buffer(struct st__restart *r, replay_t *p, const old_buffer_t *b, char *err,
                          size_t errlen) {
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  msgpack_unpack_next(&u, b->payload, b->len, &off);   /* verified by the replay */
  const msgpack_object *m = &u.data, *shape = st__map_get(m, "shape");
  st__buffer_spec_t spec;
  memset(&spec, 0, sizeof spec);
  st__grant_t readers;
  memset(&readers, 0, sizeof readers);
  uint32_t uids[ST__GRANT_MAX], gids[ST__GRANT_MAX];
  uint64_t uid = 0, data_n = 0, page_n = 0;
  int cuda = 0, rc = ST_OK;
  char dtype[32];
  if (!field_uint(m, "uid", UINT32_MAX - 1, &uid) || !field_bool(m, "cuda", &cuda) ||
      !field_str(m, "dtype", dtype, sizeof dtype) ||
      (spec.dtype = st_dtype_from_name(dtype)) == ST_DTYPE_INVALID ||
      !field_uint(m, "slots", ST__BUFFER_MAX_SLOTS, &spec.slots) ||
      !field_uint(m, "data", MAX_ARENA_NUMBER, &data_n) ||
      !field_uint(m, "page", MAX_ARENA_NUMBER, &page_n) ||
      !field_ids(m, "uids", &readers.nuids, uids) || !field_ids(m, "gids", &readers.ngids, gids) ||
      !shape || shape->type != MSGPACK_OBJECT_ARRAY || shape->via.array.size > ST_MAX_NDIM)
    rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "a field is missing or out of range");
  for (uint32_t i = 0; rc == ST_OK && i < shape->via.array.size; i++) {
    const msgpack_object *e = &shape->via.array.ptr[i];
    if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.u64 > INT64_MAX)
      rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "its shape is malformed");
    else spec.shape[spec.ndim++] = (int64_t)e->via.u64;
  }
  for (uint32_t i = 0; rc == ST_OK && i < readers.nuids; i++) readers.uids[i] = (uid_t)uids[i];
  for (uint32_t i = 0; rc == ST_OK && i < readers.ngids; i++) readers.gids[i] = (gid_t)gids[i];
  st__arena_t *data = rc == ST_OK ? import_arena(r, p, data_n, err, errlen) : NULL;
  st__arena_t *page = data ? import_arena(r, p, page_n, err, errlen) : NULL;
  if (rc == ST_OK && (!data || !page)) rc = ST_ERR_INVALID_ARGUMENT;
  if (rc == ST_OK && data == page)
    rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "its data and page are one arena");
  if (rc == ST_OK && (st__arena_device(data) >= 0) != cuda)
    rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "its data arena is on another backend");
  if (rc == ST_OK) {
    spec.device = st__arena_device(data);
    spec.name = b->name;
    spec.name_len = strlen(b->name);
    spec.readers = &readers;
    st__buffer_limits_t l = st__rpc_buffer_limits(r->srv->cfg);
    st__buffer_t *made;
    rc = st__buffer_restore(ST__HOLDING_STATE(r->srv, buffers), &spec, &l, (uid_t)uid, data,
                            page, &made, err, errlen);
  }
  msgpack_unpacked_destroy(&u);
  return rc;
}

/* The arena -> number map of what the replay imported. */
static void index_imported(const char *key, size_t len, void *value, void *ud) {
  (void)key;
  (void)len;
  old_arena_t *a = value;
  if (a->arena) st__smap_put(ud, &a->arena, sizeof a->arena, (void *)(uintptr_t)a->n);
}

/* Counts arena a (of a restored key) into the kept arenas. */
static void count_kept(struct st__restart *r, st__smap_t *imported, const st__arena_t *a) {
  uintptr_t n = (uintptr_t)st__smap_get(imported, &a, sizeof a);
  if (!n) return;
  st__stored_arena_t *e = st__store_arenas_by_number(&r->arenas, n);
  if (!e && !(e = st__store_arenas_add(&r->arenas, a, n))) return;
  st__store_arenas_hold(&r->arenas, e, a);
}

/* Lets go of the replay's arena references; an arena no restored key
 * holds leaves the store. */
static void release_imported(const char *key, size_t len, void *value, void *ud) {
  (void)key;
  (void)len;
  struct st__restart *r = ud;
  old_arena_t *a = value;
  if (a->arena && !number_of(r, a->arena)) {
    char name[64];
    fdname_arena(name, sizeof name, a->n);
    st__fdstore_remove(&r->store, name);
  }
  st__arena_unref(a->arena);
  free(a);
}

/* The journal among the received ones to restore from (the highest
 * generation and epoch that verifies), claimed; -1 when none. The others
 * are closed and removed from the store. */
static int pick_journal(struct st__restart *r, st__journal_scan_t *best) {
  int fds[2], chosen = -1;
  st__journal_scan_t scans[2];
  for (int i = 0; i < 2; i++) {
    char name[32], err[300];
    snprintf(name, sizeof name, "st-journal-%d", i);
    fds[i] = st__fdstore_claim(&r->store, name);
    if (fds[i] < 0) continue;
    if (st__journal_header(fds[i], &scans[i], err, sizeof err) != ST_OK) {
      ST_LOG_E("restart", "journal '%s' refused: %s", name, err);
      close(fds[i]);
      fds[i] = -1;
      st__fdstore_remove(&r->store, name);
      continue;
    }
    if (chosen < 0 || scans[i].generation > scans[chosen].generation ||
        (scans[i].generation == scans[chosen].generation && scans[i].epoch > scans[chosen].epoch))
      chosen = i;
  }
  for (int i = 0; i < 2; i++)
    if (fds[i] >= 0 && i != chosen) {
      char name[32];
      snprintf(name, sizeof name, "st-journal-%d", i);
      close(fds[i]);
      st__fdstore_remove(&r->store, name);
    }
  if (chosen < 0) return -1;
  *best = scans[chosen];
  r->slot = chosen;
  r->slot_stored = 1;
  return fds[chosen];
}

/* Restores the key table from the received journal and arenas. */
static void restore(struct st__restart *r) {
  st__journal_scan_t scan;
  int fd = pick_journal(r, &scan);
  if (fd < 0) return;
  replay_t p;
  memset(&p, 0, sizeof p);
  st__smap_init(&p.arenas);
  st__smap_init(&p.latest);
  st__smap_init(&p.buffer_names);
  char err[512];
  int rc = st__journal_read(fd, replay_record, &p, &scan, err, sizeof err);
  close(fd);
  r->from_generation = scan.generation;
  if (rc != ST_OK) {
    ST_LOG_E("restart", "journal generation %" PRIu64 " refused: %s; nothing restored",
             scan.generation, err);
  } else {
    if (scan.torn_tail)
      ST_LOG_W("restart", "the journal's last record was cut by the crash (a change never "
               "acknowledged): ignored");
    for (size_t i = 0; i < p.nversions; i++) {
      const old_version_t *v = &p.versions[i];
      if (v->dropped) continue;
      if (restore_version(r, &p, v, err, sizeof err) != ST_OK) {
        ST_LOG_E("restart", "key '%s' version %" PRIu64 " not restored: %s", v->key, v->version,
                 err);
        r->refused++;
        continue;
      }
      r->versions++;
    }
    for (size_t i = 0; i < p.nbuffers; i++) {
      const old_buffer_t *b = &p.buffers[i];
      if (!b->payload) continue;
      if (restore_buffer(r, &p, b, err, sizeof err) != ST_OK) {
        ST_LOG_E("restart", "buffer '%s' not restored: %s", b->name, err);
        r->refused++;
        continue;
      }
      r->buffers++;
    }
  }
  /* What the table holds now (a budget may have evicted some) decides
   * which arenas stay in the store. */
  st__smap_t imported;
  st__smap_init(&imported);
  st__smap_each(&p.arenas, index_imported, &imported);
  size_t nkeys = 0;
  st__key_t **keys = st__keys_list(&r->srv->keys, NULL, 0, &nkeys);
  for (size_t i = 0; i < nkeys; i++) {
    const st__key_t *k = keys[i];
    for (size_t j = 0; j < k->nversions; j++) {
      for (size_t a = 0; a < k->versions[j]->result.narenas; a++)
        count_kept(r, &imported, k->versions[j]->result.arenas[a]);
      if (k->page_arena) count_kept(r, &imported, k->page_arena);
    }
    r->bytes += k->bytes;
  }
  r->keys = nkeys;
  free(keys);
  st__buffers_t *bt = ST__HOLDING_STATE(r->srv, buffers);
  for (st__named_t *e = bt ? bt->named.head : NULL; e; e = e->next) {
    count_kept(r, &imported, e->data);
    count_kept(r, &imported, e->page_arena);
  }
  st__smap_clear(&imported);
  st__smap_each(&p.arenas, release_imported, r);
  st__smap_clear(&p.arenas);
  for (size_t i = 0; i < p.nversions; i++) free(p.versions[i].payload);
  free(p.versions);
  st__smap_clear(&p.latest);
  for (size_t i = 0; i < p.nbuffers; i++) free(p.buffers[i].payload);
  free(p.buffers);
  st__smap_clear(&p.buffer_names);
  ST_LOG_I("restart", "restored from generation %" PRIu64 ": %" PRIu64 " keys, %" PRIu64
           " versions, %" PRIu64 " bytes (no copy), %" PRIu64 " buffers; %" PRIu64
           " refused, %" PRIu64 " live keys torn", r->from_generation, r->keys, r->versions,
           r->bytes, r->buffers, r->refused, r->torn);
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
  fdname_arena(name, sizeof name, st__stored_arena_number(e));
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
  fdname_arena(name, sizeof name, st__stored_arena_number(e));
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
  restore(r);
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
