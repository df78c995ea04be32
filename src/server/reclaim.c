/* src/server: workers ask the loop to evict for an allocation (reclaim.h).
 *
 * A request lives on the asking worker's stack. The loop takes the whole
 * list under the lock (marking each request taken), evicts for each, then
 * marks them done and wakes the workers. A worker whose wait runs out
 * leaves only while its request is not taken; once taken, the loop is
 * already evicting for it and answers within that callback.
 */
#include "server/reclaim.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#include "common/log.h"
#include "mem/arena_release.h"
#include "mem/ledger.h"
#include "server/server.h"
#include "st/errors.h"

typedef struct request {
  struct request *next;
  int device;
  uint64_t bytes;
  unsigned fds;
  int taken;                  /* the loop is evicting for it */
  int done;
  size_t evicted;
} request_t;

struct st__reclaim {
  st__server_t *srv;
  pthread_t loop_thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;          /* CLOCK_MONOTONIC */
  request_t *pending;
  int closed;
  ev_async wake;
};

/* Loop thread: cached objects first, then versions of evictable keys
 * (docs/keys.md, "Policies"); how many went. */
static size_t evict(st__server_t *srv, int device, uint64_t bytes, unsigned fds) {
  size_t n = st__objects_reclaim(&srv->objects, device, bytes, fds);
  if (!st__ledger_fits(device, bytes, fds)) n += st__keys_reclaim(&srv->keys, device, bytes, fds);
  return n;
}

/* Loop thread: answers every pending request. */
static void on_wake(struct ev_loop *loop, ev_async *w, int revents) {
  (void)loop;
  (void)revents;
  struct st__reclaim *rc = w->data;
  pthread_mutex_lock(&rc->mu);
  request_t *list = rc->pending;
  rc->pending = NULL;
  for (request_t *q = list; q; q = q->next) q->taken = 1;
  pthread_mutex_unlock(&rc->mu);
  size_t total = 0;
  for (request_t *q = list; q; q = q->next) {
    q->evicted = evict(rc->srv, q->device, q->bytes, q->fds);
    total += q->evicted;
  }
  if (total) ST_LOG_D("server", "evicted %zu cached objects or key versions to make room", total);
  pthread_mutex_lock(&rc->mu);
  while (list) {
    request_t *next = list->next;
    list->done = 1;   /* after this the worker may return: no more access */
    list = next;
  }
  pthread_cond_broadcast(&rc->cv);
  pthread_mutex_unlock(&rc->mu);
}

static void unlink_request(struct st__reclaim *rc, request_t *q) {
  for (request_t **pp = &rc->pending; *pp; pp = &(*pp)->next)
    if (*pp == q) {
      *pp = q->next;
      return;
    }
}

/* Asks the loop to evict for the charge: 1 when something went. */
static int reclaim(struct st__reclaim *rc, int device, uint64_t bytes, unsigned fds) {
  /* A loop thread holds the server lock: it evicts itself (waiting for
   * loop 0 would wait for itself). */
  if (pthread_equal(pthread_self(), rc->loop_thread) || st__loop_thread())
    return evict(rc->srv, device, bytes, fds) > 0;
  request_t q = {.device = device, .bytes = bytes, .fds = fds};
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += (time_t)ST__RECLAIM_WAIT_S;
  pthread_mutex_lock(&rc->mu);
  if (rc->closed) {
    pthread_mutex_unlock(&rc->mu);
    return 0;
  }
  q.next = rc->pending;
  rc->pending = &q;
  ev_async_send(rc->srv->loop, &rc->wake);
  while (!q.done) {
    if (rc->closed && !q.taken) break;
    int e = pthread_cond_timedwait(&rc->cv, &rc->mu, &until);
    if (e == ETIMEDOUT && !q.taken) break;
  }
  if (!q.done) unlink_request(rc, &q);
  pthread_mutex_unlock(&rc->mu);
  return q.done && q.evicted > 0;
}

/* The ledger's hook (ledger.h): any thread. What was evicted, and what
 * the loops dropped before, is discharged only once the releaser tore it
 * down (mem/arena_release.h): the hook waits for it, so a charge is never
 * refused for memory or descriptors on their way out. */
static int on_charge_refused(void *ctx, int device, uint64_t bytes, unsigned fds) {
  int freed = reclaim(ctx, device, bytes, fds);
  return st__arena_release_settle((unsigned)ST__RECLAIM_WAIT_S) || freed;
}

/* See reclaim.h. */
uint64_t st__reclaim_fd_cap(uint64_t configured, uint64_t *nofile) {
  struct rlimit rl;
  uint64_t soft = 0;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    soft = (uint64_t)rl.rlim_cur;
  if (nofile) *nofile = soft;
  if (configured) return configured;
  uint64_t cap = soft / 2;
  return cap < 64 ? 64 : cap;
}

/* See reclaim.h. Loop thread, at start. */
int st__reclaim_start(st__server_t *srv) {
  const st__config_t *cfg = srv->cfg;
  struct st__reclaim *rc = calloc(1, sizeof *rc);
  if (!rc) return ST_ERR_OUT_OF_MEMORY;
  rc->srv = srv;
  rc->loop_thread = pthread_self();
  pthread_mutex_init(&rc->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&rc->cv, &ca);
  pthread_condattr_destroy(&ca);
  ev_async_init(&rc->wake, on_wake);
  rc->wake.data = rc;
  ev_async_start(srv->loop, &rc->wake);
  srv->reclaim = rc;
  uint64_t nofile = 0;
  uint64_t cap = st__reclaim_fd_cap(cfg->max_arena_fds, &nofile);
  st__ledger_set_fd_cap(cap);
  for (int i = 0; i < cfg->nbudgets; i++)
    st__objects_set_budget(&srv->objects, cfg->budgets[i].device, cfg->budgets[i].bytes);
  st__ledger_set_reclaim(on_charge_refused, rc);
  char source[256];
  uint64_t host = st__ledger_host_memory(source, sizeof source);
  ST_LOG_I("server", "arena descriptors: at most %llu (%s); host memory %llu bytes (%s)",
           (unsigned long long)cap,
           cfg->max_arena_fds ? "limits.max_arena_fds" : "half of RLIMIT_NOFILE",
           (unsigned long long)host, source);
  return ST_OK;
}

/* See reclaim.h. Loop thread. */
void st__reclaim_stop(st__server_t *srv) {
  struct st__reclaim *rc = srv->reclaim;
  if (!rc) return;
  st__ledger_set_reclaim(NULL, NULL);
  pthread_mutex_lock(&rc->mu);
  rc->closed = 1;
  pthread_cond_broadcast(&rc->cv);
  pthread_mutex_unlock(&rc->mu);
  ev_async_stop(srv->loop, &rc->wake);
}

/* See reclaim.h. Loop thread. */
void st__reclaim_free(st__server_t *srv) {
  struct st__reclaim *rc = srv->reclaim;
  if (!rc) return;
  st__reclaim_stop(srv);
  pthread_cond_destroy(&rc->cv);
  pthread_mutex_destroy(&rc->mu);
  free(rc);
  srv->reclaim = NULL;
}
