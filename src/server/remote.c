/* src/server: the peers' start and the side of a pull that holds the key
 * (remote.h). Loop 0, the write side of the server lock. */
#include "server/remote.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "engine/keys.h"
#include "peer/peer.h"
#include "server/handoff_link.h"
#include "server/live_source.h"
#include "server/live_stage.h"
#include "server/peering.h"
#include "server/replica.h"
#include "server/rpc_pull.h"
#include "server/rpc_replicate.h"
#include "st/errors.h"
#include "xfer/supervisor.h"

/* How long the start waits for the helper's probe of the engines. */
#define PROBE_WAIT_S 5.0





/* ------------------------------------------------------------- lends
 *
 * A lend is one version's arenas held for one peer's pull: references
 * taken at peer_xfer_open (the key may lose the version meanwhile: the
 * bytes stay until the transfer ends), handed to the helper as
 * read-only descriptors. It ends when the helper says the transfer is
 * done (the receiver has every byte, or it failed), at peer_xfer_abort,
 * or when the server stops. */
typedef struct st__lend {
  struct st__lend *next;
  st__server_t *srv;
  char peer[ST__PEER_ID_MAX + 1];
  uint64_t remote_xfer;       /* the receiver's id of the pull */
  uint64_t xfer;              /* the helper's id here */
  st__build_result_t res;     /* the version's value and arena references */
  char key[ST__KEY_NAME_MAX + 1];
  uint64_t version;
  uint8_t *peer_blob;         /* the receiver's rendezvous blob, owned */
  size_t peer_blob_len;
  st__peer_ticket_t ticket;   /* peer_xfer_open, answered once opened */
  int answered;
  double t0;
  /* A live key's lend (live_source.c): its page (a reference), the fence
   * taken before the helper reads, the version it holds. */
  st__arena_t *page_arena;
  st__key_page_t *page;
  int raised;                 /* the fence is up ... */
  int fenced;                 /* ... and holds fence_version */
  uint64_t fence_version;
  double fence_until;         /* st__now_mono seconds */
  ev_timer fence_retry;       /* while an update runs */
  int retrying;
  /* peer.live_reads = "staged" (live_stage.h): the copy being made, and
   * whether the transfer reads a copy made whole under the fence. */
  st__job_t *stage;
  int staged;
  char engine[16];
} st__lend_t;

static void lend_free(st__lend_t *l) {
  st__live_stage_cancel(l->stage);
  if (l->retrying) ev_timer_stop(l->srv->loop, &l->fence_retry);
  if (l->raised) st__key_page_fence_drop(l->page);
  if (l->page_arena) st__arena_unref(l->page_arena);
  st__build_result_destroy(&l->res);
  free(l->peer_blob);
  free(l);
}

static void lend_unlink(st__remote_t *rm, st__lend_t *l) {
  for (st__lend_t **pp = &rm->lends; *pp; pp = &(*pp)->next)
    if (*pp == l) {
      *pp = l->next;
      return;
    }
}

static st__lend_t *lend_by_remote(st__remote_t *rm, const char *peer, uint64_t remote_xfer) {
  for (st__lend_t *l = rm->lends; l; l = l->next)
    if (l->remote_xfer == remote_xfer && !strcmp(l->peer, peer)) return l;
  return NULL;
}

static unsigned lends_of(const st__remote_t *rm, const char *peer) {
  unsigned n = 0;
  for (const st__lend_t *l = rm->lends; l; l = l->next) n += !strcmp(l->peer, peer);
  return n;
}

/* ------------------------------------------------------------- peer_describe */

/* peer_describe {key, version?, live?} -> {key, version, value, arenas:
 * [{bytes, device: "cpu"|"cuda"}], live}: the value names the arenas by
 * index, as a reply's does; a live key is described only when `live`
 * asks (its current version), and a key that is not live is then
 * refused. */
static void on_describe(st__peer_t *p, const st__peer_req_t *req, void *ud) {
  st__server_t *srv = ud;
  char name[ST__KEY_NAME_MAX + 1], err[600];
  uint64_t version = 0;
  if (!st__remote_param_str(req->params, "key", name, sizeof name)) {
    st__peer_reply_error(p, req->ticket, ST_ERR_INVALID_ARGUMENT,
                         "peer_describe: key must be a key name");
    return;
  }
  st__remote_param_u64(req->params, "version", &version);
  const msgpack_object *lv = req->params ? st__map_get(req->params, "live") : NULL;
  int live = lv && lv->type == MSGPACK_OBJECT_BOOLEAN && lv->via.boolean;
  st__key_t *k;
  st__key_version_t *v;
  int rc = st__remote_find_exported(srv, name, version, live, &k, &v, err, sizeof err);
  if (rc == ST_OK && live && !k->live) {
    snprintf(err, sizeof err, "key '%s' is not live: pull it without live", name);
    rc = ST_ERR_INVALID_ARGUMENT;
  }
  if (rc != ST_OK) {
    st__peer_reply_error(p, req->ticket, rc, err);
    return;
  }
  msgpack_unpacked value;
  msgpack_unpacked_init(&value);
  if (msgpack_unpack_next(&value, v->result.value.data, v->result.value.size, NULL) !=
      MSGPACK_UNPACK_SUCCESS) {
    msgpack_unpacked_destroy(&value);
    st__peer_reply_error(p, req->ticket, ST_ERR_INTERNAL, "the key's value does not decode");
    return;
  }
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__remote_pack_begin(&sb, &pk, 0);
  msgpack_pack_map(&pk, 5);
  st__pack_kv_str(&pk, "key", k->name);
  st__pack_kv_uint(&pk, "version", k->live ? atomic_load(&k->page->version) : v->version);
  st__pack_kv_bool(&pk, "live", k->live);
  st__pack_cstr(&pk, "value");
  msgpack_pack_object(&pk, value.data);
  st__pack_cstr(&pk, "arenas");
  msgpack_pack_array(&pk, v->result.narenas);
  for (size_t i = 0; i < v->result.narenas; i++) {
    msgpack_pack_map(&pk, 2);
    st__pack_kv_uint(&pk, "bytes", st__arena_bytes(v->result.arenas[i]));
    st__pack_kv_str(&pk, "device", st__arena_device(v->result.arenas[i]) < 0 ? "cpu" : "cuda");
  }
  msgpack_unpacked_destroy(&value);
  st__peer_reply(p, req->ticket, sb.data, sb.size);
  msgpack_sbuffer_destroy(&sb);
}

/* ------------------------------------------------------------- peer_xfer_open */

static void lend_opened(void *ud, uint64_t xfer, const uint8_t *blob, size_t len);
static void lend_done(void *ud, uint64_t xfer, int ok, uint64_t bytes, int code,
                      const char *error);
static const st__xfer_sup_cbs_t lend_cbs = {lend_opened, NULL, lend_done};

/* Opens the helper's send of lend l (its fence taken first for a live
 * key); ST_OK, or the error with the reason (l is then not opened). */
static int lend_open(st__lend_t *l, char *err, size_t errlen) {
  st__server_t *srv = l->srv;
  double timeout = st__remote_transfer_timeout(srv);
  return st__xfer_sup_open(srv->remote->sup, l->engine, ST_XFER_SEND, 2, 0,
                           (uint32_t)(timeout * 1e3), &lend_cbs, l, &l->xfer, err, errlen);
}

static void lend_staged(void *ctx, int rc, const char *why, st__build_result_t *copy);

/* Ends a lend that never opened: the asking peer gets `rc`. */
static void lend_refuse(st__lend_t *l, int rc, const char *why) {
  st__server_t *srv = l->srv;
  st__peer_reply_error(srv->peer, l->ticket, rc, why);
  lend_unlink(srv->remote, l);
  lend_free(l);
}

/* Raises a live lend's fence, then waits (half a millisecond at a time,
 * until the transfer's deadline) for an update that began before it to
 * end; then the fence holds one version, and the send opens. */
static void lend_fence(st__lend_t *l) {
  char err[400];
  /* A test's switch (docs/operations.md, ST_LIVE_NO_FENCE): the version
   * read as it is, unguarded, to show what the fence prevents. */
  static int no_fence = -1;
  if (no_fence < 0) no_fence = getenv("ST_LIVE_NO_FENCE") && getenv("ST_LIVE_NO_FENCE")[0] == '1';
  if (!l->raised && !no_fence) {
    st__key_page_fence_raise(l->page, (int64_t)(l->fence_until * 1e9));
    l->raised = 1;
  }
  if (!st__key_page_fence_settled(l->page, &l->fence_version)) {
    if (st__now_mono() >= l->fence_until) {
      snprintf(err, sizeof err, "live key '%s': an update ran for as long as the transfer "
               "may (peer.transfer_timeout_s): no version could be read whole", l->key);
      lend_refuse(l, ST_ERR_TIMEOUT, err);
      return;
    }
    if (!l->retrying) {
      ev_timer_start(l->srv->loop, &l->fence_retry);
      l->retrying = 1;
    }
    return;
  }
  if (l->retrying) {
    ev_timer_stop(l->srv->loop, &l->fence_retry);
    l->retrying = 0;
  }
  l->fenced = 1;
  l->version = l->fence_version;
  if (l->srv->cfg->peer.live_staged && l->raised) {
    int rc = st__live_stage(l->srv, &l->res, lend_staged, l, &l->stage, err, sizeof err);
    if (rc == ST_OK) return;   /* lend_staged goes on */
    ST_LOG_W("peer", "live key '%s': no staging copy (%s): the transfer reads the key under "
             "the fence", l->key, err);
  }
  int rc = lend_open(l, err, sizeof err);
  if (rc != ST_OK) lend_refuse(l, rc, err);
}

/* The staging copy of a fenced version ended: the fence drops, and the
 * transfer reads the copy. A copy that failed leaves the fence up and the
 * transfer reads the key (as without staging); an update that went past
 * the fence's deadline during the copy (it is then torn) refuses the lend
 * (the subscriber asks again for the next version). */
static void lend_staged(void *ctx, int rc, const char *why, st__build_result_t *copy) {
  st__lend_t *l = ctx;
  char err[600];
  l->stage = NULL;
  if (rc != ST_OK) {
    ST_LOG_W("peer", "live key '%s': the staging copy failed (%s): the transfer reads the key "
             "under the fence", l->key, why);
  } else {
    int whole = st__key_page_fence_check(l->page, l->fence_version);
    st__key_page_fence_drop(l->page);
    l->raised = 0;
    if (!whole) {
      st__build_result_destroy(copy);
      snprintf(err, sizeof err, "live key '%s': an update went past the fence's deadline during "
               "the staging copy of version %llu", l->key, (unsigned long long)l->fence_version);
      lend_refuse(l, ST_ERR_TIMEOUT, err);
      return;
    }
    /* The transfer reads the copy: the key's arenas are let go. */
    for (size_t i = 0; i < l->res.narenas; i++) st__arena_unref(l->res.arenas[i]);
    free(l->res.arenas);
    l->res.arenas = copy->arenas;
    l->res.narenas = copy->narenas;
    l->res.bytes = copy->bytes;
    copy->arenas = NULL;
    copy->narenas = 0;
    st__build_result_destroy(copy);
    l->staged = 1;
    l->srv->remote->lends_staged++;
  }
  rc = lend_open(l, err, sizeof err);
  if (rc != ST_OK) lend_refuse(l, rc, err);
}

static void on_fence_retry(struct ev_loop *loop, ev_timer *w, int revents) {
  (void)loop, (void)revents;
  lend_fence(w->data);
}

/* peer_xfer_open {key, version, xfer, engine, blob, live?} -> {blob}:
 * lends the version's arenas to the helper for one transfer to the
 * asking peer, and answers with this side's rendezvous blob once the
 * helper opened it. The receiver allocated and charged its arenas before
 * asking. With `live` the key is a live key (version 0: whichever is
 * complete): its page's fence is taken before the helper reads, and the
 * version read is told when the transfer ends (live_source.c). */
static void on_xfer_open(st__peer_t *p, const st__peer_req_t *req, void *ud) {
  st__server_t *srv = ud;
  st__remote_t *rm = srv->remote;
  const st__peer_conf_t *pc = &srv->cfg->peer;
  char name[ST__KEY_NAME_MAX + 1], engine[16], err[600];
  uint64_t version = 0, remote_xfer = 0;
  const msgpack_object *blob = req->params ? st__map_get(req->params, "blob") : NULL;
  const msgpack_object *lv = req->params ? st__map_get(req->params, "live") : NULL;
  int live = lv && lv->type == MSGPACK_OBJECT_BOOLEAN && lv->via.boolean;
  st__remote_param_u64(req->params, "version", &version);
  if (!st__remote_param_str(req->params, "key", name, sizeof name) ||
      !st__remote_param_str(req->params, "engine", engine, sizeof engine) ||
      (version == 0 && !live) ||
      !st__remote_param_u64(req->params, "xfer", &remote_xfer) || !blob ||
      blob->type != MSGPACK_OBJECT_BIN || blob->via.bin.size == 0 ||
      blob->via.bin.size > 65536) {
    st__peer_reply_error(p, req->ticket, ST_ERR_INVALID_ARGUMENT,
                         "peer_xfer_open needs key, version, xfer, engine and a blob");
    return;
  }
  if (!rm->sup) {
    st__peer_reply_error(p, req->ticket, ST_ERR_CAPABILITY,
                         "this server's transfer helper is not running (see its log)");
    return;
  }
  if (lend_by_remote(rm, req->peer, remote_xfer)) {
    st__peer_reply_error(p, req->ticket, ST_ERR_INVALID_ARGUMENT,
                         "peer_xfer_open: this transfer is open already");
    return;
  }
  if ((int)lends_of(rm, req->peer) >= pc->max_transfers_per_peer) {
    snprintf(err, sizeof err, "server '%s' sends %d transfers to '%s' already "
             "(peer.max_transfers_per_peer)", pc->id, pc->max_transfers_per_peer, req->peer);
    st__peer_reply_error(p, req->ticket, ST_ERR_BUSY, err);
    return;
  }
  st__key_t *k;
  st__key_version_t *v;
  int rc = st__remote_find_exported(srv, name, live ? 0 : version, live, &k, &v, err, sizeof err);
  if (rc == ST_OK && live && !k->live) {
    snprintf(err, sizeof err, "key '%s' is not live: pull it without live", name);
    rc = ST_ERR_INVALID_ARGUMENT;
  }
  if (rc != ST_OK) {
    st__peer_reply_error(p, req->ticket, rc, err);
    return;
  }
  int cuda = v->result.narenas && st__arena_device(v->result.arenas[0]) >= 0;
  if (!st__remote_engine_fits(engine, cuda)) {
    snprintf(err, sizeof err, "key '%s' is in %s memory: %s cannot move it (ucx%s can)", name,
             cuda ? "CUDA" : "CPU", engine, cuda ? " or nccl" : "");
    st__peer_reply_error(p, req->ticket, ST_ERR_INVALID_ARGUMENT, err);
    return;
  }
  st__lend_t *l = calloc(1, sizeof *l);
  uint8_t *copy = malloc(blob->via.bin.size);
  st__arena_t **refs = v->result.narenas ? calloc(v->result.narenas, sizeof *refs) : NULL;
  if (!l || !copy || (v->result.narenas && !refs)) {
    free(l), free(copy), free(refs);
    st__peer_reply_error(p, req->ticket, ST_ERR_OUT_OF_MEMORY, "out of memory");
    return;
  }
  l->srv = srv;
  snprintf(l->peer, sizeof l->peer, "%s", req->peer);
  snprintf(l->key, sizeof l->key, "%s", name);
  snprintf(l->engine, sizeof l->engine, "%s", engine);
  l->version = version;
  l->remote_xfer = remote_xfer;
  l->ticket = req->ticket;
  l->t0 = st__now_mono();
  memcpy(copy, blob->via.bin.ptr, blob->via.bin.size);
  l->peer_blob = copy;
  l->peer_blob_len = blob->via.bin.size;
  st__build_result_init(&l->res);
  for (size_t i = 0; i < v->result.narenas; i++) {
    st__arena_ref(v->result.arenas[i]);
    refs[i] = v->result.arenas[i];
  }
  l->res.arenas = refs;
  l->res.narenas = v->result.narenas;
  l->res.bytes = v->bytes;
  l->next = rm->lends;
  rm->lends = l;
  if (live) {
    double timeout = st__remote_transfer_timeout(srv);
    st__arena_ref(k->page_arena);
    l->page_arena = k->page_arena;
    l->page = k->page;
    l->fence_until = l->t0 + timeout;
    ev_timer_init(&l->fence_retry, on_fence_retry, 0.0005, 0.0005);
    l->fence_retry.data = l;
    lend_fence(l);
    return;
  }
  rc = lend_open(l, err, sizeof err);
  if (rc != ST_OK) {
    lend_refuse(l, rc, err);
    return;
  }
  ST_LOG_I("peer", "lending key '%s' version %llu (%llu bytes in %zu arenas) to '%s'", name,
           (unsigned long long)version, (unsigned long long)l->res.bytes, l->res.narenas,
           req->peer);
}

/* The helper opened the send: start it with the receiver's blob and the
 * arenas (read-only descriptors), then answer with this side's blob. */
static void lend_opened(void *ud, uint64_t xfer, const uint8_t *blob, size_t len) {
  st__lend_t *l = ud;
  st__server_t *srv = l->srv;
  char err[400] = "";
  int fds[ST_MAX_FDS_PER_MESSAGE];
  st__xfer_sup_arena_t arenas[ST_MAX_FDS_PER_MESSAGE];
  st__arena_desc_t descs[ST_MAX_FDS_PER_MESSAGE];
  int n = st__remote_arena_fds(&l->res, 1, fds, arenas, descs, err, sizeof err);
  int rc = n < 0 ? n
                 : st__xfer_sup_start(srv->remote->sup, xfer, l->peer_blob, l->peer_blob_len,
                                      arenas, (size_t)n, err, sizeof err);
  for (int i = 0; i < n; i++) close(fds[i]);
  l->answered = 1;
  if (rc != ST_OK) {
    st__peer_reply_error(srv->peer, l->ticket, rc, err[0] ? err : st_strerror(rc));
    st__xfer_sup_abort(srv->remote->sup, xfer, err[0] ? err : "the transfer could not start");
    return;
  }
  st__remote_reply_blob(srv->peer, l->ticket, blob, len);
}

static void lend_done(void *ud, uint64_t xfer, int ok, uint64_t bytes, int code,
                      const char *error) {
  st__lend_t *l = ud;
  st__server_t *srv = l->srv;
  st__remote_t *rm = srv->remote;
  (void)xfer;
  if (!l->answered)
    st__peer_reply_error(srv->peer, l->ticket, code ? code : ST_ERR_INTERNAL,
                         error && error[0] ? error : "the transfer ended before it started");
  if (l->fenced) {   /* the fence checked and dropped (a copy: whole); the receiver told */
    st__live_lend_sent(srv, l->peer, l->remote_xfer, l->staged ? NULL : l->page,
                       l->fence_version, l->raised, ok);
    l->fenced = l->raised = 0;
  }
  double s = st__now_mono() - l->t0;
  if (ok && l->page_arena) {   /* a live version: one of many, logged quietly */
    rm->lends_done++;
    rm->bytes_out += bytes;
    ST_LOG_D("peer", "sent live key '%s' version %llu to '%s': %llu bytes in %.3f s", l->key,
             (unsigned long long)l->version, l->peer, (unsigned long long)bytes, s);
  } else if (ok) {
    rm->lends_done++;
    rm->bytes_out += bytes;
    ST_LOG_I("peer", "sent key '%s' version %llu to '%s': %llu bytes in %.3f s (%.2f GB/s)",
             l->key, (unsigned long long)l->version, l->peer, (unsigned long long)bytes, s,
             s > 0 ? (double)bytes / s / 1e9 : 0.0);
  } else {
    rm->lends_failed++;
    ST_LOG_W("peer", "sending key '%s' version %llu to '%s' failed after %.3f s: %s", l->key,
             (unsigned long long)l->version, l->peer, s, error ? error : st_err_name(code));
  }
  lend_unlink(rm, l);
  lend_free(l);
}

/* peer_xfer_abort {xfer} -> true: the receiver gave up (a cancel, its
 * own failure); the send stops and its arenas are let go. */
static void on_xfer_abort(st__peer_t *p, const st__peer_req_t *req, void *ud) {
  st__server_t *srv = ud;
  uint64_t remote_xfer = 0;
  if (!st__remote_param_u64(req->params, "xfer", &remote_xfer)) {
    st__peer_reply_error(p, req->ticket, ST_ERR_INVALID_ARGUMENT, "peer_xfer_abort needs xfer");
    return;
  }
  st__lend_t *l = lend_by_remote(srv->remote, req->peer, remote_xfer);
  if (l) st__xfer_sup_abort(srv->remote->sup, l->xfer, "the receiver aborted the transfer");
  st__remote_reply_true(p, req->ticket);
}

/* ------------------------------------------------------------- info */

void st__remote_pack_info(msgpack_packer *pk, const st__server_t *srv) {
  const st__remote_t *rm = srv->remote;
  if (!rm) {
    msgpack_pack_nil(pk);
    return;
  }
  unsigned pulls = 0, lends = 0;
  uint64_t pulling;
  st__pulls_of(srv, NULL, &pulls, &pulling);
  for (const st__lend_t *l = rm->lends; l; l = l->next) lends++;
  msgpack_pack_map(pk, 16);
  st__pack_kv_int(pk, "helper_pid", rm->sup ? (int64_t)st__xfer_sup_pid(rm->sup) : 0);
  st__pack_kv_uint(pk, "helper_spawns", rm->sup ? st__xfer_sup_spawns(rm->sup) : 0);
  st__pack_cstr(pk, "engines");
  msgpack_pack_map(pk, rm->nengines);
  for (size_t i = 0; i < rm->nengines; i++) {
    char v[400];
    if (rm->engines[i].version[0]) snprintf(v, sizeof v, "%s", rm->engines[i].version);
    else snprintf(v, sizeof v, "unavailable: %s", rm->engines[i].why);
    st__pack_kv_str(pk, rm->engines[i].name, v);
  }
  st__pack_kv_uint(pk, "pulls", pulls);
  st__pack_kv_uint(pk, "pulls_done", rm->pulls_done);
  st__pack_kv_uint(pk, "pulls_failed", rm->pulls_failed);
  st__pack_kv_uint(pk, "lends", lends);
  st__pack_kv_uint(pk, "lends_done", rm->lends_done);
  st__pack_kv_uint(pk, "lends_failed", rm->lends_failed);
  st__pack_kv_uint(pk, "lends_staged", rm->lends_staged);
  st__pack_kv_uint(pk, "bytes_in", rm->bytes_in);
  st__pack_kv_uint(pk, "bytes_out", rm->bytes_out);
  st__pack_kv_uint(pk, "live_subscribers", st__live_source_count(srv));
  st__pack_kv_uint(pk, "live_replicas", st__replicas_count(srv));
  st__pack_kv_uint(pk, "handoff_followers", st__hsrc_count(srv));
  st__pack_kv_uint(pk, "handoff_mirrors", st__mirrors_count(srv));
}

/* ------------------------------------------------------------- start, stop */

/* The engines of the probe as peer_hello reports them (borrowed from rm):
 * NCCL with this server's GPUs, so that two servers on one GPU do not
 * pick it (one rank per device). */
static size_t engines_of(const st__remote_t *rm, st__peer_engine_t *out) {
  size_t n = 0;
  for (; n < rm->nengines; n++)
    out[n] = (st__peer_engine_t){
        .name = rm->engines[n].name,
        .version = rm->engines[n].version[0] ? rm->engines[n].version : NULL,
        .why = rm->engines[n].why,
        .devices = !strcmp(rm->engines[n].name, "nccl") && rm->gpus[0] ? rm->gpus : NULL};
  return n;
}

/* rm->gpus from the server's devices. */
static void list_gpus(st__remote_t *rm, const st__devices_t *d) {
  size_t at = 0;
  rm->gpus[0] = '\0';
  for (int i = 0; i < d->count; i++) {
    const st__device_t *dev = &d->list[i];
    if (dev->index < 0 || !dev->uuid[0]) continue;
    int w = snprintf(rm->gpus + at, sizeof rm->gpus - at, "%s%s", at ? " " : "", dev->uuid);
    if (w < 0 || (size_t)w >= sizeof rm->gpus - at) {
      rm->gpus[at] = '\0';   /* the devices that fit */
      break;
    }
    at += (size_t)w;
  }
}

static void on_probe(void *ud, const st__xfer_sup_probe_t *rows, size_t n) {
  st__server_t *srv = ud;
  st__remote_t *rm = srv->remote;
  rm->nengines = 0;
  for (size_t i = 0; i < n && rm->nengines < sizeof rm->engines / sizeof rm->engines[0]; i++) {
    st__remote_engine_t *e = &rm->engines[rm->nengines++];
    snprintf(e->name, sizeof e->name, "%s", rows[i].engine);
    snprintf(e->version, sizeof e->version, "%s",
             rows[i].probe.available ? rows[i].probe.version : "");
    snprintf(e->why, sizeof e->why, "%s", rows[i].probe.available ? "" : rows[i].probe.reason);
    if (rows[i].probe.available)
      ST_LOG_I("peer", "engine %s %s (%s)", e->name, e->version, rows[i].probe.library);
    else
      ST_LOG_I("peer", "engine %s unavailable: %s", e->name, e->why);
  }
  rm->probed = 1;
  /* A probe that answered after the start stopped waiting: links made
   * from now on report it. */
  if (srv->peer) {
    st__peer_engine_t engines[4];
    st__peer_set_engines(srv->peer, engines, engines_of(rm, engines));
  }
}

static void probe_timeout(struct ev_loop *loop, ev_timer *w, int revents) {
  (void)loop, (void)revents;
  ((st__remote_t *)w->data)->probed = 1;
}

/* A peer's link went down or was refused: its pulls fail now (their
 * requests fail too, but a transfer may wait for its engine's own
 * timeout). */
static void on_state(void *ud, const char *peer, st__peer_state_t state, const char *why) {
  st__server_t *srv = ud;
  if (state != ST__PEER_DOWN && state != ST__PEER_REFUSED) return;
  char m[400];
  snprintf(m, sizeof m, "the link to peer '%s' went down: %s", peer, why && why[0] ? why : "closed");
  st__pulls_fail(srv, peer, ST_ERR_IO, m);
  st__live_source_peer_down(srv, peer);
  st__replicas_lost(srv, peer, m);
  st__hsrc_peer_down(srv, peer, 0);
  st__mirrors_lost(srv, peer, m);
}

int st__remote_start(st__server_t *srv, char *err, size_t errlen) {
  const st__peer_conf_t *pc = &srv->cfg->peer;
  if (!st__peer_configured(pc)) return ST_OK;
  st__remote_t *rm = calloc(1, sizeof *rm);
  if (!rm) {
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  srv->remote = rm;
  list_gpus(rm, &srv->devices);
  st__xfer_sup_config_t sc = {.ucx_library = pc->ucx_library, .nccl_library = pc->nccl_library,
                              .max_transfers = 64, .log_level = -1};
  char why[400];
  if (st__xfer_sup_new(srv->loop, &sc, &rm->sup, why, sizeof why) != ST_OK) {
    ST_LOG_E("peer", "the transfer helper cannot start: %s; keys cannot move between hosts",
             why);
    rm->sup = NULL;
  } else if (st__xfer_sup_probe(rm->sup, on_probe, srv, why, sizeof why) == ST_OK) {
    /* Before any client is served: the loop runs only the helper's
     * watchers (and this timer) until the probe answers: the helper's
     * exec and dlopens. */
    ev_timer limit;
    ev_timer_init(&limit, probe_timeout, PROBE_WAIT_S, 0);
    limit.data = rm;
    ev_timer_start(srv->loop, &limit);
    while (!rm->probed) ev_run(srv->loop, EVRUN_ONCE);
    ev_timer_stop(srv->loop, &limit);
    if (!rm->nengines)
      ST_LOG_W("peer", "the transfer helper did not report its engines within %g s",
               PROBE_WAIT_S);
  }
  st__peer_engine_t engines[4];
  int rc = st__peer_start(srv->loop, pc, engines, engines_of(rm, engines), &srv->peer, err, errlen);
  if (rc != ST_OK) return rc;
  if (!srv->peer) return ST_OK;
  st__peer_on_state(srv->peer, on_state, srv);
  if (st__peer_method_add(srv->peer, "peer_describe", on_describe, srv) != ST_OK ||
      st__peer_method_add(srv->peer, "peer_xfer_open", on_xfer_open, srv) != ST_OK ||
      st__peer_method_add(srv->peer, "peer_xfer_abort", on_xfer_abort, srv) != ST_OK ||
      st__replicate_methods(srv) != ST_OK || st__live_source_methods(srv) != ST_OK ||
      st__replica_methods(srv) != ST_OK || st__hsrc_methods(srv) != ST_OK ||
      st__mirror_methods(srv) != ST_OK) {
    snprintf(err, errlen, "the peer methods could not be added");
    return ST_ERR_INTERNAL;
  }
  return ST_OK;
}

void st__remote_stop(st__server_t *srv) {
  st__remote_t *rm = srv->remote;
  if (rm) {
    st__pulls_fail(srv, NULL, ST_ERR_SHUTTING_DOWN, "the server is stopping");
    if (srv->peer) st__live_source_stop(srv);
    st__replicas_lost(srv, NULL, "the server is stopping");
    st__mirrors_lost(srv, NULL, "the server is stopping");
  }
  st__peer_stop(srv->peer);
  srv->peer = NULL;
  if (!rm) return;
  /* No callback after this: the lends go with their references. */
  st__xfer_sup_free(rm->sup);
  while (rm->lends) {
    st__lend_t *l = rm->lends;
    rm->lends = l->next;
    lend_free(l);
  }
  st__replicas_free(srv);
  st__hsrc_peer_down(srv, NULL, 1);
  st__mirrors_free(srv);
  free(rm);
  srv->remote = NULL;
}
