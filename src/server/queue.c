/* src/server: where builds wait and run (work.h, "queue.c"): the list of
 * builds in flight, the flight table that later calls join, the hand-off
 * to the workers, and the FIFO queue of each serialized endpoint (one
 * of its builds on the workers at a time). Loop thread only.
 */
#include <stdlib.h>
#include <string.h>

#include "server/work.h"
#include "st/errors.h"

/* Frees b's consumers and everything b owns but its job. */
void st__build_free(st__build_t *b) {
  st__consumer_t *k = b->consumers;
  while (k) {
    st__consumer_t *next = k->next;
    free(k);
    k = next;
  }
  free(b->endpoint);
  free(b->cache_key);
  free(b->flight);
  free(b);
}

/* Adds b to the list of every build. */
void st__build_link(st__work_t *w, st__build_t *b) {
  b->prev = NULL;
  b->next = w->builds;
  if (w->builds) w->builds->prev = b;
  w->builds = b;
}

/* Takes b out of that list (and out of the submitted ones). */
void st__build_unlink(st__work_t *w, st__build_t *b) {
  if (b->prev) b->prev->next = b->next;
  else if (w->builds == b) w->builds = b->next;
  if (b->next) b->next->prev = b->prev;
  b->prev = b->next = NULL;
  if (b->in_queued) {
    if (b->fprev) b->fprev->fnext = b->fnext;
    else w->queued = b->fnext;
    if (b->fnext) b->fnext->fprev = b->fprev;
    else w->queued_tail = b->fprev;
    b->fprev = b->fnext = NULL;
    b->in_queued = 0;
  }
}

/* Later calls stop joining b. */
void st__build_forget_flight(st__work_t *w, st__build_t *b) {
  if (!b->flight) return;
  if (st__smap_get(&w->flights, b->flight, b->flight_len) == b)
    st__smap_del(&w->flights, b->flight, b->flight_len);
  free(b->flight);
  b->flight = NULL;
}

/* The loop that completes b (job.h, `home`): the loop of its one
 * consumer's connection (a call's, or the submitter's of a task), so that
 * the reply (or the answer to a `wait` the submitter sent) is written by
 * the thread that owns it; loop 0 for a build several consumers joined
 * already. Other consumers and waiters on other loops get theirs through
 * their loop's `todo` list; a waiter's timer is loop 0's, stopped under
 * the write side (loops.c). */
static int home_of(st__server_t *srv, const st__build_t *b) {
  const st__consumer_t *k = b->consumers;
  if (!srv->threaded || !k || k->next) return 0;
  st__conn_t *c = st__conn_find(srv, k->conn_id);
  return c && !c->dead ? c->loop->index : 0;
}

static int submit(st__server_t *srv, st__build_t *b) {
  if (!srv->workers) return ST_ERR_SHUTTING_DOWN;
  b->job->home = home_of(srv, b);
  int rc = st__workers_submit(srv->workers, b->job);
  if (rc != ST_OK) return rc;
  b->state = ST_BUILD_SUBMITTED;
  st__tasks_build_submitted(srv->work, b);
  srv->counters.builds++;
  return ST_OK;
}

/* A build of a serialized endpoint left the workers: the next one in its
 * queue gets the turn; see work.h. */
void st__queue_next(st__server_t *srv, const char *endpoint) {
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
    /* Only workers that stopped refuse: end the build here. */
    st__build_unlink(w, b);
    st__build_forget_flight(w, b);
    st__deliver_error(srv, &b->consumers, rc, "the server is shutting down");
    st__job_free(b->job);
    st__build_free(b);
  }
  if (!s->busy && !s->head) {
    st__smap_del(&w->serial, endpoint, len);
    free(s);
  }
}

/* Hands b to the workers, or queues it behind the running build of its
 * serialized endpoint; see work.h. */
int st__queue_enqueue(st__server_t *srv, st__build_t *b) {
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

/* Takes b out of its serialized queue. 0 when it was not there. */
static int unqueue(st__work_t *w, st__build_t *b) {
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
  return 1;
}

/* Ends a build that has not run; see work.h. */
int st__queue_abort(st__server_t *srv, st__build_t *b) {
  st__work_t *w = srv->work;
  int waiting = b->state == ST_BUILD_WAITING;
  if (waiting ? !unqueue(w, b) : !srv->workers || !st__workers_remove(srv->workers, b->job)) return 0;
  st__build_unlink(w, b);
  st__build_forget_flight(w, b);
  st__job_free(b->job);
  /* A build that held its endpoint's turn passes it on. */
  int pass = !waiting && b->serialized;
  char *endpoint = b->endpoint;
  b->endpoint = NULL;
  st__build_free(b);
  if (pass) st__queue_next(srv, endpoint);
  free(endpoint);
  return 1;
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

/* Frees the serialized queues and the jobs of the builds waiting in them
 * (the builds themselves stay on the list of every build). */
void st__queue_destroy(st__work_t *w) {
  st__smap_each(&w->serial, serial_free, NULL);
  st__smap_clear(&w->serial);
}
