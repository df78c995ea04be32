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
  _Atomic uint32_t *word, *waiters;
  int gone;                    /* removed: the thread unmaps it           */
} entry_t;

struct st__pwatch {
  struct ev_loop *loop;
  ev_async async;
  void (*cb)(struct ev_loop *loop, void *ud);
  void *ud;
  pthread_t thread;
  pthread_mutex_t mu;
  entry_t e[ST__PWATCH_MAX];
  int n;
  _Atomic uint32_t ctl;        /* moved by add, remove and free: the thread
                                  takes the new set                       */
  int stop;
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
  uint32_t last[ST__PWATCH_MAX];
  uint64_t last_key[ST__PWATCH_MAX];
  int nlast = 0;
  for (;;) {
    pthread_mutex_lock(&w->mu);
    if (w->stop) {
      pthread_mutex_unlock(&w->mu);
      return NULL;
    }
    /* Removed pages go; the others are read (after the waiter count, so
     * that a publish from here on wakes us) and compared with the last
     * reading of the same key. */
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
    uint32_t seen[ST__PWATCH_MAX];
    for (int i = 0; i < w->n; i++) {
      entry_t *e = &w->e[i];
      atomic_fetch_add(e->waiters, 1);
      seen[i] = atomic_load(e->word);
      int known = 0;
      for (int k = 0; k < nlast; k++)
        if (last_key[k] == e->key) {
          known = 1;
          moved |= last[k] != seen[i];
        }
      moved |= !known;
      waitv_of(&v[i], e->word, seen[i]);
    }
    int n = w->n;
    for (int i = 0; i < n; i++) {
      last[i] = seen[i];
      last_key[i] = w->e[i].key;
    }
    nlast = n;
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
    for (int i = 0; i < n; i++) atomic_fetch_sub(waiters[i], 1);
    if (rc < 0 && errno != EAGAIN && errno != EINTR) {
      ST_LOG_W("peer", "page watch: futex_waitv: %s; pages are read by the timer alone",
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

/* Whether this kernel has futex_waitv (an empty wait says ENOSYS when not). */
static int have_waitv(void) {
  long rc = syscall(SYS_futex_waitv, NULL, 0u, 0, NULL, CLOCK_MONOTONIC);
  return !(rc < 0 && errno == ENOSYS);
}

int st__pwatch_new(struct ev_loop *loop, void (*cb)(struct ev_loop *loop, void *ud), void *ud,
                   st__pwatch_t **out, char *err, size_t errlen) {
  *out = NULL;
  if (!have_waitv()) {
    snprintf(err, errlen, "this kernel has no futex_waitv (Linux 5.16)");
    return ST_ERR_CAPABILITY;
  }
  st__pwatch_t *w = calloc(1, sizeof *w);
  if (!w) {
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  w->loop = loop;
  w->cb = cb;
  w->ud = ud;
  pthread_mutex_init(&w->mu, NULL);
  ev_async_init(&w->async, on_async);
  w->async.data = w;
  ev_async_start(loop, &w->async);
  ev_unref(loop);   /* the watch alone does not keep the loop running */
  int rc = pthread_create(&w->thread, NULL, run, w);
  if (rc != 0) {
    ev_ref(loop);
    ev_async_stop(loop, &w->async);
    pthread_mutex_destroy(&w->mu);
    free(w);
    snprintf(err, errlen, "pthread_create: %s", strerror(rc));
    return ST_ERR_INTERNAL;
  }
  *out = w;
  return ST_OK;
}

int st__pwatch_add(st__pwatch_t *w, uint64_t key, int fd, uint64_t page_bytes, size_t word,
                   size_t waiters, char *err, size_t errlen) {
  if (word + 4 > page_bytes || waiters + 4 > page_bytes || (word | waiters) % 4) {
    snprintf(err, errlen, "the words lie outside the page");
    return ST_ERR_INVALID_ARGUMENT;
  }
  pthread_mutex_lock(&w->mu);
  int live = 0;
  for (int i = 0; i < w->n; i++) live += !w->e[i].gone;
  pthread_mutex_unlock(&w->mu);
  if (live >= ST__PWATCH_MAX) {
    snprintf(err, errlen, "%d pages are watched already", ST__PWATCH_MAX);
    return ST_ERR_LIMIT;
  }
  void *map = mmap(NULL, (size_t)page_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    snprintf(err, errlen, "mmap of the page: %s", strerror(errno));
    return ST_ERR_OUT_OF_MEMORY;
  }
  pthread_mutex_lock(&w->mu);
  if (w->n >= ST__PWATCH_MAX) {   /* removed ones not yet unmapped: room after the next turn */
    pthread_mutex_unlock(&w->mu);
    munmap(map, (size_t)page_bytes);
    snprintf(err, errlen, "%d pages are watched already", ST__PWATCH_MAX);
    return ST_ERR_LIMIT;
  }
  w->e[w->n++] = (entry_t){.key = key,
                           .map = map,
                           .len = (size_t)page_bytes,
                           .word = (_Atomic uint32_t *)((char *)map + word),
                           .waiters = (_Atomic uint32_t *)((char *)map + waiters)};
  pthread_mutex_unlock(&w->mu);
  poke(w);
  return ST_OK;
}

void st__pwatch_remove(st__pwatch_t *w, uint64_t key) {
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  int hit = 0;
  for (int i = 0; i < w->n; i++)
    if (w->e[i].key == key && !w->e[i].gone) {
      w->e[i].gone = 1;
      hit = 1;
    }
  pthread_mutex_unlock(&w->mu);
  if (hit) poke(w);
}

void st__pwatch_free(st__pwatch_t *w) {
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  w->stop = 1;
  pthread_mutex_unlock(&w->mu);
  poke(w);
  pthread_join(w->thread, NULL);
  for (int i = 0; i < w->n; i++) munmap(w->e[i].map, w->e[i].len);
  ev_ref(w->loop);
  ev_async_stop(w->loop, &w->async);
  pthread_mutex_destroy(&w->mu);
  free(w);
}
