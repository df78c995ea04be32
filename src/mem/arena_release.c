/* src/mem: the releaser thread and its queue (arena_release.h).
 *
 * The queue is an array the marked threads append to under `mu`; the
 * releaser takes the whole array at once, tears its arenas down outside
 * the lock, and counts them out of `pending` afterwards, so that
 * st__arena_release_settle wakes only once their resources are gone.
 */
#include "mem/arena_release.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "st/errors.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER;  /* queued, or stopping */
static pthread_cond_t idle_cv;                             /* pending fell to 0 */
static pthread_once_t idle_once = PTHREAD_ONCE_INIT;
typedef struct job {
  st__arena_teardown_fn teardown;
  void *obj;                     /* owned: an arena with no reference left */
} job_t;

static job_t *queue;             /* the arenas waiting, in order */
static size_t qlen, qcap;
static size_t pending;           /* queued + being torn down */
static unsigned users;           /* st__arena_releaser_start minus stop */
static int running;              /* the thread runs and takes new work */
static int stopping;             /* the last user left: drain and exit */
static pthread_t thread;
static _Thread_local int defer_here;
static atomic_uint_fast64_t deferred_total;

/* idle_cv waits on CLOCK_MONOTONIC. */
static void init_idle(void) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&idle_cv, &ca);
  pthread_condattr_destroy(&ca);
}

/* The releaser: takes the queue whole, tears it down, until stopped with
 * nothing left. */
static void *releaser_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&mu);
  for (;;) {
    while (!qlen && !stopping) pthread_cond_wait(&work_cv, &mu);
    if (!qlen) break;   /* stopping, and drained */
    job_t *batch = queue;
    size_t n = qlen;
    queue = NULL;
    qlen = qcap = 0;
    pthread_mutex_unlock(&mu);
    for (size_t i = 0; i < n; i++) batch[i].teardown(batch[i].obj);
    free(batch);
    pthread_mutex_lock(&mu);
    pending -= n;
    if (!pending) pthread_cond_broadcast(&idle_cv);
  }
  pthread_mutex_unlock(&mu);
  return NULL;
}

/* See arena_release.h. Any thread. */
int st__arena_releaser_start(char *err, size_t errlen) {
  pthread_once(&idle_once, init_idle);
  pthread_mutex_lock(&mu);
  if (users++) {
    pthread_mutex_unlock(&mu);
    return ST_OK;
  }
  /* Signals stay with the threads that take them (the server's loop). */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int e = pthread_create(&thread, NULL, releaser_main, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (e != 0) {
    users = 0;
    pthread_mutex_unlock(&mu);
    if (err && errlen) snprintf(err, errlen, "cannot start the releaser thread: %s", strerror(e));
    return ST_ERR_INTERNAL;
  }
  running = 1;
  pthread_mutex_unlock(&mu);
  return ST_OK;
}

/* See arena_release.h. Any thread but the releaser. */
void st__arena_releaser_stop(void) {
  pthread_mutex_lock(&mu);
  if (!users || --users || !running) {
    pthread_mutex_unlock(&mu);
    return;
  }
  stopping = 1;
  pthread_cond_signal(&work_cv);
  pthread_mutex_unlock(&mu);
  pthread_join(thread, NULL);
  pthread_mutex_lock(&mu);
  running = 0;
  stopping = 0;
  pthread_mutex_unlock(&mu);
}

/* See arena_release.h. The calling thread's own. */
void st__arena_defer_here(int on) { defer_here = on; }

/* See arena_release.h. Any thread. */
int st__arena_release_defer(st__arena_teardown_fn teardown, void *obj) {
  if (!defer_here) return 0;
  pthread_mutex_lock(&mu);
  if (!running || stopping) {
    pthread_mutex_unlock(&mu);
    return 0;
  }
  if (qlen == qcap) {
    size_t cap = qcap ? qcap * 2 : 64;
    job_t *q = realloc(queue, cap * sizeof *q);
    if (!q) {   /* out of memory: the caller releases inline */
      pthread_mutex_unlock(&mu);
      return 0;
    }
    queue = q;
    qcap = cap;
  }
  queue[qlen++] = (job_t){teardown, obj};
  pending++;
  pthread_cond_signal(&work_cv);
  pthread_mutex_unlock(&mu);
  atomic_fetch_add(&deferred_total, 1);
  return 1;
}

/* See arena_release.h. With nothing queued (every info asks): one lock,
 * no clock read. Any thread but the releaser. */
int st__arena_release_settle(unsigned timeout_s) {
  pthread_mutex_lock(&mu);
  int was = pending > 0;
  if (was) {
    pthread_once(&idle_once, init_idle);
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += (time_t)timeout_s;
    while (pending && pthread_cond_timedwait(&idle_cv, &mu, &until) != ETIMEDOUT) {
    }
  }
  pthread_mutex_unlock(&mu);
  return was;
}

/* See arena_release.h. Any thread. */
void st__arena_release_stats(uint64_t *now, uint64_t *deferred) {
  pthread_mutex_lock(&mu);
  if (now) *now = pending;
  pthread_mutex_unlock(&mu);
  if (deferred) *deferred = atomic_load(&deferred_total);
}
