/* src/server: reloading the endpoints (SIGHUP and the `reload` method;
 * server.h).
 *
 * A reload loads a new generation on a loader thread of its own: reading
 * the files and running each file's top level (at most
 * endpoint_load_timeout_s each) never blocks the loop, so every client,
 * ping included, is served while it runs. When the load ends, the loop
 * thread swaps the new generation in (the caches of changed and removed
 * endpoints are dropped) or keeps the current one and records why, then
 * answers the requests that asked for it.
 *
 * One load runs at a time. Requests that come while one runs are
 * coalesced: one more load starts when the running one ends (so it sees
 * the files as they are after those requests) and answers all of them.
 * At most ST__RELOAD_MAX_WAITING requests wait at once; more get BUSY.
 *
 * Threads: everything here runs on the loop thread except load_main, which
 * touches only its reload_run_t until it sets `finished` and wakes the
 * loop (ev_async_send, the one libev call that is safe from another
 * thread).
 */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/clock.h"
#include "lua/st_lua.h"
#include "server/server.h"
#include "server/work.h"
#include "st/errors.h"

typedef struct reload_waiter {
  struct reload_waiter *next;
  st__reload_done_fn done;
  uint64_t conn_id;
  uint32_t request_id;
} reload_waiter_t;

/* One load on the loader thread. The thread owns dir..errs until it sets
 * `finished`; the loop thread reads them after joining it. */
typedef struct reload_run {
  pthread_t thread;
  struct ev_loop *loop;
  ev_async *wake;
  char *dir;                  /* owned copy of endpoints_dir */
  uint64_t number;
  st__load_opts_t opts;       /* opts.cancel points at `cancel` */
  int cancel;                 /* atomic: the server is going away */
  int finished;               /* atomic: the thread is done with the run */
  int rc;
  st__generation_t *gen;      /* owned reference on success */
  st__errlist_t errs;
  double t0;                  /* monotonic, when it started */
  reload_waiter_t *waiters;   /* answered with this load's outcome */
} reload_run_t;

struct st__reloader {
  ev_async wake;              /* the loader thread finished a load */
  reload_run_t *run;          /* the load in progress, NULL when idle */
  int again;                  /* asked for while it ran: one more load */
  reload_waiter_t *next;      /* the requests that next load answers */
  size_t waiting;             /* waiters of `run` and `next` together */
};

/* Frees the owned strings of a reload report. */
static void reload_report_free(st__reload_report_t *r) {
  free(r->error);
  for (int k = 0; k < 3; k++) {
    for (size_t i = 0; i < r->counts[k]; i++) free(r->names[k][i]);
    free(r->names[k]);
  }
  memset(r, 0, sizeof *r);
}

static void report_add(st__reload_report_t *r, int list, const char *name) {
  char **v = realloc(r->names[list], (r->counts[list] + 1) * sizeof *v);
  if (!v) return;
  r->names[list] = v;
  char *copy = strdup(name);
  if (copy) v[r->counts[list]++] = copy;
}

/* Changed, added and removed endpoints between two generations (both
 * sorted by name), compared by fingerprint. Caches of changed and removed
 * endpoints are dropped, and their builds in flight are not cached. */
static void diff_generations(st__server_t *srv, const st__generation_t *old,
                             const st__generation_t *g, st__reload_report_t *r) {
  size_t i = 0, j = 0, nold = old ? old->nendpoints : 0;
  while (i < nold || j < g->nendpoints) {
    int c = i == nold ? 1 : j == g->nendpoints ? -1
                                               : strcmp(old->endpoints[i].name, g->endpoints[j].name);
    if (c < 0 || (c == 0 && old->endpoints[i].fingerprint != g->endpoints[j].fingerprint)) {
      const char *name = old->endpoints[i].name;
      report_add(r, c < 0 ? ST_RELOAD_REMOVED : ST_RELOAD_CHANGED, name);
      size_t dropped = st__objects_uncache_endpoint(&srv->objects, name);
      st__builds_forget(srv, name, NULL, 0);
      if (dropped)
        ST_LOG_I("server", "reload: %s %s: %zu cache entries dropped", name,
                 c < 0 ? "removed" : "changed", dropped);
      i++;
      if (c == 0) j++;
    } else if (c > 0) {
      report_add(r, ST_RELOAD_ADDED, g->endpoints[j].name);
      j++;
    } else {
      i++;
      j++;
    }
  }
}

/* ------------------------------------------------------------- the load */

/* The loader thread: one st__generation_load, then wakes the loop. */
static void *load_main(void *arg) {
  reload_run_t *run = arg;
  run->rc = st__generation_load(run->dir, run->number, &run->opts, &run->gen, &run->errs);
  struct ev_loop *loop = run->loop;
  ev_async *wake = run->wake;
  __atomic_store_n(&run->finished, 1, __ATOMIC_RELEASE);
  ev_async_send(loop, wake);
  return NULL;
}

static void free_waiters(reload_waiter_t *w) {
  while (w) {
    reload_waiter_t *next = w->next;
    free(w);
    w = next;
  }
}

/* Frees a run whose thread was joined. */
static void run_free(reload_run_t *run) {
  if (run->gen) st__generation_unref(run->gen);
  st__errlist_clear(&run->errs);
  free_waiters(run->waiters);
  free(run->dir);
  free(run);
}

/* Starts a load of the next generation with `waiters` (taken) on a new
 * loader thread. ST_OK, or an error with waiters left to the caller. */
static int run_start(st__server_t *srv, reload_waiter_t *waiters) {
  st__reloader_t *rl = srv->reloader;
  reload_run_t *run = calloc(1, sizeof *run);
  if (!run || !(run->dir = strdup(srv->cfg->endpoints_dir))) {
    free(run);
    return ST_ERR_OUT_OF_MEMORY;
  }
  run->loop = srv->loop;
  run->wake = &rl->wake;
  run->number = (srv->gen ? srv->gen->number : 0) + 1;
  run->opts.limit_s = srv->cfg->endpoint_load_timeout_s;
  run->opts.cancel = &run->cancel;
  run->t0 = st__now_mono();
  /* The thread takes no signal: SIGHUP and SIGTERM stay the loop's. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&run->thread, NULL, load_main, run);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    free(run->dir);
    free(run);
    return ST_ERR_OUT_OF_MEMORY;
  }
  run->waiters = waiters;
  rl->run = run;
  st__notify("RELOADING=1\nSTATUS=reloading the endpoints (generation %llu)",
             (unsigned long long)run->number);
  return ST_OK;
}

/* Answers every waiter of the list with r (waiters whose connection is
 * gone are skipped by their callback). */
static void answer(st__server_t *srv, const reload_waiter_t *w, const st__reload_report_t *r) {
  for (; w; w = w->next)
    if (w->done) w->done(srv, w->conn_id, w->request_id, r);
}

/* A failed load: the current generation stays, the errors are recorded
 * for info and logged. Fills r->error. */
static void load_failed(st__server_t *srv, reload_run_t *run, st__reload_report_t *r) {
  srv->last_reload_ok = 0;
  srv->last_reload_error = st__errlist_join(&run->errs);
  if (!srv->last_reload_error) srv->last_reload_error = strdup(st_strerror(run->rc));
  srv->counters.reload_failures++;
  ST_LOG_E("server", "reload failed after %.1f ms; generation %llu stays in service:",
           (st__now_mono() - run->t0) * 1e3,
           (unsigned long long)(srv->gen ? srv->gen->number : 0));
  st__errlist_log(&run->errs, ST_LOG_ERROR, "server");
  r->error = srv->last_reload_error ? strdup(srv->last_reload_error) : NULL;
  st__notify("READY=1\nSTATUS=reload failed; generation %llu serves %zu endpoints",
             (unsigned long long)(srv->gen ? srv->gen->number : 0),
             srv->gen ? srv->gen->nendpoints : 0);
}

/* A loaded generation replaces the current one. Fills r. */
static void swap_in(st__server_t *srv, reload_run_t *run, st__reload_report_t *r) {
  st__generation_t *g = run->gen, *old = srv->gen;
  run->gen = NULL;
  diff_generations(srv, old, g, r);
  srv->gen = g;
  if (srv->workers) st__workers_set_generation(srv->workers, g);
  /* Jobs and worker states hold their own references: the old generation
   * is freed when the last of them lets go. */
  if (old) st__generation_unref(old);
  srv->last_reload_ok = 1;
  srv->counters.reloads++;
  r->ok = 1;
  r->generation = g->number;
  char names[1024];
  st__generation_names(g, names, sizeof names);
  ST_LOG_I("server", "reloaded in %.1f ms: generation %llu, %zu endpoints (%zu changed, "
           "%zu added, %zu removed): %s",
           (st__now_mono() - run->t0) * 1e3, (unsigned long long)g->number, g->nendpoints,
           r->counts[ST_RELOAD_CHANGED], r->counts[ST_RELOAD_ADDED],
           r->counts[ST_RELOAD_REMOVED], names);
  st__notify("READY=1\nSTATUS=serving %zu endpoints (generation %llu)", g->nendpoints,
             (unsigned long long)g->number);
}

/* Answers the waiters of w with an error report (no load ran for them). */
static void answer_error(st__server_t *srv, const reload_waiter_t *w, int code,
                         const char *why) {
  st__reload_report_t r = {0};
  r.refused = code;
  r.generation = srv->gen ? srv->gen->number : 0;
  r.error = strdup(why);
  answer(srv, w, &r);
  reload_report_free(&r);
}

static size_t count_waiters(const reload_waiter_t *w) {
  size_t n = 0;
  for (; w; w = w->next) n++;
  return n;
}

/* Starts the load asked for while the last one ran, if any. */
static void start_next(st__server_t *srv) {
  st__reloader_t *rl = srv->reloader;
  if (!rl->again) return;
  reload_waiter_t *next = rl->next;
  rl->again = 0;
  rl->next = NULL;
  int code = srv->shutting_down ? ST_ERR_SHUTTING_DOWN : ST_OK;
  if (!code && run_start(srv, next) != ST_OK) {
    code = ST_ERR_OUT_OF_MEMORY;
    ST_LOG_E("server", "reload: cannot start a loader thread");
  }
  if (!code) return;
  rl->waiting -= count_waiters(next);
  answer_error(srv, next, code, code == ST_ERR_SHUTTING_DOWN ? "the server is shutting down"
                                                             : "cannot start a loader thread");
  free_waiters(next);
}

/* The loader thread finished: swap or keep, answer, start the next load
 * that was asked for meanwhile. */
static void on_loaded(struct ev_loop *loop, ev_async *w, int revents) {
  st__server_t *srv = w->data;
  st__reloader_t *rl = srv->reloader;
  reload_run_t *run = rl->run;
  (void)loop;
  (void)revents;
  if (!run || !__atomic_load_n(&run->finished, __ATOMIC_ACQUIRE)) return;
  rl->run = NULL;
  pthread_join(run->thread, NULL);
  st__reload_report_t r = {0};
  r.generation = srv->gen ? srv->gen->number : 0;
  if (srv->shutting_down) {
    r.refused = ST_ERR_SHUTTING_DOWN;
    r.error = strdup("the server is shutting down");
  } else {
    srv->last_reload_done = 1;
    srv->last_reload_at = st__now_unix();
    free(srv->last_reload_error);
    srv->last_reload_error = NULL;
    if (run->rc == ST_OK) swap_in(srv, run, &r);
    else load_failed(srv, run, &r);
  }
  rl->waiting -= count_waiters(run->waiters);
  answer(srv, run->waiters, &r);
  reload_report_free(&r);
  run_free(run);
  start_next(srv);
}

/* ------------------------------------------------------------- requests */

/* See server.h. Loop thread, at start. */
int st__reload_init(st__server_t *srv) {
  st__reloader_t *rl = calloc(1, sizeof *rl);
  if (!rl) return ST_ERR_OUT_OF_MEMORY;
  ev_async_init(&rl->wake, on_loaded);
  rl->wake.data = srv;
  ev_async_start(srv->loop, &rl->wake);
  srv->reloader = rl;
  return ST_OK;
}

/* See server.h. Loop thread, after the loop stopped. */
void st__reload_destroy(st__server_t *srv) {
  st__reloader_t *rl = srv->reloader;
  if (!rl) return;
  if (rl->run) {
    /* The file running now stops at its next hook check. */
    __atomic_store_n(&rl->run->cancel, 1, __ATOMIC_RELAXED);
    pthread_join(rl->run->thread, NULL);
    run_free(rl->run);
  }
  free_waiters(rl->next);
  ev_async_stop(srv->loop, &rl->wake);
  free(rl);
  srv->reloader = NULL;
}

/* See server.h. Loop thread. */
int st__reload_pending(const st__server_t *srv) {
  return srv->reloader && srv->reloader->run;
}

/* See server.h. Loop thread. */
int st__server_reload(st__server_t *srv, st__reload_done_fn done, uint64_t conn_id,
                      uint32_t request_id) {
  st__reloader_t *rl = srv->reloader;
  if (srv->shutting_down) {
    ST_LOG_W("server", "reload ignored: shutting down");
    return ST_ERR_SHUTTING_DOWN;
  }
  if (!done) {
    /* SIGHUP: nobody to answer, so nothing to queue. */
    if (rl->run) rl->again = 1;
    else if (run_start(srv, NULL) != ST_OK) ST_LOG_E("server", "reload: cannot start a loader thread");
    return ST_OK;
  }
  if (rl->waiting >= ST__RELOAD_MAX_WAITING) return ST_ERR_BUSY;
  reload_waiter_t *w = calloc(1, sizeof *w);
  if (!w) return ST_ERR_OUT_OF_MEMORY;
  w->done = done;
  w->conn_id = conn_id;
  w->request_id = request_id;
  if (rl->run) {
    /* Coalesced: the next load answers every request made meanwhile. */
    w->next = rl->next;
    rl->next = w;
    rl->again = 1;
  } else if (run_start(srv, w) != ST_OK) {
    free(w);
    ST_LOG_E("server", "reload: cannot start a loader thread");
    return ST_ERR_OUT_OF_MEMORY;
  }
  rl->waiting++;
  return ST_OK;
}
