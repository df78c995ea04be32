/* src/peer/requests.c: what the rest of the server asks of the channel
 * (peer.h): requests to a peer by id with a timeout and their pending
 * table, replies to a peer's requests, the table of peer_* methods, the
 * state listener, and the queries (`peers`, `info`). The channel's loop
 * thread unless a function says otherwise (st__peer_request: any thread,
 * it only queues). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "peer/channel_int.h"
#include "peer/ssl_api.h"
#include "proto/proto.h"
#include "st/errors.h"
#include "st/wire.h"

/* ------------------------------------------------------------- requests */

/* See channel_int.h. */
pending_t *st__peer_add_pending(st__peer_t *p, st__link_t *l, const char *peer, double timeout_s,
                                st__peer_reply_fn cb, void *ud) {
  pending_t *q = calloc(1, sizeof *q);
  if (!q) return NULL;
  q->handle = ++p->next_handle;
  q->link = l->serial;
  q->id = ++l->next_id;
  if (q->id == 0) q->id = ++l->next_id;
  q->deadline = st__now_mono() + timeout_s;
  q->cb = cb;
  q->ud = ud;
  snprintf(q->peer, sizeof q->peer, "%s", peer);
  q->next = p->pending;
  p->pending = q;
  return q;
}

/* Unlinks and returns the pending request (link serial, id), or NULL. */
pending_t *st__peer_take_pending(st__peer_t *p, uint64_t link, uint32_t id) {
  for (pending_t **pp = &p->pending; *pp; pp = &(*pp)->next) {
    if ((*pp)->link == link && (*pp)->id == id) {
      pending_t *q = *pp;
      *pp = q->next;
      return q;
    }
  }
  return NULL;
}

/* Fails every pending request of link serial `link` (0: all). */
void st__peer_fail_pending(st__peer_t *p, uint64_t link, int code, const char *why) {
  pending_t **pp = &p->pending;
  while (*pp) {
    pending_t *q = *pp;
    if (link && q->link != link) {
      pp = &q->next;
      continue;
    }
    *pp = q->next;
    if (q->cb) q->cb(q->ud, q->peer, code, why, NULL);
    free(q);
    pp = &p->pending;   /* a callback may have changed the list */
  }
}

/* Packs [0, id, method, <params>] and sends it. */
/* See peer.h. */
int st__peer_request(st__peer_t *p, const char *peer, const char *method, const void *params,
                     size_t params_len, double timeout_s, st__peer_reply_fn cb, void *ud,
                     uint64_t *handle, char *err, size_t errlen) {
  if (!method || strncmp(method, "peer_", 5) != 0 || !cb || !(timeout_s > 0)) {
    snprintf(err, errlen, "a peer request needs a peer_* method, a callback and a timeout");
    return ST_ERR_INVALID_ARGUMENT;
  }
  if (params_len + 512 > ST__PEER_MAX_FRAME) {
    snprintf(err, errlen, "the request's parameters (%zu bytes) pass the peer frame limit (%u)",
             params_len, ST__PEER_MAX_FRAME);
    return ST_ERR_LIMIT;
  }
  peer_rec_t *r = p ? st__peer_find(p, peer, strlen(peer)) : NULL;
  if (!r) {
    snprintf(err, errlen, "'%s' is not a peer of this server (peer.peers)", peer);
    return ST_ERR_NOT_FOUND;
  }
  if (!r->up || p->stopping) {
    snprintf(err, errlen, "no link to peer '%s' is up (state %s%s%s)", peer,
             st__peer_state_name(st__peer_state_of(p, r)), r->last_error[0] ? ": " : "",
             r->last_error);
    return ST_ERR_CAPABILITY;
  }
  pending_t *q = st__peer_add_pending(p, r->up, peer, timeout_s, cb, ud);
  if (!q) {
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  /* Queued only: the channel's loop sends it after its wake-up, so that
   * no callback (this one, or another request's when a link fails) runs
   * inside this call. A queue that refuses it closes the link there. */
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  st__pack_request_head(&pk, q->id, method);
  msgpack_sbuffer_write(&sb, params, params_len);
  int rc = st__link_queue(r->up, sb.data, sb.size);
  msgpack_sbuffer_destroy(&sb);
  if (rc != ST_OK) {
    st__link_t *l = r->up;
    free(st__peer_take_pending(p, q->link, q->id));
    st__peer_say(l->refusal, sizeof l->refusal, "%s",
                 rc == ST_ERR_LIMIT ? "more than 64 MiB queued for the peer"
                                    : "out of memory (link output)");
    l->refused = 0;
    l->close_after_flush = 1;
    l->deadline = 0;
    ev_async_send(p->loop, &p->wake);
    snprintf(err, errlen, "the link to peer '%s' cannot take the request: %s", peer, l->refusal);
    return rc;
  }
  if (handle) *handle = q->handle;
  ev_async_send(p->loop, &p->wake);
  return ST_OK;
}

/* See peer.h. */
int st__peer_cancel(st__peer_t *p, uint64_t handle) {
  for (pending_t **pp = &p->pending; *pp; pp = &(*pp)->next) {
    if ((*pp)->handle == handle) {
      pending_t *q = *pp;
      *pp = q->next;
      free(q);
      return 1;
    }
  }
  return 0;
}

static st__link_t *link_by_serial(st__peer_t *p, uint64_t serial) {
  for (st__link_t *l = p->links; l; l = l->next)
    if (l->serial == serial && l->stage == ST__LINK_OPEN && l->up) return l;
  return NULL;
}

/* See peer.h. */
int st__peer_reply(st__peer_t *p, st__peer_ticket_t t, const void *result, size_t len) {
  st__link_t *l = link_by_serial(p, t.link);
  if (!l) return 0;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  st__pack_response_head(&pk, t.id);
  msgpack_sbuffer_write(&sb, result, len);
  int rc = st__peer_send_frame(p, l, &sb);
  msgpack_sbuffer_destroy(&sb);
  return rc == ST_OK;
}

/* See peer.h. */
int st__peer_reply_error(st__peer_t *p, st__peer_ticket_t t, int code, const char *message) {
  st__link_t *l = link_by_serial(p, t.link);
  if (!l) return 0;
  return st__peer_send_error(p, l, t.id, code, message) == ST_OK;
}

/* See peer.h. */
int st__peer_method_add(st__peer_t *p, const char *name, st__peer_method_fn fn, void *ud) {
  if (!name || strncmp(name, "peer_", 5) != 0 || strlen(name) >= sizeof p->methods[0].name ||
      !fn || strcmp(name, "peer_hello") == 0 || strcmp(name, "peer_ping") == 0)
    return ST_ERR_INVALID_ARGUMENT;
  for (int i = 0; i < p->nmethods; i++)
    if (strcmp(p->methods[i].name, name) == 0) return ST_ERR_INVALID_ARGUMENT;
  if (p->nmethods == MAX_METHODS) return ST_ERR_LIMIT;
  method_row_t *m = &p->methods[p->nmethods++];
  snprintf(m->name, sizeof m->name, "%s", name);
  m->fn = fn;
  m->ud = ud;
  return ST_OK;
}

/* See peer.h. */
void st__peer_on_state(st__peer_t *p, st__peer_state_fn fn, void *ud) {
  p->on_state = fn;
  p->on_state_ud = ud;
}

/* ------------------------------------------------------------- queries */

/* See peer.h. */
st__peer_state_t st__peer_state(const st__peer_t *p, const char *peer) {
  const peer_rec_t *r = p ? st__peer_find(p, peer, strlen(peer)) : NULL;
  return r ? st__peer_state_of(p, r) : ST__PEER_DOWN;
}

/* See peer.h. */
int st__peer_engine_usable(const st__peer_t *p, const char *peer, const char *engine, char *why,
                           size_t whylen) {
  const peer_rec_t *r = p ? st__peer_find(p, peer, strlen(peer)) : NULL;
  if (!r || !r->up) {
    snprintf(why, whylen, "no link to peer '%s' is up", peer);
    return 0;
  }
  for (int i = 0; i < r->up->nengines; i++) {
    const st__link_engine_t *x = &r->up->engines[i];
    if (strcmp(x->name, engine) != 0) continue;
    if (!x->usable) snprintf(why, whylen, "%s", x->why);
    return x->usable;
  }
  snprintf(why, whylen, "neither this server nor peer '%s' reports the engine %s", peer, engine);
  return 0;
}

/* See peer.h. */
const char *st__peer_listen_address(const st__peer_t *p) {
  return p && p->lfd >= 0 ? p->listen_addr : NULL;
}

static void pack_peer(msgpack_packer *pk, const st__peer_t *p, const st__peer_entry_t *e,
                      const peer_rec_t *r) {
  msgpack_pack_map(pk, 9);
  st__pack_kv_str(pk, "id", e->id);
  st__pack_kv_str(pk, "addr", e->addr);
  st__pack_kv_str(pk, "state", st__peer_state_name(r ? st__peer_state_of(p, r) : ST__PEER_DOWN));
  st__pack_cstr(pk, "engines");
  const st__link_t *l = r ? r->up : NULL;
  msgpack_pack_array(pk, l ? (size_t)l->nengines : 0);
  for (int i = 0; l && i < l->nengines; i++) {
    const st__link_engine_t *x = &l->engines[i];
    msgpack_pack_map(pk, 5);
    st__pack_kv_str(pk, "name", x->name);
    st__pack_kv_str(pk, "local", x->local[0] ? x->local : NULL);
    st__pack_kv_str(pk, "remote", x->remote[0] ? x->remote : NULL);
    st__pack_kv_bool(pk, "usable", x->usable);
    st__pack_kv_str(pk, "why", x->usable ? NULL : x->why);
  }
  if (r) st__pack_kv_double(pk, "since", r->since);
  else st__pack_kv_str(pk, "since", NULL);
  if (l && l->rtt_us >= 0) st__pack_kv_uint(pk, "rtt_us", (uint64_t)l->rtt_us);
  else st__pack_kv_str(pk, "rtt_us", NULL);
  st__pack_kv_str(pk, "last_error", r && r->last_error[0] ? r->last_error : NULL);
  st__pack_kv_str(pk, "link", l ? (l->outgoing ? "outgoing" : "incoming") : NULL);
  if (e->as_uid >= 0) st__pack_kv_int(pk, "as_uid", e->as_uid);
  else st__pack_kv_str(pk, "as_uid", NULL);
}

/* See peer.h. */
void st__peer_pack_peers(msgpack_packer *pk, const st__peer_t *p, const st__peer_conf_t *conf) {
  if (p) {
    msgpack_pack_array(pk, (size_t)p->npeers);
    for (int i = 0; i < p->npeers; i++) pack_peer(pk, p, p->peers[i].e, &p->peers[i]);
    return;
  }
  msgpack_pack_array(pk, (size_t)conf->npeers);
  for (int i = 0; i < conf->npeers; i++) pack_peer(pk, NULL, &conf->peers[i], NULL);
}

/* See peer.h. */
void st__peer_pack_info(msgpack_packer *pk, const st__peer_t *p, const st__peer_conf_t *conf) {
  int up = 0;
  for (int i = 0; p && i < p->npeers; i++) up += p->peers[i].up != NULL;
  msgpack_pack_map(pk, 8);
  st__pack_kv_str(pk, "id", conf->id);
  st__pack_kv_str(pk, "listen", st__peer_listen_address(p));
  st__pack_kv_str(pk, "auth", p ? st__tls_ctx_mode(p->tls) : NULL);
  st__pack_kv_str(pk, "tls", p ? st__ssl_version() : NULL);
  st__pack_kv_int(pk, "peers", conf->npeers);
  st__pack_kv_int(pk, "links_up", up);
  st__pack_kv_uint(pk, "refused", p ? p->refused_total : 0);
  st__pack_kv_str(pk, "last_refused", p && p->last_refused[0] ? p->last_refused : NULL);
}

