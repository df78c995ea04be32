/* src/embed: the server on a background thread of its host (st/embed.h).
 *
 *   host thread                         server thread (one per handle)
 *   -----------                         -----------------------------
 *   st_embed_start: mkdtemp, config,
 *     ev_loop_new, pthread_create  -->  st__server_start (no signals)
 *     waits for the start result   <--  started: rc (+ errors)
 *   ... connects to the socket ...      st__server_run: serves
 *   st_embed_stop:
 *     st__server_request_stop      -->  shutdown: drain, loop ends
 *     pthread_join                 <--  st__server_destroy (unlinks)
 *     ev_loop_destroy, rmdir
 *
 * The server thread is the loop thread of server.h: everything in the
 * server belongs to it from st__server_start to st__server_destroy; the
 * host only ever calls st__server_request_stop (an ev_async_send).
 *
 * Live handles are kept in a list so that an atexit handler stops the ones
 * the host forgot (a Lua script that ends with os.exit, say). That handler
 * stops a server without freeing its handle: the host may still hold it,
 * and st_embed_stop of a stopped handle only frees it.
 */
#include <errno.h>
#include <ev.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "embed/embed_int.h"
#include "server/server.h"

struct st_embed {
  st__config_t cfg;           /* owned; the server borrows it              */
  st__server_t srv;           /* the server thread's                       */
  struct ev_loop *loop;       /* owned: made here, destroyed after join    */
  pthread_t thread;
  char dir[96];               /* the private directory (mkdtemp)           */
  char path[128];             /* its socket                                */
  pthread_mutex_t mu;         /* start handshake                           */
  pthread_cond_t cv;
  int started;                /* the thread has a start result             */
  int start_rc;
  char err[4096];             /* why the start failed                      */
  int stopped;                /* the server is gone (stop or atexit)       */
  int stop_rc;
  st_embed_t *next;           /* live list                                 */
};

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static st_embed_t *live;
static pthread_once_t atexit_once = PTHREAD_ONCE_INIT;

static void live_add(st_embed_t *e) {
  pthread_mutex_lock(&live_mu);
  e->next = live;
  live = e;
  pthread_mutex_unlock(&live_mu);
}

/* Unlinks e from the live list; 0 when it was not there. */
static int live_remove(st_embed_t *e) {
  int found = 0;
  pthread_mutex_lock(&live_mu);
  for (st_embed_t **p = &live; *p; p = &(*p)->next) {
    if (*p == e) {
      *p = e->next;
      found = 1;
      break;
    }
  }
  pthread_mutex_unlock(&live_mu);
  e->next = NULL;
  return found;
}

/* The server thread: start, tell the host, serve, tear down. Every
 * signal is blocked here (inherited from st_embed_start), so the host's
 * handlers keep running on the host's threads. */
static void *server_main(void *arg) {
  st_embed_t *e = arg;
  st__server_setup_t setup = {
      .loop = e->loop, .no_signals = 1, .err = e->err, .errlen = sizeof e->err, .quiet = 1};
  int rc = st__server_start(&e->srv, &e->cfg, &setup);
  pthread_mutex_lock(&e->mu);
  e->start_rc = rc;
  e->started = 1;
  pthread_cond_signal(&e->cv);
  pthread_mutex_unlock(&e->mu);
  if (rc == ST_OK) st__server_run(&e->srv);
  st__server_destroy(&e->srv);
  return NULL;
}

/* Joins the thread of a started server and removes what it left.
 * Host thread; e->thread was started. */
static int finish(st_embed_t *e) {
  pthread_join(e->thread, NULL);
  ev_loop_destroy(e->loop);
  e->loop = NULL;
  int rc = ST_OK;
  /* The server unlinked its own socket; anything else in the directory
   * was put there by someone else and is left alone. */
  if (rmdir(e->dir) != 0 && errno != ENOENT) {
    ST_LOG_W("embed", "cannot remove %s: %s", e->dir, strerror(errno));
    rc = ST_ERR_IO;
  }
  st__config_free(&e->cfg);
  e->stopped = 1;
  e->stop_rc = rc;
  return rc;
}

/* Stops the server once; the handle's lock makes a stop at exit and one
 * by the host on another thread take turns. */
static int stop_server(st_embed_t *e) {
  pthread_mutex_lock(&e->mu);
  int rc = e->stop_rc;
  if (!e->stopped) {
    st__server_request_stop(&e->srv);
    rc = finish(e);
  }
  pthread_mutex_unlock(&e->mu);
  return rc;
}

/* atexit: stops every server still running; their handles stay allocated
 * (their owners may still call st_embed_stop). */
static void stop_all_at_exit(void) {
  for (;;) {
    pthread_mutex_lock(&live_mu);
    st_embed_t *e = live;
    if (e) live = e->next;
    pthread_mutex_unlock(&live_mu);
    if (!e) return;
    e->next = NULL;
    stop_server(e);
  }
}

static void register_atexit(void) {
  atexit(stop_all_at_exit);
}

/* A fresh 0700 directory for the socket: under $TMPDIR when the socket
 * path still fits a Unix address there, else under /tmp. */
static int make_dir(st_embed_t *e, char *err, size_t errlen) {
  const char *tmp = getenv("TMPDIR");
  if (!tmp || tmp[0] != '/' || strlen(tmp) > 48) tmp = "/tmp";
  size_t tl = strlen(tmp);
  while (tl > 1 && tmp[tl - 1] == '/') tl--;
  snprintf(e->dir, sizeof e->dir, "%.*s/st-embed-XXXXXX", (int)tl, tmp);
  if (!mkdtemp(e->dir)) {
    snprintf(err, errlen, "cannot make a directory for the socket (%s): %s", e->dir,
             strerror(errno));
    return ST_ERR_IO;
  }
  return ST_OK;
}

/* See st/embed.h. Any thread. */
ST_API int st_embed_start(const st_embed_options_t *opts, st_embed_t **out, char *err,
                          size_t errlen) {
  char dummy[1];
  if (!err || !errlen) {
    err = dummy;
    errlen = sizeof dummy;
  }
  err[0] = '\0';
  if (!out) {
    snprintf(err, errlen, "st_embed_start: out is NULL");
    return ST_ERR_INVALID_ARGUMENT;
  }
  *out = NULL;
  st_embed_t *e = calloc(1, sizeof *e);
  if (!e) {
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  int rc = make_dir(e, err, errlen);
  if (rc != ST_OK) {
    free(e);
    return rc;
  }
  char base[sizeof e->dir + 8];
  snprintf(base, sizeof base, "%s/st", e->dir);
  rc = st__embed_config(opts, base, &e->cfg, err, errlen);
  if (rc != ST_OK) {
    rmdir(e->dir);
    free(e);
    return rc;
  }
  snprintf(e->path, sizeof e->path, "%s-%d.sock", base, e->cfg.devices[0]);
  st__log_set_level(e->cfg.log_level);
  /* Its own loop: the host may use libev's default loop, and signals are
   * none of this server's business (EVFLAG_NOSIGMASK: libev leaves the
   * signal mask alone). */
  e->loop = ev_loop_new(EVFLAG_AUTO | EVFLAG_NOSIGMASK);
  if (!e->loop) {
    snprintf(err, errlen, "cannot create an event loop");
    st__config_free(&e->cfg);
    rmdir(e->dir);
    free(e);
    return ST_ERR_INTERNAL;
  }
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  pthread_once(&atexit_once, register_atexit);

  /* The thread starts with every signal blocked; the workers it starts
   * block them too (engine/workers.c). */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int prc = pthread_create(&e->thread, NULL, server_main, e);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (prc != 0) {
    snprintf(err, errlen, "cannot start the server thread: %s", strerror(prc));
    ev_loop_destroy(e->loop);
    st__config_free(&e->cfg);
    rmdir(e->dir);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
    return ST_ERR_INTERNAL;
  }
  pthread_mutex_lock(&e->mu);
  while (!e->started) pthread_cond_wait(&e->cv, &e->mu);
  rc = e->start_rc;
  pthread_mutex_unlock(&e->mu);
  if (rc != ST_OK) {
    snprintf(err, errlen, "%s", e->err[0] ? e->err : st_strerror(rc));
    finish(e);   /* the thread has torn the server down and is ending */
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
    return rc;
  }
  live_add(e);
  *out = e;
  return ST_OK;
}

/* See st/embed.h. Borrowed. */
ST_API const char *st_embed_socket_path(const st_embed_t *e) {
  return e ? e->path : NULL;
}

/* See st/embed.h. Any thread but the server's. */
ST_API int st_embed_stop(st_embed_t *e) {
  if (!e) return ST_OK;
  live_remove(e);
  int rc = stop_server(e);
  pthread_cond_destroy(&e->cv);
  pthread_mutex_destroy(&e->mu);
  free(e);
  return rc;
}
