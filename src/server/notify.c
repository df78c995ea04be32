/* src/server: service-manager notifications (sd_notify's protocol, without
 * libsystemd): one datagram "KEY=VALUE\n..." to the AF_UNIX socket named
 * by $NOTIFY_SOCKET (a path, or an abstract name written "@name"), with
 * descriptors riding on it for the fd store (fdstore.c). Without the
 * variable nothing is sent. systemd's Type=notify waits for READY=1;
 * RELOADING=1 ... READY=1 brackets a reload, STOPPING=1 starts the stop,
 * STATUS= is what `systemctl status` shows. Loop thread.
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/fail.h"
#include "common/fdpass.h"
#include "common/log.h"
#include "server/server.h"

/* How long a send waits for room in the manager's queue. */
#define NOTIFY_WAIT_MS 2000

/* See server.h. Loop thread. */
int st__notify_send(const char *msg, size_t len, const int *fds, int nfds, char *err,
                    size_t errlen) {
  const char *path = getenv("NOTIFY_SOCKET");
  if (!path || !path[0])
    return st__fail(ST_ERR_CAPABILITY, err, errlen, "no service manager ($NOTIFY_SOCKET unset)");
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  size_t n = strlen(path);
  if (n >= sizeof a.sun_path || (path[0] != '/' && path[0] != '@'))
    return st__fail(ST_ERR_CONFIGURATION, err, errlen,
                    "NOTIFY_SOCKET '%s' is not a socket path", path);
  memcpy(a.sun_path, path, n);
  if (path[0] == '@') a.sun_path[0] = '\0';   /* abstract namespace */
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return st__fail(ST_ERR_LIMIT, err, errlen, "socket: %s", strerror(errno));
  struct iovec iov = {(void *)msg, len};
  struct msghdr mh;
  memset(&mh, 0, sizeof mh);
  mh.msg_name = &a;
  mh.msg_namelen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * 8)];
  } cm;
  if (nfds < 0 || st__fdpass_put(&mh, cm.buf, sizeof cm.buf, fds, (size_t)nfds) != 0) {
    close(fd);
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "at most 8 descriptors a message");
  }
  /* A full queue (the manager is busy) is waited for, briefly: a state
   * change that is not in the store must not be acknowledged. */
  int rc = ST_OK;
  /* The receiver's queue holds few datagrams (net.unix.max_dgram_qlen),
   * and nothing of ours can poll it: retry every 200 us. */
  for (int waited_us = 0;;) {
    if (sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) >= 0) break;
    if ((errno == EAGAIN || errno == EWOULDBLOCK) && waited_us < NOTIFY_WAIT_MS * 1000) {
      struct timespec ts = {0, 200 * 1000};
      nanosleep(&ts, NULL);
      waited_us += 200;
      continue;
    }
    if (errno == EINTR) continue;
    rc = st__fail(errno == EAGAIN ? ST_ERR_BUSY : ST_ERR_IO, err, errlen,
                  "notify %s: %s", path, strerror(errno));
    break;
  }
  close(fd);
  return rc;
}

void st__notify(const char *fmt, ...) {
  const char *path = getenv("NOTIFY_SOCKET");
  if (!path || !path[0]) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (len < 0) return;
  if ((size_t)len >= sizeof msg) len = (int)sizeof msg - 1;
  char err[600];
  if (st__notify_send(msg, (size_t)len, NULL, 0, err, sizeof err) != ST_OK)
    ST_LOG_W("server", "%s: no notification sent", err);
}
