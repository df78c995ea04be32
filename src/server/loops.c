/* src/server: the loop threads (server.h, "loops.c"; docs/pool.md,
 * section 7).
 *
 * loop_threads = 1: one loop (srv->loop), run by the thread of
 * st__server_run; no lock. loop_threads = N > 1: loop 0 is srv->loop as
 * before (listeners, signals, completions, the timers of tasks and
 * reloads) and loops 1..N-1 run on threads of their own; the listener
 * gives each new connection to one of the N in turn, and that loop's
 * thread does all of its reads, writes and timers (conn.c).
 *
 * One lock, the server lock, guards the server's state and every loop's
 * libev structures. A loop thread holds it while it runs callbacks and
 * lets go of it while it waits for events (libev's release/acquire
 * callbacks around the poll) and around the recvmsg and sendmsg of its
 * own connections (conn.c), at points where it holds no pointer into
 * shared state but its connection, which only its own thread frees. So
 * the code above conn.c runs as on one loop thread, only never two
 * callbacks at once, and the system calls, the largest part of a cached
 * call, run in parallel.
 *
 * Another thread never touches a loop's watchers of a connection: it
 * puts the connection on that loop's `todo` list and wakes it (`kick`);
 * the loop's thread does the rest before its next poll (conn.c,
 * st__conn_service, through srv->on_loop_service). Loop 0's own timers (task waits) started from
 * another loop's thread wake loop 0 the same way.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "server/loopprof.h"
#include "server/server.h"
#include "st/errors.h"

/* The loop this thread runs, NULL on every other thread. */
static _Thread_local st__loop_t *current;

/* See server.h. Any thread. */
int st__loop_thread(void) {
  return current != NULL;
}

/* See server.h. */
int st__loop_is_current(const st__loop_t *lp) {
  return !lp->srv->threaded || current == lp;
}

/* See server.h. Loop thread, the server lock held. */
void st__loop_kick(st__loop_t *lp) {
  if (lp->srv->threaded && current != lp) ev_async_send(lp->ev, &lp->kick);
}

/* See server.h. */
void st__loop_unlock(st__server_t *srv) {
  if (srv->threaded) pthread_mutex_unlock(&srv->lock);
}

/* See server.h. The wait for the lock counts as its own phase of the
 * loop profile: with several loops it is their contention. */
void st__loop_lock(st__server_t *srv) {
  if (!srv->threaded) return;
  if (pthread_mutex_trylock(&srv->lock) == 0) return;
  st__prof_begin(ST_PROF_LOCK);
  pthread_mutex_lock(&srv->lock);
  st__prof_end();
}

/* libev's hooks around the poll (ev_set_loop_release_cb). */
static void release_cb(struct ev_loop *loop) {
  (void)loop;
  st__loop_unlock(current->srv);
}

static void acquire_cb(struct ev_loop *loop) {
  (void)loop;
  st__loop_lock(current->srv);
}

/* Another thread queued work for this loop, or the loops stop. The work
 * itself is done by the prepare watcher, right before the next poll. */
static void on_kick(struct ev_loop *loop, ev_async *w, int revents) {
  st__loop_t *lp = w->data;
  (void)revents;
  if (lp->index > 0 && lp->srv->loops_stop) ev_break(loop, EVBREAK_ALL);
}

/* Before each poll: what other threads (or this one, at a point where it
 * could not write) left for the loop's connections, then the frees. */
static void on_service(struct ev_loop *loop, ev_prepare *w, int revents) {
  (void)loop;
  (void)revents;
  st__loop_t *lp = w->data;
  lp->srv->on_loop_service(lp);
}

/* See server.h. Loop thread, at start. */
int st__loops_init(st__server_t *srv, char *err, size_t errlen) {
  int n = srv->cfg->loop_threads < 1 ? 1 : srv->cfg->loop_threads;
  srv->loops = calloc((size_t)n, sizeof *srv->loops);
  if (!srv->loops) {
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  /* Sections are short (a call is a few microseconds): spinning a while
   * before sleeping beats a futex wait and wake-up per hand-over. */
  pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
  pthread_mutex_init(&srv->lock, &ma);
  pthread_mutexattr_destroy(&ma);
  for (int i = 0; i < n; i++) {
    st__loop_t *lp = &srv->loops[i];
    lp->srv = srv;
    lp->index = i;
    lp->ev = i == 0 ? srv->loop : ev_loop_new(EVFLAG_AUTO | EVFLAG_NOSIGMASK);
    if (!lp->ev) {
      snprintf(err, errlen, "cannot create event loop %d of loop_threads = %d", i, n);
      return ST_ERR_INTERNAL;
    }
    srv->nloops = i + 1;
    ev_async_init(&lp->kick, on_kick);
    lp->kick.data = lp;
    ev_async_start(lp->ev, &lp->kick);
    ev_prepare_init(&lp->service, on_service);
    lp->service.data = lp;
    ev_prepare_start(lp->ev, &lp->service);
  }
  return ST_OK;
}

/* See server.h. Loop thread. */
st__loop_t *st__loops_pick(st__server_t *srv) {
  if (!srv->threaded) return &srv->loops[0];
  return &srv->loops[srv->next_loop++ % (unsigned)srv->nloops];
}

/* The thread of loop 1..N-1: runs its loop with the server lock held
 * (let go around the poll) until the loops stop. */
static void *loop_main(void *arg) {
  st__loop_t *lp = arg;
  st__server_t *srv = lp->srv;
  current = lp;
  pthread_mutex_lock(&srv->lock);
  st__loopprof_thread_start(lp);
  if (!srv->loops_stop) ev_run(lp->ev, 0);
  st__loopprof_thread_stop(lp);
  pthread_mutex_unlock(&srv->lock);
  current = NULL;
  return NULL;
}

/* Starts the threads of loops 1..N-1 (signals blocked in them: loop 0
 * takes them). The lock is held: they wait for loop 0's first poll. */
static void start_threads(st__server_t *srv) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  for (int i = 1; i < srv->nloops; i++) {
    st__loop_t *lp = &srv->loops[i];
    int e = pthread_create(&lp->thread, NULL, loop_main, lp);
    if (e != 0) {
      /* The loops that run serve; the listener picks among them only. */
      ST_LOG_W("server", "loop thread %d: %s; serving with %d loop threads", i, strerror(e), i);
      srv->nloops = i;
      break;
    }
    lp->running = 1;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* See server.h. Loop thread. */
void st__loops_run(st__server_t *srv, void (*run0)(st__server_t *srv)) {
  if (srv->stopped) return;
  current = &srv->loops[0];
  if (srv->nloops < 2) {
    run0(srv);
    current = NULL;
    return;
  }
  pthread_mutex_lock(&srv->lock);
  srv->threaded = 1;
  for (int i = 0; i < srv->nloops; i++)
    ev_set_loop_release_cb(srv->loops[i].ev, release_cb, acquire_cb);
  start_threads(srv);
  ST_LOG_I("server", "%d loop threads", srv->nloops);
  run0(srv);
  srv->loops_stop = 1;
  for (int i = 1; i < srv->nloops; i++) ev_async_send(srv->loops[i].ev, &srv->loops[i].kick);
  pthread_mutex_unlock(&srv->lock);
  for (int i = 1; i < srv->nloops; i++) {
    if (!srv->loops[i].running) continue;
    pthread_join(srv->loops[i].thread, NULL);
    srv->loops[i].running = 0;
  }
  /* One thread again: destroy closes every loop's connections. */
  srv->threaded = 0;
  for (int i = 0; i < srv->nloops; i++) ev_set_loop_release_cb(srv->loops[i].ev, 0, 0);
  current = NULL;
}

/* See server.h. Loop thread, at exit. */
void st__loops_free(st__server_t *srv) {
  if (!srv->loops) return;
  int n = srv->cfg->loop_threads < 1 ? 1 : srv->cfg->loop_threads;
  for (int i = 0; i < n; i++) {
    st__loop_t *lp = &srv->loops[i];
    if (!lp->ev) continue;
    ev_async_stop(lp->ev, &lp->kick);
    ev_prepare_stop(lp->ev, &lp->service);
    if (i > 0) ev_loop_destroy(lp->ev);
  }
  pthread_mutex_destroy(&srv->lock);
  free(srv->loops);
  srv->loops = NULL;
  srv->nloops = 0;
}
