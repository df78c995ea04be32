/* src/xfer/ucx.c: the UCX engine: CPU arenas between two helpers over
 * UCP tagged messages (docs/multihost.md, "Engines").
 *
 * Why tagged messages and not RMA: a tag receive completes on the side
 * that receives, so each side learns by itself when its bytes are in
 * place, and the blob stays the worker's address alone (RMA would need
 * every arena registered and its rkey packed before the blobs are
 * swapped, and an extra message to tell the owner the reads ended). For
 * large messages UCX itself switches to its rendezvous protocol (a get
 * where the transport has one), so no copy is added.
 *
 * One UCP worker per transfer: tags need not name the transfer, and an
 * abort is the worker's end. The wire of one transfer, sender to
 * receiver unless said:
 *
 *   tag HEADER        u64 count, then count u64 arena sizes
 *   tag (a<<32 | k)   chunk k (CHUNK bytes, the last one shorter) of arena a
 *   tag ACK (back)    u64 status (0: all received; 1: layout refused),
 *                     u64 bytes received
 *
 * The receiver compares the header with its own arenas before it posts a
 * single receive, and refuses a different layout (ACK status 1). The
 * sender is done when the ACK says every byte arrived; the receiver when
 * its last chunk and the ACK's send completed. Both sides create an
 * endpoint to the other with UCP_ERR_HANDLING_MODE_PEER: a peer that dies
 * fails the transfer through the endpoint's error handler; the deadline
 * catches the rest.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "st/errors.h"
#include "xfer/engine.h"
#include "xfer/ucx_api.h"

#ifdef ST_HAVE_UCX

#define CHUNK ((uint64_t)8 << 20) /* bytes per tagged message          */
#define WINDOW 8                  /* chunks in flight per transfer      */
#define TAG_HEADER UINT64_C(0xFFFFFFFFFFFFFFFE)
#define TAG_ACK UINT64_C(0xFFFFFFFFFFFFFFFF)
#define BLOB_MAGIC "STU1"
#define CLOSE_SECONDS 2.0         /* the longest an endpoint's close may progress */

typedef struct slot {
  struct st__xfer *x;
  void *req;            /* in flight when non-NULL                       */
  uint64_t bytes;       /* expected length                               */
  int kind;             /* 0 chunk, 1 header, 2 ack                      */
} slot_t;

struct st__xfer {
  const st__ucx_api_t *u;
  st__xfer_open_t o;
  ucp_worker_h worker;
  ucp_ep_h ep;
  int efd;
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
  int ack_posted;       /* sender: its receive; receiver: its send       */
  int ack_done;
  /* A finished receiver's close lingers (below): its flush waits for the
   * sender's side, which may never answer. */
  void *close_req;
  double linger_end;
  struct st__xfer *next_linger;
};

static ucp_context_h ctx;

/* Endpoints whose graceful close is still in progress, each with its
 * worker: progressed by every open and poll of the engine, destroyed when
 * the close completes or after CLOSE_SECONDS, so that no close holds the
 * helper's loop. At most MAX_LINGER: past it the oldest is destroyed. */
#define MAX_LINGER 16
static struct st__xfer *lingering;
static void destroy(struct st__xfer *x);
static void reap_lingering(int all);

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

/* The process's UCP context, made on the first open. */
static int context(const st__ucx_api_t *u, char *err, size_t errlen) {
  if (ctx) return ST_OK;
  ucp_config_t *cfg = NULL;
  ucs_status_t s = u->ucp_config_read(NULL, NULL, &cfg);
  if (s != UCS_OK) {
    snprintf(err, errlen, "ucp_config_read: %s (check the UCX_* environment)",
             status_text(u, s));
    return ST_ERR_CAPABILITY;
  }
  ucp_params_t p;
  memset(&p, 0, sizeof p);
  p.field_mask = UCP_PARAM_FIELD_FEATURES;
  p.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  s = u->ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, &p, cfg, &ctx);
  u->ucp_config_release(cfg);
  if (s != UCS_OK) {
    ctx = NULL;
    snprintf(err, errlen, "ucp_init: %s", status_text(u, s));
    return ST_ERR_CAPABILITY;
  }
  return ST_OK;
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
  struct st__xfer *x = arg;
  if (x->ack_done && (x->o.role == ST_XFER_SEND || x->inflight == 0)) return;
  fail(x, "the peer's endpoint failed: %s (the other host's transfer helper or network went away)",
       status_text(x->u, status));
}

static int ucx_open(const st__xfer_open_t *o, st__xfer_t **out, uint8_t *blob, size_t *blob_len,
                    char *err, size_t errlen) {
  const st__ucx_api_t *u = st__ucx_api(NULL);
  if (!u) {
    snprintf(err, errlen, "UCX is unavailable (probe the engine for the reason)");
    return ST_ERR_CAPABILITY;
  }
  if (lingering) reap_lingering(0);
  if (o->nranks != 2 || (o->rank != 0 && o->rank != 1)) {
    snprintf(err, errlen,
             "the UCX engine moves to one receiver per transfer (nranks %d): open one transfer "
             "per receiver",
             o->nranks);
    return ST_ERR_CAPABILITY;
  }
  int rc = context(u, err, errlen);
  if (rc != ST_OK) return rc;
  struct st__xfer *x = calloc(1, sizeof *x);
  if (!x) {
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  x->u = u;
  x->o = *o;
  x->efd = -1;
  ucp_worker_params_t wp;
  memset(&wp, 0, sizeof wp);
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucs_status_t s = u->ucp_worker_create(ctx, &wp, &x->worker);
  if (s != UCS_OK) {
    snprintf(err, errlen, "ucp_worker_create: %s", status_text(u, s));
    free(x);
    return ST_ERR_CAPABILITY;
  }
  s = u->ucp_worker_get_efd(x->worker, &x->efd);
  if (s != UCS_OK) x->efd = -1; /* polled on the helper's tick instead */
  ucp_address_t *addr = NULL;
  size_t len = 0;
  s = u->ucp_worker_get_address(x->worker, &addr, &len);
  if (s != UCS_OK || len + 5 > ST_XFER_BLOB_MAX) {
    snprintf(err, errlen, "ucp_worker_get_address: %s",
             s != UCS_OK ? status_text(u, s) : "the address is too long");
    if (s == UCS_OK) u->ucp_worker_release_address(x->worker, addr);
    u->ucp_worker_destroy(x->worker);
    free(x);
    return ST_ERR_INTERNAL;
  }
  memcpy(blob, BLOB_MAGIC, 4);
  blob[4] = (uint8_t)o->role;
  memcpy(blob + 5, addr, len);
  *blob_len = len + 5;
  u->ucp_worker_release_address(x->worker, addr);
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
  if (info->length != sl->bytes && sl->kind != 1) {
    fail(x, "a message of %zu bytes arrived where %llu were expected (the arena layouts differ)",
         info->length, (unsigned long long)sl->bytes);
    return;
  }
  if (sl->kind == 0) {
    x->done_bytes += sl->bytes;
  } else if (sl->kind == 1) {
    sl->bytes = info->length;
    check_header(x);
  } else {
    x->ack_done = 1;
  }
}

static ucs_status_ptr_t post(struct st__xfer *x, slot_t *sl, void *buf, uint64_t len,
                             ucp_tag_t tag) {
  ucp_request_param_t p;
  memset(&p, 0, sizeof p);
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.user_data = sl;
  sl->x = x;
  sl->bytes = len;
  int sending = x->o.role == ST_XFER_SEND ? tag != TAG_ACK : tag == TAG_ACK;
  ucs_status_ptr_t r;
  /* The callback may run before the call returns (UCX completes a small
   * send at once even with NO_IMM_CMPL on some transports): it clears
   * sl->req, and then the request is gone and must not be kept. */
  static char posting;
  sl->req = &posting;
  if (sending) {
    p.cb.send = on_send;
    r = x->u->ucp_tag_send_nbx(x->ep, buf, len, tag, &p);
  } else {
    p.cb.recv = on_recv;
    r = x->u->ucp_tag_recv_nbx(x->worker, buf, len, tag, UINT64_MAX, &p);
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
    if (post(x, &x->ack_slot, x->ack, sizeof x->ack, TAG_ACK)) x->ack_posted = 1;
    return;
  }
  x->header_ok = 1;
}

static int ucx_start(st__xfer_t *x, const uint8_t *peer, size_t peer_len,
                     const st__xfer_arena_t *arenas, size_t n, char *err, size_t errlen) {
  const st__ucx_api_t *u = x->u;
  st__xfer_role_t want = x->o.role == ST_XFER_SEND ? ST_XFER_RECV : ST_XFER_SEND;
  if (peer_len <= 5 || memcmp(peer, BLOB_MAGIC, 4) != 0 || peer[4] != (uint8_t)want) {
    snprintf(err, errlen, "the peer's blob is not a UCX %s blob of this version",
             want == ST_XFER_SEND ? "sender's" : "receiver's");
    return ST_ERR_INVALID_ARGUMENT;
  }
  if (x->started) {
    snprintf(err, errlen, "the transfer was started already");
    return ST_ERR_INVALID_ARGUMENT;
  }
  x->header_slot.kind = 1;
  x->ack_slot.kind = 2;
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
  ucp_ep_params_t ep;
  memset(&ep, 0, sizeof ep);
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = (const ucp_address_t *)(peer + 5);
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = on_ep_error;
  ep.err_handler.arg = x;
  ucs_status_t s = u->ucp_ep_create(x->worker, &ep, &x->ep);
  if (s != UCS_OK) {
    x->ep = NULL;
    snprintf(err, errlen, "ucp_ep_create to the peer: %s", status_text(u, s));
    return ST_ERR_IO;
  }
  x->started = 1;
  if (x->o.role == ST_XFER_SEND) {
    x->header[0] = n;
    for (size_t i = 0; i < n; i++) x->header[1 + i] = arenas[i].bytes;
    if (!post(x, &x->ack_slot, x->ack, sizeof x->ack, TAG_ACK) ||
        !post(x, &x->header_slot, x->header, x->header_len, TAG_HEADER)) {
      snprintf(err, errlen, "%s", x->why);
      return ST_ERR_INTERNAL;
    }
    x->ack_posted = 1;
  } else {
    if (!post(x, &x->header_slot, x->header, x->header_len, TAG_HEADER)) {
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
    ucp_tag_t tag = ((uint64_t)x->next_arena << 32) | (x->next_off / CHUNK);
    sl->kind = 0;
    if (!post(x, sl, (char *)a->addr + x->next_off, len, tag)) return;
    x->inflight++;
    x->next_off += len;
  }
}

static st__xfer_state_t ucx_poll(st__xfer_t *x, double now, uint64_t *bytes, char *err,
                                 size_t errlen) {
  if (lingering) reap_lingering(0);
  if (x->worker)
    while (x->u->ucp_worker_progress(x->worker)) {
    }
  if (x->started && !x->failed) {
    if (x->o.role == ST_XFER_SEND || x->header_ok) post_chunks(x);
    int all = x->next_arena >= x->n && x->inflight == 0;
    if (x->o.role == ST_XFER_RECV && all && x->header_ok && !x->ack_posted) {
      x->ack[0] = 0;
      x->ack[1] = x->done_bytes;
      if (post(x, &x->ack_slot, x->ack, sizeof x->ack, TAG_ACK)) x->ack_posted = 1;
    }
    if (x->o.role == ST_XFER_SEND && x->ack_done && !x->failed) {
      if (x->ack[0] != 0)
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

/* Progresses until no request of the transfer is in flight (bounded). */
static void drain(struct st__xfer *x) {
  for (int i = 0; i < WINDOW; i++)
    if (x->slots[i].req && x->o.role == ST_XFER_RECV)
      x->u->ucp_request_cancel(x->worker, x->slots[i].req);
  if (x->header_slot.req && x->o.role == ST_XFER_RECV)
    x->u->ucp_request_cancel(x->worker, x->header_slot.req);
  if (x->ack_slot.req && x->o.role == ST_XFER_SEND)
    x->u->ucp_request_cancel(x->worker, x->ack_slot.req);
  double end = st__now_mono() + CLOSE_SECONDS;
  while (st__now_mono() < end) {
    int busy = x->header_slot.req || x->ack_slot.req;
    for (int i = 0; i < WINDOW; i++) busy |= x->slots[i].req != NULL;
    if (!busy) return;
    x->u->ucp_worker_progress(x->worker);
  }
}

/* The worker and what is left of x, after its endpoint is closed or
 * given up. */
static void destroy(struct st__xfer *x) {
  const st__ucx_api_t *u = x->u;

  if (x->close_req) {
    if (u->ucp_request_check_status(x->close_req) == UCS_INPROGRESS)
      u->ucp_request_cancel(x->worker, x->close_req);
    u->ucp_request_free(x->close_req);
    x->close_req = NULL;
  }
  if (x->worker) {
    drain(x);
    u->ucp_worker_destroy(x->worker);
  }
  free(x->arenas);
  free(x->header);
  free(x);
}

/* Progresses the lingering closes; destroys those that completed or ran
 * out of time (all: every one, or the oldest past MAX_LINGER). */
static void reap_lingering(int all) {
  double now = st__now_mono();
  size_t n = 0;
  for (struct st__xfer **pp = &lingering; *pp;) {
    struct st__xfer *x = *pp;
    x->u->ucp_worker_progress(x->worker);
    int ended = x->u->ucp_request_check_status(x->close_req) != UCS_INPROGRESS;
    if (all || ended || now > x->linger_end || ++n > MAX_LINGER) {
      *pp = x->next_linger;
      destroy(x);
    } else {
      pp = &x->next_linger;
    }
  }
}

static void ucx_close(st__xfer_t *x) {
  if (!x) return;
  const st__ucx_api_t *u = x->u;
  x->failed = 1; /* callbacks from here on only release */
  if (x->ep) {
    /* A receiver that finished flushes, so that its acknowledgement
     * leaves before the connection closes; everything else force-closes:
     * a flush would wait on a peer that may be gone. The flush lingers
     * (reap_lingering) instead of holding the caller. */
    ucp_request_param_t p;
    memset(&p, 0, sizeof p);
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    int flush = x->ack_done && x->o.role == ST_XFER_RECV;
    p.flags = flush ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = u->ucp_ep_close_nbx(x->ep, &p);
    x->ep = NULL;
    if (UCS_PTR_IS_PTR(r)) {
      x->close_req = r;
      if (flush) {
        x->linger_end = st__now_mono() + CLOSE_SECONDS;
        x->next_linger = lingering;
        lingering = x;
        reap_lingering(0);
        return;
      }
      double end = st__now_mono() + CLOSE_SECONDS;
      while (u->ucp_request_check_status(r) == UCS_INPROGRESS && st__now_mono() < end)
        u->ucp_worker_progress(x->worker);
    }
  }
  destroy(x);
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
