/* src/xfer/nccl.c: the NCCL engine: CUDA arenas between helpers with
 * ncclSend/ncclRecv (two ranks) or ncclBroadcast from rank 0 (a fan-out
 * to N receivers), on a stream of the helper's (docs/multihost.md,
 * "Engines").
 *
 * The sender's open makes the unique id (its blob: a bearer secret, sent
 * only to the server, which sends it only over the peer channel; never
 * logged). Start creates the communicator non-blocking
 * (ncclCommInitRankConfig, blocking = 0) and every poll asks
 * ncclCommGetAsyncError: a peer that never joins or fails later ends in
 * ncclCommAbort at the deadline or at the error. One operation per arena
 * is enqueued on the stream, each followed by an event, so the bytes done
 * grow arena by arena.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st/errors.h"
#include "xfer/engine.h"
#include "xfer/nccl_api.h"

#ifdef ST_HAVE_CUDA
#include "cudadrv/driver.h"

#define BLOB_MAGIC "STN1"

typedef enum { PH_OPENED, PH_INIT, PH_ENQUEUE, PH_WAIT, PH_DONE, PH_FAILED } phase_t;

struct st__xfer {
  const st__nccl_api_t *nc;
  const st__cuda_api_t *cu;
  st__xfer_open_t o;
  st__nccl_unique_id_t id;
  st__nccl_comm_t comm;
  int device;
  CUstream stream;
  CUevent *events;
  st__xfer_arena_t *arenas;
  size_t n;
  size_t enqueued;     /* operations handed to NCCL                      */
  int pending;         /* the last one returned ncclInProgress           */
  size_t completed;    /* operations whose event completed               */
  uint64_t done_bytes;
  phase_t phase;
  char why[320];
};

static void fail(struct st__xfer *x, const char *why, const char *detail) {
  if (x->phase == PH_FAILED) return;
  snprintf(x->why, sizeof x->why, "%s%s%s", why, detail ? ": " : "", detail ? detail : "");
  x->phase = PH_FAILED;
  if (x->comm) {
    /* Releases NCCL's threads and the peer connections even when a rank
     * never joined; a helper that still hangs here is killed by the
     * server (the abort of last resort). */
    x->nc->ncclCommAbort(x->comm);
    x->comm = NULL;
  }
}

static const char *nccl_text(struct st__xfer *x, st__nccl_result_t r) {
  const char *t = x->nc->ncclGetErrorString(r);
  return t ? t : "unknown NCCL error";
}

static int nccl_probe(const char *library, st__xfer_probe_t *out) {
  return st__nccl_probe(library, out);
}

static int nccl_open(const st__xfer_open_t *o, st__xfer_t **out, uint8_t *blob, size_t *blob_len,
                     char *err, size_t errlen) {
  const st__nccl_api_t *nc = st__nccl_api(NULL);
  if (!nc) {
    snprintf(err, errlen, "NCCL is unavailable (probe the engine for the reason)");
    return ST_ERR_CAPABILITY;
  }
  const st__cuda_api_t *cu = st__cuda_api(err, errlen);
  if (!cu) return ST_ERR_CAPABILITY;
  if (o->nranks < 2 || o->rank < 0 || o->rank >= o->nranks ||
      (o->role == ST_XFER_SEND) != (o->rank == 0)) {
    snprintf(err, errlen, "bad ranks: rank %d of %d as %s (the sender is rank 0)", o->rank,
             o->nranks, o->role == ST_XFER_SEND ? "sender" : "receiver");
    return ST_ERR_INVALID_ARGUMENT;
  }
  struct st__xfer *x = calloc(1, sizeof *x);
  if (!x) {
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  x->nc = nc;
  x->cu = cu;
  x->o = *o;
  x->device = -1;
  memcpy(blob, BLOB_MAGIC, 4);
  blob[4] = (uint8_t)o->role;
  *blob_len = 5;
  if (o->role == ST_XFER_SEND) {
    st__nccl_result_t r = nc->ncclGetUniqueId(&x->id);
    if (r != ST_NCCL_SUCCESS) {
      snprintf(err, errlen, "ncclGetUniqueId: %s", nccl_text(x, r));
      free(x);
      return ST_ERR_IO;
    }
    memcpy(blob + 5, &x->id, sizeof x->id);
    *blob_len = 5 + sizeof x->id;
  }
  *out = x;
  return ST_OK;
}

static int cu_fail(struct st__xfer *x, CUresult r, const char *what, char *err, size_t errlen) {
  int rc = st__cuda_error(r, what, err, errlen);
  fail(x, err, NULL);
  return rc;
}

static int nccl_start(st__xfer_t *x, const uint8_t *peer, size_t peer_len,
                      const st__xfer_arena_t *arenas, size_t n, char *err, size_t errlen) {
  st__xfer_role_t want = x->o.role == ST_XFER_SEND ? ST_XFER_RECV : ST_XFER_SEND;
  size_t want_len = want == ST_XFER_SEND ? 5 + sizeof x->id : 5;
  if (peer_len != want_len || memcmp(peer, BLOB_MAGIC, 4) != 0 || peer[4] != (uint8_t)want) {
    snprintf(err, errlen, "the peer's blob is not an NCCL %s blob of this version",
             want == ST_XFER_SEND ? "sender's" : "receiver's");
    return ST_ERR_INVALID_ARGUMENT;
  }
  if (x->phase != PH_OPENED || n == 0) {
    snprintf(err, errlen, x->phase != PH_OPENED ? "the transfer was started already"
                                                : "a transfer needs at least one arena");
    return ST_ERR_INVALID_ARGUMENT;
  }
  if (want == ST_XFER_SEND) memcpy(&x->id, peer + 5, sizeof x->id);
  x->device = arenas[0].device;
  for (size_t i = 1; i < n; i++)
    if (arenas[i].device != x->device) {
      snprintf(err, errlen, "arena %zu is on device %d, arena 0 on device %d: one transfer "
               "moves the arenas of one device", i, arenas[i].device, x->device);
      return ST_ERR_INVALID_ARGUMENT;
    }
  x->arenas = calloc(n, sizeof *arenas);
  x->events = calloc(n, sizeof *x->events);
  if (!x->arenas || !x->events) {
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  memcpy(x->arenas, arenas, n * sizeof *arenas);
  x->n = n;
  int rc = st__cuda_ctx_enter(x->device, err, errlen);
  if (rc != ST_OK) return rc;
  CUresult cr = x->cu->cuStreamCreate(&x->stream, CU_STREAM_NON_BLOCKING);
  if (cr != CUDA_SUCCESS) return cu_fail(x, cr, "cuStreamCreate", err, errlen);
  for (size_t i = 0; i < n; i++) {
    cr = x->cu->cuEventCreate(&x->events[i], CU_EVENT_DISABLE_TIMING);
    if (cr != CUDA_SUCCESS) return cu_fail(x, cr, "cuEventCreate", err, errlen);
  }
  st__nccl_config_t cfg;
  st__nccl_config_init(&cfg, 0);
  st__nccl_result_t r =
      x->nc->ncclCommInitRankConfig(&x->comm, x->o.nranks, x->id, x->o.rank, &cfg);
  if (r != ST_NCCL_SUCCESS && r != ST_NCCL_IN_PROGRESS) {
    snprintf(err, errlen, "ncclCommInitRankConfig: %s", nccl_text(x, r));
    fail(x, err, NULL);
    return ST_ERR_IO;
  }
  x->phase = PH_INIT;
  return ST_OK;
}

/* Hands arena x->enqueued to NCCL. */
static st__nccl_result_t enqueue(struct st__xfer *x) {
  const st__xfer_arena_t *a = &x->arenas[x->enqueued];
  if (x->o.nranks == 2) {
    if (x->o.role == ST_XFER_SEND)
      return x->nc->ncclSend(a->addr, a->bytes, ST_NCCL_UINT8, 1, x->comm, x->stream);
    return x->nc->ncclRecv(a->addr, a->bytes, ST_NCCL_UINT8, 0, x->comm, x->stream);
  }
  return x->nc->ncclBroadcast(a->addr, a->addr, a->bytes, ST_NCCL_UINT8, 0, x->comm, x->stream);
}

static st__xfer_state_t nccl_poll(st__xfer_t *x, double now, uint64_t *bytes, char *err,
                                  size_t errlen) {
  if (x->phase == PH_INIT || x->phase == PH_ENQUEUE || x->phase == PH_WAIT) {
    char cerr[160];
    if (st__cuda_ctx_enter(x->device, cerr, sizeof cerr) != ST_OK) fail(x, cerr, NULL);
  }
  if (x->comm && x->phase != PH_FAILED) {
    st__nccl_result_t st = ST_NCCL_SUCCESS;
    st__nccl_result_t r = x->nc->ncclCommGetAsyncError(x->comm, &st);
    if (r != ST_NCCL_SUCCESS) st = r;
    if (st == ST_NCCL_SUCCESS) {
      if (x->phase == PH_INIT) x->phase = PH_ENQUEUE;
      if (x->pending) {   /* the operation in progress is enqueued now */
        x->pending = 0;
        x->cu->cuEventRecord(x->events[x->enqueued], x->stream);
        x->enqueued++;
      }
    } else if (st != ST_NCCL_IN_PROGRESS) {
      fail(x, x->phase == PH_INIT ? "NCCL communicator init failed" : "NCCL failed",
           nccl_text(x, st));
    }
  }
  while (x->phase == PH_ENQUEUE && !x->pending && x->enqueued < x->n) {
    st__nccl_result_t r = enqueue(x);
    if (r == ST_NCCL_IN_PROGRESS) {
      x->pending = 1;
    } else if (r != ST_NCCL_SUCCESS) {
      fail(x, x->o.nranks == 2 ? (x->o.role == ST_XFER_SEND ? "ncclSend" : "ncclRecv")
                               : "ncclBroadcast",
           nccl_text(x, r));
    } else {
      CUresult cr = x->cu->cuEventRecord(x->events[x->enqueued], x->stream);
      if (cr != CUDA_SUCCESS) {
        char e[160];
        st__cuda_error(cr, "cuEventRecord", e, sizeof e);
        fail(x, e, NULL);
      }
      x->enqueued++;
    }
  }
  if (x->phase == PH_ENQUEUE && x->enqueued == x->n) x->phase = PH_WAIT;
  while ((x->phase == PH_ENQUEUE || x->phase == PH_WAIT) && x->completed < x->enqueued) {
    CUresult cr = x->cu->cuEventQuery(x->events[x->completed]);
    if (cr == CUDA_ERROR_NOT_READY) break;
    if (cr != CUDA_SUCCESS) {
      char e[160];
      st__cuda_error(cr, "cuEventQuery", e, sizeof e);
      fail(x, "the transfer's stream failed", e);
      break;
    }
    x->done_bytes += x->arenas[x->completed].bytes;
    x->completed++;
  }
  if (x->phase == PH_WAIT && x->completed == x->n) x->phase = PH_DONE;
  if (x->phase != PH_DONE && x->phase != PH_FAILED && now > x->o.deadline) {
    char d[96];
    snprintf(d, sizeof d, "%llu bytes moved, ncclCommAbort called",
             (unsigned long long)x->done_bytes);
    fail(x, x->phase == PH_INIT ? "the NCCL communicator was not ready by the deadline (a "
                                  "rank did not join)"
         : x->phase == PH_OPENED ? "the transfer was never started before its deadline"
                                 : "the transfer did not finish by its deadline",
         d);
  }
  *bytes = x->done_bytes;
  if (x->phase == PH_DONE) return ST_XFER_DONE;
  if (x->phase == PH_FAILED) {
    snprintf(err, errlen, "%s", x->why);
    return ST_XFER_FAILED;
  }
  return ST_XFER_RUNNING;
}

static int nccl_wait_fd(st__xfer_t *x, int *fd) { return -1; }

static void nccl_abort(st__xfer_t *x, const char *why) { fail(x, why, NULL); }

static void nccl_close(st__xfer_t *x) {
  if (!x) return;
  if (x->comm) {
    if (x->phase == PH_DONE)
      x->nc->ncclCommDestroy(x->comm);
    else
      x->nc->ncclCommAbort(x->comm);
    x->comm = NULL;
  }
  if (x->device >= 0) {
    char e[160];
    (void)st__cuda_ctx_enter(x->device, e, sizeof e);
  }
  for (size_t i = 0; x->events && i < x->n; i++)
    if (x->events[i]) x->cu->cuEventDestroy(x->events[i]);
  if (x->stream) {
    /* Work still queued after an abort ends with the communicator;
     * the arenas are unmapped only after this returns. */
    x->cu->cuStreamSynchronize(x->stream);
    x->cu->cuStreamDestroy(x->stream);
  }
  free(x->events);
  free(x->arenas);
  memset(&x->id, 0, sizeof x->id);
  free(x);
}

#else /* !ST_HAVE_CUDA */

static int nccl_probe(const char *library, st__xfer_probe_t *out) {
  return st__nccl_probe(library, out);
}
static int nccl_open(const st__xfer_open_t *o, st__xfer_t **x, uint8_t *blob, size_t *blob_len,
                     char *err, size_t errlen) {
  snprintf(err, errlen, "built without CUDA: the NCCL engine moves CUDA arenas only");
  return ST_ERR_CAPABILITY;
}
static int nccl_start(st__xfer_t *x, const uint8_t *peer, size_t peer_len,
                      const st__xfer_arena_t *arenas, size_t n, char *err, size_t errlen) {
  return ST_ERR_CAPABILITY;
}
static st__xfer_state_t nccl_poll(st__xfer_t *x, double now, uint64_t *bytes, char *err,
                                  size_t errlen) {
  return ST_XFER_FAILED;
}
static int nccl_wait_fd(st__xfer_t *x, int *fd) { return -1; }
static void nccl_abort(st__xfer_t *x, const char *why) {}
static void nccl_close(st__xfer_t *x) {}

#endif

const st__xfer_engine_t st__xfer_nccl_engine = {
    .name = "nccl",
    .memory = ST_XFER_MEM_CUDA,
    .fanout = 1,
    .probe = nccl_probe,
    .open = nccl_open,
    .start = nccl_start,
    .poll = nccl_poll,
    .wait_fd = nccl_wait_fd,
    .abort = nccl_abort,
    .close = nccl_close,
};
