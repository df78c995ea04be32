/* src/server: the loop threads (server.h, "loops.c"; docs/pool.md,
 * section 7).
 *
 * loop_threads = 1: one loop (srv->loop), run by the thread of
 * st__server_run; no lock. loop_threads = N > 1: loop 0 is srv->loop as
 * before (listeners, signals, the completions of builds several
 * connections joined, the timers of tasks and reloads) and loops 1..N-1
 * run on threads of their own; the listener
 * gives each new connection to one of loops 1..N-1 in turn, and that
 * loop's thread does all of its reads, writes and timers (conn.c).
 *
 * The server lock is a reader/writer lock (writers first). Its write side
 * guards the server's state and loop 0's libev structures: loop 0 holds it
 * while it runs callbacks. Loops 1..N-1 hold its read side while they run
 * callbacks; a callback that changes shared state first takes the write
 * side (st__loop_exclusive: the read side let go, the write side taken,
 * so that what it looked at before may have changed), and every callback
 * but a connection's read does so at once. Under the read side a loop's
 * thread answers the cache hits of its own connections (fastcall.c),
 * touching only that connection, its own loop's libev structures (no
 * other thread touches them: another thread leaves a connection on its
 * loop's `todo` list and wakes it), its loop's counters (`counts`, added
 * into the server's by whoever takes the write side next) and relaxed
 * atomics. Either side is let go of while a loop waits for events
 * (libev's release/acquire callbacks around the poll) and around the
 * recvmsg and sendmsg of its own connections (conn.c), at points where it
 * holds no pointer into shared state but its connection, which only its
 * own thread frees.
 *
 * Loop 0's own timers (task waits) started from another loop's thread
 * wake loop 0 through its `kick`; stopped from another loop's thread (a
 * task completed on its submitter's loop), they need no wake-up: loop 0
 * finds the heap changed when it takes the write side after its poll.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "engine/workers.h"
#include "server/loopprof.h"
#include "server/server.h"
#include "st/errors.h"

/* The loop this thread runs, NULL on every other thread; which side of
 * the server lock it holds now, and which it let go of in
 * st__loop_unlock. */
enum { HELD_NONE, HELD_READ, HELD_WRITE };
static _Thread_local st__loop_t *current;
static _Thread_local int held, released;

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

/* Adds the counts of the loops' read sides into the server's. The write
 * side is held: no loop adds to its counts meanwhile. */
static void fold(st__server_t *srv) {
  for (int i = 1; i < srv->nloops; i++) {
    st__loop_counts_t *k = &srv->loops[i].counts;
    if (!k->dirty) continue;
    st__counters_t *t = &srv->counters;
    t->requests += k->calls;
    t->calls += k->calls;
    t->requests_ok += k->calls;
    t->calls_ok += k->calls;
    t->cache_hits += k->calls;
    t->bytes_received += k->bytes_received;
    t->bytes_sent += k->bytes_sent;
    if (srv->stats.call_method >= 0) {
      st__method_stats_t *m = &srv->stats.methods[srv->stats.call_method];
      m->requests += k->calls;
      m->ok += k->calls;
      for (int b = 0; b <= ST__STATS_NBUCKETS; b++) m->buckets[b] += k->buckets[b];
      m->seconds += k->seconds;
    }
    for (int e = 0; e < k->nendpoints; e++)
      srv->stats.endpoints[k->endpoint[e] - 1]->ok += k->endpoint_ok[e];
    memset(k, 0, sizeof *k);
  }
}

static void take(st__server_t *srv, int side) {
  if (side == HELD_READ) {
    if (pthread_rwlock_tryrdlock(&srv->lock) != 0) {
      st__prof_begin(ST_PROF_LOCK);
      pthread_rwlock_rdlock(&srv->lock);
      st__prof_end();
    }
  } else {
    if (pthread_rwlock_trywrlock(&srv->lock) != 0) {
      st__prof_begin(ST_PROF_LOCK);
      pthread_rwlock_wrlock(&srv->lock);
      st__prof_end();
    }
    fold(srv);
  }
  held = side;
}

/* See server.h. */
void st__loop_unlock(st__server_t *srv) {
  if (!srv->threaded) return;
  released = held;
  if (held != HELD_NONE) pthread_rwlock_unlock(&srv->lock);
  held = HELD_NONE;
}

/* See server.h. The wait for the lock counts as its own phase of the
 * loop profile: with several loops it is their contention. */
void st__loop_lock(st__server_t *srv) {
  if (!srv->threaded || released == HELD_NONE) return;
  take(srv, released);
  released = HELD_NONE;
}

/* See server.h. */
int st__loop_exclusive(st__server_t *srv) {
  if (!srv->threaded || held == HELD_WRITE) return 0;
  if (held != HELD_NONE) pthread_rwlock_unlock(&srv->lock);
  take(srv, HELD_WRITE);
  return 1;
}

/* See server.h. */
st__loop_counts_t *st__loop_counts(void) {
  return held == HELD_READ ? &current->counts : NULL;
}

/* libev's hooks around the poll (ev_set_loop_release_cb): whichever
 * side is held goes; loop 0 takes the write side back, the others the
 * read side. */
static void release_cb(struct ev_loop *loop) {
  (void)loop;
  st__loop_unlock(current->srv);
  released = HELD_NONE;
}

static void acquire_cb(struct ev_loop *loop) {
  (void)loop;
  take(current->srv, current->index == 0 ? HELD_WRITE : HELD_READ);
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
  /* Read without the write side: only a holder of it adds to `todo`, and
   * only this thread to `dead`; completions of this loop's builds come
   * from the workers (a peek, loops 1..N-1: loop 0 has its own watcher). */
  if (!lp->todo && !lp->dead &&
      !(lp->index > 0 && lp->srv->workers && st__workers_done_pending(lp->srv->workers, lp->index)))
    return;
  st__loop_exclusive(lp->srv);
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
  pthread_rwlockattr_t ra;
  pthread_rwlockattr_init(&ra);
  /* Writers first: the loops' cache hits never keep loop 0 (completions,
   * accepts, signals) or a miss waiting for long. */
  pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&srv->lock, &ra);
  pthread_rwlockattr_destroy(&ra);
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
  return &srv->loops[1 + srv->next_loop++ % (unsigned)(srv->nloops - 1)];
}

/* The thread of loop 1..N-1: runs its loop with the read side of the
 * server lock held (let go around the poll) until the loops stop. */
static void *loop_main(void *arg) {
  st__loop_t *lp = arg;
  st__server_t *srv = lp->srv;
  current = lp;
  take(srv, HELD_READ);
  st__loopprof_thread_start(lp);
  if (!srv->loops_stop) srv->run_loop(srv, lp);
  st__loopprof_thread_stop(lp);
  st__loop_unlock(srv);
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
void st__loops_run(st__server_t *srv, void (*run)(st__server_t *srv, st__loop_t *lp)) {
  if (srv->stopped) return;
  current = &srv->loops[0];
  srv->run_loop = run;
  if (srv->nloops < 2) {
    run(srv, current);
    current = NULL;
    return;
  }
  srv->threaded = 1;
  take(srv, HELD_WRITE);
  for (int i = 0; i < srv->nloops; i++)
    ev_set_loop_release_cb(srv->loops[i].ev, release_cb, acquire_cb);
  start_threads(srv);
  ST_LOG_I("server", "%d loop threads", srv->nloops);
  run(srv, &srv->loops[0]);
  srv->loops_stop = 1;
  for (int i = 1; i < srv->nloops; i++) ev_async_send(srv->loops[i].ev, &srv->loops[i].kick);
  st__loop_unlock(srv);
  for (int i = 1; i < srv->nloops; i++) {
    if (!srv->loops[i].running) continue;
    pthread_join(srv->loops[i].thread, NULL);
    srv->loops[i].running = 0;
  }
  /* One thread again: destroy closes every loop's connections. */
  fold(srv);
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
  pthread_rwlock_destroy(&srv->lock);
  free(srv->loops);
  srv->loops = NULL;
  srv->nloops = 0;
}
