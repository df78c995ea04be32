/* src/server: `pull`, the side of a pull that asks (remote.h;
 * docs/protocol.md, "pull"; docs/multihost.md, "Pulling a key").
 *
 * A pull is a task. Its steps, each on the loop but the allocation:
 *   1. peer_describe to the peer: the version's value and arenas, checked
 *      as a hostile client's put is (every tensor inside its arena,
 *      every arena within max_object_bytes, at most 253);
 *   2. the arenas allocated on a worker (charged to the budget there:
 *      OUT_OF_MEMORY before any byte moves), with the uid's quota of
 *      pinned bytes asked first;
 *   3. the helper opens the receive; its blob goes in peer_xfer_open,
 *      whose answer (the sender's blob) starts it;
 *   4. when every byte is in: the version is published under the uid that
 *      asked, as key `as`, with its origin; nothing is visible before.
 * A live pull (`live`: docs/multihost.md, "Live replication") asks for
 * the peer's live key, whose lend reads it under its page's fence and
 * says which version it read and whether it is whole (peer_live_sent):
 * only a whole one is published, as a live key of no publisher here,
 * whose subscription (replica.c) then brings every later version.
 * A failure or a cancel at any step frees what the pull holds and tells
 * the peer (peer_xfer_abort) once it may be sending.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "engine/keys.h"
#include "engine/targs.h"
#include "engine/workers.h"
#include "peer/peer.h"
#include "server/replica.h"
#include "server/rpc.h"
#include "server/rpc_pull.h"
#include "server/work.h"
#include "st/errors.h"
#include "xfer/supervisor.h"

typedef enum { DESCRIBING = 0, ALLOCATING, OPENING, MOVING } pull_state_t;

struct st__pull {
  struct st__pull *next;
  st__server_t *srv;
  st__task_t *task;
  uint64_t id;                /* the task's id: the pull's name to the peer */
  char peer[ST__PEER_ID_MAX + 1];
  char key[ST__KEY_NAME_MAX + 1];   /* the peer's */
  char as[ST__KEY_NAME_MAX + 1];    /* the name here */
  uint64_t version;           /* asked (0: the latest), then the described one */
  uid_t uid;
  st__key_policy_t policy;
  int has_readers;
  st__grant_t readers;
  int device;                 /* here: -1 the CPU, else a CUDA ordinal; -3: as the key */
  const char *engine;          /* chosen once described (st__remote_engine_for) */
  int src_cuda;                /* the peer's key is in CUDA memory */
  pull_state_t state;
  msgpack_sbuffer value;      /* the described value, checked */
  size_t narenas;
  uint64_t *sizes;            /* owned, narenas */
  uint64_t bytes;
  st__build_result_t res;     /* the arenas allocated here, and the value */
  uint64_t req;               /* a peer request in flight (0: none) */
  st__job_t *job;             /* the allocation on a worker (borrowed) */
  uint64_t xfer;              /* the helper's transfer (xfer_open) */
  int xfer_open;
  int sending;                /* the peer may be sending: abort tells it */
  int cancelled;              /* stopped: ends with end_code and end_why
                                 when its job or transfer comes back      */
  int end_code;
  char end_why[600];
  uint64_t moved;
  double t0;
  int pushed;                 /* started by a peer's replicate (peer_pull) */
  st__peer_ticket_t push_ticket;   /* answered when the pull ends */
  uint64_t push_id;           /* the pushing server's replicate task */
  uint64_t published;         /* the version made here */
  int live;                   /* a live pull: publish after the verdict too */
  int got_all;                /* every byte is in */
  int verdict;                /* peer_live_sent came: */
  uint64_t verdict_version;   /* the version the bytes are */
  int verdict_whole;          /* read under the fence, nothing overran it */
};

/* ------------------------------------------------------------- the list */

static void unlink_pull(st__remote_t *rm, st__pull_t *p) {
  for (st__pull_t **pp = &rm->pulls; *pp; pp = &(*pp)->next)
    if (*pp == p) {
      *pp = p->next;
      return;
    }
}

void st__pulls_of(const st__server_t *srv, const char *peer, unsigned *n, uint64_t *bytes) {
  *n = 0;
  *bytes = 0;
  for (const st__pull_t *p = srv->remote ? srv->remote->pulls : NULL; p; p = p->next)
    if (!peer || !strcmp(p->peer, peer)) (*n)++, *bytes += p->bytes;
}

/* Sends request `method` (params packed in sb) to p's peer, with cb
 * called once for its outcome: ST_OK, or the error (cb is then never
 * called). p->req names it while it is pending. */
static int request(st__pull_t *p, const char *method, const msgpack_sbuffer *sb, double timeout,
                   st__peer_reply_fn cb, char *err, size_t errlen) {
  return st__peer_request(p->srv->peer, p->peer, method, sb->data, sb->size, timeout, cb, p,
                          &p->req, err, errlen);
}

/* Ends the pull: its task completed (code ST_OK, result moved in) or
 * failed with `why`. Frees what it holds. The job, a request and the
 * transfer must be over or forgotten first. */
static void finish(st__pull_t *p, int code, const char *why, st__build_result_t *result) {
  st__server_t *srv = p->srv;
  st__remote_t *rm = srv->remote;
  if (p->req) st__peer_cancel(srv->peer, p->req);
  if (code != ST_OK && p->sending && srv->peer) {
    msgpack_sbuffer sb;
    msgpack_packer pk;
    st__remote_pack_begin(&sb, &pk, 1);
    msgpack_pack_map(&pk, 1);
    st__pack_kv_uint(&pk, "xfer", p->id);
    st__peer_request(srv->peer, p->peer, "peer_xfer_abort", sb.data, sb.size, 10.0,
                     st__remote_ignore_reply, NULL, NULL, NULL, 0);
    msgpack_sbuffer_destroy(&sb);
  }
  unlink_pull(rm, p);
  p->task->cancel = NULL;
  p->task->op = NULL;
  if (p->pushed && srv->peer) {      /* the pushing server's peer_pull */
    if (code == ST_OK) {
      msgpack_sbuffer sb;
      msgpack_packer pk;
      st__remote_pack_begin(&sb, &pk, 0);
      msgpack_pack_map(&pk, 2);
      st__pack_kv_str(&pk, "key", p->as);
      st__pack_kv_uint(&pk, "version", p->published);
      st__peer_reply(srv->peer, p->push_ticket, sb.data, sb.size);
      msgpack_sbuffer_destroy(&sb);
    } else {
      st__peer_reply_error(srv->peer, p->push_ticket, code, why);
    }
  }
  if (code == ST_OK) {
    rm->pulls_done++;
    rm->bytes_in += p->bytes;
    st__task_finish_plain(srv, p->task, result);
  } else {
    rm->pulls_failed++;
    ST_LOG_W("peer", "pull of key '%s' from '%s' (task %llu) failed: %s", p->key, p->peer,
             (unsigned long long)p->id, why);
    st__task_finish_error(srv, p->task, code, why);
  }
  msgpack_sbuffer_destroy(&p->value);
  st__build_result_destroy(&p->res);
  free(p->sizes);
  free(p);
}

static void fail(st__pull_t *p, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(st__pull_t *p, int code, const char *fmt, ...) {
  char m[900];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof m, fmt, ap);
  va_end(ap);
  finish(p, code, m, NULL);
}

/* Stops whatever the pull waits for; it ends with code and why at once,
 * or when its job or transfer comes back. */
static void stop(st__pull_t *p, int code, const char *why) {
  if (!p->cancelled) {
    p->cancelled = 1;
    p->end_code = code;
    snprintf(p->end_why, sizeof p->end_why, "%s", why);
  }
  if (p->job) {                 /* allocated ends it */
    st__job_cancel(p->job);
    return;
  }
  if (p->xfer_open) {           /* xfer_done ends it */
    st__xfer_sup_abort(p->srv->remote->sup, p->xfer, why);
    return;
  }
  finish(p, p->end_code, p->end_why, NULL);
}

void st__pulls_fail(st__server_t *srv, const char *peer, int code, const char *why) {
  st__remote_t *rm = srv->remote;
  st__pull_t *p = rm ? rm->pulls : NULL;
  while (p) {
    st__pull_t *next = p->next;
    if (!peer || !strcmp(p->peer, peer)) {
      if (code == ST_ERR_SHUTTING_DOWN) {   /* no callback comes back after the stop */
        if (p->job) p->job->back_ctx = NULL, st__job_cancel(p->job);   /* allocated frees it */
        p->job = NULL;
        p->xfer_open = 0;
      }
      stop(p, code, why);
    }
    p = next;
  }
}

void st__pulls_stop_pushed(st__server_t *srv, const char *peer, uint64_t push_id) {
  st__pull_t *p = srv->remote ? srv->remote->pulls : NULL;
  while (p) {
    st__pull_t *next = p->next;
    if (p->pushed && p->push_id == push_id && !strcmp(p->peer, peer))
      stop(p, ST_ERR_CANCELLED, "cancelled by the server that pushed it");
    p = next;
  }
}

static void on_cancel(st__server_t *srv, st__task_t *t) {
  (void)srv;
  st__pull_t *p = t->op;
  if (p) stop(p, ST_ERR_CANCELLED, "cancelled");
}

/* ------------------------------------------------------------- 4. publish */

static void publish(st__pull_t *p) {
  st__server_t *srv = p->srv;
  st__key_origin_t origin;
  memset(&origin, 0, sizeof origin);
  snprintf(origin.peer, sizeof origin.peer, "%s", p->peer);
  snprintf(origin.key, sizeof origin.key, "%s", p->key);
  origin.version = p->version;
  if (p->live) origin.version = p->version = p->verdict_version;
  st__key_put_t kp = {.name = p->as, .len = strlen(p->as), .uid = p->uid, .conn = 0,
                      .policy = p->policy, .readers = p->has_readers ? &p->readers : NULL,
                      .precharged = 1, .origin = &origin, .live = p->live};
  uint64_t version = 0;
  char err[600];
  int rc = st__keys_put(&srv->keys, &kp, &p->res, &version, err, sizeof err);
  if (rc != ST_OK) {
    fail(p, rc, "pull: every byte arrived but the key could not be published: %s", err);
    return;
  }
  if (p->live) {
    /* The replica shows its source's number from its first version on,
     * and its subscription brings the next ones (replica.c). */
    st__who_t who = {.uid = geteuid(), .gid = getegid(), .admin = 1};
    st__key_t *k = NULL;
    st__key_version_t *kv = NULL;
    if (st__keys_get(&srv->keys, p->as, strlen(p->as), &who, 0, &k, &kv, err, sizeof err) ==
            ST_OK && k->live)
      st__key_page_end_as(k->page, st__key_page_begin(k->page), p->verdict_version);
    version = p->verdict_version;
    rc = st__replica_start(srv, p->id, p->peer, p->key, p->as, p->engine, version, err,
                           sizeof err);
    if (rc != ST_OK)
      ST_LOG_W("peer", "live key '%s' from '%s': the replica holds version %llu but cannot "
               "follow it: %s", p->key, p->peer, (unsigned long long)version, err);
  }
  p->published = version;
  double s = st__now_mono() - p->t0;
  ST_LOG_I("peer", "pulled key '%s' version %llu from '%s' as '%s' version %llu: %llu bytes in "
           "%zu arenas, %.3f s", p->key, (unsigned long long)p->version, p->peer, p->as,
           (unsigned long long)version, (unsigned long long)p->bytes, p->narenas, s);
  st__build_result_t out;
  st__build_result_init(&out);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &out.value, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, p->live ? 6 : 5);
  st__pack_kv_str(&pk, "key", p->as);
  st__pack_kv_uint(&pk, "version", version);
  if (p->live) st__pack_kv_bool(&pk, "live", 1);
  st__pack_cstr(&pk, "origin");
  msgpack_pack_map(&pk, 3);
  st__pack_kv_str(&pk, "peer", p->peer);
  st__pack_kv_str(&pk, "key", p->key);
  st__pack_kv_uint(&pk, "version", p->version);
  st__pack_kv_uint(&pk, "bytes", p->bytes);
  st__pack_kv_double(&pk, "seconds", s);
  finish(p, ST_OK, NULL, &out);
}

/* ------------------------------------------------------------- 3. transfer */

static void xfer_opened(void *ud, uint64_t xfer, const uint8_t *blob, size_t len);
static void xfer_progress(void *ud, uint64_t xfer, uint64_t bytes, uint64_t total);
static void xfer_done(void *ud, uint64_t xfer, int ok, uint64_t bytes, int code,
                      const char *error);
static const st__xfer_sup_cbs_t pull_cbs = {xfer_opened, xfer_progress, xfer_done};

static void open_transfer(st__pull_t *p) {
  st__remote_t *rm = p->srv->remote;
  if (p->narenas == 0) {        /* a value with no tensor: nothing to move */
    publish(p);
    return;
  }
  if (!rm->sup) {
    fail(p, ST_ERR_CAPABILITY, "pull: this server's transfer helper is not running (see its log)");
    return;
  }
  double timeout = st__remote_transfer_timeout(p->srv);
  char err[400];
  int rc = st__xfer_sup_open(rm->sup, p->engine, ST_XFER_RECV, 2, 1, (uint32_t)(timeout * 1e3),
                             &pull_cbs, p, &p->xfer, err, sizeof err);
  if (rc != ST_OK) {
    fail(p, rc, "pull: the transfer helper: %s", err);
    return;
  }
  p->xfer_open = 1;
  p->state = OPENING;
}

/* The sender's answer to peer_xfer_open: its blob starts the receive. */
static void xfer_answered(void *ud, const char *peer, int code, const char *message,
                          const msgpack_object *result) {
  st__pull_t *p = ud;
  st__server_t *srv = p->srv;
  (void)peer;
  p->req = 0;
  if (p->cancelled) return;            /* the abort's done ends it */
  char err[400] = "";
  int rc = st__remote_start_receive(srv, p->peer, code, message, result, p->xfer, &p->res, NULL,
                                    NULL, err, sizeof err);
  if (rc != ST_OK) {                    /* xfer_done ends the pull */
    stop(p, rc, err);
    return;
  }
  p->state = MOVING;
  ST_LOG_D("peer", "pull %llu: '%s' sends", (unsigned long long)p->id, p->peer);
}

static void xfer_opened(void *ud, uint64_t xfer, const uint8_t *blob, size_t len) {
  st__pull_t *p = ud;
  st__server_t *srv = p->srv;
  (void)xfer;
  if (p->cancelled) return;            /* the abort's done ends it */
  ST_LOG_D("peer", "pull %llu: the receive is open; asking '%s' to send",
           (unsigned long long)p->id, p->peer);
  char err[400];
  p->sending = 1;   /* from now on the peer may lend: an abort tells it */
  int rc = st__remote_ask_send(srv, p->peer, p->key, p->version, p->id, p->engine, p->live, blob,
                               len, xfer_answered, p, &p->req, err, sizeof err);
  if (rc != ST_OK) stop(p, rc, err);
}

static void xfer_progress(void *ud, uint64_t xfer, uint64_t bytes, uint64_t total) {
  st__pull_t *p = ud;
  (void)xfer;
  p->moved = bytes;
  char note[96];
  int n = snprintf(note, sizeof note, "%llu of %llu bytes", (unsigned long long)bytes,
                   (unsigned long long)total);
  st__progress_set(&p->task->progress, total ? (double)bytes / (double)total : 0.0, note,
                   n > 0 ? (size_t)n : 0);
}

/* A live pull's bytes are in and the peer said what they are: a whole
 * version is published; one an update overran is not. */
static void live_landed(st__pull_t *p) {
  if (p->verdict_whole) {
    publish(p);
    return;
  }
  fail(p, ST_ERR_STALE_HANDLE, "pull: live key '%s' from '%s': version %llu was updated while it "
       "was read (an update went past the fence's deadline, peer.transfer_timeout_s); nothing "
       "was published: pull it again", p->key, p->peer,
       (unsigned long long)p->verdict_version);
}

/* See remote.h. */
int st__pull_live_sent(st__server_t *srv, const char *peer, uint64_t xfer, uint64_t version,
                       int whole) {
  for (st__pull_t *p = srv->remote ? srv->remote->pulls : NULL; p; p = p->next) {
    if (p->id != xfer || !p->live || strcmp(p->peer, peer) || p->verdict) continue;
    p->verdict = 1;
    p->verdict_version = version;
    p->verdict_whole = whole && version > 0;
    if (p->got_all && !p->cancelled) live_landed(p);
    return 1;
  }
  return 0;
}

static void xfer_done(void *ud, uint64_t xfer, int ok, uint64_t bytes, int code,
                      const char *error) {
  st__pull_t *p = ud;
  (void)xfer;
  p->xfer_open = 0;
  if (ok && !p->cancelled && bytes == p->bytes) {
    p->sending = 0;
    if (!p->live) {
      publish(p);
    } else {
      p->got_all = 1;
      if (p->verdict) live_landed(p);   /* else when peer_live_sent comes */
    }
    return;
  }
  if (p->cancelled) {
    finish(p, p->end_code, p->end_why, NULL);
    return;
  }
  fail(p, code && code != ST_OK ? code : ST_ERR_IO,
       "pull: key '%s' from '%s': the transfer failed after %llu of %llu bytes: %s", p->key,
       p->peer, (unsigned long long)bytes, (unsigned long long)p->bytes,
       error && error[0] ? error : "no reason given");
}

/* ------------------------------------------------------------- 2. allocation */

typedef struct alloc_in {
  int device;
  size_t n;
  uint64_t *sizes;            /* borrowed from the pull, which outlives the job */
} alloc_in_t;

/* Worker: one arena per size, charged to the budget (which may evict
 * cached objects and evictable key versions first), zero-filled. */
static int alloc_run(st__job_t *job, char *err, size_t errlen) {
  alloc_in_t *in = job->ud;
  job->result.arenas = calloc(in->n, sizeof *job->result.arenas);
  if (!job->result.arenas) {
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  for (size_t i = 0; i < in->n; i++) {
    if (__atomic_load_n(&job->cancel, __ATOMIC_RELAXED)) {
      snprintf(err, errlen, "cancelled");
      return ST_ERR_CANCELLED;
    }
    st__arena_spec_t s = {.device = in->device, .bytes = in->sizes[i]};
    char why[400];
    int rc = st__arena_new(&s, &job->result.arenas[i], why, sizeof why);
    if (rc != ST_OK) {
      snprintf(err, errlen, "arena %zu of %zu (%llu bytes): %s", i, in->n,
               (unsigned long long)in->sizes[i], why);
      return rc;
    }
    job->result.narenas++;
    job->result.bytes += in->sizes[i];
  }
  return ST_OK;
}

static void allocated(void *ctx, st__job_t *job) {
  st__pull_t *p = ctx;
  if (!p) {                     /* its pull ended with the server's stop */
    st__job_free(job);
    return;
  }
  p->job = NULL;
  if (p->cancelled) {
    st__job_free(job);
    finish(p, p->end_code, p->end_why, NULL);
    return;
  }
  if (job->status != ST_OK) {
    int rc = job->status;
    char why[1100];
    snprintf(why, sizeof why, "pull: key '%s' from '%s' needs %llu bytes in %zu arenas here: "
             "%.600s; nothing moved", p->key, p->peer, (unsigned long long)p->bytes, p->narenas,
             job->error);
    st__job_free(job);
    finish(p, rc, why, NULL);
    return;
  }
  p->res.arenas = job->result.arenas;
  p->res.narenas = job->result.narenas;
  p->res.bytes = job->result.bytes;
  job->result.arenas = NULL;
  job->result.narenas = 0;
  msgpack_sbuffer_write(&p->res.value, p->value.data, p->value.size);
  st__job_free(job);
  ST_LOG_D("peer", "pull %llu: %zu arenas allocated", (unsigned long long)p->id, p->narenas);
  open_transfer(p);
}

static void allocate(st__pull_t *p) {
  st__server_t *srv = p->srv;
  alloc_in_t *in = malloc(sizeof *in);
  st__job_t *job = in ? st__job_new_native(0, 0, alloc_run, in, free) : NULL;
  if (!job) {
    free(in);
    fail(p, ST_ERR_OUT_OF_MEMORY, "pull: out of memory");
    return;
  }
  *in = (alloc_in_t){.device = p->device, .n = p->narenas, .sizes = p->sizes};
  job->back_on_loop = allocated;
  job->back_ctx = p;
  if (srv->shutting_down || !srv->workers || st__workers_submit(srv->workers, job) != ST_OK) {
    st__job_free(job);
    fail(p, ST_ERR_SHUTTING_DOWN, "pull: the server is shutting down");
    return;
  }
  p->job = job;
  p->state = ALLOCATING;
}

/* ------------------------------------------------------------- 1. describe */

/* Checks the peer's description (nothing a peer sends is trusted) and
 * keeps its value and arena sizes. ST_OK or an error with the reason. */
static int take_description(st__pull_t *p, const msgpack_object *d, char *err, size_t errlen) {
  const msgpack_object *version = d ? st__map_get(d, "version") : NULL;
  const msgpack_object *value = d ? st__map_get(d, "value") : NULL;
  const msgpack_object *arenas = d ? st__map_get(d, "arenas") : NULL;
  if (!version || version->type != MSGPACK_OBJECT_POSITIVE_INTEGER || version->via.u64 == 0 ||
      !value || !arenas || arenas->type != MSGPACK_OBJECT_ARRAY ||
      arenas->via.array.size > ST_MAX_FDS_PER_MESSAGE) {
    snprintf(err, errlen, "peer '%s' described key '%s' without a version, a value or at most "
             "%d arenas", p->peer, p->key, ST_MAX_FDS_PER_MESSAGE);
    return ST_ERR_PROTOCOL;
  }
  if (p->version && version->via.u64 != p->version) {
    snprintf(err, errlen, "peer '%s' described version %llu of key '%s'; version %llu was asked",
             p->peer, (unsigned long long)version->via.u64, p->key,
             (unsigned long long)p->version);
    return ST_ERR_PROTOCOL;
  }
  size_t n = arenas->via.array.size;
  st__arena_desc_t *descs = calloc(n ? n : 1, sizeof *descs);
  p->sizes = calloc(n ? n : 1, sizeof *p->sizes);
  if (!descs || !p->sizes) {
    free(descs);
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  int cuda = -1, rc = ST_OK;
  uint64_t total = 0;
  for (size_t i = 0; i < n && rc == ST_OK; i++) {
    const msgpack_object *a = &arenas->via.array.ptr[i];
    const msgpack_object *b = a->type == MSGPACK_OBJECT_MAP ? st__map_get(a, "bytes") : NULL;
    const msgpack_object *dev = a->type == MSGPACK_OBJECT_MAP ? st__map_get(a, "device") : NULL;
    int is_cuda = st__str_eq(dev, "cuda");
    char why[300];
    if (!b || b->type != MSGPACK_OBJECT_POSITIVE_INTEGER || b->via.u64 == 0 ||
        (!is_cuda && !st__str_eq(dev, "cpu"))) {
      snprintf(err, errlen, "peer '%s': arena %zu of key '%s' is not {bytes, device}", p->peer,
               i, p->key);
      rc = ST_ERR_PROTOCOL;
    } else if (cuda >= 0 && is_cuda != cuda) {
      snprintf(err, errlen, "peer '%s': key '%s' mixes CPU and CUDA arenas", p->peer, p->key);
      rc = ST_ERR_PROTOCOL;
    } else if ((rc = st__arena_check_limit(b->via.u64, why, sizeof why)) != ST_OK) {
      snprintf(err, errlen, "key '%s' from '%s': arena %zu: %.200s", p->key, p->peer, i, why);
    } else {
      cuda = is_cuda;
      descs[i].bytes = p->sizes[i] = b->via.u64;
      descs[i].cuda = is_cuda;
      total += b->via.u64;
    }
  }
  if (rc == ST_OK && (rc = st__check_value(value, 1, err, errlen)) == ST_OK) {
    st__targs_t t = {.n = n, .descs = descs};
    st__param_t param = {.name = "value", .type = ST_PARAM_ANY};
    rc = st__targs_check(&t, &param, value, NULL, err, errlen);
  }
  free(descs);
  if (rc != ST_OK) return rc == ST_ERR_INVALID_ARGUMENT ? ST_ERR_PROTOCOL : rc;
  p->version = version->via.u64;
  p->narenas = n;
  p->bytes = total;
  p->src_cuda = cuda == 1;
  if (p->device == -3) p->device = cuda == 1 ? 0 : -1;
  msgpack_packer pk;
  msgpack_packer_init(&pk, &p->value, msgpack_sbuffer_write);
  msgpack_pack_object(&pk, *value);
  return ST_OK;
}

static void described(void *ud, const char *peer, int code, const char *message,
                      const msgpack_object *result) {
  st__pull_t *p = ud;
  st__server_t *srv = p->srv;
  const st__peer_conf_t *pc = &srv->cfg->peer;
  (void)peer;
  p->req = 0;
  if (code != ST_OK) {
    fail(p, code, "pull: key '%s' from '%s': %s", p->key, p->peer,
         message ? message : st_strerror(code));
    return;
  }
  char err[700], why[400];
  int rc = take_description(p, result, err, sizeof err);
  if (rc != ST_OK) {
    fail(p, rc, "pull: %s", err);
    return;
  }
  /* NCCL between two CUDA ends when both servers have it; UCX otherwise,
   * a CUDA end staged through host memory by its helper. */
  p->engine = st__remote_engine_for(
      p->src_cuda, p->device >= 0,
      p->src_cuda && p->device >= 0 &&
          st__peer_engine_usable(srv->peer, p->peer, "nccl", why, sizeof why));
  if (p->narenas && !st__peer_engine_usable(srv->peer, p->peer, p->engine, why, sizeof why)) {
    fail(p, ST_ERR_CAPABILITY, "pull: key '%s' from '%s' moves over %s: %s", p->key, p->peer,
         p->engine, why);
    return;
  }
  unsigned n;
  uint64_t inflight;
  st__pulls_of(srv, p->peer, &n, &inflight);   /* this pull included */
  if ((int)n > pc->max_transfers_per_peer) {
    fail(p, ST_ERR_BUSY, "pull: key '%s' from '%s': %u pulls from it run already "
         "(peer.max_transfers_per_peer = %d)", p->key, p->peer, n - 1, pc->max_transfers_per_peer);
    return;
  }
  if (inflight > pc->max_bytes_in_flight_per_peer) {
    fail(p, ST_ERR_BUSY, "pull: key '%s' from '%s': %llu bytes with the pulls from it in flight "
         "pass peer.max_bytes_in_flight_per_peer = %llu", p->key, p->peer,
         (unsigned long long)inflight, (unsigned long long)pc->max_bytes_in_flight_per_peer);
    return;
  }
  ST_LOG_D("peer", "pull %llu: '%s' version %llu described: %llu bytes in %zu arenas",
           (unsigned long long)p->id, p->key, (unsigned long long)p->version,
           (unsigned long long)p->bytes, p->narenas);
  if (st__uidq_room(p->uid, ST__UIDQ_PINNED_BYTES, p->bytes, why, sizeof why) != ST_OK) {
    fail(p, ST_ERR_LIMIT, "pull: key '%s' from '%s': %s", p->key, p->peer, why);
    return;
  }
  allocate(p);
}

/* ------------------------------------------------------------- the method */

/* See remote.h. */
int st__pull_start(st__server_t *srv, const st__pull_req_t *q, uint64_t *task_id, char *err,
                   size_t errlen) {
  if (!srv->peer) {
    snprintf(err, errlen, "this server has no peers (config.lua: peer = { ... }; "
             "docs/multihost.md)");
    return ST_ERR_CAPABILITY;
  }
  char why[400];
  if (st__keys_name_ok(q->key, strlen(q->key), why, sizeof why) != ST_OK ||
      st__keys_name_ok(q->as, strlen(q->as), why, sizeof why) != ST_OK) {
    snprintf(err, errlen, "%s", why);
    return ST_ERR_INVALID_ARGUMENT;
  }
  int up = st__remote_peer_up(srv, q->peer, err, errlen);
  if (up != ST_OK) return up;
  st__pull_t *p = calloc(1, sizeof *p);
  if (!p) {
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  p->srv = srv;
  p->uid = q->uid;
  p->device = q->device;
  p->policy = q->policy;
  p->version = q->version;
  if (q->readers) p->has_readers = 1, p->readers = *q->readers;
  p->pushed = q->pushed;
  p->push_ticket = q->push_ticket;
  p->push_id = q->push_id;
  p->live = q->live;
  snprintf(p->peer, sizeof p->peer, "%s", q->peer);
  snprintf(p->key, sizeof p->key, "%s", q->key);
  snprintf(p->as, sizeof p->as, "%s", q->as);
  msgpack_sbuffer_init(&p->value);
  st__build_result_init(&p->res);
  p->t0 = st__now_mono();
  int code;
  p->task = st__task_new(srv, q->pushed ? "pull (pushed)" : q->live ? "pull (live)" : "pull",
                         p->uid, err, errlen, &code);
  if (!p->task) {
    msgpack_sbuffer_destroy(&p->value);
    free(p);
    return code;
  }
  p->id = p->task->id;
  p->task->cancel = on_cancel;
  p->task->op = p;
  st__task_started(srv, p->task, st__now_unix());
  p->next = srv->remote->pulls;
  srv->remote->pulls = p;

  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__remote_pack_begin(&sb, &pk, 1);
  msgpack_pack_map(&pk, (p->version ? 2 : 1) + p->live);
  st__pack_kv_str(&pk, "key", p->key);
  if (p->version) st__pack_kv_uint(&pk, "version", p->version);
  if (p->live) st__pack_kv_bool(&pk, "live", 1);
  double timeout = st__remote_connect_timeout(srv);
  *task_id = p->id;   /* a failure below ends (and frees) p; the task stands, failed */
  char rerr[400];
  int rc = request(p, "peer_describe", &sb, timeout, described, rerr, sizeof rerr);
  msgpack_sbuffer_destroy(&sb);
  if (rc != ST_OK) fail(p, rc, "pull: %s", rerr);
  return ST_OK;
}

/* pull {key, from, version?, as?, device?, policy?, readers?, live?} ->
 * {task_id}; the task's result: {key, version, live?, origin: {peer,
 * key, version}, bytes, seconds}. */
void st__rpc_pull(st__rpc_req_t *r) {
  const msgpack_object *key = st__rpc_arg(r, "key"), *from = st__rpc_arg(r, "from");
  const msgpack_object *as = st__rpc_arg(r, "as");
  char k[ST__KEY_NAME_MAX + 1], a[ST__KEY_NAME_MAX + 1], peer[ST__PEER_ID_MAX + 1], err[700];
  if (st__wire_cstr(key, k, sizeof k) <= 0 || (as && st__wire_cstr(as, a, sizeof a) <= 0)) {
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "pull: key and as must be key names (at most %d "
                  "bytes of A-Z a-z 0-9 . _ - / :)", ST__KEY_NAME_MAX);
    return;
  }
  if (st__wire_cstr(from, peer, sizeof peer) <= 0) {
    st__rpc_error(r, ST_ERR_NOT_FOUND, "pull: no peer with that id");
    return;
  }
  st__pull_req_t q = {.peer = peer, .key = k, .as = as ? a : k, .uid = r->c->cred.uid,
                      .version = st__rpc_u64(r, "version", 0), .device = -3,
                      .policy = (st__key_policy_t)st__rpc_word(r, "policy", ST__KEY_PINNED)};
  if (st__rpc_arg(r, "device") && (q.device = st__rpc_device(r)) == -2) return;
  const msgpack_object *live = st__rpc_arg(r, "live");
  q.live = live && live->type == MSGPACK_OBJECT_BOOLEAN && live->via.boolean;
  if (q.live && q.version) {
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "pull: a live pull follows the key's versions "
                  "from its current one: version cannot be given with live");
    return;
  }
  if (q.live && q.policy != ST__KEY_PINNED) {
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "pull: a live replica is pinned: policy cannot be "
                  "given with live");
    return;
  }
  st__grant_t readers;
  int given = st__rpc_readers(r, &readers);
  if (given < 0) return;
  if (given) q.readers = &readers;
  uint64_t id = 0;
  int rc = st__pull_start(r->c->srv, &q, &id, err, sizeof err);
  if (rc != ST_OK) {
    st__rpc_error(r, rc, "pull: %s", err);
    return;
  }
  msgpack_sbuffer reply;
  msgpack_packer pk;
  st__reply_begin(&reply, &pk, r->id);
  msgpack_pack_map(&pk, 1);
  st__pack_kv_uint(&pk, "task_id", id);
  st__reply_send(r->c, r->id, &reply);
}
