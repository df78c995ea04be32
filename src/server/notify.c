/* src/server: service-manager notifications (sd_notify's protocol, without
 * libsystemd): one datagram "KEY=VALUE\n..." to the AF_UNIX socket named
 * by $NOTIFY_SOCKET (a path, or an abstract name written "@name"). Without
 * the variable nothing is sent. systemd's Type=notify waits for READY=1;
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
#include <unistd.h>

#include "common/log.h"
#include "server/server.h"

void st__notify(const char *fmt, ...) {
  const char *path = getenv("NOTIFY_SOCKET");
  if (!path || !path[0]) return;
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  size_t n = strlen(path);
  if (n >= sizeof a.sun_path || (path[0] != '/' && path[0] != '@')) {
    ST_LOG_W("server", "NOTIFY_SOCKET '%s' is not a socket path: no notification sent", path);
    return;
  }
  memcpy(a.sun_path, path, n);
  if (path[0] == '@') a.sun_path[0] = '\0';   /* abstract namespace */
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (len < 0) return;
  if ((size_t)len >= sizeof msg) len = (int)sizeof msg - 1;
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  socklen_t alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
  if (sendto(fd, msg, (size_t)len, MSG_NOSIGNAL, (struct sockaddr *)&a, alen) < 0)
    ST_LOG_W("server", "notify %s: %s", path, strerror(errno));
  close(fd);
}
