/* src/client: the socket of one client. Connect with a time limit, send and
 * receive with deadlines (poll), and the FIFO of received descriptors
 * (docs/protocol.md, "File descriptors": descriptors come with or before
 * the first byte of the response that names them, so they are kept in
 * arrival order and each response with `arenas` takes its share).
 *
 * The socket is non-blocking after connect; every wait is a poll bounded by
 * the call's deadline. Writes use MSG_NOSIGNAL: a server that went away is
 * an ST_ERR_IO, never a SIGPIPE.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/client_internal.h"

/* Room for the largest SCM_RIGHTS message Linux sends. */
#define FD_CMSG_SPACE CMSG_SPACE(sizeof(int) * ST_MAX_FDS_PER_MESSAGE)
#define RECV_CHUNK 65536

static const char closed_by_server[] = "connection closed by the server";

/* Is the listening side of connected socket fd the server c expects?
 * SO_PEERCRED on a connected Unix stream socket gives the credentials the
 * kernel recorded when the peer called listen(): the peer cannot forge
 * them. ST_OK, or a recorded ST_ERR_AUTH naming the uid found and the one
 * expected (ST_ERR_IO when the kernel does not say). */
static int check_server_uid(st_client_t *c, int fd, const char *path) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof cred)
    return st__client_fail(c, ST_ERR_IO, "cannot read the credentials of the server at %s: %s",
                           path, strerror(errno));
  uid_t me = geteuid();
  if (c->server_uid >= 0 ? cred.uid == (uid_t)c->server_uid : cred.uid == me || cred.uid == 0)
    return ST_OK;
  if (c->server_uid >= 0)
    return st__client_fail(c, ST_ERR_AUTH,
                           "the server at %s runs as uid %u; this client expects uid %lld "
                           "(server_uid)",
                           path, (unsigned)cred.uid, (long long)c->server_uid);
  return st__client_fail(c, ST_ERR_AUTH,
                         "the server at %s runs as uid %u; this client expects uid %u (its own) "
                         "or root (set server_uid or $" ST_ENV_SERVER_UID
                         " to trust another uid)",
                         path, (unsigned)cred.uid, (unsigned)me);
}

/* Opens `path` and connects, waiting until `deadline` (st__now_mono_ns
 * time; limit_ms is the limit it came from, for messages) for room in a
 * full accept queue, then checks who listens (check_server_uid).
 *
 * The wait is the kernel's: a blocking connect on a Unix socket sleeps
 * while the listener's accept queue is full for at most SO_SNDTIMEO, set
 * to what is left of the deadline (again after a signal). A non-blocking
 * connect would not do: it fails with EAGAIN and leaves the socket
 * unconnected, and poll() reports such a socket writable at once, so
 * there would be nothing to wait on but a timer. The connect never waits
 * for the server to call accept(); the hello reply does (connect.c).
 *
 * ST_OK or a recorded failure: ST_ERR_IO (nothing listens, permission),
 * ST_ERR_TIMEOUT, ST_ERR_AUTH (another uid listens),
 * ST_ERR_INVALID_ARGUMENT (path too long). Thread of the client. */
int st__client_conn_open(st_client_t *c, const char *path, int64_t deadline, int limit_ms) {
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof sa.sun_path)
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT,
                           "socket path '%s' is empty or longer than %zu bytes", path,
                           sizeof sa.sun_path - 1);
  memcpy(sa.sun_path, path, n);
  snprintf(c->path, sizeof c->path, "%s", path);

  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    int e = errno;
    return st__client_fail(c, e == EMFILE || e == ENFILE ? ST_ERR_LIMIT : ST_ERR_IO,
                           "cannot create a socket: %s", strerror(e));
  }
  int rc, e = 0;
  for (;;) {
    int64_t left = deadline - st__now_mono_ns();
    if (left <= 0) {
      e = EAGAIN;
      break;
    }
    left = (left + 999) / 1000; /* microseconds */
    struct timeval tv = {.tv_sec = (time_t)(left / 1000000),
                         .tv_usec = (suseconds_t)(left % 1000000)};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    if (rc == 0 || errno != EINTR) {
      e = rc == 0 ? 0 : errno;
      break;
    }
  }
  if (e != 0) {
    close(fd);
    if (e == ENOENT || e == ECONNREFUSED)
      return st__client_fail(c, ST_ERR_IO, "cannot connect to %s: no server is listening (%s)",
                             path, strerror(e));
    if (e == EAGAIN || e == ETIMEDOUT || e == EINPROGRESS)
      return st__client_fail(c, ST_ERR_TIMEOUT,
                             "cannot connect to %s within %d ms (the connect timeout): the "
                             "server's accept queue stayed full",
                             path, limit_ms);
    if (e == EACCES || e == EPERM)
      return st__client_fail(c, ST_ERR_IO,
                             "cannot connect to %s: no permission to use the socket (%s)", path,
                             strerror(e));
    return st__client_fail(c, ST_ERR_IO, "cannot connect to %s: %s", path, strerror(e));
  }
  rc = check_server_uid(c, fd, path);
  if (rc != ST_OK) {
    close(fd);
    return rc;
  }
  struct timeval zero = {0, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &zero, sizeof zero);
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) {
    int e = errno;
    close(fd);
    return st__client_fail(c, ST_ERR_IO, "cannot configure the socket: %s", strerror(e));
  }
  c->fd = fd;
  return ST_OK;
}

/* Waits for `events` on the socket until the deadline (-1: forever).
 * ST_OK when ready, else a recorded ST_ERR_TIMEOUT / ST_ERR_IO. */
static int wait_for(st_client_t *c, short events, int64_t deadline) {
  for (;;) {
    int ms = -1;
    if (deadline >= 0) {
      int64_t left = deadline - st__now_mono_ns();
      if (left <= 0)
        return st__client_fail(c, ST_ERR_TIMEOUT, "no reply within %d ms", c->timeout_ms);
      ms = (int)((left + 999999) / 1000000);
    }
    struct pollfd p = {.fd = c->fd, .events = events};
    int rc = poll(&p, 1, ms);
    if (rc > 0) return ST_OK; /* errors and hang-ups show up in the I/O call */
    if (rc == 0) continue;    /* re-check the deadline */
    if (errno == EINTR) continue;
    return st__client_fail(c, ST_ERR_IO, "poll failed: %s", strerror(errno));
  }
}

/* Sends all `len` bytes before the deadline. ST_OK or a recorded failure
 * (ST_ERR_IO when the server closed the connection, ST_ERR_TIMEOUT). */
int st__client_conn_send(st_client_t *c, const void *buf, size_t len, const int *fds,
                         size_t nfds, int64_t deadline) {
  const char *p = buf;
  if (nfds > ST_MAX_FDS_PER_MESSAGE)
    return st__client_fail(c, ST_ERR_LIMIT, "%zu descriptors in one request (at most %d)", nfds,
                           ST_MAX_FDS_PER_MESSAGE);
  union {
    char buf[CMSG_SPACE(sizeof(int) * ST_MAX_FDS_PER_MESSAGE)];
    struct cmsghdr align;
  } ctl;
  while (len > 0) {
    ssize_t n;
    if (nfds > 0) {
      /* The descriptors ride on the first byte (docs/protocol.md). */
      struct iovec iov = {.iov_base = (void *)p, .iov_len = len};
      struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                          .msg_controllen = CMSG_SPACE(sizeof(int) * nfds)};
      memset(ctl.buf, 0, sizeof ctl.buf);
      struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
      memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
      n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
      if (n > 0) nfds = 0;
    } else {
      n = send(c->fd, p, len, MSG_NOSIGNAL);
    }
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int rc = wait_for(c, POLLOUT, deadline);
      if (rc != ST_OK) return rc;
      continue;
    }
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET))
      return st__client_fail(c, ST_ERR_IO, "%s", closed_by_server);
    return st__client_fail(c, ST_ERR_IO, "send failed: %s",
                           n < 0 ? strerror(errno) : "no progress");
  }
  return ST_OK;
}

static int fifo_push(st_client_t *c, int fd) {
  if (c->fifo_head > 0 && c->fifo_head + c->fifo_len == c->fifo_cap) {
    memmove(c->fifo, c->fifo + c->fifo_head, c->fifo_len * sizeof(int));
    c->fifo_head = 0;
  }
  if (c->fifo_head + c->fifo_len == c->fifo_cap) {
    size_t cap = c->fifo_cap ? c->fifo_cap * 2 : 16;
    int *p = realloc(c->fifo, cap * sizeof(int));
    if (!p) return -1;
    c->fifo = p;
    c->fifo_cap = cap;
  }
  c->fifo[c->fifo_head + c->fifo_len++] = fd;
  return 0;
}

/* Reads whatever is available into the reader, waiting for something until
 * the deadline. Descriptors that come with the bytes are queued in order.
 * ST_OK or a recorded failure: ST_ERR_IO ("connection closed by the
 * server"), ST_ERR_TIMEOUT, ST_ERR_LIMIT (descriptors were dropped by the
 * kernel: this process ran out), ST_ERR_OUT_OF_MEMORY. */
int st__client_conn_fill(st_client_t *c, int64_t deadline) {
  char *buf;
  size_t cap;
  if (st__reader_reserve(&c->reader, RECV_CHUNK, &buf, &cap) != ST_OK)
    return st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory reading a reply");
  union {
    char buf[FD_CMSG_SPACE];
    struct cmsghdr align;
  } ctl;
  if (c->reply_pending) {
    /* Right after a request the reply is not there yet: wait first rather
     * than spend a recvmsg on EAGAIN. */
    c->reply_pending = 0;
    int rc = wait_for(c, POLLIN, deadline);
    if (rc != ST_OK) return rc;
  }
  for (;;) {
    struct iovec iov = {.iov_base = buf, .iov_len = cap};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                        .msg_controllen = sizeof ctl.buf};
    ssize_t n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int rc = wait_for(c, POLLIN, deadline);
      if (rc != ST_OK) return rc;
      continue;
    }
    if (n < 0) {
      if (errno == ECONNRESET) return st__client_fail(c, ST_ERR_IO, "%s", closed_by_server);
      return st__client_fail(c, ST_ERR_IO, "receive failed: %s", strerror(errno));
    }
    int lost = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
      if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
      size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const unsigned char *data = CMSG_DATA(cm);
      for (size_t i = 0; i < k; i++) {
        int fd;
        memcpy(&fd, data + i * sizeof(int), sizeof fd);
        if (lost || fifo_push(c, fd) != 0) {
          lost = 1;
          close(fd);
        }
      }
    }
    if (lost) return st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory queueing descriptors");
    if (mh.msg_flags & MSG_CTRUNC)
      return st__client_fail(c, ST_ERR_LIMIT,
                             "the kernel dropped descriptors of a reply (is this process out "
                             "of file descriptors?)");
    if (n == 0) return st__client_fail(c, ST_ERR_IO, "%s", closed_by_server);
    st__reader_commit(&c->reader, (size_t)n);
    return ST_OK;
  }
}

/* Closes the socket and the queued descriptors; later calls fail with
 * ST_ERR_IO naming `why`. Idempotent. */
void st__client_conn_shutdown(st_client_t *c, const char *why) {
  if (c->fd >= 0) {
    close(c->fd);
    c->fd = -1;
    snprintf(c->closed_why, sizeof c->closed_why, "%s", why ? why : "closed");
  }
  for (size_t i = 0; i < c->fifo_len; i++) close(c->fifo[c->fifo_head + i]);
  c->fifo_head = c->fifo_len = 0;
}

/* Takes the n oldest queued descriptors into out[] (caller owns them).
 * ST_ERR_PROTOCOL (nothing moved) when fewer than n are queued. */
int st__client_fifo_take(st_client_t *c, int *out, size_t n) {
  if (n > c->fifo_len) return ST_ERR_PROTOCOL;
  memcpy(out, c->fifo + c->fifo_head, n * sizeof(int));
  c->fifo_head += n;
  c->fifo_len -= n;
  if (c->fifo_len == 0) c->fifo_head = 0;
  return ST_OK;
}
