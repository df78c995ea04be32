/* src/peer/link.c: a link's bytes (link.h): the non-blocking connect, the
 * TLS handshake, frames out from the queue and in through the reader. */
#include "peer/link.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "st/errors.h"

/* Frames handed upward per pump, so that one busy link never holds the
 * loop for long; the rest wait for the next readiness. */
#define FRAMES_PER_PUMP 256

static void on_io(struct ev_loop *loop, ev_io *w, int revents);

/* See link.h. */
int st__link_new(struct ev_loop *loop, int fd, st__tls_ctx_t *ctx, int outgoing, int connecting,
                 const st__link_hooks_t *hooks, void *owner, st__link_t **out, char *err,
                 size_t errlen) {
  *out = NULL;
  st__link_t *l = calloc(1, sizeof *l);
  if (!l || st__reader_init(&l->rd, ST__PEER_MAX_FRAME) != ST_OK) {
    free(l);
    close(fd);
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  l->tls = st__tls_new(ctx, fd, !outgoing, err, errlen);
  if (!l->tls) {
    st__reader_destroy(&l->rd);
    free(l);
    close(fd);
    return ST_ERR_OUT_OF_MEMORY;
  }
  l->loop = loop;
  l->fd = fd;
  l->outgoing = outgoing;
  l->hooks = hooks;
  l->owner = owner;
  l->stage = connecting ? ST__LINK_CONNECT : ST__LINK_TLS;
  l->opened = st__now_mono();
  l->rtt_us = -1;
  ev_io_init(&l->io, on_io, fd, connecting ? EV_WRITE : EV_READ | EV_WRITE);
  l->io.data = l;
  ev_io_start(loop, &l->io);
  *out = l;
  return ST_OK;
}

/* See link.h. */
int st__link_queue(st__link_t *l, const void *frame, size_t len) {
  if (l->stage == ST__LINK_CLOSED) return ST_ERR_IO;
  if (l->off == l->len) l->off = l->len = 0;
  if (l->len - l->off + len > ST__PEER_MAX_QUEUED) return ST_ERR_LIMIT;
  if (l->len + len > l->cap) {
    if (l->off) {
      memmove(l->out, l->out + l->off, l->len - l->off);
      l->len -= l->off;
      l->off = 0;
    }
    size_t cap = l->cap ? l->cap : 4096;
    while (cap < l->len + len) cap *= 2;
    char *p = realloc(l->out, cap);
    if (!p) return ST_ERR_OUT_OF_MEMORY;
    l->out = p;
    l->cap = cap;
  }
  memcpy(l->out + l->len, frame, len);
  l->len += len;
  return ST_OK;
}

/* See link.h. */
int st__link_has_output(const st__link_t *l) {
  return l->off < l->len || (l->tls && st__tls_pending_out(l->tls));
}

/* Read interest always; write interest while bytes wait. */
static void set_events(st__link_t *l, int want_write) {
  int ev = EV_READ | (want_write || st__link_has_output(l) ? EV_WRITE : 0);
  if ((l->io.events & (EV_READ | EV_WRITE)) == ev) return;
  ev_io_stop(l->loop, &l->io);
  ev_io_set(&l->io, l->fd, ev);
  ev_io_start(l->loop, &l->io);
}

/* The non-blocking connect finished: on to TLS, or closed with why. */
static int finish_connect(st__link_t *l) {
  int soerr = 0;
  socklen_t sl = sizeof soerr;
  if (getsockopt(l->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0) soerr = errno;
  if (soerr == EINPROGRESS || soerr == EALREADY) return 0;
  if (soerr) {
    char why[160];
    snprintf(why, sizeof why, "connect to %s: %s", l->remote, strerror(soerr));
    st__link_close(l, why);
    return 0;
  }
  l->stage = ST__LINK_TLS;
  return 1;
}

/* Sends queued frames: 0 while it may go on, -1 after closing. */
static int write_out(st__link_t *l) {
  char err[512];
  while (l->off < l->len) {
    size_t n = 0;
    int r = st__tls_write(l->tls, l->out + l->off, l->len - l->off, &n, err, sizeof err);
    if (r == ST__TLS_ERROR) {
      st__link_close(l, err);
      return -1;
    }
    if (r != ST__TLS_OK) break;
    l->off += n;
  }
  if (st__tls_flush(l->tls, err, sizeof err) == ST__TLS_ERROR) {
    st__link_close(l, err);
    return -1;
  }
  return 0;
}

/* Reads and hands frames upward: 0 while it may go on, -1 after closing. */
static int read_in(st__link_t *l) {
  char err[512];
  int frames = 0;
  for (;;) {
    st__message_t m;
    memset(&m, 0, sizeof m);
    int r = st__reader_next(&l->rd, &m, err, sizeof err);
    if (r < 0) {
      char why[640];
      snprintf(why, sizeof why, "%s: %s", r == ST_ERR_LIMIT ? "frame too large" : "bad frame",
               err);
      st__message_destroy(&m);
      st__link_close(l, why);
      return -1;
    }
    if (r == 1) {
      l->hooks->on_message(l, &m);
      st__message_destroy(&m);
      if (l->stage == ST__LINK_CLOSED) return -1;
      if (++frames >= FRAMES_PER_PUMP) return 0;
      continue;
    }
    char *buf;
    size_t cap, n = 0;
    if (st__reader_reserve(&l->rd, 64 << 10, &buf, &cap) != ST_OK) {
      st__link_close(l, "out of memory (frame reader)");
      return -1;
    }
    int t = st__tls_read(l->tls, buf, cap, &n, err, sizeof err);
    if (t == ST__TLS_OK) {
      st__reader_commit(&l->rd, n);
      continue;
    }
    if (t == ST__TLS_CLOSED) {
      st__link_close(l, "the peer closed the connection");
      return -1;
    }
    if (t == ST__TLS_ERROR) {
      st__link_close(l, err);
      return -1;
    }
    return 0;   /* WANT_READ / WANT_WRITE */
  }
}

/* See link.h. */
void st__link_pump(st__link_t *l) {
  if (l->stage == ST__LINK_CLOSED) return;
  if (l->stage == ST__LINK_CONNECT && !finish_connect(l)) return;
  if (l->stage == ST__LINK_TLS) {
    char err[512];
    int r = st__tls_handshake(l->tls, err, sizeof err);
    if (r == ST__TLS_ERROR) {
      st__link_close(l, err);
      return;
    }
    if (r != ST__TLS_OK) {
      set_events(l, r == ST__TLS_WANT_WRITE);
      return;
    }
    l->stage = ST__LINK_OPEN;
    l->hooks->on_secure(l);
    if (l->stage == ST__LINK_CLOSED) return;
  }
  for (int round = 0; round < 2; round++) {
    if (write_out(l) < 0) return;
    if (read_in(l) < 0) return;
  }
  if (write_out(l) < 0) return;
  set_events(l, 0);
}

static void on_io(struct ev_loop *loop, ev_io *w, int revents) {
  (void)loop;
  (void)revents;
  st__link_pump(w->data);
}

/* See link.h. */
void st__link_close(st__link_t *l, const char *why) {
  if (l->stage == ST__LINK_CLOSED) return;
  l->stage = ST__LINK_CLOSED;
  ev_io_stop(l->loop, &l->io);
  st__tls_free(l->tls);
  l->tls = NULL;
  close(l->fd);
  l->fd = -1;
  st__reader_destroy(&l->rd);
  free(l->out);
  l->out = NULL;
  l->off = l->len = l->cap = 0;
  l->hooks->on_closed(l, why);
}

/* See link.h. */
void st__link_free(st__link_t *l) {
  if (!l) return;
  st__link_close(l, "closed");
  free(l);
}
