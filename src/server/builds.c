/* src/server: builds (work.h): `call` and `submit`, the flight table of
 * singleflight and cached endpoints, the queues of serialized endpoints,
 * and what happens when a job comes back from the pool. Loop thread only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "engine/bind.h"
#include "engine/cachekey.h"
#include "server/work.h"
#include "st/errors.h"

/* ------------------------------------------------------------- tables */

static void sweep_timer_cb(struct ev_loop *loop, ev_timer *w, int revents);

/* Tables and the task sweep timer. Loop thread, at start. */
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
}

static void free_consumers(st__build_t *b) {
  st__consumer_t *k = b->consumers;
  while (k) {
    st__consumer_t *next = k->next;
    free(k);
    k = next;
  }
  b->consumers = NULL;
}

static void free_build(st__build_t *b) {
  free_consumers(b);
  free(b->endpoint);
  free(b->cache_key);
  free(b->flight);
  free(b);
}

static void serial_free(const char *key, size_t len, void *value, void *ud) {
  (void)key;
  (void)len;
  (void)ud;
  st__serial_t *s = value;
  st__build_t *b = s->head;
  while (b) {
    st__build_t *next = b->qnext;
    st__job_free(b->job);    /* waiting builds own their job */
    b->job = NULL;
    b = next;
  }
  free(s);
}

/* Frees everything; jobs on the pool were freed with it. Loop thread. */
void st__work_destroy(st__server_t *srv) {
  st__work_t *w = srv->work;
  if (!w) return;
  ev_timer_stop(srv->loop, &w->sweep);
  st__tasks_destroy(srv);
  st__smap_each(&w->serial, serial_free, NULL);
  st__smap_clear(&w->serial);
  st__build_t *b = w->builds;
  while (b) {
    st__build_t *next = b->next;
    free_build(b);
    b = next;
  }
  st__smap_clear(&w->flights);
  st__smap_clear(&w->tasks);
  free(w);
  srv->work = NULL;
}

/* ------------------------------------------------------------- lists */

static void link_build(st__work_t *w, st__build_t *b) {
  b->prev = NULL;
  b->next = w->builds;
  if (w->builds) w->builds->prev = b;
  w->builds = b;
}

static void unlink_build(st__work_t *w, st__build_t *b) {
  if (b->prev) b->prev->next = b->next;
  else if (w->builds == b) w->builds = b->next;
  if (b->next) b->next->prev = b->prev;
  b->prev = b->next = NULL;
}

/* Later calls stop joining b. */
static void forget_flight(st__work_t *w, st__build_t *b) {
  if (!b->flight) return;
  if (st__smap_get(&w->flights, b->flight, b->flight_len) == b)
    st__smap_del(&w->flights, b->flight, b->flight_len);
  free(b->flight);
  b->flight = NULL;
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

/* ------------------------------------------------------------- pool */

static int submit(st__server_t *srv, st__build_t *b) {
  if (!srv->pool) return ST_ERR_SHUTTING_DOWN;
  int rc = st__pool_submit(srv->pool, b->job);
  if (rc != ST_OK) return rc;
  b->state = ST_BUILD_SUBMITTED;
  srv->counters.builds++;
  return ST_OK;
}

static void deliver_error(st__server_t *srv, st__build_t *b, int code, const char *msg);

/* A serialized build of `endpoint` left the pool: the next one in its
 * queue gets the turn. */
static void serial_next(st__server_t *srv, const char *endpoint) {
  st__work_t *w = srv->work;
  size_t len = strlen(endpoint);
  st__serial_t *s = st__smap_get(&w->serial, endpoint, len);
  if (!s) return;
  s->busy = 0;
  while (s->head && !s->busy) {
    st__build_t *b = s->head;
    s->head = b->qnext;
    if (!s->head) s->tail = NULL;
    b->qnext = NULL;
    w->nwaiting--;
    int rc = submit(srv, b);
    if (rc == ST_OK) {
      s->busy = 1;
      break;
    }
    /* Only a pool that stopped refuses: end the build here. */
    unlink_build(w, b);
    forget_flight(w, b);
    deliver_error(srv, b, rc, "the server is shutting down");
    st__job_free(b->job);
    free_build(b);
  }
  if (!s->busy && !s->head) {
    st__smap_del(&w->serial, endpoint, len);
    free(s);
  }
}

/* Hands b to the pool, or queues it behind the running build of its
 * serialized endpoint. */
static int enqueue(st__server_t *srv, st__build_t *b) {
  st__work_t *w = srv->work;
  if (!b->serialized) return submit(srv, b);
  size_t len = strlen(b->endpoint);
  st__serial_t *s = st__smap_get(&w->serial, b->endpoint, len);
  if (!s) {
    s = calloc(1, sizeof *s);
    if (!s || st__smap_put(&w->serial, b->endpoint, len, s) != ST_OK) {
      free(s);
      return ST_ERR_OUT_OF_MEMORY;
    }
  }
  if (s->busy) {
    b->state = ST_BUILD_WAITING;
    b->qnext = NULL;
    if (s->tail) s->tail->qnext = b;
    else s->head = b;
    s->tail = b;
    w->nwaiting++;
    return ST_OK;
  }
  int rc = submit(srv, b);
  if (rc == ST_OK) {
    s->busy = 1;
  } else if (!s->head) {
    st__smap_del(&w->serial, b->endpoint, len);
    free(s);
  }
  return rc;
}

/* Ends a build that has not run: out of its queue or the pool's. Returns
 * 1 when it did (b and its job are freed; consumers are not told), 0
 * when a worker already runs it. */
static int abort_build(st__server_t *srv, st__build_t *b) {
  st__work_t *w = srv->work;
  if (b->state == ST_BUILD_WAITING) {
    st__serial_t *s = st__smap_get(&w->serial, b->endpoint, strlen(b->endpoint));
    st__build_t **pp = s ? &s->head : NULL;
    while (pp && *pp && *pp != b) pp = &(*pp)->qnext;
    if (!pp || !*pp) return 0;   /* not found: broken invariant, keep it */
    *pp = b->qnext;
    if (s->tail == b) {
      s->tail = NULL;
      for (st__build_t *q = s->head; q; q = q->qnext) s->tail = q;
    }
    w->nwaiting--;
    unlink_build(w, b);
    forget_flight(w, b);
    st__job_free(b->job);
    free_build(b);
    return 1;
  }
  if (!srv->pool || !st__pool_remove(srv->pool, b->job)) return 0;
  unlink_build(w, b);
  forget_flight(w, b);
  st__job_free(b->job);
  int serialized = b->serialized;
  char *endpoint = b->endpoint;
  b->endpoint = NULL;
  free_build(b);
  if (serialized) serial_next(srv, endpoint);
  free(endpoint);
  st__server_check_drained(srv);
  return 1;
}

/* ------------------------------------------------------------- delivery */

static void call_error(st__server_t *srv, const st__consumer_t *k, int code, const char *msg) {
  st__conn_t *c = st__conn_find(srv, k->conn_id);
  if (!c || c->dead) return;
  st__conn_send_error(c, k->request_id, code, msg);
  st__conn_request_done(c);
}

/* Every consumer of b gets the error; b keeps its (now empty) list. */
static void deliver_error(st__server_t *srv, st__build_t *b, int code, const char *msg) {
  st__consumer_t *k = b->consumers;
  b->consumers = NULL;
  while (k) {
    st__consumer_t *next = k->next;
    if (k->kind == ST_CONSUMER_CALL) call_error(srv, k, code, msg);
    else st__task_finish_error(srv, k->task, code, msg);
    free(k);
    k = next;
  }
}

/* One consumer receives obj (a lease first when the endpoint is managed). */
static void give_object(st__server_t *srv, const st__consumer_t *k, st__object_t *obj) {
  if (k->kind == ST_CONSUMER_TASK) {
    st__task_finish_object(srv, k->task, obj);
    return;
  }
  st__conn_t *c = st__conn_find(srv, k->conn_id);
  if (!c || c->dead) {
    srv->counters.calls_dropped++;
    return;
  }
  int lease = 0;
  if (obj->managed) {
    if (st__objects_lease(&srv->objects, obj, c->id) != ST_OK) {
      st__conn_send_error(c, k->request_id, ST_ERR_OUT_OF_MEMORY, "out of memory taking a lease");
      st__conn_request_done(c);
      return;
    }
    c->leases++;
    lease = 1;
  }
  st__objects_touch(&srv->objects, obj);
  if (st__reply_result(c, k->request_id, obj->endpoint, &obj->result, obj, lease) != ST_OK &&
      lease)
    st__drop_lease(srv, c, obj);   /* the client never saw it */
  st__conn_request_done(c);
}

/* The job of a task consumer started: the task is running (or ran). */
static void note_started(st__server_t *srv, st__task_t *t, st__job_t *job) {
  if (st__job_state(job) != ST_JOB_QUEUED) st__task_started(srv, t, job->started_unix);
  st__progress_get(&job->progress, &t->progress);
}

/* ------------------------------------------------------------- start */

static st__consumer_t *copy_consumer(const st__consumer_t *who) {
  st__consumer_t *k = malloc(sizeof *k);
  if (k) {
    *k = *who;
    k->next = NULL;
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
    return;
  }
  st__conn_t *c = st__conn_find(srv, who->conn_id);
  if (c) c->inflight++;
}

/* Cache hit, join, or a new build; see work.h. */
int st__build_start(st__server_t *srv, const st__endpoint_decl_t *ep, const char *bound,
                    size_t bound_len, st__targs_t *targs, const st__consumer_t *who, int socket,
                    char *err, size_t errlen) {
  st__work_t *w = srv->work;
  int device, cuda_device;
  int rc = st__device_for_call(&srv->devices, srv->cfg, ep, socket, &device, &cuda_device, err,
                               errlen);
  if (rc != ST_OK) return rc;
  char where[16];
  if (device < 0) snprintf(where, sizeof where, "cpu");
  else snprintf(where, sizeof where, "cuda:%d", device);
  char *key = NULL;
  size_t klen = 0;
  if (ep->cache || ep->singleflight) {
    rc = st__cache_key(ep, bound, bound_len, &key, &klen, err, errlen);
    if (rc != ST_OK) return rc;
  }
  if (ep->cache) {
    st__object_t *obj = st__objects_lookup_on(&srv->objects, ep->name, where, key, klen);
    if (obj) {
      srv->counters.cache_hits++;
      free(key);
      consumer_waits(srv, who, NULL);
      give_object(srv, who, obj);
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
    if (b) free_build(b);
    free(k);
    free(fk);
    free(key);
    st__job_free(job);
    snprintf(err, errlen, "out of memory queueing the call");
    return ST_ERR_OUT_OF_MEMORY;
  }
  job->owner = b;
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
  link_build(w, b);
  rc = enqueue(srv, b);
  if (rc != ST_OK) {
    unlink_build(w, b);
    forget_flight(w, b);
    st__job_free(job);
    free_build(b);
    snprintf(err, errlen, "%s", rc == ST_ERR_SHUTTING_DOWN ? "the server is shutting down"
                                                           : "out of memory queueing the call");
    return rc;
  }
  consumer_waits(srv, who, b);
  return ST_OK;
}

/* ------------------------------------------------------------- methods */

/* Finds and binds: ep and the bound map, or an error reply was sent. */
static const st__endpoint_decl_t *resolve(st__conn_t *c, uint32_t id, const char *method,
                                          const msgpack_object *params, msgpack_sbuffer *bound) {
  st__server_t *srv = c->srv;
  const msgpack_object *name = st__map_get(params, "endpoint");
  if (name && name->type == MSGPACK_OBJECT_STR && (srv->shutting_down || !srv->pool)) {
    st__conn_send_error(c, id, ST_ERR_SHUTTING_DOWN, "the server is shutting down");
    return NULL;
  }
  const st__endpoint_decl_t *ep = st__param_endpoint(c, id, method, params);
  if (!ep) return NULL;
  msgpack_sbuffer_init(bound);
  char err[1024];
  int rc = st__bind_args(ep, st__map_get(params, "args"), c->targs, bound, err, sizeof err);
  if (rc != ST_OK) {
    msgpack_sbuffer_destroy(bound);
    char msg[1200];
    snprintf(msg, sizeof msg, "%s: %s", ep->name, err);
    st__conn_send_error(c, id, rc, msg);
    return NULL;
  }
  return ep;
}

/* A new task whose build has started (or that already ended, on a cache
 * hit). NULL when it could not start: an error reply was sent. `waiter`:
 * the request waits for the result (call of a task endpoint). */
static st__task_t *start_task(st__conn_t *c, uint32_t id, const st__endpoint_decl_t *ep,
                              const msgpack_sbuffer *bound, int waiter) {
  st__server_t *srv = c->srv;
  char err[512];
  int code = ST_OK;
  st__task_t *t = st__task_new(srv, ep->name, err, sizeof err, &code);
  if (!t) {
    st__conn_send_error(c, id, code, err);
    return NULL;
  }
  srv->counters.tasks_submitted++;
  if (waiter && st__task_add_waiter(srv, t, c, id, ST_WAIT_RESULT, 0) != ST_OK) {
    st__task_finish_error(srv, t, ST_ERR_OUT_OF_MEMORY, "out of memory");
    st__conn_send_error(c, id, ST_ERR_OUT_OF_MEMORY, "out of memory");
    return NULL;
  }
  st__consumer_t who = {.kind = ST_CONSUMER_TASK, .task = t};
  int rc = st__build_start(srv, ep, bound->data, bound->size, c->targs, &who, c->device, err,
                           sizeof err);
  if (rc != ST_OK) {
    char msg[700];
    snprintf(msg, sizeof msg, "%s: %s", ep->name, err);
    /* A waiting call gets the error through its task; submit replies. */
    st__task_finish_error(srv, t, rc, msg);
    if (!waiter) st__conn_send_error(c, id, rc, msg);
    return NULL;
  }
  ST_LOG_D("task", "conn %llu: task %llu (%s) submitted", (unsigned long long)c->id,
           (unsigned long long)t->id, ep->name);
  return t;
}

/* call: binds, then answers from the cache, joins a build in flight,
 * starts a build, or (execution = "task") runs it as a task and answers
 * when it ends. Loop thread. */
void st__method_call(st__conn_t *c, uint32_t id, const msgpack_object *params) {
  st__server_t *srv = c->srv;
  msgpack_sbuffer bound;
  const st__endpoint_decl_t *ep = resolve(c, id, "call", params, &bound);
  if (!ep) return;
  srv->counters.calls++;
  if (ep->execution == ST_EXEC_TASK) {
    start_task(c, id, ep, &bound, 1);
    msgpack_sbuffer_destroy(&bound);
    return;
  }
  st__consumer_t who = {.kind = ST_CONSUMER_CALL, .conn_id = c->id, .request_id = id};
  char err[512];
  int rc = st__build_start(srv, ep, bound.data, bound.size, c->targs, &who, c->device, err,
                           sizeof err);
  msgpack_sbuffer_destroy(&bound);
  if (rc != ST_OK) {
    char msg[700];
    snprintf(msg, sizeof msg, "%s: %s", ep->name, err);
    st__conn_send_error(c, id, rc, msg);
    return;
  }
  ST_LOG_D("call", "conn %llu: call %s (id %u) accepted", (unsigned long long)c->id, ep->name,
           (unsigned)id);
}

/* submit: a task of any endpoint; replies {task_id} at once. */
void st__method_submit(st__conn_t *c, uint32_t id, const msgpack_object *params) {
  msgpack_sbuffer bound;
  const st__endpoint_decl_t *ep = resolve(c, id, "submit", params, &bound);
  if (!ep) return;
  st__task_t *t = start_task(c, id, ep, &bound, 0);
  msgpack_sbuffer_destroy(&bound);
  if (!t) return;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, id);
  msgpack_pack_map(&pk, 1);
  st__pack_cstr(&pk, "task_id");
  msgpack_pack_uint64(&pk, t->id);
  st__reply_send(c, &sb);
}

/* ------------------------------------------------------------- completion */

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
             st_err_name(job->status), job->result.narenas,
             (unsigned long long)job->result.bytes);
  unlink_build(w, b);
  forget_flight(w, b);
  srv->counters.calls_dropped += b->dropped;
  for (st__consumer_t *k = b->consumers; k; k = k->next)
    if (k->kind == ST_CONSUMER_TASK) note_started(srv, k->task, job);

  if (job->status != ST_OK) {
    deliver_error(srv, b, job->status, job->error);
  } else if (!b->object) {
    /* A plain endpoint has one consumer at most (it is never joined). */
    st__consumer_t *k = b->consumers;
    b->consumers = NULL;
    if (!k) {
      /* Its caller left (counted in `dropped`): the arenas go with the job. */
    } else if (k->kind == ST_CONSUMER_TASK) {
      st__task_finish_plain(srv, k->task, &job->result);
    } else {
      st__conn_t *c = st__conn_find(srv, k->conn_id);
      if (c && !c->dead) {
        st__reply_result(c, k->request_id, job->ep->name, &job->result, NULL, 0);
        st__conn_request_done(c);
      } else {
        srv->counters.calls_dropped++;
      }
    }
    free(k);
  } else {
    /* Cache only what the current definition of the endpoint built. */
    const st__endpoint_decl_t *now =
        st__generation_find(srv->gen, job->ep->name, strlen(job->ep->name));
    int cache = b->cacheable && now && now->fingerprint == job->ep->fingerprint;
    if (b->consumers || cache) {
      st__object_spec_t spec = {.endpoint = job->ep->name,
                                .cache_key = b->cache_key,
                                .cache_key_len = b->cache_key_len,
                                .fingerprint = job->ep->fingerprint,
                                .cache = cache,
                                .managed = job->ep->managed,
                                .where = b->where};
      st__object_t *obj = NULL;
      char err[512];
      int rc = st__objects_add(&srv->objects, &spec, &job->result, &obj, err, sizeof err);
      if (rc != ST_OK) {
        char msg[700];
        snprintf(msg, sizeof msg, "%s: %s", job->ep->name, err);
        srv->counters.budget_refusals++;
        ST_LOG_W("call", "%s", msg);
        deliver_error(srv, b, rc, msg);
      } else {
        /* Held while it is handed out: a connection that fails while
         * we write to it gives its lease back, which must not destroy
         * the object under the next consumer. */
        st__objects_hold(&srv->objects, obj);
        st__consumer_t *k = b->consumers;
        b->consumers = NULL;
        while (k) {
          st__consumer_t *next = k->next;
          give_object(srv, k, obj);
          free(k);
          k = next;
        }
        st__objects_unhold(&srv->objects, obj);   /* destroys it if nothing holds it */
      }
    }
  }
  int serialized = b->serialized;
  char *endpoint = b->endpoint;
  b->endpoint = NULL;
  free_build(b);
  st__job_free(job);
  if (serialized) serial_next(srv, endpoint);
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
  if (abort_build(srv, b)) return 1;
  b->cancelled = 1;
  st__job_cancel(b->job);
  return 0;
}

/* The task stops waiting for b; see work.h. */
int st__build_drop_task(st__server_t *srv, st__build_t *b, st__task_t *t) {
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

/* Calls of a closed connection stop waiting; see work.h. */
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
      b->dropped += removed;
      if (removed && !b->consumers) {
        /* Counted as dropped now if it never runs, else at completion.
         * (abort_build may start the next serialized build, never free
         * another one: the pool only refuses after every connection
         * closed, in st__server_destroy.) */
        size_t dropped = b->dropped;
        if (orphan(srv, b)) srv->counters.calls_dropped += dropped;
      }
      b = next;
    }
    st__tasks_conn_closed(srv, c->id);
  }
  if (c->leases) {
    st__objects_release_conn(&srv->objects, c->id);
    c->leases = 0;
  }
}

/* Builds waiting for their turn end CANCELLED (shutdown). They are all
 * taken out first and answered afterwards: an answer may close a
 * connection, which walks the builds again. */
void st__builds_cancel_waiting(st__server_t *srv) {
  st__work_t *w = srv->work;
  if (!w) return;
  st__build_t gone = {0};
  st__build_t *b = w->builds;
  while (b) {
    st__build_t *next = b->next;
    if (b->state == ST_BUILD_WAITING) {
      st__consumer_t **tail = &gone.consumers;
      while (*tail) tail = &(*tail)->next;
      *tail = b->consumers;
      b->consumers = NULL;
      abort_build(srv, b);
    }
    b = next;
  }
  deliver_error(srv, &gone, ST_ERR_CANCELLED, "cancelled: the server is shutting down");
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
    forget_flight(w, b);
  }
}
