/* src/server: the side of a hand-off across servers that mirrors a
 * peer's hand-off (handoff_link.h; docs/multihost.md, "Hand-offs across
 * servers").
 *
 * The first handoff_open of "name@peer" subscribes to the peer's
 * hand-off `name` (peer_handoff_subscribe) and, once the peer answered
 * with its geometry, makes the mirror: a hand-off here named
 * "name@peer", of the same chunks and chunk size, `consumers` slots (the
 * first opener's count, 1 by default) on the opener's device (the
 * peer's kind of memory unless `device` says), owned and charged to the
 * first opener's uid, whose producer is this server (a connection id of
 * its own, ST__HANDOFF_MIRROR_CONN). Openers that came meanwhile are
 * answered then; later ones open it as any hand-off.
 *
 * The peer announces what its producer published (peer_handoff_ready
 * {sub, chunks: [[chunk, seq, bytes], ...]}); the entries queue here, in
 * order. Up to two batches of a mirror move at once (one lands while the
 * next sets up): each entry whose chunk here is free is taken for the
 * producer (an entry for a chunk whose earlier entry still waits or moves
 * waits too, so a chunk's publishes land in order), the helper opens a
 * receive of one window per chunk, the peer is asked for the bytes
 * (peer_handoff_send), and when every byte is in, each chunk is
 * published here under the peer's sequence number (st__handoff_publish_as)
 * while the peer clears its slot's bit in its own chunk. A chunk whose
 * consumers here have not acknowledged its last publish holds its entry
 * back (a 1 ms timer looks again), and so the peer's producer, whose
 * chunk stays pending for the mirror, is held back too: memory is bounded
 * on both sides. A failed batch gives its chunks back and is tried again
 * after 100 ms; a batch the peer refuses as stale is dropped.
 *
 * The mirror ends when its last consumer leaves (the subscription with
 * it). The peer's link going down, the hand-off deleted there or its
 * producer gone with everything moved, sets PRODUCER_GONE here: what was
 * published stays readable and acknowledgeable, waits for more fail.
 *
 * Loop 0, the write side of the server lock, but st__mirror_open and
 * st__mirrors_check (any loop, the write side held).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "engine/handoff.h"
#include "server/handoff_link.h"
#include "server/holdings.h"
#include "server/work.h"
#include "st/errors.h"

/* Mirrors being subscribed at once, and openers waiting on one. */
#define OPENING_MAX 64
#define WAITERS_MAX 64
/* Chunks one batch moves at most (the peer's limit too). */
#define BATCH_MAX 256
/* Batches of one mirror in flight at once (each one transfer, within the
 * peer's peer.max_transfers_per_peer). */
#define INFLIGHT_MAX 2
/* The look for freed chunks, and the wait before a failed batch again. */
#define POLL_S 0.001
#define RETRY_S 0.1
/* Batches failing in a row (BUSY aside) before the mirror is lost: a
 * failure that repeats (an engine that cannot move this memory) ends the
 * wait of the consumers instead of retrying for ever. */
#define FAILS_MAX 20

enum { M_OPENING, M_LIVE, M_LOST };

typedef struct waiter {
  uint64_t conn;
  uint32_t id;
  int device;                         /* its socket's CUDA device, or -1 */
  st__who_t who;
} waiter_t;

typedef struct entry {
  uint32_t chunk, seq;
  uint64_t bytes;
} entry_t;

struct st__mirror;

/* One batch in flight: a transfer of its chunks' windows. */
typedef struct batch {
  struct st__mirror *m;
  int xfer_open;                      /* moving: the helper's done is still
                                         to come                           */
  int refused;                        /* the peer's error for it, 0: none  */
  uint64_t xfer, xid, req;            /* the helper's id, the wire's, the
                                         peer_handoff_send in flight       */
  entry_t e[BATCH_MAX];
  uint32_t n;
  double t0;
} batch_t;

typedef struct st__mirror {
  struct st__mirror *next;
  st__server_t *srv;
  uint64_t sub;                       /* its id to the peer                */
  char peer[ST__PEER_ID_MAX + 1];
  char src[ST__HANDOFF_NAME_MAX + 1]; /* the peer's name                   */
  char local[ST__HANDOFF_NAME_MAX + 1];   /* "src@peer"                    */
  uint64_t serial, conn;              /* the hand-off here, its producer   */
  int state;
  int ended;                          /* unlinked: the helper's done frees it */
  int src_gone;                       /* the peer said: nothing more comes */
  char why[400];
  uint32_t chunks, consumers;
  uint64_t chunk_bytes, stride;
  int device;                         /* here; -3: the peer's kind         */
  uid_t uid;                          /* the first opener's                */
  char engine[16];
  waiter_t waiters[WAITERS_MAX];
  unsigned nwaiters;
  uint64_t req;                       /* the subscription's request        */
  entry_t *q;                         /* announced, not moved, in order    */
  uint32_t qlen, qcap;                /* qlen + every batch's n <= qcap    */
  batch_t b[INFLIGHT_MAX];
  unsigned fails;                     /* batches failed in a row (BUSY aside) */
  ev_timer timer;                     /* the look again, or the retry      */
  int timer_on;
  uint64_t chunks_in, bytes_in;
} st__mirror_t;

static st__handoffs_t *table(st__server_t *srv) { return ST__HOLDING_STATE(srv, handoffs); }

static st__handoff_t *local_of(st__mirror_t *m) {
  return m->serial ? st__handoff_find(table(m->srv), m->local, m->serial) : NULL;
}

static void timer_stop(st__mirror_t *m) {
  if (m->timer_on) {
    ev_timer_stop(m->srv->loop, &m->timer);
    m->timer_on = 0;
  }
}

static void timer_in(st__mirror_t *m, double s) {
  if (m->timer_on) return;
  ev_timer_set(&m->timer, s, 0);
  ev_timer_start(m->srv->loop, &m->timer);
  m->timer_on = 1;
}

static void mirror_unlink(st__mirror_t *m) {
  for (st__mirror_t **pp = &m->srv->remote->mirrors; *pp; pp = &(*pp)->next)
    if (*pp == m) {
      *pp = m->next;
      return;
    }
}

static void mirror_free(st__mirror_t *m) {
  timer_stop(m);
  if (m->req && m->srv->peer) st__peer_cancel(m->srv->peer, m->req);
  for (int i = 0; i < INFLIGHT_MAX; i++)
    if (m->b[i].req && m->srv->peer) st__peer_cancel(m->srv->peer, m->b[i].req);
  free(m->q);
  free(m);
}

/* The batches that move, and their entries. */
static unsigned batches_moving(const st__mirror_t *m) {
  unsigned n = 0;
  for (int i = 0; i < INFLIGHT_MAX; i++) n += (unsigned)m->b[i].xfer_open;
  return n;
}

static uint32_t moving_entries(const st__mirror_t *m) {
  uint32_t n = 0;
  for (int i = 0; i < INFLIGHT_MAX; i++) n += m->b[i].xfer_open ? m->b[i].n : 0;
  return n;
}

/* Asks the helper to stop every batch still open. */
static void abort_batches(st__mirror_t *m, const char *why) {
  for (int i = 0; i < INFLIGHT_MAX; i++)
    if (m->b[i].xfer_open) st__xfer_sup_abort(m->srv->remote->sup, m->b[i].xfer, why);
}

/* ------------------------------------------------------------- openers */

/* Answers every opener that waits with an error. */
static void refuse_waiters(st__mirror_t *m, int code, const char *why) {
  for (unsigned i = 0; i < m->nwaiters; i++) {
    st__conn_t *c = st__conn_find(m->srv, m->waiters[i].conn);
    if (!c || c->dead) continue;
    st__conn_send_error(c, m->waiters[i].id, code, why);
    st__conn_request_done(c);
  }
  m->nwaiters = 0;
}

/* Opens the mirror here for connection `conn` and answers request id. */
static void open_for(st__mirror_t *m, st__conn_t *c, uint32_t id, const st__who_t *who) {
  char err[400];
  st__handoff_t *h = NULL;
  uint32_t slot = 0;
  int rc = st__handoff_open(table(m->srv), m->local, strlen(m->local), c->id, who,
                            m->srv->cfg->max_handoffs_per_connection, &h, &slot, err, sizeof err);
  if (rc != ST_OK) st__conn_send_error(c, id, rc, err);
  else st__handoff_reply(c, id, h, (int)slot);
}

static void end_if_unused(st__mirror_t *m);

/* ------------------------------------------------------------- moving */

static void pump(st__mirror_t *m);
static void unsubscribe(st__mirror_t *m);

/* The local hand-off says the producer is gone (waits fail; what was
 * published stays). */
static void say_gone(st__mirror_t *m) {
  st__handoff_t *h = local_of(m);
  if (h) st__handoff_producer_gone(h);
}

/* m no longer follows its source (`why`): the hand-off here says the
 * producer is gone (what was published stays readable), the batch in
 * flight is aborted, the queue dropped; a new open is refused until its
 * consumers closed it. */
static void mirror_lose(st__mirror_t *m, const char *why) {
  m->state = M_LOST;
  snprintf(m->why, sizeof m->why, "%s", why);
  timer_stop(m);
  ST_LOG_W("peer", "mirror '%s' lost its source: %s; what was published stays readable",
           m->local, why);
  say_gone(m);
  abort_batches(m, why);
  m->qlen = 0;
}

/* Gives back the chunks of batch b (not published). */
static void batch_untake(batch_t *b) {
  st__handoff_t *h = local_of(b->m);
  for (uint32_t k = 0; h && k < b->n; k++) st__handoff_untake(h->page, b->e[k].chunk);
  b->n = 0;
}

/* The batch did not land: its chunks here are given back; its entries go
 * back to the head of the queue and are tried again later, but when the
 * peer no longer has them for us (a stale batch: they are not coming). */
static void batch_failed(batch_t *b, int code, const char *why) {
  st__mirror_t *m = b->m;
  uint32_t n = b->n;
  entry_t back[BATCH_MAX];
  memcpy(back, b->e, n * sizeof *back);
  batch_untake(b);
  if (m->state != M_LIVE) return;
  if (code == ST_ERR_STALE_HANDLE || code == ST_ERR_NOT_FOUND) {
    ST_LOG_W("peer", "mirror '%s': the peer refused a batch (%s): dropped", m->local, why);
    pump(m);
    return;
  }
  /* Back in front, in their order: an entry behind them for one of their
   * chunks stays behind (the queue with the batch never holds more than
   * qcap: on_ready). */
  memmove(m->q + n, m->q, m->qlen * sizeof *m->q);
  memcpy(m->q, back, n * sizeof *m->q);
  m->qlen += n;
  if (code != ST_ERR_BUSY && ++m->fails >= FAILS_MAX) {
    char lost[sizeof m->why];
    snprintf(lost, sizeof lost, "%u batches in a row failed; the last: %s", m->fails, why);
    mirror_lose(m, lost);
    unsubscribe(m);
    return;
  }
  ST_LOG_W("peer", "mirror '%s': a batch failed (%s): tried again in %g s", m->local, why,
           RETRY_S);
  timer_stop(m);
  timer_in(m, RETRY_S);
}

/* Every byte of the batch is in: each chunk is published here under the
 * peer's sequence number. The batch's entries leave the queue: they are
 * its first ones, in order (pump takes them so). */
static void batch_landed(batch_t *b, uint64_t bytes) {
  st__mirror_t *m = b->m;
  st__handoff_t *h = local_of(m);
  for (uint32_t k = 0; h && k < b->n; k++)
    st__handoff_publish_as(h->page, b->e[k].chunk, b->e[k].bytes, b->e[k].seq);
  m->chunks_in += b->n;
  m->bytes_in += bytes;
  m->fails = 0;
  ST_LOG_D("peer", "mirror '%s': %u chunks (%llu bytes) in %.3f ms", m->local, b->n,
           (unsigned long long)bytes, (st__now_mono() - b->t0) * 1e3);
  b->n = 0;
  pump(m);
}

static void answered(void *ud, const char *peer, int code, const char *message,
                     const msgpack_object *result) {
  batch_t *b = ud;
  st__mirror_t *m = b->m;
  st__server_t *srv = m->srv;
  (void)peer;
  b->req = 0;
  char err[400] = "";
  const msgpack_object *blob = NULL;
  int rc = st__remote_answer_blob(m->peer, "peer_handoff_send", code, message, result, &blob, err,
                                  sizeof err);
  if (rc == ST_OK && (m->state != M_LIVE || !local_of(m))) {
    rc = ST_ERR_CANCELLED;
    snprintf(err, sizeof err, "the mirror ended");
  } else if (rc == ST_OK) {
    st__handoff_t *h = local_of(m);
    uint32_t chunk[BATCH_MAX];
    uint64_t len[BATCH_MAX];
    for (uint32_t k = 0; k < b->n; k++) {
      chunk[k] = b->e[k].chunk;
      len[k] = b->e[k].bytes;
    }
    st__xfer_sup_arena_t wins[BATCH_MAX];
    st__arena_desc_t desc;
    int fd = st__handoff_windows(h->named.data, 0, m->stride, chunk, len, b->n, wins, &desc,
                                 err, sizeof err);
    rc = fd < 0 ? fd
                : st__xfer_sup_start(srv->remote->sup, b->xfer,
                                     (const uint8_t *)blob->via.bin.ptr, blob->via.bin.size,
                                     wins, b->n, err, sizeof err);
    if (fd >= 0) close(fd);
  }
  /* The helper's done ends the batch either way; it fails with the
   * peer's own code (a stale batch is dropped, not tried again). */
  if (rc != ST_OK) {
    b->refused = rc;
    st__xfer_sup_abort(srv->remote->sup, b->xfer, err);
  }
}

static void xfer_opened(void *ud, uint64_t xfer, const uint8_t *blob, size_t len) {
  batch_t *b = ud;
  st__mirror_t *m = b->m;
  st__server_t *srv = m->srv;
  (void)xfer;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__remote_pack_begin(&sb, &pk, 1);
  msgpack_pack_map(&pk, 5);
  st__pack_kv_uint(&pk, "sub", m->sub);
  st__pack_kv_uint(&pk, "xfer", b->xid);
  st__pack_kv_str(&pk, "engine", m->engine);
  st__pack_cstr(&pk, "blob");
  msgpack_pack_bin(&pk, len);
  msgpack_pack_bin_body(&pk, blob, len);
  st__pack_cstr(&pk, "chunks");
  msgpack_pack_array(&pk, b->n);
  for (uint32_t k = 0; k < b->n; k++) {
    msgpack_pack_array(&pk, 3);
    msgpack_pack_uint32(&pk, b->e[k].chunk);
    msgpack_pack_uint32(&pk, b->e[k].seq);
    msgpack_pack_uint64(&pk, b->e[k].bytes);
  }
  char err[400];
  int rc = st__peer_request(srv->peer, m->peer, "peer_handoff_send", sb.data, sb.size,
                            st__remote_connect_timeout(srv), answered, b, &b->req, err,
                            sizeof err);
  msgpack_sbuffer_destroy(&sb);
  if (rc != ST_OK) st__xfer_sup_abort(srv->remote->sup, b->xfer, err);
}

static void xfer_done(void *ud, uint64_t xfer, int ok, uint64_t bytes, int code,
                      const char *error) {
  batch_t *b = ud;
  st__mirror_t *m = b->m;
  (void)xfer;
  b->xfer_open = 0;
  if (b->req) {
    st__peer_cancel(m->srv->peer, b->req);
    b->req = 0;
  }
  if (m->ended) {   /* end_if_unused let it go meanwhile: the last done frees it */
    b->n = 0;
    if (!batches_moving(m)) mirror_free(m);
    return;
  }
  if (ok && m->state == M_LIVE) batch_landed(b, bytes);
  else batch_failed(b, b->refused ? b->refused : ok ? ST_ERR_CANCELLED : code,
                    error && error[0] ? error : st_err_name(code));
}

static const st__xfer_sup_cbs_t mirror_cbs = {xfer_opened, NULL, xfer_done};

/* Moves the next batches while fewer than INFLIGHT_MAX move: each takes
 * the queue's entries whose chunks here are free, in order. */
static void pump(st__mirror_t *m) {
  st__server_t *srv = m->srv;
  while (batches_moving(m) < INFLIGHT_MAX && m->state == M_LIVE && !m->timer_on) {
    if (!m->qlen) {
      if (m->src_gone && !batches_moving(m)) say_gone(m);
      return;
    }
    st__handoff_t *h = local_of(m);
    if (!h || !srv->remote->sup) return;
    batch_t *b = NULL;
    for (int i = 0; i < INFLIGHT_MAX && !b; i++)
      if (!m->b[i].xfer_open) b = &m->b[i];
    /* Every entry whose chunk here is free goes, but an entry behind one
     * of the same chunk that stays (the publishes of one chunk land in
     * order; a chunk a batch moves is taken, so its next entry stays);
     * the rest keep their order. */
    uint32_t n = 0, kept = 0;
    uint8_t *seen = calloc(m->chunks, 1);   /* 1: taken now, 2: held back */
    if (!seen) {
      timer_in(m, RETRY_S);
      return;
    }
    for (uint32_t i = 0; i < m->qlen; i++) {
      const entry_t e = m->q[i];
      if (n < BATCH_MAX && !seen[e.chunk] && st__handoff_take(h->page, e.chunk)) {
        seen[e.chunk] = 1;
        b->e[n++] = e;
      } else {
        seen[e.chunk] = 2;
        m->q[kept++] = e;
      }
    }
    free(seen);
    m->qlen = kept;
    b->n = n;
    if (!n) {   /* every chunk waits for its consumers here, or moves */
      if (!batches_moving(m)) timer_in(m, POLL_S);
      return;
    }
    char err[400];
    double timeout = st__remote_transfer_timeout(srv);
    int rc = st__xfer_sup_open(srv->remote->sup, m->engine, ST_XFER_RECV, 2, 1,
                               (uint32_t)(timeout * 1e3), &mirror_cbs, b, &b->xfer, err,
                               sizeof err);
    if (rc != ST_OK) {
      batch_failed(b, rc, err);   /* back at the head, and again later */
      return;
    }
    b->xfer_open = 1;
    b->refused = 0;
    b->xid = ++srv->remote->next_xfer | (1ull << 61);
    b->t0 = st__now_mono();
  }
}

static void on_timer(struct ev_loop *loop, ev_timer *w, int revents) {
  (void)loop, (void)revents;
  st__mirror_t *m = w->data;
  m->timer_on = 0;
  pump(m);
}

/* ------------------------------------------------------------- the peer's messages */

static st__mirror_t *by_sub(const st__server_t *srv, const char *peer, uint64_t sub) {
  for (st__mirror_t *m = srv->remote->mirrors; m; m = m->next)
    if (m->sub == sub && !strcmp(m->peer, peer)) return m;
  return NULL;
}

/* peer_handoff_ready {sub, chunks: [[chunk, seq, bytes], ...]} or {sub,
 * gone: true, why} -> true. */
static void on_ready(st__peer_t *p, const st__peer_req_t *req, void *ud) {
  st__server_t *srv = ud;
  uint64_t sub = 0;
  if (!st__remote_param_u64(req->params, "sub", &sub)) {
    st__peer_reply_error(p, req->ticket, ST_ERR_INVALID_ARGUMENT, "peer_handoff_ready needs sub");
    return;
  }
  st__mirror_t *m = by_sub(srv, req->peer, sub);
  st__remote_reply_true(p, req->ticket);
  if (!m || m->state != M_LIVE) return;
  const msgpack_object *gone = st__map_get(req->params, "gone");
  if (gone && gone->type == MSGPACK_OBJECT_BOOLEAN && gone->via.boolean) {
    st__remote_param_str(req->params, "why", m->why, sizeof m->why);
    ST_LOG_I("peer", "mirror '%s': %s on '%s'", m->local, m->why[0] ? m->why : "gone", m->peer);
    m->src_gone = 1;
    pump(m);
    return;
  }
  const msgpack_object *list = st__map_get(req->params, "chunks");
  if (!list || list->type != MSGPACK_OBJECT_ARRAY) return;
  for (uint32_t k = 0; k < list->via.array.size; k++) {
    const msgpack_object *e = &list->via.array.ptr[k];
    uint64_t v[3];
    int ok = e->type == MSGPACK_OBJECT_ARRAY && e->via.array.size == 3;
    for (int j = 0; ok && j < 3; j++) {
      ok = e->via.array.ptr[j].type == MSGPACK_OBJECT_POSITIVE_INTEGER;
      if (ok) v[j] = e->via.array.ptr[j].via.u64;
    }
    /* Checked against this side's geometry: the peer cannot make the
     * mirror move past a chunk, or queue without bound (each chunk is
     * pending at most once there until this side took it). */
    if (!ok || v[0] >= m->chunks || v[1] == 0 || v[1] > UINT32_MAX || v[2] > m->chunk_bytes ||
        m->qlen + moving_entries(m) >= m->qcap) {
      ST_LOG_W("peer", "mirror '%s': peer '%s' announced a chunk it cannot have (entry %u): "
               "ignored", m->local, m->peer, k);
      continue;
    }
    m->q[m->qlen++] = (entry_t){.chunk = (uint32_t)v[0], .seq = (uint32_t)v[1], .bytes = v[2]};
  }
  pump(m);
}

int st__mirror_methods(st__server_t *srv) {
  return st__peer_method_add(srv->peer, "peer_handoff_ready", on_ready, srv) == ST_OK
             ? ST_OK
             : ST_ERR_INTERNAL;
}

/* ------------------------------------------------------------- opening */

/* Tells the peer the mirror no longer follows (its slot there closes). */
static void unsubscribe(st__mirror_t *m) {
  st__server_t *srv = m->srv;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__remote_pack_begin(&sb, &pk, 1);
  msgpack_pack_map(&pk, 1);
  st__pack_kv_uint(&pk, "sub", m->sub);
  char e[200];
  st__peer_request(srv->peer, m->peer, "peer_handoff_unsubscribe", sb.data, sb.size,
                   st__remote_connect_timeout(srv), st__remote_ignore_reply, NULL, NULL, e,
                   sizeof e);
  msgpack_sbuffer_destroy(&sb);
}

/* The peer's answer to peer_handoff_subscribe: the mirror is made here
 * and its openers attached. */
static void subscribed(void *ud, const char *peer, int code, const char *message,
                       const msgpack_object *result) {
  st__mirror_t *m = ud;
  st__server_t *srv = m->srv;
  const st__config_t *cfg = srv->cfg;
  (void)peer;
  m->req = 0;
  int peer_took = code == ST_OK;   /* it holds a slot for us */
  char err[1200] = "", why[400];
  uint64_t chunks = 0, chunk_bytes = 0, stride = 0;
  char device[16] = "";
  if (code == ST_OK &&
      (!st__remote_param_u64(result, "chunks", &chunks) ||
       !st__remote_param_u64(result, "chunk_bytes", &chunk_bytes) ||
       !st__remote_param_u64(result, "stride", &stride) ||
       !st__remote_param_str(result, "device", device, sizeof device))) {
    code = ST_ERR_PROTOCOL;
    message = "the answer to peer_handoff_subscribe lacks the geometry";
  }
  int src_cuda = !strcmp(device, "cuda");
  int dev = m->device;
  if (code == ST_OK) {
    if (dev == -3) dev = src_cuda ? m->waiters[0].device : -1;
    snprintf(m->engine, sizeof m->engine, "%s",
             st__remote_engine_for(src_cuda, dev >= 0,
                                   src_cuda && dev >= 0 &&
                                       st__peer_engine_usable(srv->peer, m->peer, "nccl", why,
                                                              sizeof why)));
    if (!st__peer_engine_usable(srv->peer, m->peer, m->engine, why, sizeof why)) {
      code = ST_ERR_CAPABILITY;
      snprintf(err, sizeof err, "hand-off '%s' of '%s' moves over %s: %s", m->src, m->peer,
               m->engine, why);
      message = err;
    }
  }
  st__handoff_t *h = NULL;
  if (code == ST_OK) {
    st__handoff_spec_t s = {.name = m->local, .name_len = strlen(m->local), .device = dev,
                            .chunk_bytes = chunk_bytes, .chunks = chunks,
                            .consumers = m->consumers,
                            .max_chunks = (uint64_t)cfg->max_handoff_chunks,
                            .max_per_connection = 1, .mirror = 1};
    code = st__handoff_create(table(srv), &s, m->conn, m->uid, &h, why, sizeof why);
    if (code == ST_OK && h->stride != stride) code = ST_ERR_PROTOCOL;
    if (code != ST_OK) {
      snprintf(err, sizeof err, "the mirror of hand-off '%s' of '%s' could not be made: %s",
               m->src, m->peer, code == ST_ERR_PROTOCOL ? "another chunk stride" : why);
      message = err;
      if (h) st__handoff_close(table(srv), m->local, strlen(m->local), m->conn, why, sizeof why);
    }
  }
  if (code != ST_OK) {
    char m2[1400];
    snprintf(m2, sizeof m2, "handoff_open: %s: %s", m->local,
             message ? message : st_strerror(code));
    ST_LOG_W("peer", "%s", m2);
    refuse_waiters(m, code, m2);
    if (peer_took) unsubscribe(m);
    mirror_unlink(m);
    mirror_free(m);
    return;
  }
  m->serial = h->serial;
  m->chunks = (uint32_t)chunks;
  m->chunk_bytes = chunk_bytes;
  m->stride = stride;
  m->qcap = 2 * m->chunks;
  m->q = calloc(m->qcap, sizeof *m->q);
  m->state = M_LIVE;
  ST_LOG_I("peer", "mirror '%s' follows hand-off '%s' of '%s' (%u chunks of %llu bytes, %s, "
           "over %s)", m->local, m->src, m->peer, m->chunks, (unsigned long long)chunk_bytes,
           dev < 0 ? "cpu" : "cuda", m->engine);
  for (unsigned i = 0; i < m->nwaiters; i++) {
    st__conn_t *c = st__conn_find(srv, m->waiters[i].conn);
    if (!c || c->dead) continue;
    if (!m->q) st__conn_send_error(c, m->waiters[i].id, ST_ERR_OUT_OF_MEMORY, "out of memory");
    else open_for(m, c, m->waiters[i].id, &m->waiters[i].who);
    st__conn_request_done(c);
  }
  m->nwaiters = 0;
  if (!m->q) m->state = M_LOST;
  end_if_unused(m);
}

void st__mirror_open(st__rpc_req_t *r, const char *name, size_t len) {
  st__conn_t *c = r->c;
  st__server_t *srv = c->srv;
  st__remote_t *rm = srv->remote;
  const char *at = memchr(name, '@', len);
  size_t nlen = (size_t)(at - name), plen = len - nlen - 1;
  char src[ST__HANDOFF_NAME_MAX + 1], peer[ST__PEER_ID_MAX + 1], local[ST__HANDOFF_NAME_MAX + 1];
  char err[500];
  if (nlen == 0 || plen == 0 || nlen > ST__HANDOFF_NAME_MAX || plen > ST__PEER_ID_MAX ||
      len > ST__HANDOFF_NAME_MAX || memchr(at + 1, '@', plen)) {
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "handoff_open: '%.*s': a peer's hand-off is "
                  "name@peer, at most %d bytes", (int)(len > 80 ? 80 : len), name,
                  ST__HANDOFF_NAME_MAX);
    return;
  }
  memcpy(src, name, nlen);
  src[nlen] = 0;
  memcpy(peer, at + 1, plen);
  peer[plen] = 0;
  memcpy(local, name, len);
  local[len] = 0;
  if (st__named_check("hand-off", src, nlen, err, sizeof err) != ST_OK) {
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "handoff_open: %s", err);
    return;
  }
  if (!rm || !srv->peer) {
    st__rpc_error(r, ST_ERR_CAPABILITY, "handoff_open: '%s': this server has no peers (the "
                  "peer section of its config)", local);
    return;
  }
  st__who_t who;
  st__rpc_who(r, &who);
  who.in_group = NULL;   /* the socket may be gone when the answer comes */
  st__mirror_t *m = rm->mirrors;
  while (m && strcmp(m->local, local)) m = m->next;
  if (m && m->state == M_LIVE) {   /* made: open it as any hand-off */
    open_for(m, c, r->id, &who);
    return;
  }
  if (m && m->state == M_LOST) {
    st__rpc_error(r, ST_ERR_CAPABILITY, "handoff_open: mirror '%s' lost its source (%s); it "
                  "ends when its consumers close it", local, m->why);
    return;
  }
  if (m) {   /* being subscribed: answered with the others */
    if (m->nwaiters >= WAITERS_MAX) {
      st__rpc_error(r, ST_ERR_BUSY, "handoff_open: '%s' is being opened by %d requests "
                    "already", local, WAITERS_MAX);
      return;
    }
    m->waiters[m->nwaiters++] = (waiter_t){.conn = c->id, .id = r->id, .who = who};
    c->inflight++;
    return;
  }
  int up = st__remote_peer_up(srv, peer, err, sizeof err);
  if (up != ST_OK) {
    st__rpc_error(r, up, "handoff_open: %s", err);
    return;
  }
  unsigned opening = 0;
  for (const st__mirror_t *o = rm->mirrors; o; o = o->next) opening += o->state == M_OPENING;
  uint64_t consumers = st__rpc_u64(r, "consumers", 1);
  if (opening >= OPENING_MAX || consumers == 0 || consumers > ST__HANDOFF_MAX_CONSUMERS) {
    if (opening >= OPENING_MAX)
      st__rpc_error(r, ST_ERR_BUSY, "handoff_open: %d mirrors are being opened already",
                    OPENING_MAX);
    else
      st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "handoff_open: 'consumers' must be 1 to %u",
                    ST__HANDOFF_MAX_CONSUMERS);
    return;
  }
  int device = st__rpc_arg(r, "device") ? st__rpc_device(r) : -3;
  if (device == -2) return;   /* answered */
  m = calloc(1, sizeof *m);
  if (!m) {
    st__rpc_error(r, ST_ERR_OUT_OF_MEMORY, "out of memory");
    return;
  }
  m->srv = srv;
  for (int i = 0; i < INFLIGHT_MAX; i++) m->b[i].m = m;
  m->sub = ++rm->next_xfer | (1ull << 60);
  m->conn = ST__HANDOFF_MIRROR_CONN | m->sub;
  snprintf(m->peer, sizeof m->peer, "%s", peer);
  snprintf(m->src, sizeof m->src, "%s", src);
  snprintf(m->local, sizeof m->local, "%s", local);
  m->consumers = (uint32_t)consumers;
  m->device = device;
  m->uid = who.uid;
  m->state = M_OPENING;
  ev_timer_init(&m->timer, on_timer, POLL_S, 0);
  m->timer.data = m;
  m->waiters[m->nwaiters++] =
      (waiter_t){.conn = c->id, .id = r->id, .who = who,
                 .device = st__devices_cuda(&srv->devices, c->device) ? c->device : -1};
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__remote_pack_begin(&sb, &pk, 1);
  msgpack_pack_map(&pk, 2);
  st__pack_kv_str(&pk, "name", src);
  st__pack_kv_uint(&pk, "sub", m->sub);
  int rc = st__peer_request(srv->peer, peer, "peer_handoff_subscribe", sb.data, sb.size,
                            st__remote_connect_timeout(srv), subscribed, m, &m->req, err,
                            sizeof err);
  msgpack_sbuffer_destroy(&sb);
  if (rc != ST_OK) {
    free(m);
    st__rpc_error(r, rc, "handoff_open: %s", err);
    return;
  }
  m->next = rm->mirrors;
  rm->mirrors = m;
  c->inflight++;
}

/* ------------------------------------------------------------- ends */

/* Ends m when no consumer uses it any more: the subscription goes, then
 * the hand-off here (the producer's place let go). */
static void end_if_unused(st__mirror_t *m) {
  st__server_t *srv = m->srv;
  if (m->state == M_OPENING) return;
  st__handoff_t *h = local_of(m);
  if (h && st__handoff_has_consumers(h)) return;
  if (m->state == M_LIVE && srv->peer) {
    unsubscribe(m);
    ST_LOG_I("peer", "mirror '%s' has no consumer left: it ends (%llu chunks came in)",
             m->local, (unsigned long long)m->chunks_in);
  }
  if (h) {
    char e[200];
    for (int i = 0; i < INFLIGHT_MAX; i++) batch_untake(&m->b[i]);   /* not published */
    st__handoff_close(table(srv), m->local, strlen(m->local), m->conn, e, sizeof e);
  }
  mirror_unlink(m);
  if (batches_moving(m)) {   /* the last done frees it */
    m->ended = 1;
    m->state = M_LOST;
    m->serial = 0;
    timer_stop(m);
    abort_batches(m, "the mirror ended");
    return;
  }
  mirror_free(m);
}

static void on_check(struct ev_loop *loop, ev_timer *w, int revents) {
  (void)loop, (void)revents;
  st__server_t *srv = w->data;
  st__remote_t *rm = srv->remote;
  rm->mcheck_on = 0;
  st__mirror_t *m = rm->mirrors;
  while (m) {
    st__mirror_t *next = m->next;
    end_if_unused(m);
    m = next;
  }
}

void st__mirrors_check(st__server_t *srv) {
  st__remote_t *rm = srv->remote;
  if (!rm || !rm->mirrors || rm->mcheck_on) return;
  ev_timer_init(&rm->mcheck, on_check, 0., 0.);
  rm->mcheck.data = srv;
  ev_timer_start(srv->loop, &rm->mcheck);
  rm->mcheck_on = 1;
  if (srv->threaded) st__loop_kick(&srv->loops[0]);   /* from another loop's thread */
}

void st__mirrors_lost(st__server_t *srv, const char *peer, const char *why) {
  st__remote_t *rm = srv->remote;
  for (st__mirror_t *m = rm ? rm->mirrors : NULL; m; m = m->next) {
    if ((peer && strcmp(m->peer, peer)) || m->state == M_LOST) continue;
    if (m->state == M_OPENING) continue;   /* its request fails by itself */
    if (peer) {
      mirror_lose(m, why);
      continue;
    }
    m->state = M_LOST;   /* the server stops: nothing is touched */
    snprintf(m->why, sizeof m->why, "%s", why);
    timer_stop(m);
  }
}

void st__mirrors_free(st__server_t *srv) {
  st__remote_t *rm = srv->remote;
  while (rm->mirrors) {
    st__mirror_t *m = rm->mirrors;
    rm->mirrors = m->next;
    m->req = 0;   /* the channel is gone: nothing to cancel */
    for (int i = 0; i < INFLIGHT_MAX; i++) m->b[i].req = 0;
    mirror_free(m);
  }
  if (rm->mcheck_on) ev_timer_stop(srv->loop, &rm->mcheck);
  rm->mcheck_on = 0;
}

unsigned st__mirrors_count(const st__server_t *srv) {
  unsigned n = 0;
  for (const st__mirror_t *m = srv->remote ? srv->remote->mirrors : NULL; m; m = m->next) n++;
  return n;
}

/* See handoff_link.h. */
void st__mirror_pack(msgpack_packer *pk, const st__server_t *srv, uint64_t serial) {
  const st__mirror_t *m = srv->remote ? srv->remote->mirrors : NULL;
  while (m && (!serial || m->serial != serial)) m = m->next;
  if (!m) {
    msgpack_pack_nil(pk);
    return;
  }
  static const char *const states[] = {"opening", "live", "lost"};
  msgpack_pack_map(pk, 9);
  st__pack_kv_str(pk, "peer", m->peer);
  st__pack_kv_str(pk, "source", m->src);
  st__pack_kv_str(pk, "state", states[m->state]);
  st__pack_kv_str(pk, "why", m->state == M_LOST ? m->why : "");
  st__pack_kv_str(pk, "engine", m->engine);
  st__pack_kv_uint(pk, "chunks_in", m->chunks_in);
  st__pack_kv_uint(pk, "bytes_in", m->bytes_in);
  st__pack_kv_uint(pk, "queued", m->qlen);
  st__pack_kv_uint(pk, "moving", moving_entries(m));
}
