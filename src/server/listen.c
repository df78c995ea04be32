/* src/server: the listening sockets, one per served device, at
 * "<base>-<index>.sock".
 *
 * Safety rules (docs/security.md): the socket's directory must be ours or
 * root's and not writable by others unless sticky (like /tmp); a file
 * already at the path is replaced only when it is a socket nobody answers
 * on (stale); the socket is created with its final mode atomically (umask
 * around bind), so there is no window where it is more open than
 * socket_mode. On exit a socket is unlinked only if it is still the inode we
 * bound.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/log.h"
#include "common/clock.h"
#include "common/sockdir.h"
#include "server/conn.h"
#include "server/restart.h"
#include "server/server.h"
#include "st/errors.h"
#include "st/wire.h"

#define SUN_PATH_MAX (sizeof(((struct sockaddr_un *)0)->sun_path) - 1)

/* "<base>-<index>.sock" into out, or ST_ERR_LIMIT when it does not fit
 * in sun_path (the message names the length). Any thread. */
int st__socket_path(const char *base, int index, char *out, size_t len, char *err,
                    size_t errlen) {
  char path[4096];
  int n = snprintf(path, sizeof path, "%s-%d.sock", base, index);
  if (n < 0 || (size_t)n >= sizeof path) {
    snprintf(err, errlen, "socket path for base '%.64s...' is too long", base);
    return ST_ERR_LIMIT;
  }
  if ((size_t)n > SUN_PATH_MAX) {
    snprintf(err, errlen,
             "socket path %s is %d bytes long; a Unix socket path holds at most %zu: "
             "choose a shorter base_path",
             path, n, SUN_PATH_MAX);
    return ST_ERR_LIMIT;
  }
  if ((size_t)n >= len) {
    snprintf(err, errlen, "socket path %s is too long", path);
    return ST_ERR_LIMIT;
  }
  memcpy(out, path, (size_t)n + 1);
  return ST_OK;
}

/* See server.h. Any thread (getgrnam). */
int st__socket_group_id(const char *name, gid_t *gid, char *err, size_t errlen) {
  struct group *g = getgrnam(name);
  if (g) {
    *gid = g->gr_gid;
    return ST_OK;
  }
  char *end;
  unsigned long v = strtoul(name, &end, 10);
  if (*name && !*end) {
    *gid = (gid_t)v;
    return ST_OK;
  }
  snprintf(err, errlen, "socket_group '%s' is not a group of this host", name);
  return ST_ERR_CONFIGURATION;
}

/* Creates every missing directory of `dir` with `mode` (like mkdir -p). */
static int make_dirs(const char *dir, mode_t mode, int *created, char *err, size_t errlen) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s", dir);
  size_t len = strlen(tmp);
  for (size_t i = 1; i <= len; i++) {
    if (tmp[i] != '/' && tmp[i] != '\0') continue;
    char saved = tmp[i];
    tmp[i] = '\0';
    if (mkdir(tmp, mode) == 0) {
      *created = 1;
      /* mkdir's mode is filtered by the umask: set it exactly. */
      chmod(tmp, mode);
    } else if (errno != EEXIST) {
      snprintf(err, errlen, "cannot create directory %s: %s", tmp, strerror(errno));
      return ST_ERR_IO;
    }
    tmp[i] = saved;
  }
  return ST_OK;
}

/* A default socket directory (check_dir) that exists: ours, writable by
 * nobody else. ST_OK or ST_ERR_CONFIGURATION saying what to change. */
static int check_own_dir(const char *dir, const struct stat *st, char *err, size_t errlen) {
  if (st->st_uid != geteuid()) {
    snprintf(err, errlen,
             "default socket directory %s belongs to uid %u, not to this server (uid %u): "
             "refusing to serve from it (remove it, or choose another place with base_path, "
             "--base-path or $" ST_ENV_BASE_PATH ")",
             dir, (unsigned)st->st_uid, (unsigned)geteuid());
    return ST_ERR_CONFIGURATION;
  }
  if (st->st_mode & (S_IWGRP | S_IWOTH)) {
    snprintf(err, errlen,
             "default socket directory %s is writable by %s (mode %04o): another user could "
             "replace the socket; refusing to serve from it (chmod go-w %s)",
             dir, (st->st_mode & S_IWOTH) ? "others" : "its group",
             (unsigned)(st->st_mode & 07777), dir);
    return ST_ERR_CONFIGURATION;
  }
  return ST_OK;
}

/* The directory that holds the socket: created if missing; otherwise it
 * must be a directory owned by us or root, not writable by group or
 * others unless sticky (then nobody can remove or replace our socket).
 * A default directory of our own (common/sockdir.h: under
 * $XDG_RUNTIME_DIR or /run) is made 0755 (0750 with socket_group), so
 * that socket_mode alone says who may connect, and must be ours exactly
 * and writable by nobody else, sticky or not. */
static int check_dir(const st__config_t *cfg, const char *path, int have_gid, gid_t gid,
                     char *err, size_t errlen) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == dir) dir[1] = '\0';
  else *slash = '\0';
  int own = st__sockdir_is_private(dir);
  struct stat st;
  if (stat(dir, &st) != 0) {
    if (errno != ENOENT) {
      snprintf(err, errlen, "cannot inspect socket directory %s: %s", dir, strerror(errno));
      return ST_ERR_IO;
    }
    int created = 0;
    mode_t mode = cfg->socket_group ? 0750 : own ? 0755 : 0700;
    int rc = make_dirs(dir, mode, &created, err, errlen);
    if (rc != ST_OK) return rc;
    if (have_gid && chown(dir, (uid_t)-1, gid) != 0) {
      snprintf(err, errlen, "cannot give directory %s to group %s: %s", dir, cfg->socket_group,
               strerror(errno));
      return ST_ERR_IO;
    }
    ST_LOG_I("listen", "created socket directory %s (mode %04o)", dir, (unsigned)mode);
    if (stat(dir, &st) != 0) {
      snprintf(err, errlen, "cannot inspect socket directory %s: %s", dir, strerror(errno));
      return ST_ERR_IO;
    }
  }
  if (!S_ISDIR(st.st_mode)) {
    snprintf(err, errlen, "%s is not a directory", dir);
    return ST_ERR_CONFIGURATION;
  }
  if (own) return check_own_dir(dir, &st, err, errlen);
  if (st.st_uid != geteuid() && st.st_uid != 0) {
    snprintf(err, errlen,
             "socket directory %s belongs to uid %u, not to us (uid %u) or root: refusing "
             "to serve from it",
             dir, (unsigned)st.st_uid, (unsigned)geteuid());
    return ST_ERR_CONFIGURATION;
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX)) {
    snprintf(err, errlen,
             "socket directory %s is writable by %s and not sticky (mode %04o): another "
             "user could replace the socket; refusing to serve from it",
             dir, (st.st_mode & S_IWOTH) ? "others" : "its group",
             (unsigned)(st.st_mode & 07777));
    return ST_ERR_CONFIGURATION;
  }
  return ST_OK;
}

/* Something exists at `path`: a socket nobody answers on is removed;
 * anything else is refused. */
static int clear_path(const char *path, char *err, size_t errlen) {
  struct stat st;
  if (lstat(path, &st) != 0) {
    if (errno == ENOENT) return ST_OK;
    snprintf(err, errlen, "cannot inspect %s: %s", path, strerror(errno));
    return ST_ERR_IO;
  }
  if (!S_ISSOCK(st.st_mode)) {
    snprintf(err, errlen, "%s exists and is not a socket: refusing to replace it", path);
    return ST_ERR_CONFIGURATION;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    snprintf(err, errlen, "socket: %s", strerror(errno));
    return ST_ERR_IO;
  }
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path, path, strlen(path) + 1);
  int r = connect(fd, (struct sockaddr *)&sa, sizeof sa);
  int e = errno;
  close(fd);
  if (r == 0 || e == EAGAIN || e == EINPROGRESS) {
    snprintf(err, errlen, "another stserver is serving on %s", path);
    return ST_ERR_CONFIGURATION;
  }
  if (e != ECONNREFUSED) {
    snprintf(err, errlen, "%s exists and cannot be probed (%s): refusing to replace it", path,
             strerror(e));
    return ST_ERR_CONFIGURATION;
  }
  if (unlink(path) != 0 && errno != ENOENT) {
    snprintf(err, errlen, "cannot remove stale socket %s: %s", path, strerror(errno));
    return ST_ERR_IO;
  }
  ST_LOG_I("listen", "removed stale socket %s (nothing was serving on it)", path);
  return ST_OK;
}

static void on_accept(struct ev_loop *loop, ev_io *w, int revents);

static void on_retry(struct ev_loop *loop, ev_timer *w, int revents) {
  st__listener_t *l = w->data;
  (void)revents;
  ev_timer_stop(loop, &l->retry);
  if (l->fd >= 0) ev_io_start(loop, &l->io);
}

/* The reserve descriptor (server.h, spare_fd): /dev/null, or -1. */
static int spare_open(void) {
  return open("/dev/null", O_RDONLY | O_CLOEXEC);
}

/* Nonzero at most once per 10 s: the log says "out of descriptors" once,
 * not once per connection attempt. */
static int emfile_warn_due(void) {
  static double last = -1e9;
  double now = st__now_mono();
  if (now - last < 10.0) return 0;
  last = now;
  return 1;
}

/* accept failed with EMFILE/ENFILE: the connection waits in the backlog.
 * With the reserve descriptor, it is taken, told LIMIT and closed, so that
 * a client does not hang; returns 1 when that was done (the caller goes
 * on accepting). Without it (or when even that fails), accepting pauses
 * for 100 ms instead of spinning; returns 0. */
static int out_of_descriptors(st__listener_t *l, int err) {
  st__server_t *srv = l->srv;
  struct rlimit rl = {0, 0};
  getrlimit(RLIMIT_NOFILE, &rl);
  if (emfile_warn_due())
    ST_LOG_W("listen",
             "accept on %s: %s: the server is out of file descriptors (RLIMIT_NOFILE = %llu); "
             "new connections get LIMIT until some are free",
             l->path, strerror(err), (unsigned long long)rl.rlim_cur);
  if (srv->spare_fd >= 0) {
    close(srv->spare_fd);
    int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      char msg[160];
      snprintf(msg, sizeof msg,
               "the server has no descriptor left for a connection (RLIMIT_NOFILE = %llu); "
               "try again later",
               (unsigned long long)rl.rlim_cur);
      srv->counters.limit_refused++;
      st__peer_refuse(fd, ST_ERR_LIMIT, msg);
    }
    srv->spare_fd = spare_open();
    if (fd >= 0 && srv->spare_fd >= 0) return 1;
  }
  ev_io_stop(srv->loop, &l->io);
  ev_timer_set(&l->retry, 0.1, 0.);
  ev_timer_start(srv->loop, &l->retry);
  return 0;
}

static void on_accept(struct ev_loop *loop, ev_io *w, int revents) {
  st__listener_t *l = w->data;
  st__server_t *srv = l->srv;
  const st__config_t *cfg = srv->cfg;
  (void)loop;
  (void)revents;
  for (int i = 0; i < 64 && l->fd >= 0; i++) {
    int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EMFILE || errno == ENFILE) {
        if (out_of_descriptors(l, errno)) continue;
        return;
      }
      /* Out of memory or the like: pause accepting, not spin. */
      ST_LOG_W("listen", "accept on %s: %s; pausing accepts for 100 ms", l->path,
               strerror(errno));
      ev_io_stop(loop, &l->io);
      ev_timer_set(&l->retry, 0.1, 0.);
      ev_timer_start(loop, &l->retry);
      return;
    }
    struct ucred cred;
    socklen_t clen = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) {
      ST_LOG_W("listen", "SO_PEERCRED on %s: %s; dropping the connection", l->path,
               strerror(errno));
      close(fd);
      continue;
    }
    if (!st__peer_admitted(cfg, fd, &cred)) {
      srv->counters.auth_refused++;
      char msg[160];
      snprintf(msg, sizeof msg, "uid %u (gid %u) is not allowed on this server",
               (unsigned)cred.uid, (unsigned)cred.gid);
      ST_LOG_W("listen", "refused pid %d uid %u gid %u on %s: not allowed", (int)cred.pid,
               (unsigned)cred.uid, (unsigned)cred.gid, l->path);
      st__peer_refuse(fd, ST_ERR_AUTH, msg);
      continue;
    }
    if (srv->nconns >= cfg->max_connections) {
      srv->counters.limit_refused++;
      char msg[128];
      snprintf(msg, sizeof msg, "too many connections (max_connections = %d)",
               cfg->max_connections);
      ST_LOG_W("listen", "refused pid %d uid %u: %s", (int)cred.pid, (unsigned)cred.uid, msg);
      st__peer_refuse(fd, ST_ERR_LIMIT, msg);
      continue;
    }
    st__conn_open(srv, fd, l->device, &cred);
  }
}

/* Watches listener l (its fd set) and counts it. */
static void start_listener(st__server_t *srv, st__listener_t *l) {
  ev_io_init(&l->io, on_accept, l->fd, EV_READ);
  ev_init(&l->retry, on_retry);
  l->io.data = l->retry.data = l;
  ev_io_start(srv->loop, &l->io);
  srv->nlisteners++;
  if (srv->nlisteners == 1) srv->spare_fd = spare_open();
}

/* The name socket `device` of this process is bound under before it is
 * renamed to `path` (st__listen_open): "<dir>/.st-<pid>-<device>.bind".
 * Its length, or -1 when path has no directory part. */
static int bind_name(const char *path, long pid, int device, char *out, size_t cap) {
  const char *slash = strrchr(path, '/');
  if (!slash) return -1;
  return snprintf(out, cap, "%.*s/.st-%ld-%d.bind", (int)(slash - path), path, pid, device);
}

/* Whether `name` (a socket's bound name) is `path` itself, or the bind
 * name of socket `device` of some process in path's directory. */
static int bound_as(const char *name, const char *path, int device) {
  if (strcmp(name, path) == 0) return 1;
  const char *slash = strrchr(path, '/');
  size_t dir = slash ? (size_t)(slash - path) : 0;
  if (!slash || strncmp(name, path, dir) != 0 || strncmp(name + dir, "/.st-", 5) != 0) return 0;
  const char *q = name + dir + 5;
  if (*q < '0' || *q > '9') return 0;
  while (*q >= '0' && *q <= '9') q++;
  char tail[32];
  snprintf(tail, sizeof tail, "-%d.bind", device);
  return strcmp(q, tail) == 0;
}

/* Takes fd (owned; closed on failure), a listening socket another
 * server handed over, as l's after checking it is what l's path names:
 * a listening Unix stream socket bound to that path (or bound under its
 * bind name and renamed there), whose file is still a socket. */
static int adopt(st__listener_t *l, int fd, char *err, size_t errlen) {
  int type = 0, domain = 0, accepting = 0;
  socklen_t len = sizeof type;
  struct sockaddr_un sa;
  socklen_t salen = sizeof sa;
  memset(&sa, 0, sizeof sa);
  struct stat st;
  int ok = getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM &&
           (len = sizeof domain, getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len)) == 0 &&
           domain == AF_UNIX &&
           (len = sizeof accepting, getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len)) == 0 &&
           accepting && getsockname(fd, (struct sockaddr *)&sa, &salen) == 0 &&
           salen > offsetof(struct sockaddr_un, sun_path) &&
           (sa.sun_path[sizeof sa.sun_path - 1] = '\0',
            bound_as(sa.sun_path, l->path, l->device)) &&
           lstat(l->path, &st) == 0 && S_ISSOCK(st.st_mode);
  if (!ok) {
    close(fd);
    snprintf(err, errlen, "the socket handed over for %s is no listening Unix socket bound there",
             l->path);
    return ST_ERR_INVALID_ARGUMENT;
  }
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  l->fd = fd;
  l->st_dev = st.st_dev;
  l->st_ino = st.st_ino;
  return ST_OK;
}

/* See server.h. Loop thread. */
void st__listen_pause(st__server_t *srv, int pause) {
  for (int i = 0; i < srv->nlisteners; i++) {
    st__listener_t *l = &srv->listeners[i];
    if (l->fd < 0) continue;
    if (pause) {
      ev_io_stop(srv->loop, &l->io);
      ev_timer_stop(srv->loop, &l->retry);
    } else {
      ev_io_start(srv->loop, &l->io);
    }
  }
}

/* Opens the socket of one device; see server.h. Loop thread, at start. */
int st__listen_open(st__server_t *srv, int device, char *err, size_t errlen) {
  const st__config_t *cfg = srv->cfg;
  st__listener_t *l = &srv->listeners[srv->nlisteners];
  memset(l, 0, sizeof *l);
  l->fd = -1;
  l->srv = srv;
  l->device = device;
  int rc = st__socket_path(cfg->base_path, device, l->path, sizeof l->path, err, errlen);
  if (rc != ST_OK) return rc;
  gid_t gid = 0;
  int have_gid = 0;
  if (cfg->socket_group && cfg->socket_group[0]) {
    rc = st__socket_group_id(cfg->socket_group, &gid, err, errlen);
    if (rc != ST_OK) return rc;
    have_gid = 1;
  }
  rc = check_dir(cfg, l->path, have_gid, gid, err, errlen);
  if (rc != ST_OK) return rc;
  /* A takeover hands the old server's listening socket over: the same
   * socket file, and connections waiting in its backlog are ours. */
  int handed = st__restart_listener(srv, device);
  if (handed >= 0) {
    rc = adopt(l, handed, err, errlen);
    if (rc != ST_OK) return rc;
    start_listener(srv, l);
    ST_LOG_I("listen", "listening on %s (device %d), the socket handed over", l->path, device);
    return ST_OK;
  }
  rc = clear_path(l->path, err, errlen);
  if (rc != ST_OK) return rc;

  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    snprintf(err, errlen, "socket: %s", strerror(errno));
    return ST_ERR_IO;
  }
  /* Bound and listening under a name of its own in the same directory,
   * then renamed into place (atomic): a client never finds the socket
   * file of a socket that does not listen yet (a connect would be
   * refused). A directory too long for that name binds the path itself. */
  char tmp[sizeof l->path];
  int n = bind_name(l->path, (long)getpid(), device, tmp, sizeof tmp);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  const char *at = n > 0 && (size_t)n < sizeof sa.sun_path ? tmp : l->path;
  if (at == tmp) unlink(tmp);
  memcpy(sa.sun_path, at, strlen(at) + 1);
  /* The socket file gets 0777 & ~umask: set the umask so that it is born
   * with socket_mode. Only the loop thread runs while sockets are opened. */
  mode_t old = umask((mode_t)(~cfg->socket_mode & 0777));
  int r = bind(fd, (struct sockaddr *)&sa, sizeof sa);
  int e = errno;
  umask(old);
  if (r != 0) {
    close(fd);
    snprintf(err, errlen, "cannot bind %s: %s", at, strerror(e));
    return ST_ERR_IO;
  }
  const char *why = NULL;
  if (have_gid && chown(at, (uid_t)-1, gid) != 0) why = "chown";
  else if (listen(fd, SOMAXCONN) != 0) why = "listen";
  else if (at == tmp && rename(tmp, l->path) != 0) why = "rename";
  if (why) {
    e = errno;
    unlink(at);
    close(fd);
    if (!strcmp(why, "chown"))
      snprintf(err, errlen, "cannot give %s to group %s: %s", l->path, cfg->socket_group,
               strerror(e));
    else if (!strcmp(why, "listen"))
      snprintf(err, errlen, "cannot listen on %s: %s", l->path, strerror(e));
    else
      snprintf(err, errlen, "cannot rename %s to %s: %s", tmp, l->path, strerror(e));
    return ST_ERR_IO;
  }
  struct stat st;
  if (lstat(l->path, &st) == 0) {
    l->st_dev = st.st_dev;
    l->st_ino = st.st_ino;
  }
  l->fd = fd;
  start_listener(srv, l);
  ST_LOG_I("listen", "listening on %s (device %d, mode %04o%s%s)", l->path, device,
           cfg->socket_mode & 07777, have_gid ? ", group " : "",
           have_gid ? cfg->socket_group : "");
  return ST_OK;
}

/* Closes the listeners and unlinks our socket files. Loop thread. */
void st__listen_close_all(st__server_t *srv) {
  if (srv->nlisteners > 0 && srv->spare_fd >= 0) {
    close(srv->spare_fd);
    srv->spare_fd = -1;
  }
  for (int i = 0; i < srv->nlisteners; i++) {
    st__listener_t *l = &srv->listeners[i];
    if (l->fd < 0) continue;
    ev_io_stop(srv->loop, &l->io);
    ev_timer_stop(srv->loop, &l->retry);
    close(l->fd);
    l->fd = -1;
    struct stat st;
    if (srv->handed_over) {
      ST_LOG_D("listen", "%s: left to the server it was handed to", l->path);
    } else if (lstat(l->path, &st) == 0 && st.st_dev == l->st_dev && st.st_ino == l->st_ino) {
      if (unlink(l->path) != 0)
        ST_LOG_W("listen", "cannot remove %s: %s", l->path, strerror(errno));
      else
        ST_LOG_D("listen", "removed %s", l->path);
    } else {
      ST_LOG_W("listen", "%s is no longer our socket: left in place", l->path);
    }
  }
}
