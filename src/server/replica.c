/* src/server: the side of a live replication that holds the replica
 * (remote.h, "Live replication"; docs/multihost.md, "Live replication").
 *
 * A live pull (rpc_pull.c) publishes its first whole version as a live
 * key of no publisher here, then calls st__replica_start: the replica
 * subscribes to the peer's key (peer_live_subscribe), and each version
 * the peer announces (peer_live_version) that is newer than the one here
 * is brought into the replica's own arenas, in place:
 *   1. the helper opens a receive; peer_xfer_open {live: true} to the
 *      peer, whose lend takes its page's fence before its helper reads;
 *   2. the replica's page begins an update (`seq` odd) just before the
 *      receive starts: from here readers wait or retry;
 *   3. when every byte is in and the peer said which version they are
 *      and that nothing overran the fence (peer_live_sent), the update
 *      ends as that version (st__key_page_end_as); else the page is
 *      marked TORN (readers get STALE_HANDLE) until a later version lands.
 * One transfer at a time per replica: versions announced meanwhile are
 * folded into the latest. A failed transfer is tried again after 100 ms
 * while the link is up. The link going down leaves the last version (or
 * TORN, when it went down mid-transfer) and says the source is lost.
 *
 * Loop 0, the write side of the server lock.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "engine/keys.h"
#include "server/replica.h"
#include "server/rpc_pull.h"
#include "server/rpc.h"
#include "server/work.h"
#include "st/errors.h"
#include "xfer/supervisor.h"

/* The wait before a failed transfer is tried again. */
#define RETRY_S 0.1

typedef struct st__replica {
  struct st__replica *next;
  st__server_t *srv;
  uint64_t sub;                     /* the live pull's id: its name to the peer */
  char peer[ST__PEER_ID_MAX + 1];
  char key[ST__KEY_NAME_MAX + 1];   /* the peer's */
  char as[ST__KEY_NAME_MAX + 1];    /* the replica's here */
  char engine[16];
  st__arena_t *page_arena;          /* references: the replica's page ... */
  st__key_page_t *page;
  st__build_result_t res;           /* ... and arenas */
  uint64_t bytes;
  uint64_t published;               /* the version readers see */
  uint64_t wanted;                  /* the latest the peer announced */
  uint64_t updates, torn;
  int subscribed;                   /* the peer took peer_live_subscribe */
  int lost;                         /* the source is gone: nothing more comes */
  char why[700];
  int closing;                      /* unsubscribed: freed once the transfer is over */
  ev_timer retry;
  int retrying;
  /* The transfer in flight (moving). */
  int moving;
  uint64_t xid;                     /* its id to the peer */
  uint64_t xfer;                    /* the helper's */
  int xfer_open;
  uint64_t req;                     /* a peer request in flight */
  int begun;                        /* the page's update begun ... */
  uint64_t useq;                    /* ... with this odd word */
  int got_all, verdict, whole;
  uint64_t verdict_version;
  double t0;
} st__replica_t;

static void replica_free(st__replica_t *r) {
  st__server_t *srv = r->srv;
  if (r->retrying) ev_timer_stop(srv->loop, &r->retry);
  if (r->req && srv->peer) st__peer_cancel(srv->peer, r->req);
  st__arena_unref(r->page_arena);
  st__build_result_destroy(&r->res);
  free(r);
}

static void unlink_replica(st__remote_t *rm, st__replica_t *r) {
  for (st__replica_t **pp = &rm->replicas; *pp; pp = &(*pp)->next)
    if (*pp == r) {
      *pp = r->next;
      return;
    }
}

static st__replica_t *by_as(const st__server_t *srv, const char *as) {
  for (st__replica_t *r = srv->remote ? srv->remote->replicas : NULL; r; r = r->next)
    if (!strcmp(r->as, as)) return r;
  return NULL;
}

static void move_next(st__replica_t *r);

/* The transfer is over (landed or failed): the next one, or the end of
 * a closing replica. */
static void transfer_over(st__replica_t *r) {
  r->moving = 0;
  r->begun = 0;
  if (r->closing) {
    unlink_replica(r->srv->remote, r);
    replica_free(r);
    return;
  }
  move_next(r);
}

/* A transfer failed (`why`): a begun update leaves the page TORN, and
 * the replica tries again later unless its source is lost. */
static void transfer_failed(st__replica_t *r, const char *why) {
  if (r->begun) {
    st__key_page_flag(r->page, ST__KEY_TORN);
    r->torn++;
  }
  ST_LOG_W("peer", "live replica '%s' of '%s' on '%s': a transfer failed%s: %s", r->as, r->key,
           r->peer, r->begun ? " mid-update (the replica is torn until the next version lands)" : "",
           why);
  int again = !r->lost && !r->closing;
  if (again && !r->retrying) {
    ev_timer_start(r->srv->loop, &r->retry);
    r->retrying = 1;
  }
  r->moving = 0;
  r->begun = 0;
  if (r->closing) transfer_over(r);
}

/* Every byte is in and the peer said what they are. */
static void landed(st__replica_t *r) {
  if (r->whole && r->verdict_version > r->published) {
    st__key_page_end_as(r->page, r->useq, r->verdict_version);
    r->published = r->verdict_version;
    r->updates++;
    ST_LOG_D("peer", "live replica '%s' is at version %llu (%.3f s)", r->as,
             (unsigned long long)r->published, st__now_mono() - r->t0);
  } else if (r->whole) {   /* nothing newer than what readers have: as it was */
    st__key_page_end_as(r->page, r->useq, r->published);
  } else {
    st__key_page_flag(r->page, ST__KEY_TORN);
    r->torn++;
    if (r->verdict_version > r->wanted) r->wanted = r->verdict_version;
    ST_LOG_W("peer", "live replica '%s': version %llu of '%s' was updated while it was read "
             "(past the fence's deadline): not published, the replica is torn until the next "
             "version lands", r->as, (unsigned long long)r->verdict_version, r->key);
  }
  transfer_over(r);
}

/* Just before the receive starts: readers wait or retry from here. */
static void begin_update(void *ud) {
  st__replica_t *r = ud;
  r->useq = st__key_page_begin(r->page);
  r->begun = 1;
}

/* The peer's answer to peer_xfer_open: the update begins, the receive
 * starts. */
static void answered(void *ud, const char *peer, int code, const char *message,
                     const msgpack_object *result) {
  st__replica_t *r = ud;
  st__server_t *srv = r->srv;
  (void)peer;
  r->req = 0;
  char err[400] = "";
  int rc;
  if (code == ST_OK && (r->closing || r->lost)) {
    rc = ST_ERR_CANCELLED;
    snprintf(err, sizeof err, "%.300s", r->closing ? "unsubscribed" : r->why);
  } else {
    rc = st__remote_start_receive(srv, r->peer, code, message, result, r->xfer, &r->res,
                                  begin_update, r, err, sizeof err);
  }
  if (rc != ST_OK) st__xfer_sup_abort(srv->remote->sup, r->xfer, err);   /* done ends it */
}

static void xfer_opened(void *ud, uint64_t xfer, const uint8_t *blob, size_t len) {
  st__replica_t *r = ud;
  st__server_t *srv = r->srv;
  (void)xfer;
  char err[400];
  int rc = st__remote_ask_send(srv, r->peer, r->key, 0, r->xid, r->engine, 1, blob, len,
                               answered, r, &r->req, err, sizeof err);
  if (rc != ST_OK) st__xfer_sup_abort(srv->remote->sup, r->xfer, err);
}

static void xfer_done(void *ud, uint64_t xfer, int ok, uint64_t bytes, int code,
                      const char *error) {
  st__replica_t *r = ud;
  (void)xfer;
  r->xfer_open = 0;
  if (r->req) {                 /* a peer_xfer_open still unanswered */
    st__peer_cancel(r->srv->peer, r->req);
    r->req = 0;
  }
  if (ok && bytes == r->bytes && !r->closing) {
    r->got_all = 1;
    if (r->verdict) landed(r);   /* else when peer_live_sent comes */
    return;
  }
  char why[500];
  snprintf(why, sizeof why, "%llu of %llu bytes moved: %s", (unsigned long long)bytes,
           (unsigned long long)r->bytes,
           r->closing ? "unsubscribed" : error && error[0] ? error : st_err_name(code));
  transfer_failed(r, why);
}

static const st__xfer_sup_cbs_t replica_cbs = {xfer_opened, NULL, xfer_done};

/* Brings the latest announced version when it is newer than the one
 * here and nothing moves. */
static void move_next(st__replica_t *r) {
  st__server_t *srv = r->srv;
  st__remote_t *rm = srv->remote;
  if (r->moving || r->lost || r->closing || r->retrying || !r->subscribed ||
      r->wanted <= r->published)
    return;
  if (!st__keys_live_page_is(&srv->keys, r->as, r->page_arena)) {   /* the replica was deleted here: the subscription ends */
    ST_LOG_I("peer", "live replica '%s' was deleted: its subscription to '%s' on '%s' ends",
             r->as, r->key, r->peer);
    st__replica_unsubscribe(srv, r->as, NULL, NULL, NULL, 0);
    return;
  }
  if (!rm->sup) {
    snprintf(r->why, sizeof r->why, "this server's transfer helper is not running");
    r->lost = 1;
    return;
  }
  double timeout = st__remote_transfer_timeout(srv);
  char err[400];
  int rc = st__xfer_sup_open(rm->sup, r->engine, ST_XFER_RECV, 2, 1, (uint32_t)(timeout * 1e3),
                             &replica_cbs, r, &r->xfer, err, sizeof err);
  if (rc != ST_OK) {
    transfer_failed(r, err);
    return;
  }
  r->moving = 1;
  r->xfer_open = 1;
  r->xid = ++rm->next_xfer | (1ull << 62);   /* apart from the pulls' task ids */
  r->got_all = r->verdict = r->whole = 0;
  r->t0 = st__now_mono();
}

static void on_retry(struct ev_loop *loop, ev_timer *w, int revents) {
  (void)revents;
  st__replica_t *r = w->data;
  ev_timer_stop(loop, w);
  r->retrying = 0;
  move_next(r);
}

/* The peer's answer to peer_live_subscribe: {version}, the one it holds
 * now. */
static void subscribed(void *ud, const char *peer, int code, const char *message,
                       const msgpack_object *result) {
  st__replica_t *r = ud;
  (void)peer;
  r->req = 0;
  uint64_t v = 0;
  if (code == ST_OK && !st__remote_param_u64(result, "version", &v)) {
    code = ST_ERR_PROTOCOL;
    message = "the answer to peer_live_subscribe has no version";
  }
  if (code != ST_OK) {
    r->lost = 1;
    snprintf(r->why, sizeof r->why, "the subscription was refused: %s",
             message ? message : st_strerror(code));
    ST_LOG_W("peer", "live replica '%s' of '%s' on '%s': %s", r->as, r->key, r->peer, r->why);
    return;
  }
  r->subscribed = 1;
  if (v > r->wanted) r->wanted = v;
  ST_LOG_I("peer", "live replica '%s' follows '%s' on '%s' (at version %llu)", r->as, r->key,
           r->peer, (unsigned long long)r->published);
  move_next(r);
}

/* See replica.h. */
int st__replica_start(st__server_t *srv, uint64_t id, const char *peer, const char *key,
                      const char *as, const char *engine, uint64_t version, char *err,
                      size_t errlen) {
  st__remote_t *rm = srv->remote;
  st__key_t *k = st__smap_get(&srv->keys.by_name, as, strlen(as));
  if (!k || !k->live || k->nversions != 1) {
    snprintf(err, errlen, "key '%s' is not the live replica just made", as);
    return ST_ERR_INTERNAL;
  }
  st__replica_t *r = calloc(1, sizeof *r);
  st__arena_t **refs = calloc(k->versions[0]->result.narenas + 1, sizeof *refs);
  if (!r || !refs) {
    free(r), free(refs);
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  r->srv = srv;
  r->sub = id;
  snprintf(r->peer, sizeof r->peer, "%s", peer);
  snprintf(r->key, sizeof r->key, "%s", key);
  snprintf(r->as, sizeof r->as, "%s", as);
  snprintf(r->engine, sizeof r->engine, "%s", engine);
  st__arena_ref(k->page_arena);
  r->page_arena = k->page_arena;
  r->page = k->page;
  st__build_result_init(&r->res);
  const st__build_result_t *kr = &k->versions[0]->result;
  for (size_t i = 0; i < kr->narenas; i++) {
    st__arena_ref(kr->arenas[i]);
    refs[i] = kr->arenas[i];
    r->bytes += st__arena_bytes(kr->arenas[i]);
  }
  r->res.arenas = refs;
  r->res.narenas = kr->narenas;
  r->published = r->wanted = version;
  ev_timer_init(&r->retry, on_retry, RETRY_S, 0);
  r->retry.data = r;
  r->next = rm->replicas;
  rm->replicas = r;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__remote_pack_begin(&sb, &pk, 1);
  msgpack_pack_map(&pk, 2);
  st__pack_kv_str(&pk, "key", key);
  st__pack_kv_uint(&pk, "sub", id);
  double timeout = st__remote_connect_timeout(srv);
  int rc = st__peer_request(srv->peer, peer, "peer_live_subscribe", sb.data, sb.size, timeout,
                            subscribed, r, &r->req, err, errlen);
  msgpack_sbuffer_destroy(&sb);
  if (rc != ST_OK) {
    r->lost = 1;
    snprintf(r->why, sizeof r->why, "the subscription could not be asked: %s", err);
  }
  return rc;
}

/* ------------------------------------------------------------- the peer's messages */

static st__replica_t *by_sub(const st__server_t *srv, const char *peer, uint64_t sub) {
  for (st__replica_t *r = srv->remote->replicas; r; r = r->next)
    if (r->sub == sub && !strcmp(r->peer, peer)) return r;
  return NULL;
}

/* peer_live_version {sub, version, gone?} -> true. */
static void on_version(st__peer_t *p, const st__peer_req_t *req, void *ud) {
  st__server_t *srv = ud;
  uint64_t sub = 0, version = 0;
  if (!st__remote_param_u64(req->params, "sub", &sub) ||
      !st__remote_param_u64(req->params, "version", &version)) {
    st__peer_reply_error(p, req->ticket, ST_ERR_INVALID_ARGUMENT,
                         "peer_live_version needs sub and version");
    return;
  }
  const msgpack_object *gone = req->params ? st__map_get(req->params, "gone") : NULL;
  st__replica_t *r = by_sub(srv, req->peer, sub);
  if (r && gone && gone->type == MSGPACK_OBJECT_BOOLEAN && gone->via.boolean) {
    r->lost = 1;
    snprintf(r->why, sizeof r->why, "key '%s' is gone on '%s' (deleted, or its server stopped)",
             r->key, r->peer);
    ST_LOG_W("peer", "live replica '%s': %s; it keeps version %llu", r->as, r->why,
             (unsigned long long)r->published);
  } else if (r && version > r->wanted) {
    r->wanted = version;
    move_next(r);
  }
  st__remote_reply_true(p, req->ticket);
}

/* peer_live_sent {xfer, version, whole} -> true: what a live transfer's
 * bytes are, said by the side that read them. */
static void on_sent(st__peer_t *p, const st__peer_req_t *req, void *ud) {
  st__server_t *srv = ud;
  uint64_t xfer = 0, version = 0;
  const msgpack_object *whole = req->params ? st__map_get(req->params, "whole") : NULL;
  if (!st__remote_param_u64(req->params, "xfer", &xfer) ||
      !st__remote_param_u64(req->params, "version", &version) || !whole ||
      whole->type != MSGPACK_OBJECT_BOOLEAN) {
    st__peer_reply_error(p, req->ticket, ST_ERR_INVALID_ARGUMENT,
                         "peer_live_sent needs xfer, version and whole");
    return;
  }
  int w = whole->via.boolean && version > 0;
  st__replica_t *r = srv->remote->replicas;
  while (r && !(r->moving && r->xid == xfer && !strcmp(r->peer, req->peer) && !r->verdict))
    r = r->next;
  if (r) {
    r->verdict = 1;
    r->verdict_version = version;
    r->whole = w;
    if (r->got_all) landed(r);
  } else {
    st__pull_live_sent(srv, req->peer, xfer, version, w);
  }
  st__remote_reply_true(p, req->ticket);
}

/* See replica.h. */
int st__replica_methods(st__server_t *srv) {
  if (st__peer_method_add(srv->peer, "peer_live_version", on_version, srv) != ST_OK ||
      st__peer_method_add(srv->peer, "peer_live_sent", on_sent, srv) != ST_OK)
    return ST_ERR_INTERNAL;
  return ST_OK;
}

/* ------------------------------------------------------------- ends */

/* See replica.h. */
void st__replicas_lost(st__server_t *srv, const char *peer, const char *why) {
  for (st__replica_t *r = srv->remote ? srv->remote->replicas : NULL; r; r = r->next) {
    if ((peer && strcmp(r->peer, peer)) || r->lost) continue;
    r->lost = 1;
    snprintf(r->why, sizeof r->why, "%s", why);
    ST_LOG_W("peer", "live replica '%s' of '%s' lost its source: %s; it keeps version %llu%s",
             r->as, r->key, why, (unsigned long long)r->published,
             r->moving ? " (torn: a transfer was under way)" : "");
    if (r->retrying) {
      ev_timer_stop(srv->loop, &r->retry);
      r->retrying = 0;
    }
    if (r->xfer_open) st__xfer_sup_abort(srv->remote->sup, r->xfer, why);   /* done ends it */
    else if (r->moving) transfer_failed(r, why);   /* no word of what its bytes are will come */
  }
}

/* See replica.h. */
unsigned st__replicas_count(const st__server_t *srv) {
  unsigned n = 0;
  for (const st__replica_t *r = srv->remote ? srv->remote->replicas : NULL; r; r = r->next)
    n += !r->closing;
  return n;
}

/* See replica.h. */
void st__replicas_free(st__server_t *srv) {
  st__remote_t *rm = srv->remote;
  while (rm->replicas) {
    st__replica_t *r = rm->replicas;
    rm->replicas = r->next;
    r->req = 0;   /* the channel is gone: nothing to cancel */
    replica_free(r);
  }
}

/* See replica.h. */
int st__replica_unsubscribe(st__server_t *srv, const char *as, const st__who_t *who,
                            uint64_t *version, char *err, size_t errlen) {
  st__replica_t *r = by_as(srv, as);
  if (!r || r->closing) {
    if (err) snprintf(err, errlen, "key '%s' is not a live replica that follows a peer's key", as);
    return ST_ERR_NOT_FOUND;
  }
  const st__key_t *k = st__smap_get(&srv->keys.by_name, as, strlen(as));
  if (who && !who->admin && k && k->uid != who->uid) {
    if (err) snprintf(err, errlen, "key '%s' belongs to uid %u", as, (unsigned)k->uid);
    return ST_ERR_AUTH;
  }
  if (version) *version = r->published;
  if (!r->lost && srv->peer) {
    msgpack_sbuffer sb;
    msgpack_packer pk;
    st__remote_pack_begin(&sb, &pk, 1);
    msgpack_pack_map(&pk, 1);
    st__pack_kv_uint(&pk, "sub", r->sub);
    char e[200];
    st__peer_request(srv->peer, r->peer, "peer_live_unsubscribe", sb.data, sb.size, 10.0,
                     st__remote_ignore_reply, NULL, NULL, e, sizeof e);
    msgpack_sbuffer_destroy(&sb);
  }
  ST_LOG_I("peer", "live replica '%s' no longer follows '%s' on '%s' (it keeps version %llu)",
           r->as, r->key, r->peer, (unsigned long long)r->published);
  r->closing = 1;
  if (r->retrying) {
    ev_timer_stop(srv->loop, &r->retry);
    r->retrying = 0;
  }
  if (r->req && !r->moving) {
    st__peer_cancel(srv->peer, r->req);
    r->req = 0;
  }
  if (r->moving) {              /* its done frees it */
    if (r->xfer_open) st__xfer_sup_abort(srv->remote->sup, r->xfer, "unsubscribed");
    else if (!r->got_all || !r->verdict) transfer_failed(r, "unsubscribed");
    return ST_OK;
  }
  unlink_replica(srv->remote, r);
  replica_free(r);
  return ST_OK;
}

/* See replica.h. */
int st__replica_busy(const st__server_t *srv, const char *name) {
  const st__replica_t *r = by_as(srv, name);
  return r && !r->closing && !r->lost;
}

/* See replica.h. */
void st__replica_pack(msgpack_packer *pk, const st__server_t *srv, const char *as) {
  const st__replica_t *r = by_as(srv, as);
  if (!r) {
    msgpack_pack_nil(pk);
    return;
  }
  msgpack_pack_map(pk, 7);
  st__pack_kv_str(pk, "peer", r->peer);
  st__pack_kv_str(pk, "key", r->key);
  st__pack_kv_uint(pk, "version", r->published);
  st__pack_kv_uint(pk, "updates", r->updates);
  st__pack_kv_uint(pk, "torn", r->torn);
  st__pack_kv_bool(pk, "lost", r->lost);
  st__pack_kv_str(pk, "why", r->lost ? r->why : "");
}
