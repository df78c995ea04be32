/* src/server: a takeover (takeover.h). O's side runs on the loop thread
 * (loop 0, the write side of the server lock); N's side on the main
 * thread before its server starts. The handover list and its descriptors
 * belong to O's takeover state until sent, then are closed. */
#include "server/takeover.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fail.h"
#include "common/fdpass.h"
#include "common/log.h"
#include "server/conn.h"
#include "server/restart.h"
#include "server/rpc.h"
#include "server/server.h"
#include "server/work.h"
#include "st/errors.h"

#define HEADER "st-handover 1\n"
#define ANSWER_WAIT_S 60.0
#define TICK_S 0.005
#define FRAME_MAX (ST__TAKEOVER_FDS_PER_FRAME * (ST__FDNAME_MAX + 1) + 64)

enum { DRAINING, SENT };

struct st__takeover {
  st__server_t *srv;
  int ch;                     /* the request's connection (a duplicate)    */
  pid_t pid;                  /* N's                                       */
  int phase;
  int cancelled;              /* the grace period ran out                  */
  double started, deadline;
  ev_timer tick;
  ev_io answer;
  char line[256];
  size_t got;
};

/* Sends all of buf with the descriptors on its first byte; waits for
 * room (the peer reads). 0 or -1 (errno). */
static int send_frame(int fd, const char *buf, size_t len, const int *fds, int nfds) {
  size_t off = 0;
  while (off < len) {
    struct iovec iov = {(void *)(buf + off), len - off};
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    union {
      struct cmsghdr align;
      char b[CMSG_SPACE(sizeof(int) * ST__TAKEOVER_FDS_PER_FRAME)];
    } cm;
    if (st__fdpass_put(&mh, cm.b, sizeof cm.b, fds, off == 0 ? (size_t)nfds : 0) != 0) {
      errno = EMSGSIZE;
      return -1;
    }
    ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      struct pollfd p = {fd, POLLOUT, 0};
      if (poll(&p, 1, 5000) != 1) return -1;
      continue;
    }
    if (n <= 0) return -1;
    off += (size_t)n;
  }
  return 0;
}

/* One frame: length, then text; the caller's descriptors ride on it. */
static int frame(int fd, const char *text, size_t len, const int *fds, int nfds) {
  char *buf = malloc(len + 4);
  if (!buf) return -1;
  uint32_t n32 = (uint32_t)len;
  memcpy(buf, &n32, 4);
  memcpy(buf + 4, text, len);
  int rc = send_frame(fd, buf, len + 4, fds, nfds);
  free(buf);
  return rc;
}

/* Sends the handover list in frames. ST_OK, or IO with err. */
static int send_all(int ch, const st__fdstore_entry_t *list, size_t n, char *err,
                    size_t errlen) {
  char *text = malloc(FRAME_MAX);
  if (!text) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  int fds[ST__TAKEOVER_FDS_PER_FRAME], rc = ST_OK;
  for (size_t at = 0; rc == ST_OK && at < n;) {
    size_t len = (size_t)snprintf(text, FRAME_MAX, HEADER);
    int k = 0;
    for (; at < n && k < ST__TAKEOVER_FDS_PER_FRAME; at++, k++) {
      len += (size_t)snprintf(text + len, FRAME_MAX - len, "%s\n", list[at].name);
      fds[k] = list[at].fd;
    }
    if (frame(ch, text, len, fds, k) != 0)
      rc = st__fail(ST_ERR_IO, err, errlen, "sending descriptors: %s", strerror(errno));
  }
  if (rc == ST_OK) {
    size_t len = (size_t)snprintf(text, FRAME_MAX, "st-handover end %zu\n", n);
    if (frame(ch, text, len, NULL, 0) != 0)
      rc = st__fail(ST_ERR_IO, err, errlen, "sending the end: %s", strerror(errno));
  }
  free(text);
  return rc;
}

/* The takeover did not happen: accept again and serve on. */
static void give_up(struct st__takeover *t, const char *why) {
  st__server_t *srv = t->srv;
  ST_LOG_E("takeover", "the takeover by pid %ld failed: %s; serving on", (long)t->pid, why);
  st__restart_handover_failed(srv);
  st__takeover_free(srv);
  st__listen_pause(srv, 0);
}

/* N said ready: this process leaves it everything and exits 0. */
static void handed_over(struct st__takeover *t) {
  st__server_t *srv = t->srv;
  ST_LOG_I("takeover", "pid %ld serves now: exiting", (long)t->pid);
  st__notify("MAINPID=%ld\nSTATUS=handed over to pid %ld", (long)t->pid, (long)t->pid);
  srv->handed_over = 1;
  st__takeover_free(srv);
  srv->shutting_down = 1;
  srv->stopped = 1;
  ev_break(srv->loop, EVBREAK_ALL);
}

/* N's answer: one line. */
static void on_answer(struct ev_loop *loop, ev_io *w, int revents) {
  (void)loop;
  (void)revents;
  struct st__takeover *t = w->data;
  ssize_t n = read(t->ch, t->line + t->got, sizeof t->line - 1 - t->got);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) {
    give_up(t, "the new server closed the connection before it was ready");
    return;
  }
  t->got += (size_t)n;
  t->line[t->got] = '\0';
  char *nl = strchr(t->line, '\n');
  if (!nl && t->got < sizeof t->line - 1) return;
  if (nl) *nl = '\0';
  if (strncmp(t->line, "ready ", 6) == 0) {
    handed_over(t);
    return;
  }
  char why[300];
  snprintf(why, sizeof why, "the new server says: %.240s", t->line);
  give_up(t, why);
}

/* Whether anything that could change the tables or owes a reply is
 * left. */
static int busy(const st__server_t *srv) {
  return srv->nconns > 0 || (srv->workers && st__workers_outstanding(srv->workers, -1) > 0);
}

static void on_tick(struct ev_loop *loop, ev_timer *w, int revents) {
  (void)revents;
  struct st__takeover *t = w->data;
  st__server_t *srv = t->srv;
  double now = st__now_mono();
  if (t->phase == SENT) {
    if (now > t->deadline) give_up(t, "no answer from the new server within 60 s");
    return;
  }
  if (busy(srv) && now < t->deadline) return;
  if (busy(srv) && !t->cancelled) {
    ST_LOG_W("takeover", "%d connections and their calls still open after %.1f s: cancelling "
             "them", srv->nconns, srv->cfg->shutdown_grace_s);
    t->cancelled = 1;
    if (srv->workers) st__workers_cancel_all(srv->workers);
    st__builds_cancel_waiting(srv);
    st__conn_close_all(srv);
    t->deadline = now + 1.0;
    return;
  }
  /* Nothing changes the tables any more: hand them over. */
  st__fdstore_entry_t *list = NULL;
  size_t n = 0;
  char err[400];
  int rc = st__restart_handover(srv, &list, &n, err, sizeof err);
  if (rc == ST_OK) rc = send_all(t->ch, list, n, err, sizeof err);
  for (size_t i = 0; i < n; i++) close(list[i].fd);
  free(list);
  if (rc != ST_OK) {
    give_up(t, err);
    return;
  }
  ST_LOG_I("takeover", "%zu descriptors handed to pid %ld after %.3f s; waiting for it to "
           "serve", n, (long)t->pid, now - t->started);
  t->phase = SENT;
  t->deadline = now + ANSWER_WAIT_S;
  ev_io_init(&t->answer, on_answer, t->ch, EV_READ);
  t->answer.data = t;
  ev_io_start(loop, &t->answer);
}

/* See takeover.h. Loop thread. */
void st__rpc_takeover(st__rpc_req_t *r) {
  st__conn_t *c = r->c;
  st__server_t *srv = c->srv;
  if (c->cred.uid != 0 && c->cred.uid != geteuid()) {
    ST_LOG_W("takeover", "conn %llu (pid %d, uid %u): takeover refused", (unsigned long long)c->id,
             (int)c->cred.pid, (unsigned)c->cred.uid);
    st__rpc_error(r, ST_ERR_AUTH, "takeover: only the server's uid (%u) and root may take it "
                  "over", (unsigned)geteuid());
    return;
  }
  if (srv->shutting_down) {
    st__rpc_error(r, ST_ERR_SHUTTING_DOWN, "the server is shutting down");
    return;
  }
  if (srv->takeover) {
    st__rpc_error(r, ST_ERR_BUSY, "takeover: pid %ld is taking over already",
                  (long)srv->takeover->pid);
    return;
  }
  struct st__takeover *t = calloc(1, sizeof *t);
  int ch = t ? fcntl(c->fd, F_DUPFD_CLOEXEC, 0) : -1;
  if (ch < 0) {
    free(t);
    st__rpc_error(r, ST_ERR_LIMIT, "takeover: %s", strerror(errno));
    return;
  }
  t->srv = srv;
  t->ch = ch;
  t->pid = c->cred.pid;
  t->started = st__now_mono();
  t->deadline = t->started + srv->cfg->shutdown_grace_s;
  srv->takeover = t;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, r->id);
  msgpack_pack_map(&pk, 1);
  st__pack_kv_int(&pk, "pid", (int64_t)getpid());
  st__reply_send(c, r->id, &sb);
  ST_LOG_I("takeover", "pid %ld takes over: no new connections, %d open ones end after their "
           "replies", (long)t->pid, srv->nconns - 1);
  st__conn_close_after_flush(c, "taking over");
  st__listen_pause(srv, 1);
  for (size_t b = 0; b < srv->nbuckets; b++)
    for (st__conn_t *o = srv->buckets[b]; o; o = o->hnext)
      if (o != c) st__conn_stop_reading(o);
  ev_timer_init(&t->tick, on_tick, TICK_S, TICK_S);
  t->tick.data = t;
  ev_timer_start(srv->loop, &t->tick);
}

/* See takeover.h. Loop thread. */
void st__takeover_free(st__server_t *srv) {
  struct st__takeover *t = srv->takeover;
  if (!t) return;
  ev_timer_stop(srv->loop, &t->tick);
  if (t->phase == SENT) ev_io_stop(srv->loop, &t->answer);
  close(t->ch);
  free(t);
  srv->takeover = NULL;
}

/* ------------------------------------------------------------- N's side */

/* Reads exactly len bytes (the first read also takes descriptors into
 * fds, at most cap; *nfds their count). 0, or -1 (errno; EPROTO: the
 * peer closed). */
static int read_exact(int fd, char *buf, size_t len, int *fds, int cap, int *nfds) {
  size_t off = 0;
  while (off < len) {
    struct iovec iov = {buf + off, len - off};
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    union {
      struct cmsghdr align;
      char b[CMSG_SPACE(sizeof(int) * ST__TAKEOVER_FDS_PER_FRAME)];
    } cm;
    if (fds) {
      mh.msg_control = cm.b;
      mh.msg_controllen = sizeof cm.b;
    }
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 120000) != 1) {
      errno = ETIMEDOUT;
      return -1;
    }
    ssize_t n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EPROTO;
      return -1;
    }
    if (fds) {
      size_t got = (size_t)*nfds;
      st__fdpass_take(&mh, fds, (size_t)cap, &got);
      *nfds = (int)got;
    }
    off += (size_t)n;
  }
  return 0;
}

/* Receives the frames into *out. */
static int receive_all(int ch, st__fdstore_entry_t **out, size_t *n, char *err, size_t errlen) {
  size_t cap = 0;
  char *text = malloc(FRAME_MAX + 1);
  if (!text) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  int rc = ST_OK;
  for (;;) {
    uint32_t len;
    int fds[ST__TAKEOVER_FDS_PER_FRAME], nfds = 0;
    if (read_exact(ch, (char *)&len, 4, fds, ST__TAKEOVER_FDS_PER_FRAME, &nfds) != 0 ||
        len > FRAME_MAX || read_exact(ch, text, len, NULL, 0, NULL) != 0) {
      for (int i = 0; i < nfds; i++) close(fds[i]);
      rc = st__fail(ST_ERR_IO, err, errlen, "receiving what the server hands over: %s",
                    len > FRAME_MAX ? "a frame too long" : strerror(errno));
      break;
    }
    text[len] = '\0';
    size_t count;
    if (sscanf(text, "st-handover end %zu", &count) == 1) {
      for (int i = 0; i < nfds; i++) close(fds[i]);
      if (count != *n)
        rc = st__fail(ST_ERR_IO, err, errlen, "the server handed %zu descriptors, %zu arrived",
                      count, *n);
      break;
    }
    /* Names, one a line, as many as descriptors. */
    char *p = strncmp(text, HEADER, strlen(HEADER)) == 0 ? text + strlen(HEADER) : NULL;
    int k = 0;
    for (char *nl; rc == ST_OK && p && (nl = strchr(p, '\n')) != NULL; p = nl + 1, k++) {
      *nl = '\0';
      if (k >= nfds || nl - p > ST__FDNAME_MAX) {
        rc = st__fail(ST_ERR_IO, err, errlen, "names and descriptors differ in a frame");
        break;
      }
      if (*n == cap) {
        size_t grown_cap = cap ? cap * 2 : 256;
        st__fdstore_entry_t *g = realloc(*out, grown_cap * sizeof *g);
        if (!g) {
          rc = st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
          break;
        }
        *out = g;
        cap = grown_cap;
      }
      snprintf((*out)[*n].name, sizeof (*out)[*n].name, "%s", p);
      (*out)[(*n)++].fd = fds[k];
    }
    if (rc == ST_OK && (!p || k != nfds))
      rc = st__fail(ST_ERR_IO, err, errlen, "a frame is malformed");
    for (int i = k; i < nfds; i++) close(fds[i]);
    if (rc != ST_OK) break;
  }
  free(text);
  if (rc != ST_OK) {
    for (size_t i = 0; i < *n; i++) close((*out)[i].fd);
    free(*out);
    *out = NULL;
    *n = 0;
  }
  return rc;
}

/* See takeover.h. Main thread. */
int st__takeover_request(const char *path, int *channel, st__fdstore_entry_t **out, size_t *n,
                         pid_t *old, char *err, size_t errlen) {
  *channel = -1;
  *out = NULL;
  *n = 0;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof a.sun_path) {
    if (fd >= 0) close(fd);
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "socket path %s is too long", path);
  }
  memcpy(a.sun_path, path, strlen(path) + 1);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    int e = errno;
    if (fd >= 0) close(fd);
    return st__fail(ST_ERR_IO, err, errlen, "no server to take over at %s: %s", path,
                    strerror(e));
  }
  struct ucred cred;
  socklen_t clen = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 ||
      (cred.uid != 0 && cred.uid != geteuid())) {
    close(fd);
    return st__fail(ST_ERR_AUTH, err, errlen, "the server at %s runs as uid %u, not this "
                    "process's %u or root", path, (unsigned)cred.uid, (unsigned)geteuid());
  }
  *old = cred.pid;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  st__pack_request_head(&pk, 1, "takeover");
  msgpack_pack_array(&pk, 0);
  int rc = send_frame(fd, sb.data, sb.size, NULL, 0) == 0
               ? ST_OK
               : st__fail(ST_ERR_IO, err, errlen, "asking %s: %s", path, strerror(errno));
  msgpack_sbuffer_destroy(&sb);
  /* The reply: one msgpack message, read a byte at a time so that nothing
   * of the frames after it is taken. */
  char reply[4096];
  size_t got = 0;
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  while (rc == ST_OK) {
    size_t off = 0;
    if (got && msgpack_unpack_next(&u, reply, got, &off) == MSGPACK_UNPACK_SUCCESS) break;
    if (got == sizeof reply || read_exact(fd, reply + got, 1, NULL, 0, NULL) != 0)
      rc = st__fail(ST_ERR_IO, err, errlen, "the server's answer: %s",
                    got == sizeof reply ? "too long" : strerror(errno));
    got++;
  }
  if (rc == ST_OK) {
    const msgpack_object *m = &u.data;
    if (m->type != MSGPACK_OBJECT_ARRAY || m->via.array.size != 4)
      rc = st__fail(ST_ERR_IO, err, errlen, "the server's answer is no response");
    else if (m->via.array.ptr[2].type != MSGPACK_OBJECT_NIL) {
      const msgpack_object *e = &m->via.array.ptr[2];
      const msgpack_object *msg = e->type == MSGPACK_OBJECT_MAP ? st__map_get(e, "message") : NULL;
      rc = st__fail(ST_ERR_IO, err, errlen, "the server refused: %.*s",
                    msg && msg->type == MSGPACK_OBJECT_STR ? (int)msg->via.str.size : 1,
                    msg && msg->type == MSGPACK_OBJECT_STR ? msg->via.str.ptr : "?");
    }
  }
  msgpack_unpacked_destroy(&u);
  if (rc == ST_OK) rc = receive_all(fd, out, n, err, errlen);
  if (rc != ST_OK) {
    close(fd);
    return rc;
  }
  *channel = fd;
  return ST_OK;
}

/* See takeover.h. Main thread. */
void st__takeover_answer(int channel, int ok, const char *why) {
  char line[300];
  int len = ok ? snprintf(line, sizeof line, "ready %ld\n", (long)getpid())
               : snprintf(line, sizeof line, "failed %.250s\n", why ? why : "?");
  for (char *p = line; p < line + len - 1; p++)
    if (*p == '\n') *p = ' ';
  if (send_frame(channel, line, (size_t)len, NULL, 0) != 0)
    ST_LOG_W("takeover", "telling the old server: %s", strerror(errno));
  close(channel);
}
