/* src/peer/channel.c: the channel (peer.h): the listener, the dials and
 * their backoff, peer_hello both ways, the messages of a link and the
 * dispatch of peer_* methods, peer_ping for liveness and round-trip time,
 * the tick (deadlines, pings, dials), start and stop. Links' bytes are
 * link.c's; requests, replies and the queries requests.c's; the peer
 * table's checks conf.c's (channel_int.h: what they share).
 *
 * A link is admitted in steps: TCP (accepted: at most ST__PEER_MAX_PENDING
 * not yet identified), TLS 1.3 (tls.c: the cluster key or certificates),
 * then each side's peer_hello: the id must be a configured peer (and, with
 * certificates, named by the peer's certificate; on an outgoing link, the
 * peer dialled), the peer protocol the same. Before both hellos are
 * accepted only peer_hello is served. Two links between the same two
 * servers (each dialled the other) resolve to the one dialled by the
 * server whose id sorts first; both sides apply the same rule.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fnmatch.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "peer/channel_int.h"
#include "peer/ssl_api.h"
#include "proto/proto.h"
#include "st/errors.h"
#include "st/wire.h"

static const st__link_hooks_t hooks;

/* ------------------------------------------------------------- helpers */

/* See channel_int.h. Any thread. */
void st__peer_say(char *dst, size_t n, const char *fmt, ...) {
  char tmp[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  size_t k = strlen(tmp);
  if (k >= n) k = n - 1;
  memcpy(dst, tmp, k);
  dst[k] = '\0';
}

const char *st__peer_state_name(st__peer_state_t s) {
  switch (s) {
  case ST__PEER_CONNECTING: return "connecting";
  case ST__PEER_HANDSHAKE: return "handshake";
  case ST__PEER_UP: return "up";
  case ST__PEER_REFUSED: return "refused";
  default: return "down";
  }
}

static void addr_text(const struct sockaddr *sa, char *out, size_t len) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *s = (const void *)sa;
    inet_ntop(AF_INET, &s->sin_addr, host, sizeof host);
    port = ntohs(s->sin_port);
    snprintf(out, len, "%s:%d", host, port);
  } else if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *s = (const void *)sa;
    inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof host);
    port = ntohs(s->sin6_port);
    snprintf(out, len, "[%s]:%d", host, port);
  } else {
    snprintf(out, len, "?");
  }
}

peer_rec_t *st__peer_find(const st__peer_t *p, const char *id, size_t len) {
  for (int i = 0; i < p->npeers; i++)
    if (strlen(p->peers[i].e->id) == len && memcmp(p->peers[i].e->id, id, len) == 0)
      return (peer_rec_t *)&p->peers[i];
  return NULL;
}

/* The state a peer is in now. */
st__peer_state_t st__peer_state_of(const st__peer_t *p, const peer_rec_t *r) {
  if (r->up) return ST__PEER_UP;
  if (r->resolving) return ST__PEER_CONNECTING;
  for (const st__link_t *l = p->links; l; l = l->next)
    if (l->peer == r && l->stage != ST__LINK_CLOSED)
      return l->stage == ST__LINK_CONNECT ? ST__PEER_CONNECTING : ST__PEER_HANDSHAKE;
  return r->refused ? ST__PEER_REFUSED : ST__PEER_DOWN;
}

/* Tells the state listener when r's state changed. */
static void notify(st__peer_t *p, peer_rec_t *r) {
  st__peer_state_t s = st__peer_state_of(p, r);
  if (s == r->reported) return;
  r->reported = s;
  r->since = st__now_unix();
  if (p->on_state) p->on_state(p->on_state_ud, r->e->id, s, s == ST__PEER_UP ? "" : r->last_error);
}

/* ------------------------------------------------------------- frames */

/* Queues a frame on l and sends it now when this is the loop thread,
 * else wakes the loop. ST_OK or the error (the link is closed then). */
int st__peer_send_frame(st__peer_t *p, st__link_t *l, const msgpack_sbuffer *sb) {
  int mine = pthread_equal(pthread_self(), p->thread);
  int rc = st__link_queue(l, sb->data, sb->size);
  if (rc != ST_OK) {
    const char *why = rc == ST_ERR_LIMIT ? "more than 64 MiB queued for the peer"
                                         : "out of memory (link output)";
    if (mine) {
      st__link_close(l, why);
    } else {
      /* Another thread may not touch the loop's watchers: the channel's
       * next tick closes it. */
      st__peer_say(l->refusal, sizeof l->refusal, "%s", why);
      l->refused = 0;
      l->close_after_flush = 1;
      l->deadline = 0;
    }
    return rc;
  }
  if (mine) st__link_pump(l);
  else ev_async_send(p->loop, &p->wake);
  return ST_OK;
}

int st__peer_send_error(st__peer_t *p, st__link_t *l, uint32_t id, int code, const char *msg) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  st__pack_error_response(&pk, id, code, msg);
  int rc = st__peer_send_frame(p, l, &sb);
  msgpack_sbuffer_destroy(&sb);
  return rc;
}

/* Refuses l: an error reply to request `id` (its hello) when there is
 * one, logged, counted, and the link closed once the reply is out. */
static void refuse(st__peer_t *p, st__link_t *l, uint32_t id, int has_id, const char *why) {
  ST_LOG_W(WHO, "link %s %s refused: %s", l->outgoing ? "to" : "from", l->remote, why);
  if (!l->outgoing || !l->peer) {
    p->refused_total++;
    st__peer_say(p->last_refused, sizeof p->last_refused, "%s: %s", l->remote, why);
  }
  l->refused = 1;
  st__peer_say(l->refusal, sizeof l->refusal, "%s", why);
  if (l->peer) {
    peer_rec_t *r = l->peer;
    st__peer_say(r->last_error, sizeof r->last_error, "%s", why);
    r->refused = 1;
  }
  if (has_id && st__peer_send_error(p, l, id, ST_ERR_AUTH, why) == ST_OK &&
      st__link_has_output(l)) {
    l->close_after_flush = 1;
    l->deadline = st__now_mono() + 2.0;
    return;
  }
  st__link_close(l, why);
}

/* ------------------------------------------------------------- hello */

/* Packs [{id, protocol, version, engines: [{name, version, why,
 * devices?}]}]. */
static void pack_hello_params(st__peer_t *p, msgpack_packer *pk) {
  msgpack_pack_array(pk, 1);
  msgpack_pack_map(pk, 4);
  st__pack_kv_str(pk, "id", p->conf->id);
  st__pack_kv_int(pk, "protocol", ST__PEER_PROTOCOL);
  st__pack_kv_str(pk, "version", ST_VERSION_STRING);
  st__pack_cstr(pk, "engines");
  msgpack_pack_array(pk, p->nengines);
  for (size_t i = 0; i < p->nengines; i++) {
    msgpack_pack_map(pk, 3 + (p->engines[i].devices != NULL));
    st__pack_kv_str(pk, "name", p->engines[i].name);
    st__pack_kv_str(pk, "version", p->engines[i].version);
    st__pack_kv_str(pk, "why", p->engines[i].why);
    if (p->engines[i].devices) st__pack_kv_str(pk, "devices", p->engines[i].devices);
  }
}

/* TLS is up: our hello goes out. */
static void on_secure(st__link_t *l) {
  st__peer_t *p = l->owner;
  char how[160];
  st__tls_describe(l->tls, how, sizeof how);
  ST_LOG_D(WHO, "link %s %s: %s", l->outgoing ? "to" : "from", l->remote, how);
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  l->hello_id = ++l->next_id;
  st__pack_request_head(&pk, l->hello_id, "peer_hello");
  pack_hello_params(p, &pk);
  l->hello_sent = st__now_mono();
  int rc = st__link_queue(l, sb.data, sb.size);
  msgpack_sbuffer_destroy(&sb);
  if (rc != ST_OK) st__link_close(l, "out of memory (hello)");
}

/* A string field of a map, copied into out (at most len - 1 bytes): 1,
 * 0 when absent or nil (out ""), -1 when it is not a string or too long. */
static int get_str(const msgpack_object *map, const char *key, char *out, size_t len) {
  out[0] = '\0';
  const msgpack_object *o = st__map_get(map, key);
  if (!o || o->type == MSGPACK_OBJECT_NIL) return 0;
  if (o->type != MSGPACK_OBJECT_STR || o->via.str.size >= len) return -1;
  memcpy(out, o->via.str.ptr, o->via.str.size);
  out[o->via.str.size] = '\0';
  return memchr(out, '\0', o->via.str.size) ? -1 : 1;
}

/* Whether the space-separated device lists a and b (either may be NULL)
 * name a device in common: 1 with its name in out. */
static int shared_device(const char *a, const char *b, char *out, size_t len) {
  if (!a || !b) return 0;
  for (const char *s = a; *s;) {
    size_t n = strcspn(s, " ");
    for (const char *t = b; n && *t;) {
      size_t m = strcspn(t, " ");
      if (m == n && !memcmp(s, t, n)) {
        snprintf(out, len, "%.*s", (int)n, s);
        return 1;
      }
      t += m + (t[m] == ' ');
    }
    s += n + (s[n] == ' ');
  }
  return 0;
}

/* Compares the engines of both sides into l->engines. */
static int compare_engines(st__peer_t *p, st__link_t *l, const msgpack_object *list,
                           const char *peer, char *err, size_t errlen) {
  l->nengines = 0;
  size_t n = list && list->type == MSGPACK_OBJECT_ARRAY ? list->via.array.size : 0;
  if (list && list->type != MSGPACK_OBJECT_ARRAY && list->type != MSGPACK_OBJECT_NIL) {
    snprintf(err, errlen, "peer_hello: 'engines' must be an array");
    return -1;
  }
  if (n > ST__PEER_MAX_ENGINES) {
    snprintf(err, errlen, "peer_hello: more than %d engines", ST__PEER_MAX_ENGINES);
    return -1;
  }
  char rname[ST__PEER_MAX_ENGINES][32], rver[ST__PEER_MAX_ENGINES][64],
      rwhy[ST__PEER_MAX_ENGINES][256], rdev[ST__PEER_MAX_ENGINES][ST__PEER_DEVICES_MAX];
  for (size_t i = 0; i < n; i++) {
    const msgpack_object *e = &list->via.array.ptr[i];
    if (e->type != MSGPACK_OBJECT_MAP || get_str(e, "name", rname[i], sizeof rname[i]) != 1 ||
        get_str(e, "version", rver[i], sizeof rver[i]) < 0 ||
        get_str(e, "why", rwhy[i], sizeof rwhy[i]) < 0 ||
        get_str(e, "devices", rdev[i], sizeof rdev[i]) < 0) {
      snprintf(err, errlen, "peer_hello: engine %zu must be {name, version, why, devices?} "
               "(strings or nil, of bounded length)", i + 1);
      return -1;
    }
  }
  /* Every engine either side names. */
  for (size_t i = 0; i < p->nengines + n && l->nengines < 2 * ST__PEER_MAX_ENGINES; i++) {
    const char *name = i < p->nengines ? p->engines[i].name : rname[i - p->nengines];
    int seen = 0;
    for (int k = 0; k < l->nengines; k++) seen |= strcmp(l->engines[k].name, name) == 0;
    if (seen) continue;
    st__link_engine_t *x = &l->engines[l->nengines++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    const char *lwhy = "not reported", *rw = "not reported", *ldev = NULL, *rd = NULL;
    int have_local = 0, have_remote = 0;
    for (size_t k = 0; k < p->nengines; k++)
      if (strcmp(p->engines[k].name, name) == 0) {
        have_local = 1;
        snprintf(x->local, sizeof x->local, "%s", p->engines[k].version ? p->engines[k].version : "");
        lwhy = p->engines[k].why ? p->engines[k].why : "unavailable";
        ldev = p->engines[k].devices;
      }
    for (size_t k = 0; k < n; k++)
      if (strcmp(rname[k], name) == 0) {
        have_remote = 1;
        snprintf(x->remote, sizeof x->remote, "%s", rver[k]);
        rw = rwhy[k][0] ? rwhy[k] : "unavailable";
        rd = rdev[k];
      }
    char shared[64];
    if (!x->local[0])
      st__peer_say(x->why, sizeof x->why, "%s is unavailable on this server (%s)", name,
                   have_local ? lwhy : "not reported");
    else if (!x->remote[0])
      st__peer_say(x->why, sizeof x->why, "%s is unavailable on %s (%s)", name, peer,
                   have_remote ? rw : "not reported");
    else if (strcmp(x->local, x->remote) != 0)
      st__peer_say(x->why, sizeof x->why, "%s versions differ: %s on this server (%s), %s on %s; "
               "they must match exactly", name, x->local, p->conf->id, x->remote, peer);
    else if (shared_device(ldev, rd, shared, sizeof shared))
      st__peer_say(x->why, sizeof x->why, "%s needs a device of its own on each side, and this "
               "server and %s both use %s (two servers on one GPU move CUDA memory over UCX, "
               "staged)", name, peer, shared);
    else
      x->usable = 1;
    if (!x->usable) ST_LOG_W(WHO, "peer %s: %s", peer, x->why);
  }
  return 0;
}

static void link_up(st__peer_t *p, st__link_t *l);

/* The other side's peer_hello, request `id` with params map `m`. */
static void on_hello(st__peer_t *p, st__link_t *l, uint32_t id, const msgpack_object *m) {
  char err[512], peer_id[ST__PEER_ID_MAX + 1], version[64];
  if (l->hello_got) {
    refuse(p, l, id, 1, "peer_hello sent twice");
    return;
  }
  if (!m || get_str(m, "id", peer_id, sizeof peer_id) != 1 || !st__peer_id_ok(peer_id)) {
    refuse(p, l, id, 1, "peer_hello: 'id' must be a peer id (1 to 255 of A-Z a-z 0-9 . _ -)");
    return;
  }
  get_str(m, "version", version, sizeof version);
  const msgpack_object *proto = st__map_get(m, "protocol");
  peer_rec_t *r = st__peer_find(p, peer_id, strlen(peer_id));
  if (l->outgoing && l->peer != r) {
    snprintf(err, sizeof err, "dialled peer '%s' at %s, but the server there says it is '%s'",
             ((peer_rec_t *)l->peer)->e->id, l->remote, peer_id);
    refuse(p, l, id, 1, err);
    return;
  }
  if (!r) {
    snprintf(err, sizeof err, "'%s' is not a peer of server '%s' (add it to peer.peers there)",
             peer_id, p->conf->id);
    refuse(p, l, id, 1, err);
    return;
  }
  l->peer = r;
  if (!proto || proto->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
      proto->via.u64 != ST__PEER_PROTOCOL) {
    snprintf(err, sizeof err, "peer protocol mismatch: server '%s' speaks peer protocol %d "
             "(stserver %s), '%s' speaks %lld (stserver %s)", p->conf->id, ST__PEER_PROTOCOL,
             ST_VERSION_STRING, peer_id,
             proto && proto->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (long long)proto->via.u64
                                                                     : -1LL,
             version[0] ? version : "?");
    refuse(p, l, id, 1, err);
    return;
  }
  if (!st__tls_names_peer(l->tls, peer_id, err, sizeof err)) {
    refuse(p, l, id, 1, err);
    return;
  }
  int links = 0;
  for (st__link_t *k = p->links; k; k = k->next)
    links += k->peer == r && k->stage != ST__LINK_CLOSED;
  if (links > MAX_LINKS_PER_PEER) {
    refuse(p, l, id, 1, "too many links from this peer at once");
    return;
  }
  if (compare_engines(p, l, st__map_get(m, "engines"), peer_id, err, sizeof err) != 0) {
    refuse(p, l, id, 1, err);
    return;
  }
  if (!l->outgoing && p->pending_links > 0) p->pending_links--;
  l->hello_got = 1;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  st__pack_response_head(&pk, id);
  msgpack_pack_map(&pk, 2);
  st__pack_kv_str(&pk, "id", p->conf->id);
  st__pack_kv_int(&pk, "protocol", ST__PEER_PROTOCOL);
  int rc = st__link_queue(l, sb.data, sb.size);
  msgpack_sbuffer_destroy(&sb);
  if (rc != ST_OK) {
    st__link_close(l, "out of memory (hello)");
    return;
  }
  if (l->hello_ok) link_up(p, l);
}

/* The reply to our hello. */
static void on_hello_reply(st__peer_t *p, st__link_t *l, const st__message_t *m) {
  if (m->error.type != MSGPACK_OBJECT_NIL) {
    char why[400] = "refused", msg[512];
    const msgpack_object *e = &m->error;
    if (e->type == MSGPACK_OBJECT_MAP) get_str(e, "message", why, sizeof why);
    snprintf(msg, sizeof msg, "refused by %s: %s", l->remote, why);
    l->refused = 1;
    st__peer_say(l->refusal, sizeof l->refusal, "%s", msg);
    if (l->peer) {
      peer_rec_t *r = l->peer;
      st__peer_say(r->last_error, sizeof r->last_error, "%s", msg);
      r->refused = 1;
    }
    ST_LOG_W(WHO, "%s", msg);
    st__link_close(l, msg);
    return;
  }
  l->hello_ok = 1;
  l->rtt_us = (st__now_mono() - l->hello_sent) * 1e6;
  if (l->hello_got) link_up(p, l);
}

/* Both hellos accepted: l becomes the peer's link, unless another one is
 * up already; then the one dialled by the server whose id sorts first
 * stays. */
static void link_up(st__peer_t *p, st__link_t *l) {
  peer_rec_t *r = l->peer;
  l->up = 1;
  l->deadline = 0;
  if (r->up && r->up != l) {
    int we_first = strcmp(p->conf->id, r->e->id) < 0;
    /* Two links the same way (the peer restarted before the old one was
     * seen to go): the newer stays. */
    int keep_new = l->outgoing == r->up->outgoing ? 1 : l->outgoing == we_first;
    st__link_t *loser = keep_new ? r->up : l;
    ST_LOG_D(WHO, "peer %s: two links; keeping the one dialled by %s", r->e->id,
             we_first ? p->conf->id : r->e->id);
    if (keep_new) r->up = l;
    loser->up = 0;
    st__link_close(loser, "a duplicate link (the other one stays)");
    return;
  }
  r->up = l;
  r->refused = 0;
  r->last_error[0] = '\0';
  r->backoff = 0;
  if (r->dialing == l) r->dialing = NULL;
  char how[160];
  st__tls_describe(l->tls, how, sizeof how);
  ST_LOG_I(WHO, "link to peer %s is up (%s %s, %s)", r->e->id, l->outgoing ? "dialled" : "from",
           l->remote, how);
  notify(p, r);
}

/* ------------------------------------------------------------- messages */

static void on_ping(st__peer_t *p, st__link_t *l, uint32_t id) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  st__pack_response_head(&pk, id);
  st__pack_cstr(&pk, "pong");
  st__peer_send_frame(p, l, &sb);
  msgpack_sbuffer_destroy(&sb);
}

static void on_message(st__link_t *l, st__message_t *m) {
  st__peer_t *p = l->owner;
  char why[400];
  if (l->close_after_flush) return;
  if (m->type == ST_MSG_RESPONSE) {
    if (m->id == l->hello_id && !l->hello_ok) {
      on_hello_reply(p, l, m);
      return;
    }
    if (l->ping_id && m->id == l->ping_id) {
      l->rtt_us = (st__now_mono() - l->ping_sent) * 1e6;
      l->ping_sent = 0;
      l->ping_id = 0;
      return;
    }
    pending_t *q = st__peer_take_pending(p, l->serial, m->id);
    if (!q) {
      ST_LOG_D(WHO, "link %s: a reply to no request (id %u) ignored", l->remote, m->id);
      return;
    }
    if (m->error.type != MSGPACK_OBJECT_NIL) {
      char msg[1024] = "";
      int code = ST_ERR_INTERNAL;
      if (m->error.type == MSGPACK_OBJECT_MAP) {
        get_str(&m->error, "message", msg, sizeof msg);
        const msgpack_object *c = st__map_get(&m->error, "code");
        if (c && c->type == MSGPACK_OBJECT_POSITIVE_INTEGER && c->via.u64 >= 1 &&
            c->via.u64 <= (uint64_t)-ST_ERR_MIN)
          code = -(int)c->via.u64;
      }
      q->cb(q->ud, q->peer, code, msg[0] ? msg : "the peer answered with an error", NULL);
    } else {
      q->cb(q->ud, q->peer, ST_OK, NULL, &m->result);
    }
    free(q);
    return;
  }
  if (m->type != ST_MSG_REQUEST) {
    snprintf(why, sizeof why, "a notification: the peer channel takes requests and replies only");
    ST_LOG_W(WHO, "link %s closed: %s", l->remote, why);
    st__link_close(l, why);
    return;
  }
  char method[64];
  if (m->method_len >= sizeof method || m->method_len < 5 ||
      memcmp(m->method, "peer_", 5) != 0) {
    snprintf(why, sizeof why, "it sent '%.*s': only peer_* methods are served on the peer port",
             (int)(m->method_len < 60 ? m->method_len : 60), m->method);
    ST_LOG_W(WHO, "link %s %s closed: %s", l->outgoing ? "to" : "from", l->remote, why);
    if (!l->hello_got) {
      p->refused_total++;
      st__peer_say(p->last_refused, sizeof p->last_refused, "%s: %s", l->remote, why);
    }
    st__link_close(l, why);
    return;
  }
  memcpy(method, m->method, m->method_len);
  method[m->method_len] = '\0';
  const msgpack_object *params = NULL;
  if (st__params_map(&m->params, &params, why, sizeof why) != ST_OK) {
    st__peer_send_error(p, l, m->id, ST_ERR_INVALID_ARGUMENT, why);
    return;
  }
  if (strcmp(method, "peer_hello") == 0) {
    on_hello(p, l, m->id, params);
    return;
  }
  if (!l->up) {
    snprintf(why, sizeof why, "'%s' before both peer_hellos were accepted", method);
    refuse(p, l, m->id, 1, why);
    return;
  }
  if (strcmp(method, "peer_ping") == 0) {
    on_ping(p, l, m->id);
    return;
  }
  for (int i = 0; i < p->nmethods; i++) {
    if (strcmp(p->methods[i].name, method) == 0) {
      st__peer_req_t req = {.ticket = {l->serial, m->id},
                            .peer = ((peer_rec_t *)l->peer)->e->id,
                            .method = method,
                            .params = params};
      p->methods[i].fn(p, &req, p->methods[i].ud);
      return;
    }
  }
  snprintf(why, sizeof why, "unknown peer method '%s'", method);
  st__peer_send_error(p, l, m->id, ST_ERR_UNKNOWN_METHOD, why);
}

static void on_closed(st__link_t *l, const char *why) {
  st__peer_t *p = l->owner;
  peer_rec_t *r = l->peer;
  if (l->refusal[0]) why = l->refusal;
  if (!l->outgoing && !l->hello_got && p->pending_links > 0) p->pending_links--;
  if (!l->outgoing && !l->hello_got && !l->refused && !p->stopping) {
    /* An incoming link that failed before it said who it is. */
    p->refused_total++;
    st__peer_say(p->last_refused, sizeof p->last_refused, "%s: %s", l->remote, why);
    ST_LOG_W(WHO, "incoming link from %s closed before its hello: %s", l->remote, why);
  }
  st__peer_fail_pending(p, l->serial, p->stopping ? ST_ERR_SHUTTING_DOWN : ST_ERR_IO, why);
  if (!r) return;
  if (r->dialing == l) r->dialing = NULL;
  int was_up = r->up == l;
  if (was_up) {
    r->up = NULL;
    ST_LOG_W(WHO, "link to peer %s is down: %s", r->e->id, why);
  }
  if (was_up || (l->outgoing && !r->up)) {
    st__peer_say(r->last_error, sizeof r->last_error, "%s", why);
    r->refused = l->refused || strstr(why, "TLS handshake failed") != NULL;
  }
  if (l->outgoing && !r->up) {
    /* Dial again after the backoff. */
    r->backoff = r->backoff ? r->backoff * 2 : BACKOFF_MIN_S;
    if (r->backoff > BACKOFF_MAX_S) r->backoff = BACKOFF_MAX_S;
    r->next_dial = st__now_mono() + r->backoff;
    if (!was_up) ST_LOG_D(WHO, "peer %s: %s; next attempt in %.2g s", r->e->id, why, r->backoff);
  } else if (was_up && r->e->addr) {
    r->backoff = BACKOFF_MIN_S;
    r->next_dial = st__now_mono() + r->backoff;
  }
  if (!p->stopping) notify(p, r);
}

static const st__link_hooks_t hooks = {on_secure, on_message, on_closed};

/* ------------------------------------------------------------- sockets */

static void tune_socket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
}

/* A failed attempt of r: the reason, the next attempt after the backoff. */
static void dial_failed(st__peer_t *p, peer_rec_t *r) {
  r->backoff = r->backoff ? r->backoff * 2 : BACKOFF_MIN_S;
  if (r->backoff > BACKOFF_MAX_S) r->backoff = BACKOFF_MAX_S;
  r->next_dial = st__now_mono() + r->backoff;
  notify(p, r);
}

static void connect_to(st__peer_t *p, peer_rec_t *r, struct addrinfo *res);

/* Starts a dial of r. A numeric address connects at once; a host name is
 * resolved on a thread of its own (resolve.h: DNS may take seconds, the
 * loop never waits for it) and connects when the answer comes. */
static void dial(st__peer_t *p, peer_rec_t *r) {
  char host[256], port[16], err[512];
  r->next_dial = 0;
  if (st__peer_split_addr("addr", r->e->addr, host, sizeof host, port, sizeof port, 0, err,
                          sizeof err))
    return;
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_NUMERICSERV | AI_NUMERICHOST},
                  *res = NULL;
  int g = getaddrinfo(host, port, &hints, &res);
  if (g == 0 && res) {
    connect_to(p, r, res);
    return;
  }
  if (g != EAI_NONAME) {
    snprintf(r->last_error, sizeof r->last_error, "cannot resolve %s: %s", r->e->addr,
             gai_strerror(g));
    dial_failed(p, r);
    return;
  }
  if (st__resolver_start(p->resolver, host, port, (uint64_t)(r - p->peers), err, sizeof err) !=
      ST_OK) {
    st__peer_say(r->last_error, sizeof r->last_error, "cannot resolve %s: %s", r->e->addr, err);
    dial_failed(p, r);
    return;
  }
  r->resolving = 1;
  notify(p, r);
}

/* The resolver's answer for peer number `tag` (loop thread). */
static void on_resolved(void *ctx, uint64_t tag, struct addrinfo *res, int gai_error,
                        int sys_errno) {
  st__peer_t *p = ctx;
  peer_rec_t *r = tag < (uint64_t)p->npeers ? &p->peers[tag] : NULL;
  if (!r || p->stopping) {
    if (res) freeaddrinfo(res);
    return;
  }
  r->resolving = 0;
  if (!res) {
    snprintf(r->last_error, sizeof r->last_error, "cannot resolve %s: %s", r->e->addr,
             gai_error == EAI_SYSTEM ? strerror(sys_errno) : gai_strerror(gai_error));
    dial_failed(p, r);
    return;
  }
  connect_to(p, r, res);
}

/* Connects r to the first address of res (freed here). */
static void connect_to(st__peer_t *p, peer_rec_t *r, struct addrinfo *res) {
  char err[512];
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(r->last_error, sizeof r->last_error, "socket: %s", strerror(errno));
    freeaddrinfo(res);
    r->next_dial = st__now_mono() + BACKOFF_MAX_S;
    return;
  }
  tune_socket(fd);
  char remote[96];
  addr_text(res->ai_addr, remote, sizeof remote);
  int c = connect(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (c != 0 && errno != EINPROGRESS) {
    snprintf(r->last_error, sizeof r->last_error, "connect to %s: %s", remote, strerror(errno));
    close(fd);
    dial_failed(p, r);
    return;
  }
  st__link_t *l;
  if (st__link_new(p->loop, fd, p->tls, 1, c != 0, &hooks, p, &l, err, sizeof err) != ST_OK) {
    snprintf(r->last_error, sizeof r->last_error, "%s", err);
    r->next_dial = st__now_mono() + BACKOFF_MAX_S;
    return;
  }
  snprintf(l->remote, sizeof l->remote, "%s", remote);
  l->serial = ++p->next_serial;
  l->peer = r;
  l->deadline = st__now_mono() + p->conf->connect_timeout_s;
  l->next = p->links;
  p->links = l;
  r->dialing = l;
  notify(p, r);
  if (c == 0) st__link_pump(l);
}

static void on_accept(struct ev_loop *loop, ev_io *w, int revents) {
  st__peer_t *p = w->data;
  (void)loop;
  (void)revents;
  for (int i = 0; i < 16; i++) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = accept4(p->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        ST_LOG_W(WHO, "accept on %s: %s", p->listen_addr, strerror(errno));
      return;
    }
    char remote[96], err[512];
    addr_text((struct sockaddr *)&ss, remote, sizeof remote);
    if (p->pending_links >= ST__PEER_MAX_PENDING || p->stopping) {
      p->refused_total++;
      snprintf(p->last_refused, sizeof p->last_refused,
               "%s: %d connections not yet identified already", remote, ST__PEER_MAX_PENDING);
      ST_LOG_W(WHO, "connection from %s refused: %s", remote, p->last_refused);
      close(fd);
      continue;
    }
    tune_socket(fd);
    st__link_t *l;
    if (st__link_new(p->loop, fd, p->tls, 0, 0, &hooks, p, &l, err, sizeof err) != ST_OK) {
      ST_LOG_W(WHO, "connection from %s dropped: %s", remote, err);
      continue;
    }
    snprintf(l->remote, sizeof l->remote, "%s", remote);
    l->serial = ++p->next_serial;
    l->deadline = st__now_mono() + p->conf->connect_timeout_s;
    l->next = p->links;
    p->links = l;
    p->pending_links++;
    ST_LOG_D(WHO, "connection from %s", remote);
  }
}

static int open_listener(st__peer_t *p, char *err, size_t errlen) {
  char host[256], port[16];
  if (st__peer_split_addr("peer.listen", p->conf->listen, host, sizeof host, port, sizeof port,
                          1, err, errlen))
    return ST_ERR_CONFIGURATION;
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                  *res = NULL;
  const char *h = strcmp(host, "*") == 0 ? NULL : host;
  int g = getaddrinfo(h, port, &hints, &res);
  if (g != 0 || !res) {
    snprintf(err, errlen, "peer.listen: cannot resolve \"%s\": %s", p->conf->listen,
             gai_strerror(g));
    return ST_ERR_CONFIGURATION;
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 64) != 0) {
    snprintf(err, errlen, "peer.listen: cannot listen on %s: %s", p->conf->listen,
             strerror(errno));
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
    return ST_ERR_IO;
  }
  freeaddrinfo(res);
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  getsockname(fd, (struct sockaddr *)&ss, &sl);
  addr_text((struct sockaddr *)&ss, p->listen_addr, sizeof p->listen_addr);
  p->lfd = fd;
  ev_io_init(&p->accept_io, on_accept, fd, EV_READ);
  p->accept_io.data = p;
  ev_io_start(p->loop, &p->accept_io);
  return ST_OK;
}

/* ------------------------------------------------------------- timer */

static void send_ping(st__peer_t *p, st__link_t *l) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  l->ping_id = ++l->next_id;
  l->ping_sent = st__now_mono();
  st__pack_request_head(&pk, l->ping_id, "peer_ping");
  msgpack_pack_array(&pk, 0);
  st__peer_send_frame(p, l, &sb);
  msgpack_sbuffer_destroy(&sb);
}

static void on_tick(struct ev_loop *loop, ev_timer *w, int revents) {
  st__peer_t *p = w->data;
  (void)loop;
  (void)revents;
  double now = st__now_mono();
  /* Closed links are freed here, never inside their own callbacks. */
  for (st__link_t **lp = &p->links; *lp;) {
    st__link_t *l = *lp;
    if (l->stage == ST__LINK_CLOSED) {
      *lp = l->next;
      st__link_free(l);
      continue;
    }
    char why[200];
    if (l->close_after_flush && (!st__link_has_output(l) || now > l->deadline)) {
      st__link_close(l, l->refusal[0] ? l->refusal : "refused");
    } else if (!l->up && l->deadline && now > l->deadline) {
      snprintf(why, sizeof why, "%s did not finish within %g s (peer.connect_timeout_s)",
               l->stage == ST__LINK_CONNECT ? "the TCP connect"
               : l->stage == ST__LINK_TLS   ? "the TLS handshake"
                                            : "the peer_hello exchange",
               p->conf->connect_timeout_s);
      st__link_close(l, why);
    } else if (l->up && l->ping_sent && now - l->ping_sent > p->conf->connect_timeout_s) {
      snprintf(why, sizeof why, "no answer to peer_ping within %g s (peer.connect_timeout_s)",
               p->conf->connect_timeout_s);
      st__link_close(l, why);
    } else if (l->up && !l->ping_sent &&
               now - (l->hello_sent > l->opened ? l->hello_sent : l->opened) > PING_EVERY_S) {
      l->hello_sent = now;   /* the next ping is due PING_EVERY_S after this one */
      send_ping(p, l);
    }
    lp = &l->next;
  }
  /* Requests past their deadline. */
  for (pending_t **pp = &p->pending; *pp;) {
    pending_t *q = *pp;
    if (now <= q->deadline) {
      pp = &q->next;
      continue;
    }
    *pp = q->next;
    char why[300];
    snprintf(why, sizeof why, "peer %s did not answer in time", q->peer);
    if (q->cb) q->cb(q->ud, q->peer, ST_ERR_TIMEOUT, why, NULL);
    free(q);
    pp = &p->pending;
  }
  /* Dials due. */
  for (int i = 0; i < p->npeers && !p->stopping; i++) {
    peer_rec_t *r = &p->peers[i];
    if (r->e->addr && !r->up && !r->dialing && !r->resolving && r->next_dial &&
        now >= r->next_dial)
      dial(p, r);
  }
}

/* Output queued by another thread: send it. */
static void on_wake(struct ev_loop *loop, ev_async *w, int revents) {
  st__peer_t *p = w->data;
  (void)loop;
  (void)revents;
  for (st__link_t *l = p->links; l; l = l->next)
    if (l->stage == ST__LINK_OPEN && st__link_has_output(l)) st__link_pump(l);
}

/* ------------------------------------------------------------- start */

static void free_engines(st__peer_t *p) {
  for (size_t i = 0; i < p->nengines; i++) {
    free((char *)p->engines[i].name);
    free((char *)p->engines[i].version);
    free((char *)p->engines[i].why);
    free((char *)p->engines[i].devices);
  }
  p->nengines = 0;
}

/* See peer.h. */
int st__peer_set_engines(st__peer_t *p, const st__peer_engine_t *engines, size_t n) {
  if (n > ST__PEER_MAX_ENGINES) return ST_ERR_LIMIT;
  free_engines(p);
  for (size_t i = 0; i < n; i++) {
    st__peer_engine_t *e = &p->engines[i];
    e->name = strdup(engines[i].name);
    e->version = engines[i].version ? strdup(engines[i].version) : NULL;
    e->why = engines[i].why ? strdup(engines[i].why) : NULL;
    e->devices = engines[i].devices ? strdup(engines[i].devices) : NULL;
    p->nengines = i + 1;
    if (!e->name || (engines[i].version && !e->version) || (engines[i].why && !e->why) ||
        (engines[i].devices && !e->devices))
      return ST_ERR_OUT_OF_MEMORY;
  }
  return ST_OK;
}

static int by_id(const void *a, const void *b) {
  return strcmp(((const peer_rec_t *)a)->e->id, ((const peer_rec_t *)b)->e->id);
}

/* See peer.h. */
int st__peer_start(struct ev_loop *loop, const st__peer_conf_t *conf,
                   const st__peer_engine_t *engines, size_t n, st__peer_t **out, char *err,
                   size_t errlen) {
  *out = NULL;
  if (!st__peer_configured(conf)) return ST_OK;
  int rc = st__peer_check(conf, geteuid(), err, errlen);
  if (rc != ST_OK) return rc;
  st__peer_t *p = calloc(1, sizeof *p);
  if (!p) {
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  p->loop = loop;
  p->thread = pthread_self();
  p->conf = conf;
  p->lfd = -1;
  st__tls_conf_t tc = {.secret = conf->secret, .cert = conf->tls_cert, .key = conf->tls_key,
                       .ca = conf->tls_ca, .owner = geteuid()};
  rc = st__tls_ctx_new(&tc, &p->tls, err, errlen);
  if (rc == ST_OK && st__peer_set_engines(p, engines, n) != ST_OK) {
    snprintf(err, errlen, "out of memory");
    rc = ST_ERR_OUT_OF_MEMORY;
  }
  if (rc == ST_OK && conf->listen) rc = open_listener(p, err, errlen);
  if (rc != ST_OK) {
    free_engines(p);
    st__tls_ctx_free(p->tls);
    free(p);
    return rc;
  }
  double now = st__now_mono(), unix_now = st__now_unix();
  p->npeers = conf->npeers;
  for (int i = 0; i < conf->npeers; i++) {
    p->peers[i].e = &conf->peers[i];
    p->peers[i].since = unix_now;
    p->peers[i].next_dial = conf->peers[i].addr ? now : 0;
  }
  qsort(p->peers, (size_t)p->npeers, sizeof p->peers[0], by_id);
  ev_timer_init(&p->tick, on_tick, TICK_S, TICK_S);
  p->tick.data = p;
  ev_timer_start(loop, &p->tick);
  ev_async_init(&p->wake, on_wake);
  p->wake.data = p;
  ev_async_start(loop, &p->wake);
  if (st__resolver_new(loop, on_resolved, p, &p->resolver) != ST_OK) {
    snprintf(err, errlen, "out of memory");
    ev_timer_stop(loop, &p->tick);
    ev_async_stop(loop, &p->wake);
    if (p->lfd >= 0) {
      ev_io_stop(loop, &p->accept_io);
      close(p->lfd);
    }
    free_engines(p);
    st__tls_ctx_free(p->tls);
    free(p);
    return ST_ERR_OUT_OF_MEMORY;
  }
  if (conf->listen)
    ST_LOG_I(WHO, "server '%s' listening for peers on %s (TLS 1.3, %s); %d peer(s)", conf->id,
             p->listen_addr, st__tls_ctx_mode(p->tls), p->npeers);
  else
    ST_LOG_I(WHO, "server '%s': no peer listener; dialling %d peer(s) (TLS 1.3, %s)", conf->id,
             p->npeers, st__tls_ctx_mode(p->tls));
  for (int i = 0; i < p->npeers; i++) {
    peer_rec_t *r = &p->peers[i];
    if (r->e->addr) dial(p, r);
  }
  *out = p;
  return ST_OK;
}

/* See peer.h. */
void st__peer_stop(st__peer_t *p) {
  if (!p) return;
  p->stopping = 1;
  for (st__link_t *l = p->links; l; l = l->next) st__link_close(l, "this server is stopping");
  st__peer_fail_pending(p, 0, ST_ERR_SHUTTING_DOWN, "this server is stopping");
  while (p->links) {
    st__link_t *l = p->links;
    p->links = l->next;
    st__link_free(l);
  }
  if (p->lfd >= 0) {
    ev_io_stop(p->loop, &p->accept_io);
    close(p->lfd);
  }
  ev_timer_stop(p->loop, &p->tick);
  ev_async_stop(p->loop, &p->wake);
  st__resolver_free(p->resolver);
  free_engines(p);
  st__tls_ctx_free(p->tls);
  free(p);
}
