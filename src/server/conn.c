/* src/server: connections (conn.h). Loop threads, the server lock held
 * (conn.h, "Loops"; loops.c): the read side only where a function says
 * so, and there the connection's own loop's thread, which takes the write
 * side (st__loop_exclusive) before anything that changes shared state. */
#include "server/conn.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "server/loopprof.h"
#include "st/errors.h"

/* Stop reading a client whose replies pile up beyond this many bytes (it
 * pipelines without reading); resume below the low mark. */
#define WQ_HIGH (8u << 20)
#define WQ_LOW  (1u << 20)
#define READ_CHUNK 65536
/* Messages this large are decoded SLICE_BYTES per loop turn ("Large
 * messages" below). */
#define SLICE_AT (1u << 20)
#define SLICE_BYTES (256u << 10)
#define MAX_IOV 64
/* How often a connection whose sent replies still hold descriptors or
 * arenas asks the kernel whether the client has read them. */
/* Replies written but not read yet are polled for (SIOCOUTQ) from
 * UNREAD_POLL_FIRST_S on, each poll twice as late as the one before, up
 * to UNREAD_POLL_S: a client reads its reply within microseconds, and a
 * connection paused by what its replies pin (a 14 GiB arena is past
 * max_queued_bytes_per_connection) resumes that soon, not after 100 ms. */
#define UNREAD_POLL_FIRST_S 1e-4
#define UNREAD_POLL_S 0.1

static void on_read(struct ev_loop *loop, ev_io *w, int revents);
static void on_write(struct ev_loop *loop, ev_io *w, int revents);
static void on_frame_timeout(struct ev_loop *loop, ev_timer *w, int revents);
static void on_resume(struct ev_loop *loop, ev_idle *w, int revents);
static void on_decode_step(struct ev_loop *loop, ev_check *w, int revents);
static void on_decode_idle(struct ev_loop *loop, ev_idle *w, int revents);
static void on_unread_check(struct ev_loop *loop, ev_timer *w, int revents);
static void process_messages(st__conn_t *c);
static void flush(st__conn_t *c);
static void maybe_finish(st__conn_t *c);

/* The libev loop of c's watchers. */
#define EVL(c) ((c)->loop->ev)

/* Leaves c for its loop's thread (conn.h, "Loops"), waking it when it is
 * another one. */
static void todo(st__conn_t *c) {
  if (!c->on_todo) {
    c->on_todo = 1;
    c->tnext = c->loop->todo;
    c->loop->todo = c;
  }
  st__loop_kick(c->loop);
}

/* Writes c's queue now when this thread may (its own loop's thread at a
 * point that holds nothing but c, or the only thread); else later, from
 * its loop (st__conn_service). */
static void flush_soon(st__conn_t *c) {
  if (c->srv->threaded) todo(c);
  else if (!ev_is_active(&c->wio)) flush(c);
}

/* ------------------------------------------------------------- id table */

static size_t bucket_of(const st__server_t *srv, uint64_t id) {
  return (size_t)(id * 0x9e3779b97f4a7c15ull >> 17) & (srv->nbuckets - 1);
}

static void table_insert(st__server_t *srv, st__conn_t *c) {
  size_t b = bucket_of(srv, c->id);
  c->hnext = srv->buckets[b];
  srv->buckets[b] = c;
  c->onext = NULL;
  c->oprev = srv->conns_tail;
  if (srv->conns_tail) srv->conns_tail->onext = c;
  else srv->conns = c;
  srv->conns_tail = c;
  srv->nconns++;
}

static void table_remove(st__server_t *srv, st__conn_t *c) {
  st__conn_t **pp = &srv->buckets[bucket_of(srv, c->id)];
  while (*pp && *pp != c) pp = &(*pp)->hnext;
  if (*pp) {
    *pp = c->hnext;
    if (c->oprev) c->oprev->onext = c->onext;
    else srv->conns = c->onext;
    if (c->onext) c->onext->oprev = c->oprev;
    else srv->conns_tail = c->oprev;
    srv->nconns--;
  }
  c->hnext = c->onext = c->oprev = NULL;
}

/* Connection by id or NULL (borrowed); see conn.h. Loop thread. */
st__conn_t *st__conn_find(st__server_t *srv, uint64_t id) {
  for (st__conn_t *c = srv->buckets[bucket_of(srv, id)]; c; c = c->hnext)
    if (c->id == id) return c;
  return NULL;
}

/* ------------------------------------------------------------- holdings */

/* Whether c's replies hold as much as its limits allow: then it is not
 * read until the client reads them. */
static int replies_at_limit(const st__conn_t *c) {
  const st__config_t *cfg = c->srv->cfg;
  return c->wq_bytes > WQ_HIGH || c->out_fds >= cfg->max_fds_per_connection ||
         c->out_bytes >= cfg->max_queued_bytes_per_connection;
}

/* Reading resumes once the replies are below every mark: first the
 * messages buffered while paused (from an idle watcher, so that nothing
 * recurses), then reads. */
static void maybe_resume(st__conn_t *c) {
  if (c->dead || !c->read_paused || c->wq_bytes >= WQ_LOW || replies_at_limit(c)) return;
  c->read_paused = 0;
  if (!c->eof && !c->slicing) ev_io_start(EVL(c), &c->rio);
  ev_idle_start(EVL(c), &c->resume);
}

static void on_unread_check(struct ev_loop *loop, ev_timer *w, int revents) {
  (void)loop;
  (void)revents;
  st__conn_t *c = w->data;
  st__loop_exclusive(c->srv);
  /* Another loop's thread may have seen them read (st__conn_reply_room)
   * and left the timer to this one. */
  if (st__conn_unread_check(c) || (!c->dead && !c->unread_fds && !c->unread_bytes)) {
    ev_timer_stop(loop, &c->unread_check);
    maybe_resume(c);
    maybe_finish(c);
  } else if (w->repeat < UNREAD_POLL_S) {
    w->repeat = w->repeat * 2 < UNREAD_POLL_S ? w->repeat * 2 : UNREAD_POLL_S;
    ev_timer_again(loop, w);
  }
}

/* ------------------------------------------------------------- open/close */

/* Adopts an admitted socket (fd owned) and starts reading. Loop thread. */
void st__conn_open(st__server_t *srv, int fd, int device, const struct ucred *cred) {
  st__conn_t *c = calloc(1, sizeof *c);
  if (c && st__reader_init(&c->reader, srv->cfg->max_message_bytes) == ST_OK)
    st__reader_set_slicing(&c->reader, SLICE_AT);
  else {
    free(c);
    ST_LOG_E("conn", "out of memory accepting a connection");
    close(fd);
    return;
  }
  c->srv = srv;
  c->loop = st__loops_pick(srv);
  c->id = ++srv->next_conn_id;
  c->fd = fd;
  c->device = device;
  c->cred = *cred;
  c->opened_at = st__now_mono();
  ev_io_init(&c->rio, on_read, fd, EV_READ);
  ev_io_init(&c->wio, on_write, fd, EV_WRITE);
  double t = srv->cfg->frame_timeout_ms / 1000.0;
  ev_timer_init(&c->frame_timer, on_frame_timeout, t, t);
  ev_idle_init(&c->resume, on_resume);
  ev_check_init(&c->decode_step, on_decode_step);
  ev_idle_init(&c->decode_idle, on_decode_idle);
  c->decode_step.data = c->decode_idle.data = c;
  ev_timer_init(&c->unread_check, on_unread_check, UNREAD_POLL_S, UNREAD_POLL_S);
  c->rio.data = c->wio.data = c->frame_timer.data = c->resume.data = c;
  c->unread_check.data = c;
  table_insert(srv, c);
  srv->counters.connections++;
  if (st__loop_is_current(c->loop)) {
    c->armed = 1;
    ev_io_start(EVL(c), &c->rio);
  } else {
    todo(c);
  }
  ST_LOG_D("conn", "conn %llu accepted on device %d: pid %d uid %u gid %u",
           (unsigned long long)c->id, device, (int)cred->pid, (unsigned)cred->uid,
           (unsigned)cred->gid);
}

static void free_frame(st__wframe_t *f) {
  for (int i = 0; i < f->nfds; i++) close(f->fds[i]);
  free(f->data);
  free(f);
}

/* What only c's loop's thread may do at its close: stop the watchers,
 * close the socket, free the queued frames and the reader (another
 * thread's close leaves this to it: c's own thread may be in a recvmsg or
 * sendmsg on them). The struct is freed before that loop's next poll. */
static void close_io(st__conn_t *c) {
  if (c->io_closed) return;
  c->io_closed = 1;
  struct ev_loop *loop = EVL(c);
  ev_io_stop(loop, &c->rio);
  ev_io_stop(loop, &c->wio);
  ev_timer_stop(loop, &c->frame_timer);
  ev_idle_stop(loop, &c->resume);
  ev_check_stop(loop, &c->decode_step);
  ev_idle_stop(loop, &c->decode_idle);
  ev_timer_stop(loop, &c->unread_check);
  close(c->fd);
  c->fd = -1;
  st__wframe_t *f = c->wq_head;
  while (f) {
    st__wframe_t *next = f->next;
    free_frame(f);
    f = next;
  }
  c->wq_head = c->wq_tail = NULL;
  c->wq_bytes = 0;
  st__reader_destroy(&c->reader);
  c->dnext = c->loop->dead;
  c->loop->dead = c;
}

/* Closes at once; the struct is freed by its loop before its next poll.
 * Any loop thread. */
static void conn_close(st__conn_t *c, const char *why) {
  if (c->dead) return;
  st__server_t *srv = c->srv;
  c->dead = 1;
  table_remove(srv, c);
  if (st__loop_is_current(c->loop)) close_io(c);
  else todo(c);
  ST_LOG_D("conn", "conn %llu closed (%s) after %llu requests, %d waiting, %llu leases",
           (unsigned long long)c->id, why ? why : "closed", (unsigned long long)c->requests,
           c->inflight, (unsigned long long)c->leases);
  /* Everything it holds goes back, kind by kind (holdings.h): its unread
   * replies and unclaimed descriptors stop counting, builds nobody else
   * waits for stop early (their completions drop what was built), its
   * waits end, its seats, handles, live keys and leases go back. */
  srv->on_conn_closed(srv, c);
  st__stats_dropped(srv, &c->open);
}

static void reap(st__loop_t *lp) {
  st__conn_t *c = lp->dead;
  lp->dead = NULL;
  while (c) {
    st__conn_t *next = c->dnext;
    free(c);
    c = next;
  }
}

/* Frees the closed connections of every loop. Loop thread, at exit (the
 * other loops' threads have stopped). */
void st__conn_reap(st__server_t *srv) {
  for (int i = 0; i < srv->nloops; i++) {
    st__loop_t *lp = &srv->loops[i];
    /* A close another thread left to a loop that stopped first. */
    for (st__conn_t *c = lp->todo; c; c = c->tnext)
      if (c->dead) close_io(c);
    lp->todo = NULL;
    reap(lp);
  }
}

/* What another thread (or this one, inside a callback) left for c: start
 * reading it, stop reading it when it closes, write its queue, close its
 * socket. Its loop's thread. */
static void service(st__conn_t *c) {
  if (c->dead) {
    close_io(c);
    return;
  }
  if (!c->armed) {
    c->armed = 1;
    if (!c->closing && !c->slicing) ev_io_start(EVL(c), &c->rio);
  }
  if (c->end_input) {
    c->end_input = 0;
    st__conn_stop_reading(c);
    if (c->dead) return;
  }
  if (c->closing) {
    ev_io_stop(EVL(c), &c->rio);
    ev_timer_stop(EVL(c), &c->frame_timer);
    if (!c->wq_head) {
      conn_close(c, "closed after error");
      return;
    }
  }
  if (c->wq_head && !ev_is_active(&c->wio)) flush(c);
}

/* See conn.h. lp's thread, before its poll. */
void st__conn_service(st__loop_t *lp) {
  /* A write lets go of the lock: other threads may add to the list
   * meanwhile, and are served in this same pass. */
  while (lp->todo) {
    st__conn_t *c = lp->todo;
    lp->todo = c->tnext;
    c->tnext = NULL;
    c->on_todo = 0;
    service(c);
  }
  reap(lp);
}

/* Stops reading; closes once the write queue is empty. Loop thread. */
void st__conn_close_after_flush(st__conn_t *c, const char *why) {
  if (c->dead) return;
  if (!c->closing) ST_LOG_D("conn", "conn %llu closing: %s", (unsigned long long)c->id, why);
  c->closing = 1;
  st__conn_rx_close_all(c);
  if (!c->wq_head) {
    conn_close(c, why);
  } else if (st__loop_is_current(c->loop)) {
    ev_io_stop(EVL(c), &c->rio);
    ev_timer_stop(EVL(c), &c->frame_timer);
  } else {
    todo(c);
  }
}

/* Shutdown: one last flush of each connection, then close. Loop thread. */
void st__conn_close_all(st__server_t *srv) {
  for (size_t b = 0; b < srv->nbuckets; b++) {
    while (srv->buckets[b]) {
      st__conn_t *c = srv->buckets[b];
      if (c->wq_head) flush(c);
      if (!c->dead) conn_close(c, "server stopping");
    }
  }
}

/* Closes a connection whose peer finished sending once nothing remains to
 * be sent or computed for it, and the replies that hold descriptors or
 * arenas were read (or the peer closed: its socket's queue is gone). */
static int finished(const st__conn_t *c) {
  return !c->dead && c->eof && c->inflight == 0 && !c->wq_head && !c->unread_fds &&
         !c->unread_bytes;
}

/* Closes c at the end of its input once everything is answered and read.
 * Either side of the lock. */
static void maybe_finish(st__conn_t *c) {
  if (!finished(c)) return;
  if (st__loop_exclusive(c->srv) && !finished(c)) return;
  conn_close(c, "end of input");
}

/* Takes the write side of the server lock when this thread holds the read
 * side; 1 when c closed meanwhile (nothing more may be done with it). */
static int exclusive_gone(st__conn_t *c) {
  return st__loop_exclusive(c->srv) && (c->dead || c->closing);
}

/* Counts n bytes read or written: in this loop's counts under the read
 * side (loops.c), else in the server's. */
static void count_bytes(st__server_t *srv, int sent, uint64_t n) {
  st__loop_counts_t *k = st__loop_counts();
  if (k) {
    k->dirty = 1;
    if (sent) k->bytes_sent += n;
    else k->bytes_received += n;
  } else if (sent) {
    srv->counters.bytes_sent += n;
  } else {
    srv->counters.bytes_received += n;
  }
}

/* One in-flight request was answered; see conn.h. Loop thread. */
void st__conn_request_done(st__conn_t *c) {
  if (c->inflight > 0) c->inflight--;
  maybe_finish(c);
}

/* ------------------------------------------------------------- reading */

static void update_frame_timer(st__conn_t *c, int completed) {
  if (c->dead || c->closing || c->read_paused || c->eof) {
    if (!c->io_closed) ev_timer_stop(EVL(c), &c->frame_timer);
    return;
  }
  if (st__reader_pending(&c->reader) == 0) {
    ev_timer_stop(EVL(c), &c->frame_timer);
  } else if (completed || !ev_is_active(&c->frame_timer)) {
    ev_timer_again(EVL(c), &c->frame_timer);
  }
}

/* Closes the descriptors a read brought (its connection takes no more). */
static void close_received(struct msghdr *mh) {
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(cm) + i * sizeof fd, sizeof fd);
      close(fd);
    }
  }
}

/* No request can come any more on c (its client finished sending, or
 * the server stops reading it): what it sent for one is closed, a
 * half-sent frame's buffer freed; replies still go out, and c closes
 * once they are out and read. c's loop thread, the write side. */
static void input_ended(st__conn_t *c) {
  c->eof = 1;
  ev_io_stop(EVL(c), &c->rio);
  update_frame_timer(c, 0);
  st__conn_rx_close_all(c);
  if (st__reader_pending(&c->reader) > 0) {
    ST_LOG_D("conn", "conn %llu: input ended inside a frame", (unsigned long long)c->id);
    st__reader_destroy(&c->reader);
    if (st__reader_init(&c->reader, c->srv->cfg->max_message_bytes) != ST_OK) {
      conn_close(c, "out of memory");
      return;
    }
    st__reader_set_slicing(&c->reader, SLICE_AT);
  }
  maybe_finish(c);
}

/* See conn.h. Loop thread, the write side. */
void st__conn_stop_reading(st__conn_t *c) {
  if (c->dead || c->closing || c->eof) return;
  if (!st__loop_is_current(c->loop)) {
    c->end_input = 1;   /* its loop's thread does it (service) */
    todo(c);
    return;
  }
  /* Whole requests already read are answered first, as at the end of a
   * client's input. */
  if (!c->read_paused && st__reader_buffered(&c->reader) > st__reader_pending(&c->reader))
    process_messages(c);
  /* A large one being decoded a slice per turn is finished here. */
  while (c->slicing && !c->dead && !c->closing && !c->read_paused) process_messages(c);
  if (!c->dead && !c->closing && !c->eof) input_ended(c);
}

/* Reads c and handles what came. Under the read side of the lock on loops
 * 1..N-1 (loops.c), taking the write side at the first thing that needs
 * it: descriptors, the end of input, an error, a message that is not a
 * cache hit fastcall.c answers. */
static void on_read(struct ev_loop *loop, ev_io *w, int revents) {
  st__conn_t *c = w->data;
  (void)loop;
  (void)revents;
  if ((c->unread_fds || c->unread_bytes) && exclusive_gone(c)) return;
  if (st__conn_unread_check(c)) maybe_resume(c);
  /* Whole messages still buffered from a pause go first (reads resume
   * before the idle watcher runs): the end of input below then always
   * finds at most a half-sent frame buffered. */
  if (st__reader_buffered(&c->reader) > st__reader_pending(&c->reader)) process_messages(c);
  for (int round = 0; round < 4; round++) {
    if (c->dead || c->closing || c->read_paused || c->eof) return;
    char *buf;
    size_t cap;
    if (st__reader_reserve(&c->reader, READ_CHUNK, &buf, &cap) != ST_OK) {
      if (exclusive_gone(c)) return;
      conn_close(c, "out of memory");
      return;
    }
    union {
      char buf[CMSG_SPACE(sizeof(int) * ST_MAX_FDS_PER_MESSAGE)];
      struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = buf, .iov_len = cap};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                        .msg_controllen = sizeof ctl.buf};
    st__loop_unlock(c->srv);
    st__prof_begin(ST_PROF_READ);
    ssize_t n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    int e = errno;
    st__prof_end();
    st__loop_lock(c->srv);
    if (c->dead || c->closing) {
      /* Closed by another loop's thread meanwhile: nothing more is read. */
      if (n > 0) close_received(&mh);
      return;
    }
    /* A failed read leaves msg_controllen as we set it and the buffer as an
     * earlier read left it: no control data may be looked at before this. */
    if (n < 0) {
      if (e == EINTR) continue;
      if (e == EAGAIN || e == EWOULDBLOCK) return;
      if (exclusive_gone(c)) return;
      char why[128];
      snprintf(why, sizeof why, "read: %s", strerror(e));
      conn_close(c, why);
      return;
    }
    int control = mh.msg_controllen > 0 || (mh.msg_flags & MSG_CTRUNC);
    if ((control || n == 0) && exclusive_gone(c)) {
      if (n > 0) close_received(&mh);
      return;
    }
    if (control && st__conn_rx_queue(c, &mh, c->rx_bytes, c->rx_bytes + (uint64_t)n) != 0) {
      c->srv->counters.protocol_errors++;
      ST_LOG_W("conn", "conn %llu (pid %d): more descriptors than its requests list; closing",
               (unsigned long long)c->id, (int)c->cred.pid);
      st__conn_send_fault(c, 0, ST_ERR_PROTOCOL,
                          "more descriptors arrived than the requests list in params.arenas");
      st__conn_close_after_flush(c, "protocol error");
      return;
    }
    if (n == 0) {
      /* The peer closed (POLLHUP: both directions are shut) or only
       * finished sending (shutdown(SHUT_WR)): then it still reads the
       * replies of what it sent, and we close once they are out. */
      struct pollfd p = {.fd = c->fd, .events = POLLOUT};
      if (poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR))) {
        conn_close(c, "closed by the client");
        return;
      }
      input_ended(c);
      return;
    }
    st__reader_commit(&c->reader, (size_t)n);
    c->rx_bytes += (uint64_t)n;
    count_bytes(c->srv, 0, (uint64_t)n);
    process_messages(c);
    if ((size_t)n < cap) return;
  }
}

/* ------------------------------------------------------ large messages
 *
 * A message of SLICE_AT bytes or more is decoded SLICE_BYTES per loop
 * turn (st__reader_next_sliced), so that one large request never holds
 * the loop for more than decoding a slice takes (about 0.1 ms) and every
 * other connection of the loop is served between two slices. Meanwhile
 * the connection reads nothing (its next messages wait in the socket),
 * a check watcher takes the next slice after each poll, and an idle
 * watcher keeps the poll from sleeping. */

/* A slice is done and more are due: the watchers run (again). */
static void slicing_go(st__conn_t *c) {
  if (!c->slicing) {
    c->slicing = 1;
    c->srv->counters.sliced_decodes++;
    ev_io_stop(EVL(c), &c->rio);
  }
  ev_check_start(EVL(c), &c->decode_step);
  ev_idle_start(EVL(c), &c->decode_idle);
}

/* Paused (replies unread): the slices wait for on_resume. */
static void slicing_park(st__conn_t *c) {
  ev_check_stop(EVL(c), &c->decode_step);
  ev_idle_stop(EVL(c), &c->decode_idle);
}

/* The message is whole (or failed): reading resumes. */
static void slicing_done(st__conn_t *c) {
  if (!c->slicing) return;
  c->slicing = 0;
  slicing_park(c);
  if (c->armed && !c->dead && !c->closing && !c->eof && !c->read_paused)
    ev_io_start(EVL(c), &c->rio);
}

static void on_decode_step(struct ev_loop *loop, ev_check *w, int revents) {
  st__conn_t *c = w->data;
  (void)loop;
  (void)revents;
  st__loop_exclusive(c->srv);
  if (!c->dead && c->slicing) process_messages(c);
}

static void on_decode_idle(struct ev_loop *loop, ev_idle *w, int revents) {
  (void)loop;
  (void)w;
  (void)revents;
}

static void process_messages(st__conn_t *c) {
  st__server_t *srv = c->srv;
  int completed = 0;
  while (!c->dead && !c->closing) {
    if (replies_at_limit(c)) {
      /* Backpressure: keep the rest buffered until the client reads. */
      if (exclusive_gone(c)) break;
      if (c->slicing) slicing_park(c);
      if (!c->read_paused) {
        c->read_paused = 1;
        srv->counters.read_pauses++;
        ev_io_stop(EVL(c), &c->rio);
        ST_LOG_D("conn",
                 "conn %llu: replies unread (%zu bytes queued, %d descriptors, %llu arena "
                 "bytes): pausing reads",
                 (unsigned long long)c->id, c->wq_bytes, c->out_fds,
                 (unsigned long long)c->out_bytes);
      }
      break;
    }
    st__message_t msg;
    memset(&msg, 0, sizeof msg);
    char why[256] = "";
    st__prof_begin(ST_PROF_DECODE);
    int r = st__reader_next_sliced(&c->reader, &msg, SLICE_BYTES, why, sizeof why);
    st__prof_end();
    if (r == 2) {
      slicing_go(c);
      break;
    }
    slicing_done(c);
    if (r == 0) break;
    if (r < 0) {
      uint32_t id = r == ST_ERR_PROTOCOL ? msg.id : 0;
      st__message_destroy(&msg);
      if (exclusive_gone(c)) break;
      srv->counters.protocol_errors++;
      ST_LOG_W("conn", "conn %llu (pid %d): %s: %s; closing", (unsigned long long)c->id,
               (int)c->cred.pid, st_err_name(r), why[0] ? why : st_strerror(r));
      st__conn_send_fault(c, id, r, why[0] ? why : st_strerror(r));
      st__conn_close_after_flush(c, st_err_name(r));
      break;
    }
    completed = 1;
    c->requests++;
    st__prof_message();
    st__prof_begin(ST_PROF_DISPATCH);
    /* A cache hit answered with its short form needs no write side
     * (fastcall.c); anything else does. */
    int fast = srv->on_fast_message(c, &msg);
    if (!fast && exclusive_gone(c)) {
      st__prof_end();
      st__message_destroy(&msg);
      break;
    }
    if (!fast) srv->on_message(c, &msg);
    st__prof_end();
    st__message_destroy(&msg);
    /* Right after a message, this is where it ended (proto.h). */
    if (!c->dead && c->rx_nfds && !exclusive_gone(c))
      st__conn_rx_drop_stray(c, c->rx_bytes - st__reader_buffered(&c->reader), 0);
    /* With several loops the dispatch only queued its replies (a write
     * lets go of the lock), and a fast answer always: they go out here,
     * before the next message, as they do from inside the dispatch with
     * one. */
    if ((srv->threaded || fast) && !c->dead && c->wq_head && !ev_is_active(&c->wio)) flush(c);
  }
  /* Every whole message was handled unless reads are paused or a large
   * one is being decoded: what is left is at most a half-sent frame,
   * which began here. */
  if (!c->dead && !c->closing && !c->read_paused && !c->slicing && c->rx_nfds &&
      !exclusive_gone(c))
    st__conn_rx_drop_stray(c, c->rx_bytes - st__reader_pending(&c->reader), 1);
  update_frame_timer(c, completed);
}

static void on_frame_timeout(struct ev_loop *loop, ev_timer *w, int revents) {
  st__conn_t *c = w->data;
  (void)loop;
  (void)revents;
  st__loop_exclusive(c->srv);
  ev_timer_stop(EVL(c), &c->frame_timer);
  if (c->dead || c->closing) return;
  char msg[128];
  snprintf(msg, sizeof msg, "frame incomplete after %d ms (%zu bytes received)",
           c->srv->cfg->frame_timeout_ms, st__reader_pending(&c->reader));
  c->srv->counters.timeouts++;
  ST_LOG_W("conn", "conn %llu (pid %d): %s; closing", (unsigned long long)c->id,
           (int)c->cred.pid, msg);
  st__conn_send_fault(c, 0, ST_ERR_TIMEOUT, msg);
  st__conn_close_after_flush(c, "frame timeout");
}

/* ------------------------------------------------------------- writing */

/* Queues a frame (takes the bytes of sb and the fds) and writes what
 * the socket takes now; see conn.h. Loop thread. */
void st__conn_send(st__conn_t *c, msgpack_sbuffer *sb, const int *fds, int nfds) {
  st__conn_send_pinned(c, sb, fds, nfds, 0);
}

/* st__conn_send, counting the descriptors and `pinned` bytes until the
 * client has read them; see conn.h. Loop thread. */
void st__conn_send_pinned(st__conn_t *c, msgpack_sbuffer *sb, const int *fds, int nfds,
                          uint64_t pinned) {
  if (nfds < 0) nfds = 0;
  if (c->dead) {
    for (int i = 0; i < nfds; i++) close(fds[i]);
    msgpack_sbuffer_destroy(sb);
    msgpack_sbuffer_init(sb);
    return;
  }
  st__wframe_t *f = malloc(sizeof *f + (size_t)nfds * sizeof(int));
  if (!f) {
    for (int i = 0; i < nfds; i++) close(fds[i]);
    msgpack_sbuffer_destroy(sb);
    msgpack_sbuffer_init(sb);
    conn_close(c, "out of memory");
    return;
  }
  f->next = NULL;
  f->len = sb->size;
  f->off = 0;
  f->data = msgpack_sbuffer_release(sb);
  f->nfds = f->held_fds = nfds;
  f->pinned = pinned;
  st__conn_hold(c, nfds, pinned);
  if (nfds) memcpy(f->fds, fds, (size_t)nfds * sizeof(int));
  if (c->wq_tail) c->wq_tail->next = f;
  else c->wq_head = f;
  c->wq_tail = f;
  c->wq_bytes += f->len;
  /* Write at once unless the socket already pushed back (then the write
   * watcher is active and will continue in order); with several loops, at
   * the next point where c's loop thread may (flush_soon). */
  flush_soon(c);
}

/* See conn.h. Either side of the lock (the read side: c's own loop's
 * thread). */
int st__conn_queue(st__conn_t *c, msgpack_sbuffer *sb) {
  st__wframe_t *f = malloc(sizeof *f);
  if (!f) return ST_ERR_OUT_OF_MEMORY;
  f->next = NULL;
  f->len = sb->size;
  f->off = 0;
  f->data = msgpack_sbuffer_release(sb);
  f->nfds = f->held_fds = 0;
  f->pinned = 0;
  if (c->wq_tail) c->wq_tail->next = f;
  else c->wq_head = f;
  c->wq_tail = f;
  c->wq_bytes += f->len;
  return ST_OK;
}

/* Queues [1, id, {code, name, message}, nil]; see conn.h. Loop thread. */
void st__conn_send_fault(st__conn_t *c, uint32_t id, int err, const char *message) {
  if (c->dead) return;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  st__pack_error_response(&pk, id, err, message);
  st__conn_send(c, &sb, NULL, 0);
  msgpack_sbuffer_destroy(&sb);
}

/* The error reply of request `id`; see conn.h. Loop thread. */
void st__conn_send_error(st__conn_t *c, uint32_t id, int err, const char *message) {
  if (c->dead) return;
  st__stats_answered(c->srv, &c->open, id, err);
  st__conn_send_fault(c, id, err, message);
}

/* Writes as much of the queue as the socket takes. Frames without
 * descriptors are gathered into one sendmsg; a frame with descriptors
 * always starts a sendmsg of its own so that they ride on its first byte. */
/* Whether writing c's queue needs the write side of the lock: a frame
 * with descriptors or pinned bytes (counted in shared holdings), replies
 * already written but not read, a close to do. */
static int flush_needs_exclusive(const st__conn_t *c) {
  if (c->closing || c->unread_fds || c->unread_bytes) return 1;
  for (const st__wframe_t *f = c->wq_head; f; f = f->next)
    if (f->nfds || f->held_fds || f->pinned) return 1;
  return 0;
}

/* Either side of the lock (the read side: c's own loop's thread), taking
 * the write side when flush_needs_exclusive. */
static void flush(st__conn_t *c) {
  st__server_t *srv = c->srv;
  while (c->wq_head && !c->dead) {
    if (st__loop_counts() && flush_needs_exclusive(c) && st__loop_exclusive(srv)) continue;
    struct iovec iov[MAX_IOV];
    int niov = 0;
    st__wframe_t *head = c->wq_head;
    union {
      char buf[CMSG_SPACE(sizeof(int) * ST_MAX_FDS_PER_MESSAGE)];
      struct cmsghdr align;
    } ctl;
    struct msghdr mh = {.msg_iov = iov};
    int with_fds = head->off == 0 && head->nfds > 0;
    if (with_fds) {
      mh.msg_control = ctl.buf;
      mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)head->nfds);
      struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)head->nfds);
      memcpy(CMSG_DATA(cm), head->fds, sizeof(int) * (size_t)head->nfds);
    }
    iov[niov].iov_base = head->data + head->off;
    iov[niov].iov_len = head->len - head->off;
    niov++;
    for (st__wframe_t *f = head->next; f && niov < MAX_IOV && f->nfds == 0; f = f->next) {
      iov[niov].iov_base = f->data;
      iov[niov].iov_len = f->len;
      niov++;
    }
    mh.msg_iovlen = (size_t)niov;
    /* Counted before the send, what it did not take taken back after: a
     * client that has read a reply finds it counted, even when another
     * loop's thread answers its next request before this one has the
     * lock again. */
    size_t offered = 0;
    for (int i = 0; i < niov; i++) offered += iov[i].iov_len;
    count_bytes(srv, 1, offered);
    if (with_fds) srv->counters.fds_sent += (uint64_t)head->nfds;
    st__loop_unlock(srv);
    st__prof_begin(ST_PROF_SEND);
    ssize_t n = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    int e = errno;
    st__prof_end();
    st__loop_lock(srv);
    /* Taken back where it was counted (the same side is held again). */
    count_bytes(srv, 1, -(uint64_t)(offered - (n > 0 ? (size_t)n : 0)));
    if (with_fds && n < 0) srv->counters.fds_sent -= (uint64_t)head->nfds;
    /* Closed by another loop's thread meanwhile: its frames (and what
     * this sendmsg took of them) go with close_io. */
    if (c->dead) return;
    if (n < 0) {
      if (e == EINTR) continue;
      if (e == EAGAIN || e == EWOULDBLOCK) {
        ev_io_start(EVL(c), &c->wio);
        return;
      }
      if (exclusive_gone(c) && c->dead) return;
      char why[128];
      snprintf(why, sizeof why, "write: %s", strerror(e));
      conn_close(c, why);
      return;
    }
    if (with_fds) {
      /* The kernel took its own references with the first byte. */
      st__prof_begin(ST_PROF_CLOSE);
      for (int i = 0; i < head->nfds; i++) close(head->fds[i]);
      st__prof_end();
      head->nfds = 0;
    }
    size_t left = (size_t)n;
    while (left > 0 && c->wq_head) {
      st__wframe_t *f = c->wq_head;
      size_t rest = f->len - f->off;
      if (left < rest) {
        f->off += left;
        c->wq_bytes -= left;
        left = 0;
        break;
      }
      left -= rest;
      c->wq_bytes -= rest;
      c->wq_head = f->next;
      if (!c->wq_head) c->wq_tail = NULL;
      if (f->held_fds || f->pinned) {
        /* In the client's socket now: counted until it has read it. */
        c->unread_fds += f->held_fds;
        c->unread_bytes += f->pinned;
        if (!ev_is_active(&c->unread_check)) {
          c->unread_check.repeat = UNREAD_POLL_FIRST_S;
          ev_timer_again(EVL(c), &c->unread_check);
        }
      }
      free_frame(f);
    }
  }
  if (c->dead) return;
  ev_io_stop(EVL(c), &c->wio);
  if (st__loop_counts() && flush_needs_exclusive(c) && st__loop_exclusive(srv) && c->dead) return;
  if (c->closing) {
    conn_close(c, "closed after error");
    return;
  }
  st__conn_unread_check(c);
  maybe_resume(c);
  maybe_finish(c);
}

static void on_resume(struct ev_loop *loop, ev_idle *w, int revents) {
  st__conn_t *c = w->data;
  (void)revents;
  st__loop_exclusive(c->srv);
  ev_idle_stop(loop, &c->resume);
  if (!c->dead && !c->read_paused) process_messages(c);
}

static void on_write(struct ev_loop *loop, ev_io *w, int revents) {
  st__conn_t *c = w->data;
  (void)loop;
  (void)revents;
  st__loop_exclusive(c->srv);
  ev_io_stop(EVL(c), &c->wio);
  flush(c);
}
