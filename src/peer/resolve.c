/* src/peer: host-name resolution off the loop thread (resolve.h). */
#include "peer/resolve.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st/errors.h"

/* What a resolving thread and the resolver share. Guarded by mu; freed
 * by whichever side drops the last reference. */
typedef struct shared {
  pthread_mutex_t mu;
  int refs;
  int closed;                 /* the resolver is gone: drop answers       */
  struct ev_loop *loop;
  ev_async *wake;             /* the resolver's, valid while !closed      */
  struct answer *done;        /* answers for the loop, newest first       */
} shared_t;

typedef struct answer {
  shared_t *s;
  uint64_t tag;
  char host[256], port[16];
  struct addrinfo *res;
  int gai_error, sys_errno;
  struct answer *next;
} answer_t;

struct st__resolver {
  ev_async wake;
  struct ev_loop *loop;
  shared_t *s;
  st__resolved_fn fn;
  void *ctx;
};

/* Drops one reference; the last frees the shared state and any answer
 * nobody will take. Called with s->mu held; unlocks it. */
static void unref_unlock(shared_t *s) {
  int last = --s->refs == 0;
  pthread_mutex_unlock(&s->mu);
  if (!last) return;
  while (s->done) {
    answer_t *a = s->done;
    s->done = a->next;
    if (a->res) freeaddrinfo(a->res);
    free(a);
  }
  pthread_mutex_destroy(&s->mu);
  free(s);
}

static void *resolve_thread(void *arg) {
  answer_t *a = arg;
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
  errno = 0;
  a->gai_error = getaddrinfo(a->host, a->port, &hints, &a->res);
  a->sys_errno = errno;
  if (a->gai_error != 0) a->res = NULL;
  shared_t *s = a->s;
  pthread_mutex_lock(&s->mu);
  if (s->closed) {
    if (a->res) freeaddrinfo(a->res);
    free(a);
  } else {
    a->next = s->done;
    s->done = a;
    ev_async_send(s->loop, s->wake);
  }
  unref_unlock(s);
  return NULL;
}

/* The loop side: every answer that came, oldest first. */
static void on_wake(struct ev_loop *loop, ev_async *w, int revents) {
  st__resolver_t *r = w->data;
  (void)loop;
  (void)revents;
  pthread_mutex_lock(&r->s->mu);
  answer_t *list = r->s->done, *rev = NULL;
  r->s->done = NULL;
  pthread_mutex_unlock(&r->s->mu);
  while (list) {
    answer_t *a = list;
    list = a->next;
    a->next = rev;
    rev = a;
  }
  while (rev) {
    answer_t *a = rev;
    rev = a->next;
    r->fn(r->ctx, a->tag, a->res, a->gai_error, a->sys_errno);
    free(a);
  }
}

int st__resolver_new(struct ev_loop *loop, st__resolved_fn fn, void *ctx, st__resolver_t **out) {
  st__resolver_t *r = calloc(1, sizeof *r);
  shared_t *s = calloc(1, sizeof *s);
  if (!r || !s) {
    free(r);
    free(s);
    return ST_ERR_OUT_OF_MEMORY;
  }
  pthread_mutex_init(&s->mu, NULL);
  s->refs = 1;
  s->loop = loop;
  s->wake = &r->wake;
  r->s = s;
  r->loop = loop;
  r->fn = fn;
  r->ctx = ctx;
  ev_async_init(&r->wake, on_wake);
  r->wake.data = r;
  ev_async_start(loop, &r->wake);
  *out = r;
  return ST_OK;
}

int st__resolver_start(st__resolver_t *r, const char *host, const char *port, uint64_t tag,
                       char *err, size_t errlen) {
  answer_t *a = calloc(1, sizeof *a);
  if (!a || strlen(host) >= sizeof a->host || strlen(port) >= sizeof a->port) {
    free(a);
    snprintf(err, errlen, a ? "host name too long" : "out of memory");
    return a ? ST_ERR_INVALID_ARGUMENT : ST_ERR_OUT_OF_MEMORY;
  }
  snprintf(a->host, sizeof a->host, "%s", host);
  snprintf(a->port, sizeof a->port, "%s", port);
  a->tag = tag;
  a->s = r->s;
  pthread_mutex_lock(&r->s->mu);
  r->s->refs++;
  pthread_mutex_unlock(&r->s->mu);
  /* Signals stay with the loop's thread: the new thread blocks them all. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 256 << 10);
  pthread_t th;
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int e = pthread_create(&th, &attr, resolve_thread, a);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&attr);
  if (e == 0) return ST_OK;
  pthread_mutex_lock(&r->s->mu);
  unref_unlock(r->s);
  free(a);
  snprintf(err, errlen, "cannot start a resolver thread: %s", strerror(e));
  return ST_ERR_INTERNAL;
}

void st__resolver_free(st__resolver_t *r) {
  if (!r) return;
  /* Once closed is set (under mu) no thread sends to the watcher. */
  pthread_mutex_lock(&r->s->mu);
  r->s->closed = 1;
  r->s->wake = NULL;
  /* Answers that came but were not delivered go with the shared state. */
  unref_unlock(r->s);
  ev_async_stop(r->loop, &r->wake);
  free(r);
}
