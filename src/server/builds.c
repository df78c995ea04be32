/* src/server: the build scheduler (work.h, "builds.c"): a consumer's
 * build starts (an answer from the cache, a build in flight to join, or a
 * new one for the workers or its serialized queue: queue.c), a job comes back
 * and its consumers receive the result (deliver.c), and consumers that
 * stop waiting (a cancelled task, a closed connection, shutdown) cancel
 * builds nobody waits for. Loop thread only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/pool_conn.h"
#include "common/log.h"
#include "engine/cachekey.h"
#include "server/holdings.h"
#include "server/work.h"
#include "st/errors.h"

/* ------------------------------------------------------------- tables */

static void sweep_timer_cb(struct ev_loop *loop, ev_timer *w, int revents);

/* Tables and the sweep timer (expired tasks, idle pool slabs). Loop
 * thread, at start. */
void st__work_init(st__server_t *srv) {
  st__work_t *w = calloc(1, sizeof *w);
  if (!w) {
    ST_LOG_E("server", "out of memory");
    abort();
  }
  st__smap_init(&w->flights);
  st__smap_init(&w->serial);
  st__smap_init(&w->tasks);
  srv->work = w;
  double every = srv->cfg->task_ttl_s / 4;
  /* Idle pool slabs wait at most half pool.idle_s more (as at start). */
  if (srv->cfg->pool_idle_s > 0 && srv->cfg->pool_idle_s / 2 < every)
    every = srv->cfg->pool_idle_s / 2;
  if (every < 0.05) every = 0.05;
  if (every > 5.0) every = 5.0;
  ev_timer_init(&w->sweep, sweep_timer_cb, every, every);
  w->sweep.data = srv;
  ev_timer_start(srv->loop, &w->sweep);
}

static void sweep_timer_cb(struct ev_loop *loop, ev_timer *w, int revents) {
  (void)loop;
  (void)revents;
  st__tasks_sweep(w->data);
  st__pool_conn_sweep(w->data);
}

/* Frees everything; jobs on the workers were freed with it. Loop thread. */
void st__work_destroy(st__server_t *srv) {
  st__work_t *w = srv->work;
  if (!w) return;
  ev_timer_stop(srv->loop, &w->sweep);
  st__tasks_destroy(srv);
  st__queue_destroy(w);
  st__build_t *b = w->builds;
  while (b) {
    st__build_t *next = b->next;
    st__build_free(b);
    b = next;
  }
  st__smap_clear(&w->flights);
  st__smap_clear(&w->tasks);
  free(w);
  srv->work = NULL;
}

/* "name NUL fingerprint@device NUL key": a build of another definition
 * of the endpoint (after a reload), or on another device, is never
 * joined. */
static char *flight_key(const st__endpoint_decl_t *ep, const char *where, const char *key,
                        size_t klen, size_t *len) {
  char fp[48];
  int fl = snprintf(fp, sizeof fp, "%016llx@%s", (unsigned long long)ep->fingerprint, where);
  size_t nl = strlen(ep->name);
  char *s = malloc(nl + 1 + (size_t)fl + 1 + klen + 1);
  if (!s) return NULL;
  memcpy(s, ep->name, nl + 1);
  memcpy(s + nl + 1, fp, (size_t)fl + 1);
  memcpy(s + nl + 1 + (size_t)fl + 1, key, klen);
  *len = nl + 1 + (size_t)fl + 1 + klen;
  s[*len] = '\0';
  return s;
}

/* ------------------------------------------------------------- start */

/* The job of a task consumer started: the task is running (or ran). */
static void note_started(st__server_t *srv, st__task_t *t, st__job_t *job) {
  if (st__job_state(job) != ST_JOB_QUEUED) st__task_started(srv, t, job->started_unix);
  st__progress_get(&job->progress, &t->progress);
}

/* A consumer of its own, its view's text in the same allocation (so that
 * free(k) frees both). */
static st__consumer_t *copy_consumer(const st__consumer_t *who) {
  st__consumer_t *k = malloc(sizeof *k + (who->view ? who->view_len + 1 : 0));
  if (k) {
    *k = *who;
    k->next = NULL;
    if (who->view) {
      char *text = (char *)(k + 1);
      memcpy(text, who->view, who->view_len);
      text[who->view_len] = '\0';
      k->view = text;
    }
  }
  return k;
}

static void add_consumer(st__build_t *b, st__consumer_t *k) {
  st__consumer_t **pp = &b->consumers;
  while (*pp) pp = &(*pp)->next;
  *pp = k;
}

/* The consumer starts waiting: a call counts as in flight on its
 * connection, a task points at its build. */
static void consumer_waits(st__server_t *srv, const st__consumer_t *who, st__build_t *b) {
  if (who->kind == ST_CONSUMER_TASK) {
    who->task->build = b;
    /* A build that left the submitted list started: so did the task
     * (st__tasks_refresh would not see it any more). */
    if (b && b->state == ST_BUILD_SUBMITTED && !b->in_queued) st__task_status(srv, who->task);
    return;
  }
  st__conn_t *c = st__conn_find(srv, who->conn_id);
  if (c) c->inflight++;
}

/* See work.h. Reads only: either side of the server lock. */
int st__build_locate(const st__server_t *srv, const st__endpoint_decl_t *ep, const char *bound,
                     size_t bound_len, int socket, st__call_place_t *at, char *err,
                     size_t errlen) {
  memset(at, 0, sizeof *at);
  int rc = st__device_for_call(&srv->devices, srv->cfg, ep, socket, &at->device,
                               &at->cuda_device, err, errlen);
  if (rc != ST_OK) return rc;
  if (at->device < 0) snprintf(at->where, sizeof at->where, "cpu");
  else snprintf(at->where, sizeof at->where, "cuda:%d", at->device);
  if (ep->cache || ep->singleflight) {
    rc = st__cache_key(ep, bound, bound_len, &at->key, &at->klen, err, errlen);
    if (rc != ST_OK) return rc;
  }
  if (ep->cache)
    at->cached = st__objects_lookup_on(&srv->objects, ep->name, at->where,
                                       at->key, at->klen);
  return ST_OK;
}

/* Cache hit, join, or a new build; see work.h. */
int st__build_start(st__server_t *srv, const st__endpoint_decl_t *ep, const char *bound,
                    size_t bound_len, st__targs_t *targs, const st__consumer_t *who, int socket,
                    char *err, size_t errlen) {
  st__work_t *w = srv->work;
  st__call_place_t at;
  int rc = st__build_locate(srv, ep, bound, bound_len, socket, &at, err, errlen);
  if (rc != ST_OK) return rc;
  int device = at.device, cuda_device = at.cuda_device;
  const char *where = at.where;
  char *key = at.key;
  size_t klen = at.klen;
  if (ep->cache) {
    st__object_t *obj = at.cached;
    if (obj) {
      srv->counters.cache_hits++;
      free(key);
      consumer_waits(srv, who, NULL);
      st__deliver_object(srv, who, obj);
      return ST_OK;
    }
    srv->counters.cache_misses++;
  }
  char *fk = NULL;
  size_t flen = 0;
  if (key) {
    fk = flight_key(ep, where, key, klen, &flen);
    st__build_t *b = fk ? st__smap_get(&w->flights, fk, flen) : NULL;
    if (b) {
      st__consumer_t *k = copy_consumer(who);
      free(fk);
      free(key);
      if (!k) {
        snprintf(err, errlen, "out of memory");
        return ST_ERR_OUT_OF_MEMORY;
      }
      add_consumer(b, k);
      srv->counters.joins++;
      consumer_waits(srv, who, b);
      return ST_OK;
    }
  }
  st__build_t *b = calloc(1, sizeof *b);
  st__consumer_t *k = copy_consumer(who);
  st__job_t *job = st__job_new(who->kind == ST_CONSUMER_CALL ? who->conn_id : 0,
                               who->request_id, srv->gen, ep, bound, bound_len);
  if (b) b->endpoint = strdup(ep->name);
  if (!b || !b->endpoint || !k || !job || (key && !fk)) {
    if (b) st__build_free(b);
    free(k);
    free(fk);
    free(key);
    st__job_free(job);
    snprintf(err, errlen, "out of memory queueing the call");
    return ST_ERR_OUT_OF_MEMORY;
  }
  job->owner = b;
  st__pool_conn_job(ep, who->conn_id ? st__conn_find(srv, who->conn_id) : NULL, job);
  job->device = device;
  job->cuda_device = cuda_device;
  if (targs) {
    job->targs = *targs;   /* ownership moves to the job */
    memset(targs, 0, sizeof *targs);
  }
  b->job = job;
  snprintf(b->where, sizeof b->where, "%s", where);
  b->serialized = ep->concurrency == ST_CONC_SERIALIZED;
  b->object = ep->managed || ep->cache || ep->singleflight;
  b->cacheable = ep->cache;
  b->cache_key = key;
  b->cache_key_len = klen;
  b->consumers = k;
  if (fk && st__smap_put(&w->flights, fk, flen, b) == ST_OK) {
    b->flight = fk;
    b->flight_len = flen;
  } else {
    free(fk);
  }
  st__build_link(w, b);
  rc = st__queue_enqueue(srv, b);
  if (rc != ST_OK) {
    st__build_unlink(w, b);
    st__build_forget_flight(w, b);
    st__job_free(job);
    st__build_free(b);
    snprintf(err, errlen, "%s", rc == ST_ERR_SHUTTING_DOWN ? "the server is shutting down"
                                                           : "out of memory queueing the call");
    return rc;
  }
  consumer_waits(srv, who, b);
  return ST_OK;
}

/* ------------------------------------------------------------- completion */

/* An object-producing build ended well: its result becomes one object
 * (cached when the endpoint caches and its definition did not change
 * meanwhile) that every consumer receives. Its arenas were charged to the
 * memory budget when the body allocated them (mem/ledger.h), so only a
 * failed malloc refuses it: that error goes to every consumer. */
static void deliver_built_object(st__server_t *srv, st__build_t *b, st__job_t *job) {
  const st__endpoint_decl_t *now =
      st__generation_find(srv->gen, job->ep->name, strlen(job->ep->name));
  int cache = b->cacheable && now && now->fingerprint == job->ep->fingerprint;
  if (!b->consumers && !cache) return;
  st__object_spec_t spec = {.endpoint = job->ep->name,
                            .cache_key = b->cache_key,
                            .cache_key_len = b->cache_key_len,
                            .fingerprint = job->ep->fingerprint,
                            .cache = cache,
                            .managed = job->ep->managed,
                            .readonly = job->ep->readonly,
                            .where = b->where};
  st__object_t *obj = NULL;
  char err[512];
  int rc = st__objects_add(&srv->objects, &spec, &job->result, &obj, err, sizeof err);
  if (rc != ST_OK) {
    char msg[700];
    snprintf(msg, sizeof msg, "%s: %s", job->ep->name, err);
    ST_LOG_W("call", "%s", msg);
    st__deliver_error(srv, &b->consumers, rc, msg);
    return;
  }
  /* Held while it is handed out: a connection that fails while we write
   * to it gives its lease back, which must not destroy the object under
   * the next consumer. */
  st__objects_hold(&srv->objects, obj);
  st__consumer_t *k = b->consumers;
  b->consumers = NULL;
  while (k) {
    st__consumer_t *next = k->next;
    st__deliver_object(srv, k, obj);
    free(k);
    k = next;
  }
  st__objects_unhold(&srv->objects, obj);   /* destroys it if nothing holds it */
}

/* The job came back; see work.h. Loop thread. */
void st__build_complete(st__server_t *srv, st__job_t *job) {
  st__work_t *w = srv->work;
  st__build_t *b = job->owner;
  double ms = (job->finished_at - job->queued_at) * 1e3;
  if (job->status != ST_OK && !b->cancelled)
    ST_LOG_W("call", "%s failed after %.1f ms: %s: %s", job->ep->name, ms,
             st_err_name(job->status), job->error);
  else
    ST_LOG_D("call", "%s done in %.1f ms: %s, %zu arenas, %llu bytes", job->ep->name, ms,
             job->status == ST_OK ? "OK" : st_err_name(job->status), job->result.narenas,
             (unsigned long long)job->result.bytes);
  st__build_unlink(w, b);
  st__build_forget_flight(w, b);
  for (st__consumer_t *k = b->consumers; k; k = k->next)
    if (k->kind == ST_CONSUMER_TASK) note_started(srv, k->task, job);

  if (job->status != ST_OK) {
    st__deliver_error(srv, &b->consumers, job->status, job->error);
  } else if (!b->object) {
    /* A plain endpoint has one consumer at most (it is never joined);
     * none when its caller left (counted in `dropped`): the arenas go
     * with the job. */
    st__consumer_t *k = b->consumers;
    b->consumers = NULL;
    if (k) st__deliver_plain(srv, k, job);
    free(k);
  } else {
    deliver_built_object(srv, b, job);
  }
  int serialized = b->serialized;
  char *endpoint = b->endpoint;
  b->endpoint = NULL;
  st__build_free(b);
  st__job_free(job);
  if (serialized) st__queue_next(srv, endpoint);
  free(endpoint);
}

/* ------------------------------------------------------------- cancelling */

static size_t count_consumers(const st__build_t *b) {
  size_t n = 0;
  for (const st__consumer_t *k = b->consumers; k; k = k->next) n++;
  return n;
}

/* Nobody waits for b any more: stop it. Returns 1 when it is gone
 * without having run (b is freed), 0 when its body was asked to stop. */
static int orphan(st__server_t *srv, st__build_t *b) {
  if (st__queue_abort(srv, b)) return 1;
  b->cancelled = 1;
  st__job_cancel(b->job);
  return 0;
}

/* The task stops waiting for b; the build is cancelled when no consumer
 * is left. Returns 1 when the build is gone without having run (the task
 * can be cancelled at once), 0 when it still runs. */
static int drop_task(st__server_t *srv, st__build_t *b, st__task_t *t) {
  if (count_consumers(b) > 1) {
    st__consumer_t **pp = &b->consumers;
    while (*pp && !((*pp)->kind == ST_CONSUMER_TASK && (*pp)->task == t)) pp = &(*pp)->next;
    if (*pp) {
      st__consumer_t *k = *pp;
      *pp = k->next;
      free(k);
    }
    return 1;
  }
  return orphan(srv, b);
}

/* cancel (docs/protocol.md): pending ends now; running alone is asked to
 * stop and ends when it does; running in a shared build leaves it and
 * ends now. Loop thread. */
void st__task_cancel(st__server_t *srv, st__task_t *t) {
  st__task_status(srv, t);
  if (t->status >= ST_TASK_COMPLETED || t->cancel_requested) return;
  if (t->cancel) {
    t->cancel_requested = 1;
    t->cancel(srv, t);
    return;
  }
  st__build_t *b = t->build;
  if (!b || drop_task(srv, b, t)) {
    t->build = NULL;
    st__task_finish_error(srv, t, ST_ERR_CANCELLED, NULL);
    return;
  }
  /* It runs alone: it ends cancelled when its body stops. */
  t->cancel_requested = 1;
}

/* Calls of a closed connection stop waiting (its row of holdings.h:
 * what else it holds, tasks included, is the other rows'); see work.h. */
void st__work_conn_closed(st__server_t *srv, st__conn_t *c) {
  st__work_t *w = srv->work;
  if (w && c->inflight > 0) {
    st__build_t *b = w->builds;
    while (b) {
      st__build_t *next = b->next;
      size_t removed = 0;
      st__consumer_t **pp = &b->consumers;
      while (*pp) {
        st__consumer_t *k = *pp;
        if (k->kind == ST_CONSUMER_CALL && k->conn_id == c->id) {
          *pp = k->next;
          free(k);
          removed++;
        } else {
          pp = &k->next;
        }
      }
      if (removed && !b->consumers) {
        /* Nobody waits any more (the calls count as dropped: stats.c).
         * st__queue_abort may start the next serialized build, never free
         * another one: the workers only refuse after every connection
         * closed, in st__server_destroy. */
        orphan(srv, b);
      }
      b = next;
    }
  }
}

/* Calls of c waiting for a build (each counts in c->inflight: none
 * without it). */
static void calls_count(st__server_t *srv, const st__conn_t *c, st__holding_count_t *n) {
  if (!srv->work || c->inflight <= 0) return;
  for (const st__build_t *b = srv->work->builds; b; b = b->next)
    for (const st__consumer_t *k = b->consumers; k; k = k->next)
      n->items += k->kind == ST_CONSUMER_CALL && k->conn_id == c->id;
}

static int calls_none(st__server_t *srv) { return !srv->work || !srv->work->builds; }

const st__holding_kind_t st__holding_calls = {
    .name = "calls", .release = st__work_conn_closed, .count = calls_count, .none = calls_none};

/* Builds waiting for their turn end CANCELLED (shutdown). They are all
 * taken out first and answered afterwards: an answer may close a
 * connection, which walks the builds again. */
void st__builds_cancel_waiting(st__server_t *srv) {
  st__work_t *w = srv->work;
  if (!w) return;
  st__consumer_t *gone = NULL, **tail = &gone;
  st__build_t *b = w->builds;
  while (b) {
    st__build_t *next = b->next;
    if (b->state == ST_BUILD_WAITING) {
      while (*tail) tail = &(*tail)->next;
      *tail = b->consumers;
      b->consumers = NULL;
      st__queue_abort(srv, b);
    }
    b = next;
  }
  st__deliver_error(srv, &gone, ST_ERR_CANCELLED, "cancelled: the server is shutting down");
}

/* In-flight builds of (endpoint[, key]) are neither cached nor joined. */
void st__builds_forget(st__server_t *srv, const char *endpoint, const char *key, size_t key_len) {
  st__work_t *w = srv->work;
  for (st__build_t *b = w->builds; b; b = b->next) {
    if (!b->object || strcmp(b->endpoint, endpoint) != 0) continue;
    if (key && !(b->cache_key && b->cache_key_len == key_len &&
                 memcmp(b->cache_key, key, key_len) == 0))
      continue;
    b->cacheable = 0;
    st__build_forget_flight(w, b);
  }
}
