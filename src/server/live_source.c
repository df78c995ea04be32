/* src/server: the side of a live replication that holds the live key
 * (remote.h, "Live replication"; docs/multihost.md, "Live replication").
 *
 * A peer subscribes its replica to one of this server's exported live
 * keys (peer_live_subscribe); from then on the page watch (page_watch.h)
 * wakes loop 0 at each complete update of a subscribed key (and on its
 * timer: every 10 ms, or 1 ms while a page is read by the timer alone),
 * which reads the subscribed pages, and every new complete version is
 * announced to the subscribers
 * (peer_live_version {sub, version}). Each subscriber then asks for the
 * bytes with peer_xfer_open {live: true} (remote.c): the lend raises the
 * page's fence, and once it holds a version the helper reads; when the
 * transfer ends says which version the receiver got and whether it is
 * whole (peer_live_sent, st__live_lend_sent). A key deleted, or its
 * server stopping, ends its subscriptions (announced: {gone: true}); a
 * peer's link going down ends that peer's.
 *
 * Loop 0, the write side of the server lock.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "engine/keys.h"
#include "server/live_source.h"
#include "server/page_watch.h"
#include "st/errors.h"

/* Subscriptions one peer may hold, and one key may have. */
#define SUBS_PER_PEER 64
#define SUBS_PER_KEY 64
/* How often the subscribed pages are read: while one is read by the
 * watch's timer alone, and while the watch's thread wakes on all. */
#define WATCH_S 0.001
#define WATCHED_S 0.01

struct st__live_sub {
  struct st__live_sub *next;
  char peer[ST__PEER_ID_MAX + 1];
  char key[ST__KEY_NAME_MAX + 1];
  uint64_t sub;               /* the subscriber's id of it */
  st__arena_t *page_arena;    /* a reference: the key's page, watched */
  st__key_page_t *page;
  uint64_t told;              /* the last version announced */
  double since;
};

static void sub_free(st__server_t *srv, st__live_sub_t *s) {
  st__pwatch_remove(srv->remote->lpwatch, (uint64_t)(uintptr_t)s);
  st__arena_unref(s->page_arena);
  free(s);
}

/* Tells s's subscriber of version `version` (0 with gone: the key is
 * gone here). */
static void announce(st__server_t *srv, const st__live_sub_t *s, uint64_t version, int gone) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__remote_pack_begin(&sb, &pk, 1);
  msgpack_pack_map(&pk, gone ? 3 : 2);
  st__pack_kv_uint(&pk, "sub", s->sub);
  st__pack_kv_uint(&pk, "version", version);
  if (gone) st__pack_kv_bool(&pk, "gone", 1);
  char err[200];
  if (st__peer_request(srv->peer, s->peer, "peer_live_version", sb.data, sb.size, 10.0,
                       st__remote_ignore_reply, NULL, NULL, err, sizeof err) != ST_OK)
    ST_LOG_D("peer", "live key '%s': telling '%s' of version %llu: %s", s->key, s->peer,
             (unsigned long long)version, err);
  msgpack_sbuffer_destroy(&sb);
}

/* Each subscribed page read (the page watch calls it at an update, and on
 * its timer); new complete versions announced; subscriptions of keys
 * that went away ended. */
static void on_watch(struct ev_loop *loop, void *ud) {
  (void)loop;
  st__server_t *srv = ud;
  st__remote_t *rm = srv->remote;
  for (st__live_sub_t **pp = &rm->subs; *pp;) {
    st__live_sub_t *s = *pp;
    uint32_t flags = atomic_load(&s->page->flags);
    if ((flags & ST__KEY_DELETED) || !st__keys_live_page_is(&srv->keys, s->key, s->page_arena)) {
      ST_LOG_I("peer", "live key '%s' is gone: the subscription of '%s' ends", s->key, s->peer);
      announce(srv, s, 0, 1);
      *pp = s->next;
      sub_free(srv, s);
      continue;
    }
    uint64_t seq = atomic_load(&s->page->seq), v = atomic_load(&s->page->version);
    if (!(seq & 1) && v > s->told) {
      s->told = v;
      announce(srv, s, v, 0);
    }
    pp = &s->next;
  }
}

/* s's page watched: the key page's futex moves at every complete update
 * and its writer always wakes (no waiter count). */
static void watch_page(st__server_t *srv, st__live_sub_t *s) {
  st__remote_t *rm = srv->remote;
  if (!rm->lpwatch &&
      st__pwatch_new(srv->loop, "live keys followed by peers", WATCH_S, WATCHED_S, on_watch, srv,
                     &rm->lpwatch) != ST_OK)
    return;
  st__pwatch_add_arena(rm->lpwatch, (uint64_t)(uintptr_t)s, s->page_arena,
                       st__arena_bytes(s->page_arena), offsetof(st__key_page_t, futex),
                       ST__PWATCH_NO_WAITERS, s->key);
}

static st__live_sub_t *sub_find(st__remote_t *rm, const char *peer, uint64_t sub) {
  for (st__live_sub_t *s = rm->subs; s; s = s->next)
    if (s->sub == sub && !strcmp(s->peer, peer)) return s;
  return NULL;
}

/* peer_live_subscribe {key, sub} -> {version}: announces key's complete
 * versions after `version` to the asking peer, under its id `sub`. */
static void on_subscribe(st__peer_t *p, const st__peer_req_t *req, void *ud) {
  st__server_t *srv = ud;
  st__remote_t *rm = srv->remote;
  char name[ST__KEY_NAME_MAX + 1], err[600];
  uint64_t sub = 0;
  if (!st__remote_param_str(req->params, "key", name, sizeof name) ||
      !st__remote_param_u64(req->params, "sub", &sub) || sub == 0) {
    st__peer_reply_error(p, req->ticket, ST_ERR_INVALID_ARGUMENT,
                         "peer_live_subscribe needs key and sub");
    return;
  }
  if (sub_find(rm, req->peer, sub)) {
    st__peer_reply_error(p, req->ticket, ST_ERR_INVALID_ARGUMENT,
                         "peer_live_subscribe: this subscription exists already");
    return;
  }
  unsigned of_peer = 0, of_key = 0;
  for (const st__live_sub_t *s = rm->subs; s; s = s->next) {
    of_peer += !strcmp(s->peer, req->peer);
    of_key += !strcmp(s->key, name);
  }
  if (of_peer >= SUBS_PER_PEER || of_key >= SUBS_PER_KEY) {
    snprintf(err, sizeof err, "server '%s': %s (at most %d per peer and %d per key)",
             srv->cfg->peer.id, of_peer >= SUBS_PER_PEER ? "this peer holds as many live "
             "subscriptions as it may" : "this key has as many subscribers as it may",
             SUBS_PER_PEER, SUBS_PER_KEY);
    st__peer_reply_error(p, req->ticket, ST_ERR_LIMIT, err);
    return;
  }
  st__key_t *k;
  st__key_version_t *v;
  int rc = st__remote_find_exported(srv, name, 0, 1, &k, &v, err, sizeof err);
  if (rc == ST_OK && !k->live) {
    snprintf(err, sizeof err, "key '%s' is not live: pull it without live", name);
    rc = ST_ERR_INVALID_ARGUMENT;
  }
  st__live_sub_t *s = rc == ST_OK ? calloc(1, sizeof *s) : NULL;
  if (rc == ST_OK && !s) {
    rc = ST_ERR_OUT_OF_MEMORY;
    snprintf(err, sizeof err, "out of memory");
  }
  if (rc != ST_OK) {
    st__peer_reply_error(p, req->ticket, rc, err);
    return;
  }
  snprintf(s->peer, sizeof s->peer, "%s", req->peer);
  snprintf(s->key, sizeof s->key, "%s", name);
  s->sub = sub;
  st__arena_ref(k->page_arena);
  s->page_arena = k->page_arena;
  s->page = k->page;
  s->told = atomic_load(&k->page->version);
  s->since = st__now_unix();
  s->next = rm->subs;
  rm->subs = s;
  watch_page(srv, s);
  ST_LOG_I("peer", "'%s' subscribed to live key '%s' (at version %llu)", req->peer, name,
           (unsigned long long)s->told);
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__remote_pack_begin(&sb, &pk, 0);
  msgpack_pack_map(&pk, 1);
  st__pack_kv_uint(&pk, "version", s->told);
  st__peer_reply(p, req->ticket, sb.data, sb.size);
  msgpack_sbuffer_destroy(&sb);
}

/* Ends the subscriptions of `peer` (NULL: all) with id `sub` (0: any). */
static unsigned drop(st__server_t *srv, const char *peer, uint64_t sub) {
  st__remote_t *rm = srv->remote;
  unsigned n = 0;
  for (st__live_sub_t **pp = &rm->subs; *pp;) {
    st__live_sub_t *s = *pp;
    if ((!peer || !strcmp(s->peer, peer)) && (!sub || s->sub == sub)) {
      *pp = s->next;
      sub_free(srv, s);
      n++;
    } else {
      pp = &s->next;
    }
  }
  return n;
}

/* peer_live_unsubscribe {sub} -> true. */
/* A request's `sub`, or 0 when absent or not an unsigned integer. */
static uint64_t sub_of(const msgpack_object *params) {
  uint64_t v = 0;
  return st__remote_param_u64(params, "sub", &v) ? v : 0;
}

static void on_unsubscribe(st__peer_t *p, const st__peer_req_t *req, void *ud) {
  st__server_t *srv = ud;
  uint64_t sub = sub_of(req->params);
  if (sub == 0) {
    st__peer_reply_error(p, req->ticket, ST_ERR_INVALID_ARGUMENT,
                         "peer_live_unsubscribe needs sub");
    return;
  }
  if (drop(srv, req->peer, sub))
    ST_LOG_I("peer", "'%s' ended its live subscription %llu", req->peer,
             (unsigned long long)sub);
  st__remote_reply_true(p, req->ticket);
}

/* See live_source.h. */
int st__live_source_methods(st__server_t *srv) {
  if (st__peer_method_add(srv->peer, "peer_live_subscribe", on_subscribe, srv) != ST_OK ||
      st__peer_method_add(srv->peer, "peer_live_unsubscribe", on_unsubscribe, srv) != ST_OK)
    return ST_ERR_INTERNAL;
  return ST_OK;
}

/* See live_source.h. */
unsigned st__live_source_count(const st__server_t *srv) {
  unsigned n = 0;
  for (const st__live_sub_t *s = srv->remote ? srv->remote->subs : NULL; s; s = s->next) n++;
  return n;
}

/* See live_source.h. */
void st__live_source_peer_down(st__server_t *srv, const char *peer) {
  unsigned n = drop(srv, peer, 0);
  if (n) ST_LOG_I("peer", "'%s' is down: its %u live subscriptions end", peer, n);
}

/* See live_source.h. */
void st__live_source_stop(st__server_t *srv) {
  st__remote_t *rm = srv->remote;
  for (st__live_sub_t *s = rm->subs; s; s = s->next) announce(srv, s, 0, 1);
  drop(srv, NULL, 0);
  st__pwatch_free(rm->lpwatch);
  rm->lpwatch = NULL;
}

/* See live_source.h. */
void st__live_source_pack(msgpack_packer *pk, const st__server_t *srv, const char *key) {
  const st__remote_t *rm = srv->remote;
  unsigned n = 0;
  for (const st__live_sub_t *s = rm ? rm->subs : NULL; s; s = s->next) n += !strcmp(s->key, key);
  msgpack_pack_array(pk, n);
  for (const st__live_sub_t *s = rm ? rm->subs : NULL; s; s = s->next) {
    if (strcmp(s->key, key)) continue;
    msgpack_pack_map(pk, 3);
    st__pack_kv_str(pk, "peer", s->peer);
    st__pack_kv_uint(pk, "version", s->told);
    st__pack_kv_double(pk, "since", s->since);
  }
}

/* See live_source.h. */
void st__live_lend_sent(st__server_t *srv, const char *peer, uint64_t remote_xfer,
                        st__key_page_t *page, uint64_t version, int raised, int ok) {
  int whole = ok && (!page || st__key_page_fence_check(page, version));
  if (raised && page) st__key_page_fence_drop(page);
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__remote_pack_begin(&sb, &pk, 1);
  msgpack_pack_map(&pk, 3);
  st__pack_kv_uint(&pk, "xfer", remote_xfer);
  st__pack_kv_uint(&pk, "version", version);
  st__pack_kv_bool(&pk, "whole", whole);
  char err[200];
  if (st__peer_request(srv->peer, peer, "peer_live_sent", sb.data, sb.size, 10.0,
                       st__remote_ignore_reply, NULL, NULL, err, sizeof err) != ST_OK)
    ST_LOG_D("peer", "telling '%s' of a sent version: %s", peer, err);
  msgpack_sbuffer_destroy(&sb);
  if (ok && !whole)
    ST_LOG_W("peer", "a live version sent to '%s' was overwritten while it was read (an update "
             "went past the fence's deadline): its receiver does not publish it", peer);
}
