/* src/server/page_watch.c: see page_watch.h. */
#include "server/page_watch.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/log.h"
#include "mem/arena.h"
#include "st/errors.h"

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif
#ifndef FUTEX_32   /* kernel headers older than 5.16: the ABI of futex_waitv */
#define FUTEX_32 2
struct futex_waitv {
  uint64_t val;
  uint64_t uaddr;
  uint32_t flags;
  uint32_t __reserved;
};
#endif

typedef struct entry {
  uint64_t key;
  void *map;                   /* the thread's mapping of the page        */
  size_t len;
  _Atomic uint32_t *word, *waiters;   /* waiters: NULL when the page has none */
  int gone;                    /* removed: the thread unmaps it           */
  int read;                    /* the thread read the word once ...      */
  uint32_t seen;               /* ... and saw this (the thread's)         */
} entry_t;

struct st__pwatch {
  struct ev_loop *loop;
  char what[64];
  ev_async async;
  void (*cb)(struct ev_loop *loop, void *ud);
  void *ud;
  int threaded;                /* the thread runs                         */
  pthread_t thread;
  pthread_mutex_t mu;          /* e, n, stop                              */
  entry_t e[ST__PWATCH_MAX];
  int n;
  _Atomic uint32_t ctl;        /* moved by add, remove and free: the thread
                                  takes the new set                       */
  int stop;
  /* The loop's side. */
  int watched;                 /* entries not removed                     */
  uint64_t *slow_keys;         /* pages the timer alone reads             */
  size_t nslow, capslow;
  double fast, slow, every;
  ev_timer timer;
  int timer_on;
};

/* A waitv element of futex word f (a 32-bit, shared futex). */
static void waitv_of(struct futex_waitv *v, _Atomic uint32_t *f, uint32_t seen) {
  memset(v, 0, sizeof *v);
  v->val = seen;
  v->uaddr = (uint64_t)(uintptr_t)f;
  v->flags = FUTEX_32;
}

static void poke(st__pwatch_t *w) {
  atomic_fetch_add(&w->ctl, 1);
  syscall(SYS_futex, (uint32_t *)&w->ctl, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static void *run(void *arg) {
  st__pwatch_t *w = arg;
  struct futex_waitv v[ST__PWATCH_MAX + 1];
  for (;;) {
    pthread_mutex_lock(&w->mu);
    if (w->stop) {
      pthread_mutex_unlock(&w->mu);
      return NULL;
    }
    /* Removed pages go; the others are read (after the waiter count, so
     * that a publish from here on wakes us) and compared with their last
     * reading (a new page counts as moved). */
    int m = 0, moved = 0;
    for (int i = 0; i < w->n; i++) {
      entry_t *e = &w->e[i];
      if (e->gone) {
        munmap(e->map, e->len);
        continue;
      }
      w->e[m++] = *e;
    }
    w->n = m;
    uint32_t ctl = atomic_load(&w->ctl);
    for (int i = 0; i < w->n; i++) {
      entry_t *e = &w->e[i];
      if (e->waiters) atomic_fetch_add(e->waiters, 1);
      uint32_t now = atomic_load(e->word);
      moved |= !e->read || e->seen != now;
      e->read = 1;
      e->seen = now;
      waitv_of(&v[i], e->word, now);
    }
    int n = w->n;
    /* The waiter counts stay taken until the wait ends: the entries stay
     * mapped meanwhile (a remove only marks them; they go above). */
    _Atomic uint32_t *waiters[ST__PWATCH_MAX];
    for (int i = 0; i < n; i++) waiters[i] = w->e[i].waiters;
    pthread_mutex_unlock(&w->mu);
    if (moved) ev_async_send(w->loop, &w->async);
    memset(&v[n], 0, sizeof v[n]);
    v[n].val = ctl;
    v[n].uaddr = (uint64_t)(uintptr_t)&w->ctl;
    v[n].flags = FUTEX_32 | FUTEX_PRIVATE_FLAG;
    long rc = syscall(SYS_futex_waitv, v, (unsigned)(n + 1), 0, NULL, CLOCK_MONOTONIC);
    for (int i = 0; i < n; i++)
      if (waiters[i]) atomic_fetch_sub(waiters[i], 1);
    if (rc < 0 && errno != EAGAIN && errno != EINTR) {
      ST_LOG_W("peer", "%s: futex_waitv: %s; their pages are read on a timer alone", w->what,
               strerror(errno));
      pthread_mutex_lock(&w->mu);
      while (!w->stop) {   /* nothing more to do but to wait for the end */
        pthread_mutex_unlock(&w->mu);
        uint32_t c = atomic_load(&w->ctl);
        syscall(SYS_futex, (uint32_t *)&w->ctl, FUTEX_WAIT_PRIVATE, c, NULL, NULL, 0);
        pthread_mutex_lock(&w->mu);
      }
      pthread_mutex_unlock(&w->mu);
      return NULL;
    }
  }
}

static void on_async(struct ev_loop *loop, ev_async *a, int revents) {
  (void)revents;
  st__pwatch_t *w = a->data;
  w->cb(loop, w->ud);
}

static void on_timer(struct ev_loop *loop, ev_timer *t, int revents) {
  (void)revents;
  st__pwatch_t *w = t->data;
  w->cb(loop, w->ud);
}

/* The timer runs while pages are watched: `fast` while one is read by it
 * alone, else `slow`. */
static void timer_update(st__pwatch_t *w) {
  double every = w->nslow ? w->fast : w->slow;
  if (!w->watched && !w->nslow) every = 0;
  if (w->timer_on && w->every == every) return;
  if (w->timer_on) ev_timer_stop(w->loop, &w->timer);
  w->timer_on = 0;
  w->every = every;
  if (!every) return;
  ev_timer_init(&w->timer, on_timer, every, every);
  w->timer.data = w;
  ev_timer_start(w->loop, &w->timer);
  w->timer_on = 1;
}

/* Whether this kernel has futex_waitv (an empty wait says ENOSYS when not). */
static int have_waitv(void) {
  long rc = syscall(SYS_futex_waitv, NULL, 0u, 0, NULL, CLOCK_MONOTONIC);
  return !(rc < 0 && errno == ENOSYS);
}

int st__pwatch_new(struct ev_loop *loop, const char *what, double fast, double slow,
                   void (*cb)(struct ev_loop *loop, void *ud), void *ud, st__pwatch_t **out) {
  *out = NULL;
  st__pwatch_t *w = calloc(1, sizeof *w);
  if (!w) return ST_ERR_OUT_OF_MEMORY;
  w->loop = loop;
  snprintf(w->what, sizeof w->what, "%s", what);
  w->cb = cb;
  w->ud = ud;
  w->fast = fast;
  w->slow = slow;
  pthread_mutex_init(&w->mu, NULL);
  if (!have_waitv()) {
    ST_LOG_W("peer", "%s are read every %g ms: this kernel has no futex_waitv (Linux 5.16) to "
             "wake on their changes", what, fast * 1e3);
  } else {
    ev_async_init(&w->async, on_async);
    w->async.data = w;
    ev_async_start(loop, &w->async);
    ev_unref(loop);   /* the watch alone does not keep the loop running */
    int rc = pthread_create(&w->thread, NULL, run, w);
    if (rc == 0) {
      w->threaded = 1;
    } else {
      ev_ref(loop);
      ev_async_stop(loop, &w->async);
      ST_LOG_W("peer", "%s are read every %g ms: pthread_create: %s", what, fast * 1e3,
               strerror(rc));
    }
  }
  *out = w;
  return ST_OK;
}

/* The timer alone reads key's page. */
static int slow_add(st__pwatch_t *w, uint64_t key) {
  if (w->nslow == w->capslow) {
    size_t cap = w->capslow ? 2 * w->capslow : 8;
    uint64_t *k = realloc(w->slow_keys, cap * sizeof *k);
    if (!k) return 0;   /* the timer still runs while others are watched */
    w->slow_keys = k;
    w->capslow = cap;
  }
  w->slow_keys[w->nslow++] = key;
  timer_update(w);
  return 0;
}

int st__pwatch_add(st__pwatch_t *w, uint64_t key, int fd, uint64_t page_bytes, size_t word,
                   size_t waiters) {
  int has_waiters = waiters != ST__PWATCH_NO_WAITERS;
  if (!w->threaded) return slow_add(w, key);
  if (w->watched >= ST__PWATCH_MAX) {
    ST_LOG_I("peer", "%s: %d pages are watched already: one more is read every %g ms", w->what,
             ST__PWATCH_MAX, w->fast * 1e3);
    return slow_add(w, key);
  }
  if (word + 4 > page_bytes || (has_waiters && waiters + 4 > page_bytes) || word % 4 ||
      (has_waiters && waiters % 4)) {
    ST_LOG_W("peer", "%s: the words lie outside the page: it is read every %g ms", w->what,
             w->fast * 1e3);
    return slow_add(w, key);
  }
  void *map = mmap(NULL, (size_t)page_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    ST_LOG_W("peer", "%s: mmap of a page: %s: it is read every %g ms", w->what, strerror(errno),
             w->fast * 1e3);
    return slow_add(w, key);
  }
  pthread_mutex_lock(&w->mu);
  int room = w->n < ST__PWATCH_MAX;   /* removed ones not yet unmapped count */
  if (room)
    w->e[w->n++] = (entry_t){
        .key = key,
        .map = map,
        .len = (size_t)page_bytes,
        .word = (_Atomic uint32_t *)((char *)map + word),
        .waiters = has_waiters ? (_Atomic uint32_t *)((char *)map + waiters) : NULL};
  pthread_mutex_unlock(&w->mu);
  if (!room) {
    munmap(map, (size_t)page_bytes);
    return slow_add(w, key);
  }
  w->watched++;
  poke(w);
  timer_update(w);
  return 1;
}

int st__pwatch_add_arena(st__pwatch_t *w, uint64_t key, const st__arena_t *arena,
                         uint64_t page_bytes, size_t word, size_t waiters, const char *name) {
  char err[300];
  int fd = st__arena_dup_fd(arena, err, sizeof err);
  if (fd < 0)   /* the timer reads it then */
    ST_LOG_W("peer", "%s: %s: its page cannot be mapped for the watch: %s", w->what, name, err);
  int watched = st__pwatch_add(w, key, fd, page_bytes, word, waiters);
  if (fd >= 0) close(fd);
  return watched;
}

void st__pwatch_remove(st__pwatch_t *w, uint64_t key) {
  if (!w) return;
  for (size_t i = 0; i < w->nslow; i++)
    if (w->slow_keys[i] == key) {
      w->slow_keys[i] = w->slow_keys[--w->nslow];
      timer_update(w);
      return;
    }
  int hit = 0;
  pthread_mutex_lock(&w->mu);
  for (int i = 0; i < w->n; i++)
    if (w->e[i].key == key && !w->e[i].gone) {
      w->e[i].gone = 1;
      hit = 1;
    }
  pthread_mutex_unlock(&w->mu);
  if (!hit) return;
  w->watched--;
  poke(w);
  timer_update(w);
}

void st__pwatch_free(st__pwatch_t *w) {
  if (!w) return;
  if (w->threaded) {
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_mutex_unlock(&w->mu);
    poke(w);
    pthread_join(w->thread, NULL);
    ev_ref(w->loop);
    ev_async_stop(w->loop, &w->async);
  }
  for (int i = 0; i < w->n; i++) munmap(w->e[i].map, w->e[i].len);
  if (w->timer_on) ev_timer_stop(w->loop, &w->timer);
  pthread_mutex_destroy(&w->mu);
  free(w->slow_keys);
  free(w);
}
