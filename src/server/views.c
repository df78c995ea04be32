/* src/server: replies seen through a view spec (views.h; docs/views.md,
 * section 1). Loop thread only, but walk_run (a worker). */
#include "server/views.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "engine/workers.h"
#include "server/work.h"
#include "st/errors.h"

/* A request that waits for a copy. */
typedef struct waiter {
  struct waiter *next;
  st__view_to_t to;
} waiter_t;

/* One copy in flight: its job, its source (the value and a reference to
 * each of its arenas: the source may go while the copy runs), the spec,
 * and the requests that wait for it. */
typedef struct flight {
  struct flight *prev, *next;
  char *owner;                /* derived object's endpoint; NULL: not cached */
  char *cache_key;            /* owned */
  size_t cache_key_len;
  char *slot;                 /* owner NUL cache_key: the flights' index */
  size_t slot_len;
  int nocache;                /* the key changed meanwhile: serve, don't cache */
  st__viewspec_t *spec;       /* owned */
  st__build_result_t source;  /* owned copy */
  waiter_t *waiters;
} flight_t;

struct st__views {
  st__smap_t by_slot;         /* slot -> flight (cached sources only) */
  flight_t *flights;          /* every flight */
};

static st__views_t *views_of(st__server_t *srv) {
  if (!srv->views) {
    srv->views = calloc(1, sizeof *srv->views);
    if (srv->views) st__smap_init(&srv->views->by_slot);
  }
  return srv->views;
}

/* ------------------------------------------------------------ walking */

/* What a walk of the source's value does to each tensor: arenas are
 * renumbered in their first use (only the ones the view uses go), and a
 * tensor to copy is either collected (plan) or replaced by its copy
 * (compose: tensor i of `copies`, whose arenas follow the source's). */
typedef struct walk {
  size_t nsrc;                          /* the source's arenas */
  const st__build_result_t *copies;     /* compose: the copies, else NULL */
  msgpack_unpacked copied;              /* compose: the copies' value */
  size_t next_copy;
  uint32_t *renum;                      /* nsrc + copies' arenas, UINT32_MAX: unused */
  st__arena_t **used;                   /* in first-use order */
  size_t nused;
  st__tensor_desc_t *windows;           /* plan: the windows to copy */
  size_t nwindows, cap_windows;
} walk_t;

static int walk_tensor(void *ud, size_t index, int rule, int materialize, st__tensor_desc_t *d,
                       char *err, size_t errlen) {
  walk_t *w = ud;
  (void)index, (void)rule;
  if (d->arena >= w->nsrc)   /* the server packed it: a broken invariant */
    return snprintf(err, errlen, "view: tensor names arena %u of %zu", d->arena, w->nsrc),
           ST_ERR_INTERNAL;
  if (materialize && w->copies) {
    const msgpack_object *list = &w->copied.data;
    if (list->type != MSGPACK_OBJECT_ARRAY || w->next_copy >= list->via.array.size ||
        st__parse_tensor(&list->via.array.ptr[w->next_copy], d, err, errlen) != ST_OK ||
        d->arena >= w->copies->narenas)
      return snprintf(err, errlen, "view: the copies do not match the view"), ST_ERR_INTERNAL;
    w->next_copy++;
    d->arena += (uint32_t)w->nsrc;
  } else if (materialize) {
    if (w->nwindows == w->cap_windows) {
      size_t cap = w->cap_windows ? 2 * w->cap_windows : 8;
      st__tensor_desc_t *p = realloc(w->windows, cap * sizeof *p);
      if (!p) return snprintf(err, errlen, "out of memory"), ST_ERR_OUT_OF_MEMORY;
      w->windows = p;
      w->cap_windows = cap;
    }
    w->windows[w->nwindows++] = *d;
  }
  if (w->renum[d->arena] == UINT32_MAX) w->renum[d->arena] = (uint32_t)w->nused++;
  d->arena = w->renum[d->arena];
  return ST_OK;
}

/* Walks src (and copies, when composing) through spec into *out (value
 * and borrowed arena pointers: free with result_unborrow). max_steps
 * bounds the walk (viewspec.h; 0: none): past it, ST__VIEW_OVER_BUDGET.
 * Any thread, on a source it holds. */
static int walk_value(const st__viewspec_t *spec, const st__build_result_t *src,
                      const st__build_result_t *copies, walk_t *w, st__build_result_t *out,
                      uint64_t max_steps, char *err, size_t errlen) {
  memset(w, 0, sizeof *w);
  st__build_result_init(out);
  w->nsrc = src->narenas;
  w->copies = copies;
  size_t all = src->narenas + (copies ? copies->narenas : 0);
  w->renum = malloc((all ? all : 1) * sizeof *w->renum);
  w->used = malloc((all ? all : 1) * sizeof *w->used);
  msgpack_unpacked_init(&w->copied);
  if (!w->renum || !w->used) return snprintf(err, errlen, "out of memory"), ST_ERR_OUT_OF_MEMORY;
  memset(w->renum, 0xff, (all ? all : 1) * sizeof *w->renum);
  if (copies && msgpack_unpack_next(&w->copied, copies->value.data, copies->value.size, NULL) !=
                    MSGPACK_UNPACK_SUCCESS)
    return snprintf(err, errlen, "view: the copies' value is not msgpack"), ST_ERR_INTERNAL;
  int rc = st__viewspec_value_bounded(spec, src->value.data, src->value.size, &out->value,
                                      walk_tensor, w, max_steps, NULL, err, errlen);
  if (rc != ST_OK) return rc;
  out->arenas = w->used;
  w->used = NULL;
  for (size_t i = 0; i < all; i++)
    if (w->renum[i] != UINT32_MAX) {
      st__arena_t *a = i < src->narenas ? src->arenas[i] : copies->arenas[i - src->narenas];
      out->arenas[w->renum[i]] = a;
      out->bytes += st__arena_bytes(a);
    }
  out->narenas = w->nused;
  return ST_OK;
}

static void walk_free(walk_t *w) {
  free(w->renum);
  free(w->used);
  free(w->windows);
  msgpack_unpacked_destroy(&w->copied);
}

/* Frees a walked result without dropping the borrowed arenas. */
static void result_unborrow(st__build_result_t *r) {
  free(r->arenas);
  r->arenas = NULL;
  r->narenas = 0;
  st__build_result_destroy(r);
}

/* ------------------------------------------------------------ replying */

/* Answers `to` on c with error rc: a lease the reply would have given
 * goes back. */
static void fail_to(st__server_t *srv, st__conn_t *c, const st__view_to_t *to, int rc,
                    const char *msg) {
  st__conn_send_error(c, to->request_id, rc, msg);
  st__object_t *obj = to->lease ? st__objects_find(&srv->objects, to->object_id) : NULL;
  if (obj) st__drop_lease(srv, c, obj);
}

/* Sends r to `to` on c (alive). */
static void send_result(st__server_t *srv, st__conn_t *c, const st__view_to_t *to,
                        const st__build_result_t *r) {
  switch (to->kind) {
  case ST__VIEW_TO_KEY: {
    st__key_reply_t k = {.key = to->key, .version = to->version, .readonly = to->readonly,
                         .page = to->live_page, .publisher = to->publisher};
    st__rpc_reply_key(c, to->request_id, to->what, r, &k);
    return;
  }
  case ST__VIEW_TO_OBJECT: {
    st__object_t *obj = st__objects_find(&srv->objects, to->object_id);
    if (!obj) {   /* held by the caller: a broken invariant */
      st__conn_send_error(c, to->request_id, ST_ERR_INTERNAL, "view: the object went");
      return;
    }
    if (st__reply_object_view(c, to->request_id, r, obj, to->lease, to->readonly) != ST_OK &&
        to->lease)
      st__drop_lease(srv, c, obj);
    return;
  }
  case ST__VIEW_TO_PLAIN:
    st__reply_result(c, to->request_id, to->what, r, NULL, 0);
    return;
  }
}

static int offload(st__server_t *srv, st__conn_t *c, const st__viewspec_t *spec,
                   const st__view_source_t *src, const st__build_result_t *copies,
                   const st__view_to_t *to);

/* Answers `to` with src (and its copies) through spec; errors as replies.
 * A walk past the loop's bound goes to a worker: returns 1 then (the
 * request waits), else 0. */
static int answer(st__server_t *srv, st__conn_t *c, const st__viewspec_t *spec,
                  const st__build_result_t *src, const st__build_result_t *copies,
                  const st__view_to_t *to) {
  walk_t w;
  st__build_result_t r;
  char err[700];
  int rc = walk_value(spec, src, copies, &w, &r, ST__VIEWS_LOOP_STEPS, err, sizeof err);
  if (rc == ST_OK) send_result(srv, c, to, &r);
  else if (rc != ST__VIEW_OVER_BUDGET) fail_to(srv, c, to, rc, err);
  result_unborrow(&r);
  walk_free(&w);
  if (rc != ST__VIEW_OVER_BUDGET) return 0;
  st__view_source_t s = {.result = src};
  return offload(srv, c, spec, &s, copies, to);
}

/* The cache key of (src, spec) into a new string. */
static char *cache_key_of(const st__view_source_t *src, const st__viewspec_t *spec, size_t *len) {
  const char *ver = src->version ? src->version : "";
  size_t n = strlen(ver) + 1 + spec->text_len;
  char *k = malloc(n + 1);
  if (!k) return NULL;
  snprintf(k, n + 1, "%s|%s", ver, spec->text);
  *len = n;
  return k;
}

static void flight_free(flight_t *f) {
  while (f->waiters) {
    waiter_t *n = f->waiters->next;
    free(f->waiters);
    f->waiters = n;
  }
  st__viewspec_free(f->spec);
  st__build_result_destroy(&f->source);
  free(f->owner);
  free(f->cache_key);
  free(f->slot);
  free(f);
}

/* A reference to each of r's arenas and a copy of its value into *out. */
static int result_copy(const st__build_result_t *r, st__build_result_t *out) {
  st__build_result_init(out);
  if (r->narenas && !(out->arenas = calloc(r->narenas, sizeof *out->arenas)))
    return ST_ERR_OUT_OF_MEMORY;
  msgpack_sbuffer_write(&out->value, r->value.data, r->value.size);
  for (size_t i = 0; i < r->narenas; i++) {
    st__arena_ref(r->arenas[i]);
    out->arenas[i] = r->arenas[i];
  }
  out->narenas = r->narenas;
  out->bytes = r->bytes;
  return ST_OK;
}

/* A new flight for (src, spec) with its copy job on the workers. NULL with
 * err set when it cannot start. */
static flight_t *flight_start(st__server_t *srv, const st__viewspec_t *spec,
                              const st__view_source_t *src, char *key, size_t klen,
                              const walk_t *plan, int *code, char *err, size_t errlen) {
  st__views_t *v = views_of(srv);
  flight_t *f = calloc(1, sizeof *f);
  st__views_gather_t *g = calloc(1, sizeof *g);
  st__viewspec_t *own = NULL;
  *code = ST_ERR_OUT_OF_MEMORY;
  snprintf(err, errlen, "out of memory");
  if (!v || !f || !g || st__viewspec_parse(spec->text, spec->text_len, &own, err, errlen) != ST_OK ||
      result_copy(src->result, &f->source) != ST_OK) {
    free(key);
    if (f) flight_free(f);
    free(g);
    st__viewspec_free(own);
    return NULL;
  }
  f->spec = own;
  f->cache_key = key;
  f->cache_key_len = klen;
  if (src->owner) {
    size_t on = strlen(src->owner);
    f->owner = strdup(src->owner);
    f->slot_len = on + 1 + klen;
    f->slot = malloc(f->slot_len + 1);
    if (f->slot) {
      memcpy(f->slot, src->owner, on + 1);
      memcpy(f->slot + on + 1, key, klen + 1);
    }
  }
  g->windows = malloc((plan->nwindows ? plan->nwindows : 1) * sizeof *g->windows);
  g->arenas = calloc(src->result->narenas ? src->result->narenas : 1, sizeof *g->arenas);
  st__job_t *job = NULL;
  if (g->windows && g->arenas && (!src->owner || (f->owner && f->slot)))
    job = st__job_new_native(0, 0, st__views_gather, g, st__views_gather_free);
  if (!job) {
    st__views_gather_free(g);
    flight_free(f);
    return NULL;
  }
  memcpy(g->windows, plan->windows, plan->nwindows * sizeof *g->windows);
  g->n = plan->nwindows;
  for (size_t i = 0; i < src->result->narenas; i++) {
    st__arena_ref(src->result->arenas[i]);
    g->arenas[i] = src->result->arenas[i];
  }
  g->narenas = src->result->narenas;
  job->owner = f;
  if (f->slot && st__smap_put(&v->by_slot, f->slot, f->slot_len, f) != ST_OK) {
    st__job_free(job);
    flight_free(f);
    return NULL;
  }
  int rc = srv->shutting_down || !srv->workers ? ST_ERR_SHUTTING_DOWN : st__workers_submit(srv->workers, job);
  if (rc != ST_OK) {
    if (f->slot) st__smap_del(&v->by_slot, f->slot, f->slot_len);
    st__job_free(job);
    flight_free(f);
    *code = rc;
    snprintf(err, errlen, "%s", rc == ST_ERR_SHUTTING_DOWN ? "the server is shutting down"
                                                           : "cannot queue the copy");
    return NULL;
  }
  f->next = v->flights;
  if (v->flights) v->flights->prev = f;
  v->flights = f;
  return f;
}

/* The rest of a reply once its walk is done (rc, plan, r; on the loop or
 * a worker): an error, the reply when nothing is copied, else the copies
 * from the cache or a copy in flight (new or joined). Returns 1 when the
 * reply waits (views.h). */
static int after_walk(st__server_t *srv, st__conn_t *c, const st__viewspec_t *spec,
                      const st__view_source_t *src, const st__view_to_t *to, int rc,
                      const walk_t *plan, const st__build_result_t *r, const char *walk_err) {
  char err[700];
  if (rc != ST_OK || !plan->nwindows) {
    /* Every tensor is a window (or the view is wrong): answered now. */
    if (rc == ST_OK) send_result(srv, c, to, r);
    else fail_to(srv, c, to, rc, walk_err);
    return 0;
  }
  size_t klen = 0;
  char *key = cache_key_of(src, spec, &klen);
  st__views_t *v = views_of(srv);
  int code = ST_ERR_OUT_OF_MEMORY;
  flight_t *f = NULL;
  waiter_t *wt = malloc(sizeof *wt);
  if (key && v && wt && src->owner) {
    /* A copy made before, or one on its way. */
    st__object_t *done = st__objects_lookup_on(&srv->objects, src->owner, NULL, key, klen);
    if (done) {
      st__objects_touch(&srv->objects, done);
      free(key);
      free(wt);
      return answer(srv, c, spec, src->result, &done->result, to);
    }
    size_t on = strlen(src->owner);
    char *slot = malloc(on + 1 + klen + 1);
    if (slot) {
      memcpy(slot, src->owner, on + 1);
      memcpy(slot + on + 1, key, klen + 1);
      f = st__smap_get(&v->by_slot, slot, on + 1 + klen);
      free(slot);
    }
  }
  if (f) {
    free(key);
  } else if (key && v && wt) {
    f = flight_start(srv, spec, src, key, klen, plan, &code, err, sizeof err);
  } else {
    free(key);
    snprintf(err, sizeof err, "out of memory");
  }
  if (!f) {
    free(wt);
    fail_to(srv, c, to, code, err);
    return 0;
  }
  wt->to = *to;
  wt->next = f->waiters;
  f->waiters = wt;
  if (to->kind == ST__VIEW_TO_OBJECT) {
    st__object_t *obj = st__objects_find(&srv->objects, to->object_id);
    if (obj) st__objects_hold(&srv->objects, obj);
  }
  return 1;
}

/* See views.h. */
int st__views_reply(st__server_t *srv, st__conn_t *c, const st__viewspec_t *spec,
                    const st__view_source_t *src, const st__view_to_t *to) {
  walk_t plan;
  st__build_result_t r;
  char err[700];
  int rc = walk_value(spec, src->result, NULL, &plan, &r, ST__VIEWS_LOOP_STEPS, err, sizeof err);
  int waits = rc == ST__VIEW_OVER_BUDGET ? offload(srv, c, spec, src, NULL, to)
                                         : after_walk(srv, c, spec, src, to, rc, &plan, &r, err);
  result_unborrow(&r);
  walk_free(&plan);
  return waits;
}

/* ------------------------------------------------------------ walks on a worker
 *
 * A walk past ST__VIEWS_LOOP_STEPS runs on a worker: the job holds its own
 * spec, a copy of the source (a reference to each arena) and of the
 * copies it composes, and the request's `to` (its object held, its live
 * page referenced); the loop then finishes the reply (after_walk). */

typedef struct walk_job {
  st__viewspec_t *spec;       /* owned */
  st__build_result_t source;  /* owned copy */
  st__build_result_t copies;  /* owned copy, when has_copies */
  int has_copies;
  char *owner, *version;      /* owned; NULL: none */
  st__view_to_t to;           /* live_page referenced */
  /* The worker's walk. */
  int rc;
  walk_t plan;
  st__build_result_t r;
  char err[700];
} walk_job_t;

static void walk_job_free(void *ud) {
  walk_job_t *j = ud;
  if (!j) return;
  result_unborrow(&j->r);
  walk_free(&j->plan);
  st__viewspec_free(j->spec);
  st__build_result_destroy(&j->source);
  st__build_result_destroy(&j->copies);
  free(j->owner);
  free(j->version);
  if (j->to.live_page) st__arena_unref(j->to.live_page);
  free(j);
}

/* The job's run. Worker thread: the walk's result stays in the job. */
static int walk_run(st__job_t *job, char *err, size_t errlen) {
  walk_job_t *j = job->ud;
  (void)err, (void)errlen;
  j->rc = walk_value(j->spec, &j->source, j->has_copies ? &j->copies : NULL, &j->plan, &j->r, 0,
                     j->err, sizeof j->err);
  return ST_OK;
}

/* Hands the walk of (src, copies) through spec for `to` to a worker.
 * Returns 1 (the request waits), or 0 when it was answered with an
 * error. */
static int offload(st__server_t *srv, st__conn_t *c, const st__viewspec_t *spec,
                   const st__view_source_t *src, const st__build_result_t *copies,
                   const st__view_to_t *to) {
  walk_job_t *j = calloc(1, sizeof *j);
  char err[700];
  int rc = j ? ST_OK : ST_ERR_OUT_OF_MEMORY;
  snprintf(err, sizeof err, "out of memory");
  if (j) {
    st__build_result_init(&j->source);
    st__build_result_init(&j->copies);
    st__build_result_init(&j->r);
    msgpack_unpacked_init(&j->plan.copied);
    j->to = *to;
    if (j->to.live_page) st__arena_ref(j->to.live_page);
    if (st__viewspec_parse(spec->text, spec->text_len, &j->spec, err, sizeof err) != ST_OK ||
        result_copy(src->result, &j->source) != ST_OK ||
        (copies && result_copy(copies, &j->copies) != ST_OK) ||
        (src->owner && !(j->owner = strdup(src->owner))) ||
        (src->version && !(j->version = strdup(src->version))))
      rc = ST_ERR_OUT_OF_MEMORY;
    j->has_copies = copies != NULL;
  }
  st__job_t *job = NULL;
  if (rc == ST_OK && !(job = st__job_new_native(0, 0, walk_run, j, walk_job_free)))
    rc = ST_ERR_OUT_OF_MEMORY;
  if (rc == ST_OK && (srv->shutting_down || !srv->workers)) {
    rc = ST_ERR_SHUTTING_DOWN;
    snprintf(err, sizeof err, "the server is shutting down");
  }
  if (rc == ST_OK && (rc = st__workers_submit(srv->workers, job)) != ST_OK)
    snprintf(err, sizeof err, "%s", rc == ST_ERR_SHUTTING_DOWN ? "the server is shutting down"
                                                                : "cannot queue the view");
  if (rc != ST_OK) {
    if (job) st__job_free(job);   /* frees j */
    else walk_job_free(j);
    fail_to(srv, c, to, rc, err);
    return 0;
  }
  srv->counters.views_on_workers++;
  if (to->kind == ST__VIEW_TO_OBJECT) {
    st__object_t *obj = st__objects_find(&srv->objects, to->object_id);
    if (obj) st__objects_hold(&srv->objects, obj);
  }
  return 1;
}

/* A walk came back from a worker: the reply goes on (after_walk). */
static void walk_done(st__server_t *srv, st__job_t *job) {
  walk_job_t *j = job->ud;
  st__conn_t *c = st__conn_find(srv, j->to.conn_id);
  if (c && !c->dead) {
    st__view_source_t src = {.result = &j->source, .owner = j->owner, .version = j->version};
    int waits = j->has_copies
                    ? (j->rc == ST_OK ? (send_result(srv, c, &j->to, &j->r), 0)
                                      : (fail_to(srv, c, &j->to, j->rc, j->err), 0))
                    : after_walk(srv, c, j->spec, &src, &j->to, j->rc, &j->plan, &j->r, j->err);
    if (!waits) st__conn_request_done(c);
  }
  if (j->to.kind == ST__VIEW_TO_OBJECT) {
    st__object_t *obj = st__objects_find(&srv->objects, j->to.object_id);
    if (obj) st__objects_unhold(&srv->objects, obj);
  }
  st__job_free(job);
}

/* One waiter gets the copies (or the error rc, msg). */
static void answer_waiter(st__server_t *srv, const flight_t *f, const waiter_t *wt,
                          const st__build_result_t *copies, int rc, const char *msg) {
  st__conn_t *c = st__conn_find(srv, wt->to.conn_id);
  if (c && !c->dead) {
    int waits = 0;
    if (rc == ST_OK) waits = answer(srv, c, f->spec, &f->source, copies, &wt->to);
    else fail_to(srv, c, &wt->to, rc, msg);
    if (!waits) st__conn_request_done(c);
  }
  if (wt->to.kind == ST__VIEW_TO_OBJECT) {
    st__object_t *obj = st__objects_find(&srv->objects, wt->to.object_id);
    if (obj) st__objects_unhold(&srv->objects, obj);
  }
}

/* See views.h. */
void st__views_done(st__server_t *srv, st__job_t *job) {
  if (job->run == walk_run) {
    walk_done(srv, job);
    return;
  }
  st__views_t *v = srv->views;
  flight_t *f = job->owner;
  /* A flight the key's change took out of the index may share its slot
   * with a newer one: only its own entry goes. */
  if (f->slot && st__smap_get(&v->by_slot, f->slot, f->slot_len) == f)
    st__smap_del(&v->by_slot, f->slot, f->slot_len);
  if (f->prev) f->prev->next = f->next;
  else v->flights = f->next;
  if (f->next) f->next->prev = f->prev;
  int rc = job->status;
  char msg[1200];
  snprintf(msg, sizeof msg, "view: %s", job->error);
  st__object_t *obj = NULL;
  const st__build_result_t *copies = &job->result;
  if (rc == ST_OK && f->owner && !f->nocache) {
    st__object_spec_t spec = {.endpoint = f->owner,
                              .cache_key = f->cache_key,
                              .cache_key_len = f->cache_key_len,
                              .cache = 1};
    char err[512];
    if (st__objects_add(&srv->objects, &spec, &job->result, &obj, err, sizeof err) == ST_OK) {
      st__objects_hold(&srv->objects, obj);
      copies = &obj->result;
    } else {
      ST_LOG_W("views", "%s: the copy is not cached: %s", f->owner, err);
    }
  }
  ST_LOG_D("views", "%s %s: copied %zu arenas (%s)", f->owner ? f->owner : "result",
           f->spec->text, copies->narenas, st_err_name(rc));
  for (waiter_t *wt = f->waiters; wt; wt = wt->next) answer_waiter(srv, f, wt, copies, rc, msg);
  if (obj) st__objects_unhold(&srv->objects, obj);
  flight_free(f);
  st__job_free(job);
}

/* See views.h. */
void st__views_forget_key(st__server_t *srv, const char *name) {
  char owner[ST__KEY_NAME_MAX + 8];
  snprintf(owner, sizeof owner, "key:%s", name);
  size_t n = st__objects_uncache_endpoint(&srv->objects, owner);
  if (n) ST_LOG_D("views", "%s: %zu derived views dropped", owner, n);
  st__views_t *v = srv->views;
  for (flight_t *f = v ? v->flights : NULL; f; f = f->next)
    if (f->owner && strcmp(f->owner, owner) == 0 && !f->nocache) {
      f->nocache = 1;
      st__smap_del(&v->by_slot, f->slot, f->slot_len);
    }
}

/* See views.h. */
int st__views_param(st__rpc_req_t *r, st__viewspec_t **out) {
  *out = NULL;
  const msgpack_object *o = st__rpc_arg(r, "view");
  if (!o || o->type == MSGPACK_OBJECT_NIL) return ST_OK;
  char err[600];
  if (o->type != MSGPACK_OBJECT_STR) {
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "%s: 'view' must be a string", r->method->name);
    return ST_ERR_INVALID_ARGUMENT;
  }
  int rc = st__viewspec_parse(o->via.str.ptr, o->via.str.size, out, err, sizeof err);
  if (rc != ST_OK) st__rpc_error(r, rc, "%s: %s", r->method->name, err);
  return rc;
}

/* See views.h. */
void st__views_destroy(st__server_t *srv) {
  st__views_t *v = srv->views;
  if (!v) return;
  while (v->flights) {
    flight_t *f = v->flights;
    v->flights = f->next;
    flight_free(f);
  }
  st__smap_clear(&v->by_slot);
  free(v);
  srv->views = NULL;
}
