/* src/xfer/ucx_worker.c: see ucx_worker.h. Owns the UCP context, the
 * shared worker and the endpoint cache of the transfer helper. */
#include "xfer/ucx_worker.h"

#ifdef ST_HAVE_UCX
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "st/errors.h"

#define WHO "xfer"
#define CLOSE_SECONDS 2.0   /* the longest one endpoint's close may progress */

struct st__ucx_peer {
  struct st__ucx_peer *next;
  uint8_t *addr;            /* the remote worker's address (owned)         */
  size_t len;
  ucp_ep_h ep;              /* NULL once closed                            */
  unsigned refs;            /* transfers using it                          */
  int dead;                 /* failed or killed: taken by no new transfer  */
  double used;              /* st__now_mono() of its last take (LRU)       */
};

static const st__ucx_api_t *api;
static ucp_context_h ctx;
static ucp_worker_h worker;
static int wefd = -1;
static uint8_t *waddr;      /* this worker's address (owned)               */
static size_t waddr_len;
static int dirty;
static st__ucx_peer_t *peers;
static unsigned npeers;
static void (*dead_cb)(st__ucx_peer_t *pe, const char *why);

static const char *status_text(ucs_status_t s) {
  const char *t = api->ucs_status_string(s);
  return t ? t : "unknown status";
}

void st__ucx_on_dead(void (*fn)(st__ucx_peer_t *pe, const char *why)) { dead_cb = fn; }

void st__ucx_worker_dirty(void) { dirty = 1; }

ucp_ep_h st__ucx_peer_ep(const st__ucx_peer_t *pe) { return pe->ep; }

/* Closes pe's endpoint: flushed (a clean goodbye) or forced; progresses
 * the worker until the close completes, at most CLOSE_SECONDS. */
static void close_ep(st__ucx_peer_t *pe, int force) {
  if (!pe->ep) return;
  ucp_request_param_t p;
  memset(&p, 0, sizeof p);
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t r = api->ucp_ep_close_nbx(pe->ep, &p);
  pe->ep = NULL;
  if (!UCS_PTR_IS_PTR(r)) return;
  double end = st__now_mono() + CLOSE_SECONDS;
  while (api->ucp_request_check_status(r) == UCS_INPROGRESS && st__now_mono() < end)
    api->ucp_worker_progress(worker);
  if (api->ucp_request_check_status(r) == UCS_INPROGRESS) api->ucp_request_cancel(worker, r);
  api->ucp_request_free(r);
}

static void peer_free(st__ucx_peer_t *pe) {
  for (st__ucx_peer_t **pp = &peers; *pp; pp = &(*pp)->next)
    if (*pp == pe) {
      *pp = pe->next;
      npeers--;
      break;
    }
  free(pe->addr);
  free(pe);
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
  (void)ep;
  st__ucx_peer_t *pe = arg;
  if (pe->dead) return;
  pe->dead = 1;
  char why[256];
  snprintf(why, sizeof why,
           "the peer's endpoint failed: %s (the other host's transfer helper or network went "
           "away)",
           status_text(status));
  ST_LOG_D(WHO, "ucx endpoint %p: %s", (void *)pe, why);
  if (dead_cb) dead_cb(pe, why);
}

void st__ucx_peer_kill(st__ucx_peer_t *pe, const char *why) {
  if (!pe->dead) {
    pe->dead = 1;
    if (dead_cb) dead_cb(pe, why);
  }
  close_ep(pe, 1);
}

void st__ucx_peer_put(st__ucx_peer_t *pe) {
  if (pe && pe->refs) pe->refs--;
}

/* Every endpoint closed and the worker destroyed (no transfer is open). */
static void teardown(void) {
  while (peers) {
    close_ep(peers, 1);
    peer_free(peers);
  }
  if (worker) api->ucp_worker_destroy(worker);
  worker = NULL;
  wefd = -1;
  free(waddr);
  waddr = NULL;
  waddr_len = 0;
  dirty = 0;
}

/* The process's UCP context, made on the first use. */
static int context(char *err, size_t errlen) {
  if (ctx) return ST_OK;
  ucp_config_t *cfg = NULL;
  ucs_status_t s = api->ucp_config_read(NULL, NULL, &cfg);
  if (s != UCS_OK) {
    snprintf(err, errlen, "ucp_config_read: %s (check the UCX_* environment)", status_text(s));
    return ST_ERR_CAPABILITY;
  }
  ucp_params_t p;
  memset(&p, 0, sizeof p);
  p.field_mask = UCP_PARAM_FIELD_FEATURES;
  p.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  s = api->ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, &p, cfg, &ctx);
  api->ucp_config_release(cfg);
  if (s != UCS_OK) {
    ctx = NULL;
    snprintf(err, errlen, "ucp_init: %s", status_text(s));
    return ST_ERR_CAPABILITY;
  }
  return ST_OK;
}

int st__ucx_worker(const st__ucx_api_t *u, int idle, ucp_worker_h *w, int *efd,
                   const uint8_t **addr, size_t *len, char *err, size_t errlen) {
  api = u;
  if (worker && dirty && idle) {
    ST_LOG_D(WHO, "ucx: the worker is made again (a transfer ended with its traffic cut short)");
    teardown();
  }
  if (!worker) {
    int rc = context(err, errlen);
    if (rc != ST_OK) return rc;
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof wp);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    ucs_status_t s = api->ucp_worker_create(ctx, &wp, &worker);
    if (s != UCS_OK) {
      worker = NULL;
      snprintf(err, errlen, "ucp_worker_create: %s", status_text(s));
      return ST_ERR_CAPABILITY;
    }
    if (api->ucp_worker_get_efd(worker, &wefd) != UCS_OK) wefd = -1;   /* a tick instead */
    ucp_address_t *a = NULL;
    size_t n = 0;
    s = api->ucp_worker_get_address(worker, &a, &n);
    waddr = s == UCS_OK ? malloc(n) : NULL;
    if (!waddr) {
      snprintf(err, errlen, "ucp_worker_get_address: %s",
               s != UCS_OK ? status_text(s) : "out of memory");
      if (s == UCS_OK) api->ucp_worker_release_address(worker, a);
      teardown();
      return ST_ERR_INTERNAL;
    }
    memcpy(waddr, a, n);
    waddr_len = n;
    api->ucp_worker_release_address(worker, a);
    dirty = 0;
  }
  *w = worker;
  *efd = wefd;
  *addr = waddr;
  *len = waddr_len;
  return ST_OK;
}

/* Closes the least recently used idle endpoint (flushed): room for one. */
static void evict_one(void) {
  st__ucx_peer_t *old = NULL;
  for (st__ucx_peer_t *pe = peers; pe; pe = pe->next)
    if (!pe->refs && (!old || pe->used < old->used)) old = pe;
  if (!old) return;
  close_ep(old, 0);
  peer_free(old);
}

st__ucx_peer_t *st__ucx_peer_get(const uint8_t *addr, size_t len, char *err, size_t errlen) {
  for (st__ucx_peer_t *pe = peers; pe; pe = pe->next)
    if (!pe->dead && pe->ep && pe->len == len && !memcmp(pe->addr, addr, len)) {
      pe->refs++;
      pe->used = st__now_mono();
      return pe;
    }
  if (npeers >= ST__UCX_MAX_PEERS) evict_one();
  if (npeers >= ST__UCX_MAX_PEERS) {
    snprintf(err, errlen, "%d endpoints to peers are in use: no room for another",
             ST__UCX_MAX_PEERS);
    return NULL;
  }
  st__ucx_peer_t *pe = calloc(1, sizeof *pe);
  uint8_t *copy = malloc(len ? len : 1);
  if (!pe || !copy) {
    free(pe);
    free(copy);
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  memcpy(copy, addr, len);
  pe->addr = copy;
  pe->len = len;
  ucp_ep_params_t ep;
  memset(&ep, 0, sizeof ep);
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = (const ucp_address_t *)copy;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = on_ep_error;
  ep.err_handler.arg = pe;
  ucs_status_t s = api->ucp_ep_create(worker, &ep, &pe->ep);
  if (s != UCS_OK) {
    snprintf(err, errlen, "ucp_ep_create to the peer: %s", status_text(s));
    free(copy);
    free(pe);
    return NULL;
  }
  pe->refs = 1;
  pe->used = st__now_mono();
  pe->next = peers;
  peers = pe;
  npeers++;
  return pe;
}

void st__ucx_progress(void) {
  if (!worker) return;
  while (api->ucp_worker_progress(worker)) {
  }
  for (st__ucx_peer_t *pe = peers, *next; pe; pe = next) {
    next = pe->next;
    if (pe->dead && !pe->refs) {
      close_ep(pe, 1);
      peer_free(pe);
    }
  }
}

#endif
