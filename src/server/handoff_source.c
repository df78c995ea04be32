/* src/server: the side of a hand-off across servers that holds the
 * hand-off (handoff_link.h; docs/multihost.md, "Hand-offs across
 * servers").
 *
 * A peer's mirror subscribes (peer_handoff_subscribe {name, sub}): the
 * hand-off must be exported (peer.export names it), and the subscription
 * takes one consumer slot of it under a connection id of its own
 * (ST__HANDOFF_PEER_CONN), so that the producer's publishes wait for the
 * peer as for a local consumer and nothing is recycled before the peer
 * has it. The page watch (page_watch.h) wakes loop 0 on each publish into
 * a subscribed page, and on its timer (every 10 ms, or 1 ms while a page
 * is read by the timer alone); loop 0 then reads the pages: every chunk
 * newly published and not yet acknowledged by the peer's slot is
 * announced. Announced (peer_handoff_ready
 * {sub, chunks: [[chunk, seq, bytes], ...]}). The peer asks for the bytes
 * of a batch (peer_handoff_send): each chunk is checked to be still at
 * that sequence and pending for the peer, the data arena is lent to the
 * helper as one window per chunk, and when the helper says the peer has
 * every byte the peer's bit is cleared in each chunk (which frees it when
 * the local consumers acknowledged it too). A hand-off deleted, or its
 * producer gone with nothing left pending, is announced
 * ({sub, gone: true, why}) and ends the subscription; the peer's link
 * going down closes its slots (every acknowledgement it owed is made).
 *
 * Nothing a peer sends is trusted: chunk indexes, sequences and sizes are
 * checked against this server's own page and geometry; a peer reads only
 * chunks published for it, from exported hand-offs.
 *
 * Loop 0, the write side of the server lock.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "engine/handoff.h"
#include "mem/arena.h"
#include "server/handoff_link.h"
#include "server/holdings.h"
#include "server/page_watch.h"
#include "st/errors.h"

/* Subscriptions one peer may hold. */
#define SUBS_PER_PEER 64
/* How often the subscribed pages are read: when one is not watched by
 * the thread, and when all are. */
#define WATCH_S 0.001
#define WATCHED_S 0.01
/* Chunks one announcement or one send names at most. */
#define BATCH_MAX 256

typedef struct st__hsrc {
  struct st__hsrc *next;
  char peer[ST__PEER_ID_MAX + 1];
  uint64_t sub;               /* the subscriber's id of it               */
  char name[ST__HANDOFF_NAME_MAX + 1];
  uint64_t serial;            /* the hand-off it follows (handoff.h)     */
  uint64_t conn;              /* the slot's connection id                */
  uint32_t slot, chunks;
  uint64_t chunk_bytes, stride;
  uint32_t *told;             /* per chunk: the sequence last announced  */
  int gone_told;
  double since;
} st__hsrc_t;

/* One send of a batch of chunks to a peer's mirror. */
typedef struct st__hsend {
  struct st__hsend *next;
  st__server_t *srv;
  char peer[ST__PEER_ID_MAX + 1];
  uint64_t sub, remote_xfer, xfer;
  st__peer_ticket_t ticket;
  int answered;
  uint8_t *peer_blob;
  size_t peer_blob_len;
  st__arena_t *data;          /* a reference: the bytes stay while lent */
  char name[ST__HANDOFF_NAME_MAX + 1];
  uint64_t serial, stride;
  uint32_t slot;
  size_t n;
  uint32_t chunk[BATCH_MAX], seq[BATCH_MAX];
  uint64_t len[BATCH_MAX], bytes;
  double t0;
} st__hsend_t;

static st__handoffs_t *table(st__server_t *srv) { return ST__HOLDING_STATE(srv, handoffs); }

static void sub_free(st__hsrc_t *s) {
  free(s->told);
  free(s);
}

static void send_free(st__hsend_t *x) {
  st__arena_unref(x->data);
  free(x->peer_blob);
  free(x);
}

static st__hsrc_t *by_sub(const st__server_t *srv, const char *peer, uint64_t sub) {
  for (st__hsrc_t *s = srv->remote->hsrcs; s; s = s->next)
    if (s->sub == sub && !strcmp(s->peer, peer)) return s;
  return NULL;
}

/* Takes s out of the list, gives its slot back (when the hand-off is
 * still there and the server goes on) and frees it. */
static void sub_end(st__server_t *srv, st__hsrc_t *s, int touch) {
  st__remote_t *rm = srv->remote;
  for (st__hsrc_t **pp = &rm->hsrcs; *pp; pp = &(*pp)->next)
    if (*pp == s) {
      *pp = s->next;
      break;
    }
  st__pwatch_remove(rm->hpwatch, (uint64_t)(uintptr_t)s);
  if (touch && st__handoff_find(table(srv), s->name, s->serial)) {
    char e[200];
    st__handoff_close(table(srv), s->name, strlen(s->name), s->conn, e, sizeof e);
  }
  sub_free(s);
}

/* ------------------------------------------------------------- announcements */

static void tell(st__server_t *srv, const st__hsrc_t *s, const uint32_t *chunk,
                 const uint32_t *seq, const uint64_t *bytes, size_t n, const char *gone) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__remote_pack_begin(&sb, &pk, 1);
  msgpack_pack_map(&pk, gone ? 3 : 2);
  st__pack_kv_uint(&pk, "sub", s->sub);
  if (gone) {
    st__pack_kv_bool(&pk, "gone", 1);
    st__pack_kv_str(&pk, "why", gone);
  } else {
    st__pack_cstr(&pk, "chunks");
    msgpack_pack_array(&pk, n);
    for (size_t k = 0; k < n; k++) {
      msgpack_pack_array(&pk, 3);
      msgpack_pack_uint32(&pk, chunk[k]);
      msgpack_pack_uint32(&pk, seq[k]);
      msgpack_pack_uint64(&pk, bytes[k]);
    }
  }
  char err[200];
  if (st__peer_request(srv->peer, s->peer, "peer_handoff_ready", sb.data, sb.size,
                       st__remote_connect_timeout(srv), st__remote_ignore_reply, NULL, NULL, err,
                       sizeof err) != ST_OK)
    ST_LOG_D("peer", "hand-off '%s': announcing to '%s' failed: %s", s->name, s->peer, err);
  msgpack_sbuffer_destroy(&sb);
}

/* Reads s's page: announces what was published for the peer since the
 * last look. 0, or 1 when the subscription ended (s freed). */
static int look(st__server_t *srv, st__hsrc_t *s) {
  st__handoff_t *h = st__handoff_find(table(srv), s->name, s->serial);
  if (!h) {
    tell(srv, s, NULL, NULL, NULL, 0, "the hand-off was deleted");
    ST_LOG_I("peer", "hand-off '%s' is gone: the subscription of '%s' ends", s->name, s->peer);
    sub_end(srv, s, 0);
    return 1;
  }
  st__handoff_page_t *p = h->page;
  uint32_t bit = 1u << s->slot;
  uint32_t chunk[BATCH_MAX], seq[BATCH_MAX];
  uint64_t bytes[BATCH_MAX];
  size_t n = 0;
  int pending = 0;
  for (uint32_t i = 0; i < s->chunks; i++) {
    uint64_t w = atomic_load(&p->chunk[i].word);
    if (!((uint32_t)w & bit)) continue;
    pending = 1;
    uint32_t tag = st__handoff_tag(w);
    if (tag == s->told[i]) continue;
    uint64_t b = atomic_load(&p->chunk[i].bytes);
    chunk[n] = i;
    seq[n] = tag;
    bytes[n] = b < s->chunk_bytes ? b : s->chunk_bytes;
    s->told[i] = tag;
    if (++n == BATCH_MAX) {
      tell(srv, s, chunk, seq, bytes, n, NULL);
      n = 0;
    }
  }
  if (n) tell(srv, s, chunk, seq, bytes, n, NULL);
  if (!pending && !s->gone_told && (atomic_load(&p->flags) & ST__HANDOFF_PRODUCER_GONE)) {
    tell(srv, s, NULL, NULL, NULL, 0, "the producer closed");
    s->gone_told = 1;
  }
  return 0;
}

/* Every subscribed page read (page_watch.h calls it on a publish, and on
 * its timer). */
static void on_watch(struct ev_loop *loop, void *ud) {
  (void)loop;
  st__server_t *srv = ud;
  st__hsrc_t *s = srv->remote->hsrcs;
  while (s) {
    st__hsrc_t *next = s->next;
    look(srv, s);
    s = next;
  }
}

/* s's page watched (the watch made on the first subscription). */
static void watch_page(st__server_t *srv, st__hsrc_t *s, const st__handoff_t *h) {
  st__remote_t *rm = srv->remote;
  if (!rm->hpwatch &&
      st__pwatch_new(srv->loop, "hand-offs followed by peers", WATCH_S, WATCHED_S, on_watch, srv,
                     &rm->hpwatch) != ST_OK)
    return;
  st__pwatch_add_arena(rm->hpwatch, (uint64_t)(uintptr_t)s, h->named.page_arena,
                       h->named.page_bytes, offsetof(st__handoff_page_t, pub_futex),
                       offsetof(st__handoff_page_t, pub_waiters), s->name);
}

/* ------------------------------------------------------------- subscribe */

static void on_subscribe(st__peer_t *p, const st__peer_req_t *req, void *ud) {
  st__server_t *srv = ud;
  st__remote_t *rm = srv->remote;
  const st__peer_conf_t *pc = &srv->cfg->peer;
  char name[ST__HANDOFF_NAME_MAX + 1], err[400];
  uint64_t sub = 0;
  if (!st__remote_param_str(req->params, "name", name, sizeof name) ||
      !st__remote_param_u64(req->params, "sub", &sub)) {
    st__peer_reply_error(p, req->ticket, ST_ERR_INVALID_ARGUMENT,
                         "peer_handoff_subscribe needs name and sub");
    return;
  }
  if (!st__remote_exported(pc, name)) {
    snprintf(err, sizeof err, "hand-off '%s' is not exported to peers (peer.export of server "
             "'%s')", name, pc->id);
    st__peer_reply_error(p, req->ticket, ST_ERR_AUTH, err);
    return;
  }
  unsigned mine = 0;
  for (const st__hsrc_t *s = rm->hsrcs; s; s = s->next) mine += !strcmp(s->peer, req->peer);
  if (by_sub(srv, req->peer, sub)) {
    st__peer_reply_error(p, req->ticket, ST_ERR_INVALID_ARGUMENT, "that subscription exists");
    return;
  }
  if (mine >= SUBS_PER_PEER) {
    snprintf(err, sizeof err, "peer '%s' follows %d hand-offs here already", req->peer,
             SUBS_PER_PEER);
    st__peer_reply_error(p, req->ticket, ST_ERR_LIMIT, err);
    return;
  }
  st__hsrc_t *s = calloc(1, sizeof *s);
  if (!s) {
    st__peer_reply_error(p, req->ticket, ST_ERR_OUT_OF_MEMORY, "out of memory");
    return;
  }
  s->conn = ST__HANDOFF_PEER_CONN | ++rm->next_xfer;
  st__who_t admin = {.uid = geteuid(), .gid = getegid(), .admin = 1};
  st__handoff_t *h = NULL;
  uint32_t slot = 0;
  int rc = st__handoff_open(table(srv), name, strlen(name), s->conn, &admin, 1, &h, &slot, err,
                            sizeof err);
  if (rc == ST_OK && !(s->told = calloc(h->chunks, sizeof *s->told))) {
    st__handoff_close(table(srv), name, strlen(name), s->conn, err, sizeof err);
    rc = ST_ERR_OUT_OF_MEMORY;
    snprintf(err, sizeof err, "out of memory");
  }
  if (rc != ST_OK) {
    free(s);
    char m[600];
    snprintf(m, sizeof m, "server '%s': %s", pc->id, err);
    st__peer_reply_error(p, req->ticket, rc, m);
    return;
  }
  snprintf(s->peer, sizeof s->peer, "%s", req->peer);
  snprintf(s->name, sizeof s->name, "%s", name);
  s->sub = sub;
  s->serial = h->serial;
  s->slot = slot;
  s->chunks = h->chunks;
  s->chunk_bytes = h->chunk_bytes;
  s->stride = h->stride;
  s->since = st__now_unix();
  s->next = rm->hsrcs;
  rm->hsrcs = s;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__remote_pack_begin(&sb, &pk, 0);
  msgpack_pack_map(&pk, 5);
  st__pack_kv_uint(&pk, "chunks", h->chunks);
  st__pack_kv_uint(&pk, "chunk_bytes", h->chunk_bytes);
  st__pack_kv_uint(&pk, "stride", h->stride);
  st__pack_kv_uint(&pk, "slot", slot);
  st__pack_kv_str(&pk, "device", h->named.device < 0 ? "cpu" : "cuda");
  st__peer_reply(p, req->ticket, sb.data, sb.size);
  msgpack_sbuffer_destroy(&sb);
  ST_LOG_I("peer", "peer '%s' follows hand-off '%s' (consumer slot %u)", s->peer, name, slot);
  watch_page(srv, s, h);
}

static void on_unsubscribe(st__peer_t *p, const st__peer_req_t *req, void *ud) {
  st__server_t *srv = ud;
  uint64_t sub = 0;
  if (!st__remote_param_u64(req->params, "sub", &sub)) {
    st__peer_reply_error(p, req->ticket, ST_ERR_INVALID_ARGUMENT,
                         "peer_handoff_unsubscribe needs sub");
    return;
  }
  st__hsrc_t *s = by_sub(srv, req->peer, sub);
  if (s) {
    ST_LOG_I("peer", "peer '%s' no longer follows hand-off '%s'", s->peer, s->name);
    sub_end(srv, s, 1);
  }
  st__remote_reply_true(p, req->ticket);
}

/* ------------------------------------------------------------- sends */

int st__handoff_windows(st__arena_t *data, int readonly, uint64_t stride, const uint32_t *chunk,
                        const uint64_t *len, size_t n, st__xfer_sup_arena_t *out,
                        st__arena_desc_t *desc, char *err, size_t errlen) {
  int cuda = st__arena_device(data) >= 0;
  int fd = cuda || !readonly ? st__arena_dup_fd(data, err, errlen)
                             : st__arena_dup_fd_readonly(data, err, errlen);
  if (fd < 0) return fd;
  memset(desc, 0, sizeof *desc);
  st__arena_describe(data, desc);
  for (size_t k = 0; k < n; k++)
    /* A chunk published empty moves one byte: an engine moves no empty
     * window, and the chunk's `bytes` says what counts. */
    out[k] = (st__xfer_sup_arena_t){.fd = fd, .bytes = st__arena_bytes(data), .cuda = cuda,
                                    .uuid = cuda ? desc->uuid : NULL,
                                    .off = (uint64_t)chunk[k] * stride,
                                    .len = len[k] ? len[k] : 1};
  return fd;
}

static void send_opened(void *ud, uint64_t xfer, const uint8_t *blob, size_t len);
static void send_done(void *ud, uint64_t xfer, int ok, uint64_t bytes, int code,
                      const char *error);
static const st__xfer_sup_cbs_t send_cbs = {send_opened, NULL, send_done};

static void send_unlink(st__remote_t *rm, st__hsend_t *x) {
  for (st__hsend_t **pp = &rm->hsends; *pp; pp = &(*pp)->next)
    if (*pp == x) {
      *pp = x->next;
      return;
    }
}

/* Reads one [chunk, seq, bytes] of a send's list. */
static int entry_of(const msgpack_object *e, uint64_t v[3]) {
  if (e->type != MSGPACK_OBJECT_ARRAY || e->via.array.size != 3) return 0;
  for (int k = 0; k < 3; k++) {
    if (e->via.array.ptr[k].type != MSGPACK_OBJECT_POSITIVE_INTEGER) return 0;
    v[k] = e->via.array.ptr[k].via.u64;
  }
  return 1;
}

/* peer_handoff_send {sub, xfer, engine, blob, chunks: [[chunk, seq,
 * bytes], ...]} -> {blob}: lends the chunks (each still at that
 * sequence, pending for the peer, of that size) to the helper. */
static void on_send(st__peer_t *p, const st__peer_req_t *req, void *ud) {
  st__server_t *srv = ud;
  st__remote_t *rm = srv->remote;
  const st__peer_conf_t *pc = &srv->cfg->peer;
  char engine[16], err[400];
  uint64_t sub = 0, remote_xfer = 0;
  const msgpack_object *blob = req->params ? st__map_get(req->params, "blob") : NULL;
  const msgpack_object *list = req->params ? st__map_get(req->params, "chunks") : NULL;
  if (!st__remote_param_u64(req->params, "sub", &sub) ||
      !st__remote_param_u64(req->params, "xfer", &remote_xfer) ||
      !st__remote_param_str(req->params, "engine", engine, sizeof engine) || !blob ||
      blob->type != MSGPACK_OBJECT_BIN || blob->via.bin.size == 0 ||
      blob->via.bin.size > 65536 || !list || list->type != MSGPACK_OBJECT_ARRAY ||
      list->via.array.size == 0 || list->via.array.size > BATCH_MAX) {
    st__peer_reply_error(p, req->ticket, ST_ERR_INVALID_ARGUMENT,
                         "peer_handoff_send needs sub, xfer, engine, a blob and 1 to 256 chunks");
    return;
  }
  st__hsrc_t *s = by_sub(srv, req->peer, sub);
  st__handoff_t *h = s ? st__handoff_find(table(srv), s->name, s->serial) : NULL;
  if (!h) {
    st__peer_reply_error(p, req->ticket, ST_ERR_NOT_FOUND,
                         "no such subscription, or its hand-off is gone");
    return;
  }
  if (!rm->sup) {
    st__peer_reply_error(p, req->ticket, ST_ERR_CAPABILITY,
                         "this server's transfer helper is not running (see its log)");
    return;
  }
  unsigned mine = 0;
  for (const st__hsend_t *x = rm->hsends; x; x = x->next) mine += !strcmp(x->peer, req->peer);
  if ((int)mine >= pc->max_transfers_per_peer) {
    snprintf(err, sizeof err, "server '%s' sends %d transfers to '%s' already "
             "(peer.max_transfers_per_peer)", pc->id, pc->max_transfers_per_peer, req->peer);
    st__peer_reply_error(p, req->ticket, ST_ERR_BUSY, err);
    return;
  }
  if (!st__remote_engine_fits(engine, h->named.device >= 0)) {
    snprintf(err, sizeof err, "hand-off '%s' is in %s memory: %s cannot move it", s->name,
             h->named.device >= 0 ? "CUDA" : "CPU", engine);
    st__peer_reply_error(p, req->ticket, ST_ERR_INVALID_ARGUMENT, err);
    return;
  }
  st__hsend_t *x = calloc(1, sizeof *x);
  uint8_t *copy = malloc(blob->via.bin.size);
  if (!x || !copy) {
    free(x), free(copy);
    st__peer_reply_error(p, req->ticket, ST_ERR_OUT_OF_MEMORY, "out of memory");
    return;
  }
  uint32_t bit = 1u << s->slot;
  for (uint32_t k = 0; k < list->via.array.size; k++) {
    uint64_t v[3];
    uint64_t w = 0, b = 0;
    int ok = entry_of(&list->via.array.ptr[k], v) && v[0] < h->chunks && v[1] <= UINT32_MAX;
    if (ok) {
      w = atomic_load(&h->page->chunk[v[0]].word);
      b = atomic_load(&h->page->chunk[v[0]].bytes);
      if (b > h->chunk_bytes) b = h->chunk_bytes;
    }
    for (size_t j = 0; ok && j < x->n; j++) ok = x->chunk[j] != v[0];
    if (!ok || st__handoff_tag(w) != v[1] || !((uint32_t)w & bit) || b != v[2]) {
      snprintf(err, sizeof err, "hand-off '%s': entry %u is not a chunk published for this "
               "peer at that sequence and size", s->name, k);
      free(x), free(copy);
      st__peer_reply_error(p, req->ticket, ST_ERR_STALE_HANDLE, err);
      return;
    }
    x->chunk[x->n] = (uint32_t)v[0];
    x->seq[x->n] = (uint32_t)v[1];
    x->len[x->n] = b;
    x->bytes += b ? b : 1;
    x->n++;
  }
  x->srv = srv;
  snprintf(x->peer, sizeof x->peer, "%s", req->peer);
  snprintf(x->name, sizeof x->name, "%s", s->name);
  x->sub = sub;
  x->serial = s->serial;
  x->slot = s->slot;
  x->stride = h->stride;
  x->remote_xfer = remote_xfer;
  x->ticket = req->ticket;
  x->t0 = st__now_mono();
  memcpy(copy, blob->via.bin.ptr, blob->via.bin.size);
  x->peer_blob = copy;
  x->peer_blob_len = blob->via.bin.size;
  st__arena_ref(h->named.data);
  x->data = h->named.data;
  x->next = rm->hsends;
  rm->hsends = x;
  double timeout = st__remote_transfer_timeout(srv);
  int rc = st__xfer_sup_open(rm->sup, engine, ST_XFER_SEND, 2, 0, (uint32_t)(timeout * 1e3),
                             &send_cbs, x, &x->xfer, err, sizeof err);
  if (rc != ST_OK) {
    st__peer_reply_error(p, req->ticket, rc, err);
    send_unlink(rm, x);
    send_free(x);
  }
}

/* The helper opened the send: start it with the peer's blob and the
 * chunks' windows (read-only), then answer with this side's blob. */
static void send_opened(void *ud, uint64_t xfer, const uint8_t *blob, size_t len) {
  st__hsend_t *x = ud;
  st__server_t *srv = x->srv;
  char err[400] = "";
  st__xfer_sup_arena_t wins[BATCH_MAX];
  st__arena_desc_t desc;
  int fd = st__handoff_windows(x->data, 1, x->stride, x->chunk, x->len, x->n, wins, &desc, err,
                               sizeof err);
  int rc = fd < 0 ? fd
                  : st__xfer_sup_start(srv->remote->sup, xfer, x->peer_blob, x->peer_blob_len,
                                       wins, x->n, err, sizeof err);
  if (fd >= 0) close(fd);
  x->answered = 1;
  if (rc != ST_OK) {
    st__peer_reply_error(srv->peer, x->ticket, rc, err[0] ? err : st_strerror(rc));
    st__xfer_sup_abort(srv->remote->sup, xfer, err[0] ? err : "the transfer could not start");
    return;
  }
  st__remote_reply_blob(srv->peer, x->ticket, blob, len);
}

/* Every byte reached the peer: its bit is cleared in each chunk (still at
 * the sequence sent), which frees the chunks nobody else waits for. */
static void send_done(void *ud, uint64_t xfer, int ok, uint64_t bytes, int code,
                      const char *error) {
  st__hsend_t *x = ud;
  st__server_t *srv = x->srv;
  st__remote_t *rm = srv->remote;
  (void)xfer;
  if (!x->answered)
    st__peer_reply_error(srv->peer, x->ticket, code ? code : ST_ERR_INTERNAL,
                         error && error[0] ? error : "the transfer ended before it started");
  st__handoff_t *h = ok ? st__handoff_find(table(srv), x->name, x->serial) : NULL;
  if (h) {
    int any = 0;
    for (size_t k = 0; k < x->n; k++) {
      int freed = 0;
      st__handoff_clear(h->page, x->chunk[k], 1u << x->slot, x->seq[k], 0, &freed);
      any |= freed;
    }
    if (any) st__shm_notify(&h->page->free_futex, &h->page->free_waiters);
  }
  if (ok) {
    rm->lends_done++;
    rm->bytes_out += bytes;
    ST_LOG_D("peer", "hand-off '%s': %zu chunks (%llu bytes) sent to '%s' in %.3f ms", x->name,
             x->n, (unsigned long long)bytes, x->peer, (st__now_mono() - x->t0) * 1e3);
  } else {
    rm->lends_failed++;
    ST_LOG_W("peer", "hand-off '%s': sending %zu chunks to '%s' failed: %s", x->name, x->n,
             x->peer, error && error[0] ? error : st_err_name(code));
  }
  send_unlink(rm, x);
  send_free(x);
}

/* ------------------------------------------------------------- ends */

int st__hsrc_methods(st__server_t *srv) {
  if (st__peer_method_add(srv->peer, "peer_handoff_subscribe", on_subscribe, srv) != ST_OK ||
      st__peer_method_add(srv->peer, "peer_handoff_unsubscribe", on_unsubscribe, srv) != ST_OK ||
      st__peer_method_add(srv->peer, "peer_handoff_send", on_send, srv) != ST_OK)
    return ST_ERR_INTERNAL;
  return ST_OK;
}

void st__hsrc_peer_down(st__server_t *srv, const char *peer, int stopping) {
  st__remote_t *rm = srv->remote;
  if (!rm) return;
  st__hsrc_t *s = rm->hsrcs;
  while (s) {
    st__hsrc_t *next = s->next;
    if (!peer || !strcmp(s->peer, peer)) {
      if (!stopping)
        ST_LOG_I("peer", "peer '%s' left: its slot of hand-off '%s' is closed", s->peer,
                 s->name);
      sub_end(srv, s, !stopping);
    }
    s = next;
  }
  if (stopping) {   /* no callback comes after the helper's end */
    st__pwatch_free(rm->hpwatch);
    rm->hpwatch = NULL;
    while (rm->hsends) {
      st__hsend_t *x = rm->hsends;
      rm->hsends = x->next;
      send_free(x);
    }
  }
}

unsigned st__hsrc_count(const st__server_t *srv) {
  unsigned n = 0;
  for (const st__hsrc_t *s = srv->remote ? srv->remote->hsrcs : NULL; s; s = s->next) n++;
  return n;
}

/* See handoff_link.h. */
void st__hsrc_pack(msgpack_packer *pk, const st__server_t *srv, uint64_t serial) {
  uint32_t n = 0;
  for (const st__hsrc_t *s = srv->remote ? srv->remote->hsrcs : NULL; s; s = s->next)
    n += s->serial == serial;
  msgpack_pack_array(pk, n);
  for (const st__hsrc_t *s = srv->remote ? srv->remote->hsrcs : NULL; s; s = s->next) {
    if (s->serial != serial) continue;
    msgpack_pack_map(pk, 3);
    st__pack_kv_str(pk, "peer", s->peer);
    st__pack_kv_uint(pk, "slot", s->slot);
    st__pack_kv_double(pk, "since", s->since);
  }
}
