/* src/xfer/ucx.c: the UCX engine: CPU arenas between two helpers over
 * UCP tagged messages (docs/multihost.md, "Engines").
 *
 * Why tagged messages and not RMA: a tag receive completes on the side
 * that receives, so each side learns by itself when its bytes are in
 * place, and the blob stays small (RMA would need every arena registered
 * and its rkey packed before the blobs are swapped, and an extra message
 * to tell the owner the reads ended). For large messages UCX itself
 * switches to its rendezvous protocol (a get where the transport has
 * one), so no copy is added.
 *
 * Every transfer of the helper runs on one worker, and a transfer to a
 * peer it has moved to before reuses the endpoint (ucx_worker.h): no
 * worker and no wire-up per transfer. Each transfer takes a 32-bit id of
 * its own (never reused while the helper lives); its blob is
 *
 *   "STU2", role (1 byte), id (4 bytes, little-endian), worker address
 *
 * and every message is tagged with the id of the transfer it is FOR
 * (high 32 bits), so the transfers of one worker never take each other's
 * messages. The wire of one transfer, sender to receiver unless said:
 *
 *   HEADER      (low 0x80000000)  u64 count, then count u64 arena sizes
 *   chunk k of arena a (low a<<21 | k; CHUNK bytes, the last one shorter)
 *   ACK (back)  (low 0x80000001)  u64 status (0: all received; 1: layout
 *                                 refused; 2: the receiver stopped), u64
 *                                 bytes received
 *   STOP        (low 0x80000002)  u64 bytes sent: the sender stopped (an
 *                                 abort, a failure) before the ACK
 *
 * The receiver compares the header with its own arenas before it posts a
 * single receive, and refuses a different layout (ACK status 1). The
 * sender is done when the ACK says every byte arrived; the receiver when
 * its last chunk and the ACK's send completed. Endpoints run with
 * UCP_ERR_HANDLING_MODE_PEER: a peer that dies fails the transfers on
 * its endpoint; the deadline catches the rest. A transfer that ends with
 * a send in flight (a failure, an abort) closes its endpoint, forced, so
 * that nothing is left reading its arenas.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "st/errors.h"
#include "xfer/engine.h"
#include "xfer/ucx_api.h"
#include "xfer/ucx_worker.h"

#ifdef ST_HAVE_UCX

#define CHUNK ((uint64_t)8 << 20) /* bytes per tagged message          */
#define CHUNK_BITS 21             /* chunk index bits of a tag: 16 TiB an arena */
#define WINDOW 8                  /* chunks in flight per transfer      */
#define LOW_HEADER UINT32_C(0x80000000)
#define LOW_ACK UINT32_C(0x80000001)
#define LOW_STOP UINT32_C(0x80000002)
#define BLOB_MAGIC "STU2"
#define BLOB_HEAD 9               /* magic, role, id                    */
#define CLOSE_SECONDS 2.0         /* the longest a transfer's end may progress */

typedef struct slot {
  struct st__xfer *x;
  void *req;            /* in flight when non-NULL                       */
  uint64_t bytes;       /* expected length                               */
  int kind;             /* 0 chunk, 1 header, 2 ack, 3 stop              */
} slot_t;

struct st__xfer {
  const st__ucx_api_t *u;
  st__xfer_open_t o;
  struct st__xfer *next_open;   /* the open transfers (open_list)       */
  ucp_worker_h worker;          /* the shared one (ucx_worker.h), and its */
  int efd;                      /* event descriptor (-1: none): both stay
                                   while a transfer is open              */
  uint32_t id, peer_id;         /* this transfer's tag id, the peer's    */
  st__ucx_peer_t *pe;           /* the endpoint to the peer, referenced  */
  int started;
  int failed;
  char why[320];
  st__xfer_arena_t *arenas;
  size_t n;
  uint64_t total;
  uint64_t done_bytes;
  size_t next_arena;    /* the next chunk to post                        */
  uint64_t next_off;
  unsigned inflight;
  slot_t slots[WINDOW];
  /* header: the sender's copy to send, the receiver's buffer */
  uint64_t *header;
  size_t header_len;
  slot_t header_slot;
  int header_ok;        /* receiver: the layout matched                  */
  uint64_t ack[2];
  slot_t ack_slot;
  uint64_t stop_msg;    /* the sender's STOP, the receiver's buffer for it */
  slot_t stop_slot;
  int ack_posted;       /* sender: its receive; receiver: its send       */
  int ack_done;
};

static struct st__xfer *open_list;
static uint32_t last_id;

static void fail(struct st__xfer *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(struct st__xfer *x, const char *fmt, ...) {
  if (x->failed) return;
  x->failed = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(x->why, sizeof x->why, fmt, ap);
  va_end(ap);
}

static const char *status_text(const st__ucx_api_t *u, ucs_status_t s) {
  const char *t = u->ucs_status_string(s);
  return t ? t : "unknown status";
}

static int ucx_probe(const char *library, st__xfer_probe_t *out) {
  return st__ucx_probe(library, out);
}

static ucp_tag_t tag_of(uint32_t id, uint32_t low) { return ((uint64_t)id << 32) | low; }

/* An endpoint failed: every open transfer on it that still needed it
 * fails with the reason. */
static void on_dead(st__ucx_peer_t *pe, const char *why) {
  for (struct st__xfer *x = open_list; x; x = x->next_open) {
    if (x->pe != pe) continue;
    if (x->ack_done && (x->o.role == ST_XFER_SEND || x->inflight == 0)) continue;
    fail(x, "%s", why);
  }
}

/* A transfer id no open transfer has (0 is never one). */
static uint32_t new_id(void) {
  if (!last_id) last_id = (uint32_t)getpid() * 2654435761u ^ (uint32_t)(st__now_mono() * 1e6);
  for (;;) {
    uint32_t id = ++last_id;
    int used = !id;
    for (struct st__xfer *x = open_list; x && !used; x = x->next_open) used = x->id == id;
    if (!used) return id;
  }
}

static int ucx_open(const st__xfer_open_t *o, st__xfer_t **out, uint8_t *blob, size_t *blob_len,
                    char *err, size_t errlen) {
  const st__ucx_api_t *u = st__ucx_api(NULL);
  if (!u) {
    snprintf(err, errlen, "UCX is unavailable (probe the engine for the reason)");
    return ST_ERR_CAPABILITY;
  }
  if (o->nranks != 2 || (o->rank != 0 && o->rank != 1)) {
    snprintf(err, errlen,
             "the UCX engine moves to one receiver per transfer (nranks %d): open one transfer "
             "per receiver",
             o->nranks);
    return ST_ERR_CAPABILITY;
  }
  st__ucx_on_dead(on_dead);
  ucp_worker_h w;
  int efd;
  const uint8_t *addr;
  size_t len;
  int rc = st__ucx_worker(u, open_list == NULL, &w, &efd, &addr, &len, err, errlen);
  if (rc != ST_OK) return rc;
  if (len + BLOB_HEAD > ST_XFER_BLOB_MAX) {
    snprintf(err, errlen, "the worker's address is too long (%zu bytes)", len);
    return ST_ERR_INTERNAL;
  }
  struct st__xfer *x = calloc(1, sizeof *x);
  if (!x) {
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  x->u = u;
  x->o = *o;
  x->worker = w;
  x->efd = efd;
  x->id = new_id();
  memcpy(blob, BLOB_MAGIC, 4);
  blob[4] = (uint8_t)o->role;
  for (int i = 0; i < 4; i++) blob[5 + i] = (uint8_t)(x->id >> (8 * i));
  memcpy(blob + BLOB_HEAD, addr, len);
  *blob_len = len + BLOB_HEAD;
  x->next_open = open_list;
  open_list = x;
  *out = x;
  return ST_OK;
}

static void on_send(void *req, ucs_status_t status, void *user) {
  slot_t *sl = user;
  struct st__xfer *x = sl->x;
  sl->req = NULL;
  x->u->ucp_request_free(req);
  if (status != UCS_OK) {
    fail(x, "sending %s failed: %s", sl->kind == 0 ? "a chunk" : sl->kind == 1 ? "the header" : "the acknowledgement",
         status_text(x->u, status));
    if (sl->kind == 0) x->inflight--;
    return;
  }
  if (sl->kind == 0) {
    x->inflight--;
    x->done_bytes += sl->bytes;
  } else if (sl->kind == 2) {
    x->ack_done = 1;
  }
}

static void check_header(struct st__xfer *x);

static void on_recv(void *req, ucs_status_t status, const ucp_tag_recv_info_t *info,
                    void *user) {
  slot_t *sl = user;
  struct st__xfer *x = sl->x;
  sl->req = NULL;
  x->u->ucp_request_free(req);
  if (sl->kind == 0) x->inflight--;
  if (status != UCS_OK) {
    fail(x, "receiving %s failed: %s", sl->kind == 0 ? "a chunk" : sl->kind == 1 ? "the header" : "the acknowledgement",
         status == UCS_ERR_MESSAGE_TRUNCATED
             ? "the sender's message is longer than this side's arena (the arena layouts differ)"
             : status_text(x->u, status));
    return;
  }
  if (info->length != sl->bytes && sl->kind != 1 && sl->kind != 3) {
    fail(x, "a message of %zu bytes arrived where %llu were expected (the arena layouts differ)",
         info->length, (unsigned long long)sl->bytes);
    return;
  }
  if (sl->kind == 0) {
    x->done_bytes += sl->bytes;
  } else if (sl->kind == 1) {
    sl->bytes = info->length;
    check_header(x);
  } else if (sl->kind == 3) {
    fail(x, "the sender stopped the transfer after %llu of its bytes left",
         (unsigned long long)x->stop_msg);
  } else {
    x->ack_done = 1;
  }
}

/* Posts one message of x: `low` the tag's low half. The sender's header
 * and chunks and the receiver's ACK are sends to the peer's id; the rest
 * are receives on x's own id. */
static ucs_status_ptr_t post(struct st__xfer *x, slot_t *sl, void *buf, uint64_t len,
                             uint32_t low) {
  ucp_request_param_t p;
  memset(&p, 0, sizeof p);
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.user_data = sl;
  sl->x = x;
  sl->bytes = len;
  int sending = x->o.role == ST_XFER_SEND ? low != LOW_ACK : low == LOW_ACK;   /* STOP: the sender's */
  ucs_status_ptr_t r;
  /* The callback may run before the call returns (UCX completes a small
   * send at once even with NO_IMM_CMPL on some transports): it clears
   * sl->req, and then the request is gone and must not be kept. */
  static char posting;
  sl->req = &posting;
  if (sending) {
    ucp_ep_h ep = st__ucx_peer_ep(x->pe);
    if (!ep) {
      sl->req = NULL;
      fail(x, "the endpoint to the peer is closed");
      return NULL;
    }
    p.cb.send = on_send;
    r = x->u->ucp_tag_send_nbx(ep, buf, len, tag_of(x->peer_id, low), &p);
  } else {
    p.cb.recv = on_recv;
    r = x->u->ucp_tag_recv_nbx(x->worker, buf, len, tag_of(x->id, low), UINT64_MAX, &p);
  }
  if (UCS_PTR_IS_ERR(r)) {
    sl->req = NULL;
    fail(x, "%s: %s", sending ? "ucp_tag_send_nbx" : "ucp_tag_recv_nbx",
         status_text(x->u, UCS_PTR_STATUS(r)));
    return NULL;
  }
  if (sl->req == &posting) sl->req = r;   /* still in flight */
  return r;
}

/* Receiver: the sender's header against this side's arenas. */
static void check_header(struct st__xfer *x) {
  uint64_t count = x->header_slot.bytes >= 8 ? x->header[0] : UINT64_MAX;
  const char *why = NULL;
  char buf[200];
  if (count == UINT64_MAX || x->header_slot.bytes != 8 * (count + 1)) {
    why = "the sender's header is malformed";
  } else if (count != x->n) {
    snprintf(buf, sizeof buf, "the sender moves %llu arenas, this side expects %zu",
             (unsigned long long)count, x->n);
    why = buf;
  } else {
    for (size_t i = 0; i < x->n; i++)
      if (x->header[1 + i] != x->arenas[i].bytes) {
        snprintf(buf, sizeof buf, "arena %zu is %llu bytes at the sender and %llu here", i,
                 (unsigned long long)x->header[1 + i], (unsigned long long)x->arenas[i].bytes);
        why = buf;
        break;
      }
  }
  if (why) {
    fail(x, "the arena layouts differ: %s", why);
    x->ack[0] = 1;
    x->ack[1] = 0;
    if (post(x, &x->ack_slot, x->ack, sizeof x->ack, LOW_ACK)) x->ack_posted = 1;
    return;
  }
  x->header_ok = 1;
}

static int ucx_start(st__xfer_t *x, const uint8_t *peer, size_t peer_len,
                     const st__xfer_arena_t *arenas, size_t n, char *err, size_t errlen) {
  st__xfer_role_t want = x->o.role == ST_XFER_SEND ? ST_XFER_RECV : ST_XFER_SEND;
  if (peer_len <= BLOB_HEAD || memcmp(peer, BLOB_MAGIC, 4) != 0 || peer[4] != (uint8_t)want) {
    snprintf(err, errlen, "the peer's blob is not a UCX %s blob of this version",
             want == ST_XFER_SEND ? "sender's" : "receiver's");
    return ST_ERR_INVALID_ARGUMENT;
  }
  if (x->started) {
    snprintf(err, errlen, "the transfer was started already");
    return ST_ERR_INVALID_ARGUMENT;
  }
  if (n > (size_t)1 << (31 - CHUNK_BITS)) {
    snprintf(err, errlen, "%zu arenas: the UCX engine moves at most %d in one transfer", n,
             1 << (31 - CHUNK_BITS));
    return ST_ERR_INVALID_ARGUMENT;
  }
  for (size_t i = 0; i < n; i++)
    if (arenas[i].bytes > CHUNK << CHUNK_BITS) {
      snprintf(err, errlen, "arena %zu: %llu bytes; the UCX engine moves at most %llu an arena",
               i, (unsigned long long)arenas[i].bytes, (unsigned long long)(CHUNK << CHUNK_BITS));
      return ST_ERR_INVALID_ARGUMENT;
    }
  x->peer_id = 0;
  for (int i = 0; i < 4; i++) x->peer_id |= (uint32_t)peer[5 + i] << (8 * i);
  x->header_slot.kind = 1;
  x->ack_slot.kind = 2;
  x->stop_slot.kind = 3;
  x->arenas = calloc(n ? n : 1, sizeof *arenas);
  /* The receiver's buffer holds the longest header, so that a sender
   * with more arenas is told apart from a broken one. */
  x->header_len = 8 * ((x->o.role == ST_XFER_SEND ? n : ST_XFER_MAX_ARENAS) + 1);
  x->header = calloc(x->header_len / 8, 8);
  if (!x->arenas || !x->header) {
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  memcpy(x->arenas, arenas, n * sizeof *arenas);
  x->n = n;
  for (size_t i = 0; i < n; i++) x->total += arenas[i].bytes;
  x->pe = st__ucx_peer_get(peer + BLOB_HEAD, peer_len - BLOB_HEAD, err, errlen);
  if (!x->pe) return ST_ERR_IO;
  x->started = 1;
  if (x->o.role == ST_XFER_SEND) {
    x->header[0] = n;
    for (size_t i = 0; i < n; i++) x->header[1 + i] = arenas[i].bytes;
    if (!post(x, &x->ack_slot, x->ack, sizeof x->ack, LOW_ACK) ||
        !post(x, &x->header_slot, x->header, x->header_len, LOW_HEADER)) {
      snprintf(err, errlen, "%s", x->why);
      return ST_ERR_INTERNAL;
    }
    x->ack_posted = 1;
  } else {
    if (!post(x, &x->header_slot, x->header, x->header_len, LOW_HEADER) ||
        !post(x, &x->stop_slot, &x->stop_msg, sizeof x->stop_msg, LOW_STOP)) {
      snprintf(err, errlen, "%s", x->why);
      return ST_ERR_INTERNAL;
    }
  }
  return ST_OK;
}

/* Posts chunks while the window has room. */
static void post_chunks(struct st__xfer *x) {
  while (!x->failed && x->inflight < WINDOW && x->next_arena < x->n) {
    const st__xfer_arena_t *a = &x->arenas[x->next_arena];
    if (x->next_off >= a->bytes) {
      x->next_arena++;
      x->next_off = 0;
      continue;
    }
    slot_t *sl = NULL;
    for (int i = 0; i < WINDOW; i++)
      if (!x->slots[i].req) {
        sl = &x->slots[i];
        break;
      }
    if (!sl) return;
    uint64_t len = a->bytes - x->next_off < CHUNK ? a->bytes - x->next_off : CHUNK;
    uint32_t low = (uint32_t)(x->next_arena << CHUNK_BITS) | (uint32_t)(x->next_off / CHUNK);
    sl->kind = 0;
    if (!post(x, sl, (char *)a->addr + x->next_off, len, low)) return;
    x->inflight++;
    x->next_off += len;
  }
}

static st__xfer_state_t ucx_poll(st__xfer_t *x, double now, uint64_t *bytes, char *err,
                                 size_t errlen) {
  st__ucx_progress();
  if (x->started && !x->failed) {
    if (x->o.role == ST_XFER_SEND || x->header_ok) post_chunks(x);
    int all = x->next_arena >= x->n && x->inflight == 0;
    if (x->o.role == ST_XFER_RECV && all && x->header_ok && !x->ack_posted) {
      x->ack[0] = 0;
      x->ack[1] = x->done_bytes;
      if (post(x, &x->ack_slot, x->ack, sizeof x->ack, LOW_ACK)) x->ack_posted = 1;
    }
    if (x->o.role == ST_XFER_SEND && x->ack_done && !x->failed) {
      if (x->ack[0] == 2)
        fail(x, "the receiver stopped the transfer after %llu bytes",
             (unsigned long long)x->ack[1]);
      else if (x->ack[0] != 0)
        fail(x, "the receiver refused the arena layout this side sent");
      else if (x->ack[1] != x->total)
        fail(x, "the receiver reports %llu bytes received of %llu sent",
             (unsigned long long)x->ack[1], (unsigned long long)x->total);
    }
  }
  *bytes = x->done_bytes;
  if (!x->failed && x->ack_done &&
      (x->o.role == ST_XFER_RECV || (x->next_arena >= x->n && x->inflight == 0)))
    return ST_XFER_DONE;
  if (!x->failed && now > x->o.deadline)
    fail(x, "the transfer did not finish by its deadline (%s; %llu of %llu bytes moved)",
         !x->started ? "never started" : x->o.role == ST_XFER_RECV && !x->header_ok
                                             ? "no header from the sender"
                                             : "moving bytes",
         (unsigned long long)x->done_bytes, (unsigned long long)x->total);
  if (x->failed) {
    snprintf(err, errlen, "%s", x->why);
    return ST_XFER_FAILED;
  }
  return ST_XFER_RUNNING;
}

static int ucx_wait_fd(st__xfer_t *x, int *fd) {
  if (x->efd < 0) return -1;
  if (x->u->ucp_worker_progress(x->worker)) return 0;
  ucs_status_t s = x->u->ucp_worker_arm(x->worker);
  if (s == UCS_ERR_BUSY) return 0;
  if (s != UCS_OK) return -1;
  *fd = x->efd;
  return 1;
}

static void ucx_abort(st__xfer_t *x, const char *why) {
  fail(x, "%s", why);
}

/* Whether a request of x is still in flight: its sends (`sends` 1) or its
 * receives. The sender sends chunks, the header and STOP and receives
 * the ACK; the receiver the other way round. */
static int busy(const struct st__xfer *x, int sends) {
  int send_role = x->o.role == ST_XFER_SEND;
  int n = 0;
  for (int i = 0; i < WINDOW; i++) n |= x->slots[i].req && send_role == sends;
  n |= x->header_slot.req && send_role == sends;
  n |= x->stop_slot.req && send_role == sends;
  n |= x->ack_slot.req && send_role != sends;
  return n;
}

/* Ends every request of x before it is freed: its receives are
 * cancelled; a send still in flight (the peer may never take it) closes
 * the endpoint, forced. Bounded; a request that still does not end
 * leaves x allocated (its callback may yet come), never freed under it. */
static int settle(struct st__xfer *x) {
  const st__ucx_api_t *u = x->u;
  int recv_role = x->o.role == ST_XFER_RECV;
  for (int i = 0; i < WINDOW; i++)
    if (x->slots[i].req && recv_role) u->ucp_request_cancel(x->worker, x->slots[i].req);
  if (x->header_slot.req && recv_role) u->ucp_request_cancel(x->worker, x->header_slot.req);
  if (x->stop_slot.req && recv_role) u->ucp_request_cancel(x->worker, x->stop_slot.req);
  if (x->ack_slot.req && !recv_role) u->ucp_request_cancel(x->worker, x->ack_slot.req);
  if (busy(x, 1) && x->pe) st__ucx_peer_kill(x->pe, "a transfer on it stopped mid-send");
  double end = st__now_mono() + CLOSE_SECONDS;
  while ((busy(x, 0) || busy(x, 1)) && st__now_mono() < end) u->ucp_worker_progress(x->worker);
  return !busy(x, 0) && !busy(x, 1);
}

/* A side that stops early tells the other, so that it ends now rather
 * than at its deadline (the endpoints outlive the transfer, so nothing
 * else would tell it): a receiver before its ACK sends the ACK with status
 * 2, a sender before the ACK came sends STOP. Best effort, bounded. */
static void tell_stopped(struct st__xfer *x) {
  if (!x->started || !x->pe || !st__ucx_peer_ep(x->pe)) return;
  slot_t *sl;
  if (x->o.role == ST_XFER_RECV) {
    if (x->ack_posted) return;
    x->ack[0] = 2;
    x->ack[1] = x->done_bytes;
    if (!post(x, &x->ack_slot, x->ack, sizeof x->ack, LOW_ACK)) return;
    x->ack_posted = 1;
    sl = &x->ack_slot;
  } else {
    if (x->ack_done) return;
    x->stop_msg = x->done_bytes;
    if (!post(x, &x->stop_slot, &x->stop_msg, sizeof x->stop_msg, LOW_STOP)) return;
    sl = &x->stop_slot;
  }
  double end = st__now_mono() + 0.2;
  while (sl->req && st__now_mono() < end) x->u->ucp_worker_progress(x->worker);
}

static void ucx_close(st__xfer_t *x) {
  if (!x) return;
  int clean = !x->failed;
  if (!clean) tell_stopped(x);
  x->failed = 1; /* callbacks from here on only release */
  int settled = settle(x);
  /* Messages for x may still come (the sender's chunks after a failed
   * receive): the worker is made again once nothing is open. */
  if (!clean || !settled) st__ucx_worker_dirty();
  for (struct st__xfer **pp = &open_list; *pp; pp = &(*pp)->next_open)
    if (*pp == x) {
      *pp = x->next_open;
      break;
    }
  st__ucx_peer_put(x->pe);
  x->pe = NULL;
  if (!settled) {
    ST_LOG_W("xfer", "ucx: a request of a closed transfer did not end within %g s; its state "
             "is kept", CLOSE_SECONDS);
    return;
  }
  free(x->arenas);
  free(x->header);
  free(x);
}

#else /* !ST_HAVE_UCX */

static int ucx_probe(const char *library, st__xfer_probe_t *out) {
  return st__ucx_probe(library, out);
}
static int ucx_open(const st__xfer_open_t *o, st__xfer_t **x, uint8_t *blob, size_t *blob_len,
                    char *err, size_t errlen) {
  snprintf(err, errlen, "built without UCX (the build found no libucx-dev headers; CMake ST_UCX)");
  return ST_ERR_CAPABILITY;
}
static int ucx_start(st__xfer_t *x, const uint8_t *peer, size_t peer_len,
                     const st__xfer_arena_t *arenas, size_t n, char *err, size_t errlen) {
  return ST_ERR_CAPABILITY;
}
static st__xfer_state_t ucx_poll(st__xfer_t *x, double now, uint64_t *bytes, char *err,
                                 size_t errlen) {
  return ST_XFER_FAILED;
}
static int ucx_wait_fd(st__xfer_t *x, int *fd) { return -1; }
static void ucx_abort(st__xfer_t *x, const char *why) {}
static void ucx_close(st__xfer_t *x) {}

#endif

const st__xfer_engine_t st__xfer_ucx_engine = {
    .name = "ucx",
    .memory = ST_XFER_MEM_CPU,
    .fanout = 0,
    .probe = ucx_probe,
    .open = ucx_open,
    .start = ucx_start,
    .poll = ucx_poll,
    .wait_fd = ucx_wait_fd,
    .abort = ucx_abort,
    .close = ucx_close,
};
