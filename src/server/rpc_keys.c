/* src/server: the published-key methods (rpc.h; docs/protocol.md,
 * "Published keys"; the table is engine/keys.h, the design docs/keys.md).
 * Loop thread only: a put imports its tensor arguments here (an mmap of a
 * memfd; for CUDA an fstat of the descriptor and no driver call: the
 * server imports and maps a CUDA allocation the first time it reads it,
 * mem/arena.h), or on a worker for a value of many tensors, as it checks
 * a live key's take-over there (put_job.h). The versions a put pushes out
 * are released off this thread when that costs (mem/arena_release.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "engine/keys.h"
#include "engine/targs.h"
#include "server/holdings.h"
#include "server/put_job.h"
#include "server/replica.h"
#include "server/rpc.h"
#include "server/views.h"
#include "server/work.h"
#include "st/errors.h"

/* The request's `key` (a checked, required string). */
static void key_arg(const st__rpc_req_t *r, const char **name, size_t *len) {
  const msgpack_object *k = st__rpc_arg(r, "key");
  *name = k->via.str.ptr;
  *len = k->via.str.size;
}

/* The reply of a put: {key, version, bytes[, live][, taken]}. */
static void reply_put(st__rpc_req_t *r, const st__key_t *k, int taken) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, r->id);
  msgpack_pack_map(&pk, 3 + (uint32_t)k->live + (uint32_t)taken);
  st__pack_kv_str(&pk, "key", k->name);
  const st__key_version_t *v = k->versions[k->nversions - 1];
  st__pack_kv_uint(&pk, "version", st__keys_version_of(k, v));
  st__pack_kv_uint(&pk, "bytes", v->bytes);
  if (k->live) st__pack_kv_bool(&pk, "live", 1);
  if (taken) st__pack_kv_bool(&pk, "taken", 1);
  st__reply_send(r->c, r->id, &sb);
}

/* A live put into an existing live key: this connection becomes its
 * publisher; the value is not adopted (the memory stays: the client
 * copies the value in with an update, docs/views.md section 3). w: the
 * check a worker made (put_job.h), NULL: checked here. */
static void take_over(st__rpc_req_t *r, const st__key_put_t *p, const st__put_work_t *w) {
  char err[1024];
  st__key_t *k = NULL;
  int rc = w ? w->rc : ST_OK;
  if (rc != ST_OK)
    snprintf(err, sizeof err, "%s", w->err);
  else
    rc = st__keys_take(&r->c->srv->keys, p, w ? NULL : st__rpc_arg(r, "value"), &k, err,
                       sizeof err);
  if (rc != ST_OK) {
    st__rpc_error(r, rc, "put: %s", err);
    return;
  }
  reply_put(r, k, 1);
}

/* put {key, value, arenas?, policy?, readonly?, live?} -> {key, version,
 * bytes[, live][, taken]}. */
void st__rpc_put(st__rpc_req_t *r) { st__rpc_put_resume(r, NULL); }

/* See put_job.h. */
void st__rpc_put_resume(st__rpc_req_t *r, st__put_work_t *w) {
  st__conn_t *c = r->c;
  st__server_t *srv = c->srv;
  st__key_put_t p = {.uid = c->cred.uid, .conn = c->id};
  key_arg(r, &p.name, &p.len);
  p.policy = (st__key_policy_t)st__rpc_word(r, "policy", ST__KEY_PINNED);
  p.readonly = st__rpc_bool(r, "readonly", 0);
  p.live = st__rpc_bool(r, "live", 0);
  st__grant_t readers;
  int given = st__rpc_readers(r, &readers);
  if (given < 0) return;
  if (given) p.readers = &readers;
  char err[1024];
  int rc = st__keys_name_ok(p.name, p.len, err, sizeof err);
  const st__key_t *existing = rc == ST_OK ? st__smap_get(&srv->keys.by_name, p.name, p.len) : NULL;
  const st__key_t *live = p.live && existing && existing->live ? existing : NULL;
  if (existing && existing->live && st__replica_busy(srv, existing->name)) {
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "put: live key '%s' is a replica that its "
                  "subscription writes (stcli replicas %s); unsubscribe first", existing->name,
                  existing->name);
    return;
  }
  /* The per-tensor work: a worker's when it fits the put as the table is
   * now, else done again, on a worker for a large value (put_job.h). */
  if (!st__put_work_fits(w, live)) {
    int mine = !live || live->uid == p.uid;   /* else AUTH, at once */
    if (rc == ST_OK && mine && st__put_offload(r, p.name, p.len, live, w, st__rpc_put_resume))
      return;
    w = NULL;
  }
  if (live) {
    take_over(r, &p, w);
    return;
  }
  st__build_result_t res;
  st__build_result_init(&res);
  if (rc == ST_OK && w) {
    rc = w->rc;
    if (rc != ST_OK) snprintf(err, sizeof err, "%s", w->err);
    else res = w->res, st__build_result_init(&w->res);
  } else if (rc == ST_OK) {
    rc = st__put_adopt(c->targs, st__rpc_arg(r, "value"), &res, err, sizeof err);
  }
  uint64_t version = 0;
  if (rc == ST_OK) rc = st__keys_put(&srv->keys, &p, &res, &version, err, sizeof err);
  if (rc != ST_OK) {
    st__build_result_destroy(&res);
    st__rpc_error(r, rc, "put: %s", err);
    return;
  }
  st__key_t *k = st__smap_get(&srv->keys.by_name, p.name, p.len);
  st__views_forget_key(srv, k->name);
  if (k->live) st__rpc_owner_read_only(k->page_arena);   /* readers' page: see rpc_buffer.c */
  ST_LOG_D("keys", "conn %llu: put '%s' version %llu (%llu bytes)", (unsigned long long)c->id,
           k->name, (unsigned long long)version,
           (unsigned long long)k->versions[k->nversions - 1]->bytes);
  reply_put(r, k, 0);
}

typedef struct got {
  const st__key_t *key;
  const st__key_version_t *v;
  int readonly;
  int publisher;              /* a live key: this connection publishes it */
} got_t;

/* The reply to a get whose `have` is the version it resolves to: {key,
 * version, same: true}, nothing else (docs/protocol.md, "Published
 * keys"): the client still has that version mapped. It grants nothing:
 * no value, no descriptor. */
static void reply_same(st__rpc_req_t *r, const got_t *g) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, r->id);
  msgpack_pack_map(&pk, 3);
  st__pack_kv_str(&pk, "key", g->key->name);
  st__pack_kv_uint(&pk, "version", st__keys_version_of(g->key, g->v));
  st__pack_kv_bool(&pk, "same", 1);
  st__reply_send(r->c, r->id, &sb);
}

typedef struct key_pairs {
  const st__key_reply_t *k;
  uint32_t page;              /* a live key: its page's index in `arenas` */
} key_pairs_t;

static void pack_key_pairs(msgpack_packer *pk, const void *ud) {
  const key_pairs_t *p = ud;
  st__pack_kv_str(pk, "key", p->k->key);
  st__pack_kv_uint(pk, "version", p->k->version);
  if (p->k->readonly) st__pack_kv_bool(pk, "readonly", 1);
  if (!p->k->page) return;
  st__pack_cstr(pk, "live");
  msgpack_pack_map(pk, 2);
  st__pack_kv_uint(pk, "page", p->page);
  st__pack_kv_bool(pk, "publisher", p->k->publisher);
}

/* See rpc.h. Loop thread. */
void st__rpc_reply_key(st__conn_t *c, uint32_t id, const char *what, const st__build_result_t *r,
                       const st__key_reply_t *k) {
  key_pairs_t pairs = {.k = k};
  st__reply_more_t more = {.npairs = 2 + (uint32_t)(k->readonly != 0) + (k->page != NULL),
                           .pack = pack_key_pairs, .ud = &pairs, .keep_arenas = 1,
                           .readonly = k->readonly};
  if (!k->page) {
    st__reply_more(c, id, what, r, &more);
    return;
  }
  /* A live key: its control page goes as one more arena, last. */
  st__build_result_t tmp = *r;
  size_t n = tmp.narenas;
  tmp.arenas = malloc((n + 1) * sizeof *tmp.arenas);
  if (!tmp.arenas) {
    st__conn_send_error(c, id, ST_ERR_OUT_OF_MEMORY, "out of memory building a reply");
    return;
  }
  if (n) memcpy(tmp.arenas, r->arenas, n * sizeof *tmp.arenas);
  tmp.arenas[n] = k->page;
  tmp.narenas = n + 1;
  pairs.page = (uint32_t)n;
  st__reply_more(c, id, what, &tmp, &more);
  free(tmp.arenas);
}

/* What a reply of g says besides value and arenas. */
static st__key_reply_t key_reply_of(const got_t *g) {
  return (st__key_reply_t){.key = g->key->name,
                           .version = st__keys_version_of(g->key, g->v),
                           .readonly = g->readonly,
                           .page = g->key->live ? g->key->page_arena : NULL,
                           .publisher = g->publisher};
}

/* get {key, view} of version v: through the view (server/views.h). */
static void get_view(st__rpc_req_t *r, const st__viewspec_t *spec, const got_t *g) {
  st__view_to_t to;
  memset(&to, 0, sizeof to);
  to.kind = ST__VIEW_TO_KEY;
  to.conn_id = r->c->id;
  to.request_id = r->id;
  to.readonly = g->readonly;
  snprintf(to.what, sizeof to.what, "get '%s'", g->key->name);
  snprintf(to.key, sizeof to.key, "%s", g->key->name);
  to.version = st__keys_version_of(g->key, g->v);
  /* A live key's views are windows, answered at once: the page borrowed. */
  to.live_page = g->key->live ? g->key->page_arena : NULL;
  to.publisher = g->publisher;
  char owner[ST__KEY_NAME_MAX + 8], version[24];
  snprintf(owner, sizeof owner, "key:%s", g->key->name);
  snprintf(version, sizeof version, "v%llu", (unsigned long long)to.version);
  st__view_source_t src = {.result = &g->v->result, .owner = owner, .version = version};
  if (st__views_reply(r->c->srv, r->c, spec, &src, &to)) r->c->inflight++;
}

/* get of key `name` (readonly: asked) seen through `view` (NULL: none;
 * borrowed: st__rpc_get frees it, whatever happens here). */
static void get_key(st__rpc_req_t *r, const char *name, size_t len, int readonly,
                    const st__viewspec_t *view) {
  st__conn_t *c = r->c;
  char err[600];
  st__key_t *k;
  st__key_version_t *v;
  st__who_t who;
  st__rpc_who(r, &who);
  int rc = st__keys_get(&c->srv->keys, name, len, &who, st__rpc_u64(r, "version", 0), &k, &v, err,
                        sizeof err);
  if (rc != ST_OK) {
    st__rpc_error(r, rc, "get: %s", err);
    return;
  }
  int mine = k->owner_conn == c->id;
  if (k->live && st__keys_torn(k) && !mine) {
    st__rpc_error(r, ST_ERR_STALE_HANDLE,
                  "get: live key '%s' is torn: its publisher left in the middle of an update "
                  "(readable again after the next complete update: a put by its uid)",
                  k->name);
    return;
  }
  got_t g;
  memset(&g, 0, sizeof g);
  g.key = k;
  g.v = v;
  /* Only a live key's publisher writes it (docs/views.md, section 3); a
   * reader of another uid (granted, or an admin) maps it read-only. */
  g.readonly = readonly || ((k->readonly || k->live) && !mine) || k->uid != c->cred.uid;
  g.publisher = k->live && mine && !g.readonly;
  /* A copy of a live key would not follow its updates, and could mix two
   * of them: a live key's views are windows only. */
  if (view && k->live && view->contiguous) {
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT,
                  "get: live key '%s': a view of a live key cannot end with `contiguous` "
                  "(its copy would not follow updates); ask for the window and copy it "
                  "inside a consistent read", k->name);
    return;
  }
  uint64_t have = st__rpc_u64(r, "have", 0);
  if (have && have == st__keys_version_of(k, v)) {
    reply_same(r, &g);
    return;
  }
  if (view) {
    get_view(r, view, &g);
    return;
  }
  char what[ST__KEY_NAME_MAX + 16];
  snprintf(what, sizeof what, "get '%s'", k->name);
  st__key_reply_t kr = key_reply_of(&g);
  st__rpc_reply_key(c, r->id, what, &v->result, &kr);
}

/* get {key, version?, readonly?, view?, have?} -> {value, arenas, key,
 * version[, readonly]}, or {key, version, same} when `have` is the version
 * it resolves to: the value with its tensors, mapped like a call's result;
 * read-only when asked, or when the key was put read-only and this is not
 * the publisher's connection; seen through `view` when given. A live
 * key's version is its page's (st__keys_version_of), everywhere. */
void st__rpc_get(st__rpc_req_t *r) {
  const char *name;
  size_t len;
  key_arg(r, &name, &len);
  int readonly = st__rpc_bool(r, "readonly", 0);
  st__viewspec_t *view = NULL;
  if (st__views_param(r, &view) != ST_OK) return;
  get_key(r, name, len, readonly, view);
  st__viewspec_free(view);
}

static void pack_key(msgpack_packer *pk, const st__key_t *k) {
  const st__key_version_t *last = k->versions[k->nversions - 1];
  msgpack_pack_map(pk, 10 + (uint32_t)last->has_origin);
  st__pack_kv_str(pk, "key", k->name);
  st__pack_kv_uint(pk, "version", st__keys_version_of(k, k->versions[k->nversions - 1]));
  st__pack_cstr(pk, "versions");
  msgpack_pack_array(pk, k->nversions);
  for (size_t i = 0; i < k->nversions; i++)
    msgpack_pack_uint64(pk, st__keys_version_of(k, k->versions[i]));
  st__pack_kv_uint(pk, "bytes", k->bytes);
  st__pack_kv_str(pk, "policy", k->policy == ST__KEY_EVICTABLE ? "evictable" : "pinned");
  char dev[24];
  int d = k->versions[k->nversions - 1]->device;
  if (d < 0) snprintf(dev, sizeof dev, "cpu");
  else snprintf(dev, sizeof dev, "cuda:%d", d);
  st__pack_kv_str(pk, "device", dev);
  st__pack_kv_bool(pk, "readonly", k->readonly);
  st__pack_kv_uint(pk, "uid", (uint64_t)k->uid);
  double at = k->versions[k->nversions - 1]->created_at;
  if (k->live) at = (double)atomic_load(&k->page->update_time) / 1e9;
  st__pack_kv_double(pk, "updated_at", at);
  const char *state = !k->live              ? "put"
                      : st__keys_torn(k)    ? "torn"
                      : st__key_page_updating(k->page) ? "updating"
                                            : "live";
  st__pack_kv_str(pk, "state", state);
  if (last->has_origin) {
    st__pack_cstr(pk, "origin");
    msgpack_pack_map(pk, 3);
    st__pack_kv_str(pk, "peer", last->origin.peer);
    st__pack_kv_str(pk, "key", last->origin.key);
    st__pack_kv_uint(pk, "version", last->origin.version);
  }
}

/* Whether `keys` lists k for who: its own keys and those granted to it
 * (the ones it may get); all: every uid's (admins only). */
static int key_listed(const st__key_t *k, const st__who_t *who, int all) {
  if (k->uid == who->uid || (all && who->admin)) return 1;
  return !who->admin && st__keys_visible(k, who);
}

/* keys {prefix?, all?} -> [{key, version, versions, bytes, policy, device,
 * readonly, uid, updated_at, state}] by name: the keys of the caller's uid
 * and those granted to it (all: of every uid, for root and the server's
 * uid; AUTH for another). */
void st__rpc_keys(st__rpc_req_t *r) {
  st__who_t who;
  int all = st__rpc_listing_all(r, "keys", "keys", &who);
  if (all < 0) return;
  const msgpack_object *pre = st__rpc_arg(r, "prefix");
  size_t n;
  st__key_t **list = st__keys_list(&r->c->srv->keys, pre ? pre->via.str.ptr : NULL,
                                   pre ? pre->via.str.size : 0, &n);
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, r->id);
  size_t mine = 0;
  for (size_t i = 0; i < n; i++) list[mine] = list[i], mine += key_listed(list[i], &who, all);
  msgpack_pack_array(&pk, mine);
  for (size_t i = 0; i < mine; i++) pack_key(&pk, list[i]);
  free(list);
  st__reply_send(r->c, r->id, &sb);
}

/* delete {key, force?} -> true: every version goes (readers' mappings
 * stay). force: root and the server's uid delete another uid's key. */
void st__rpc_delete(st__rpc_req_t *r) {
  const char *name;
  size_t len;
  key_arg(r, &name, &len);
  char err[400];
  st__who_t who;
  st__rpc_who(r, &who);
  int rc = st__keys_delete(&r->c->srv->keys, name, len, &who, st__rpc_bool(r, "force", 0), err,
                           sizeof err);
  if (rc != ST_OK) {
    st__rpc_error(r, rc, "delete: %s", err);
    return;
  }
  char copy[ST__KEY_NAME_MAX + 1];
  snprintf(copy, sizeof copy, "%.*s", (int)len, name);
  st__views_forget_key(r->c->srv, copy);
  st__reply_true(r->c, r->id);
}

/* ------------------------------------------------------------- holdings */

static void keys_release(st__server_t *srv, st__conn_t *c) { st__keys_conn_closed(&srv->keys, c->id); }

static void keys_count(st__server_t *srv, const st__conn_t *c, st__holding_count_t *n) {
  n->items = st__keys_conn_live(&srv->keys, c->id);
}

static int keys_none(st__server_t *srv) { return !srv->keys.live; }

const st__holding_kind_t st__holding_keys = {
    .name = "keys", .release = keys_release, .count = keys_count, .none = keys_none};
