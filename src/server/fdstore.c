/* src/server: the service manager's fd store (fdstore.h). Loop thread. */
#include "server/fdstore.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fail.h"
#include "common/log.h"
#include "server/server.h"
#include "st/errors.h"

/* systemd passes stored descriptors from 3 (SD_LISTEN_FDS_START). */
#define LISTEN_FDS_START 3
/* More than any store this server asks for: a bound on what is read. */
#define LISTEN_FDS_MAX 65536

/* A decimal in [1, max], or 0. */
static uint64_t positive(const char *s, uint64_t max) {
  if (!s || !*s) return 0;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v == 0 || v > max) return 0;
  return v;
}

/* Whether name may be stored: 1..255 characters, printable, no ':'. */
static int name_ok(const char *name) {
  size_t n = strlen(name);
  if (n == 0 || n > ST__FDNAME_MAX) return 0;
  for (size_t i = 0; i < n; i++)
    if (name[i] <= ' ' || name[i] == ':' || name[i] == 0x7f) return 0;
  return 1;
}

/* Fills s->received from LISTEN_FDS and LISTEN_FDNAMES. */
static void take_listen_fds(st__fdstore_t *s) {
  const char *pid = getenv("LISTEN_PID"), *count = getenv("LISTEN_FDS");
  const char *names = getenv("LISTEN_FDNAMES");
  if (!count) return;
  uint64_t n = positive(count, LISTEN_FDS_MAX);
  if (!pid || positive(pid, (uint64_t)1 << 31) != (uint64_t)getpid()) {
    ST_LOG_W("restart", "LISTEN_FDS=%s is for process %s, not this one (%ld): not taken", count,
             pid ? pid : "(unset)", (long)getpid());
    return;
  }
  if (!n) {
    if (strcmp(count, "0") != 0)
      ST_LOG_W("restart", "LISTEN_FDS='%.32s' is no count of descriptors: none taken", count);
    return;
  }
  s->received = calloc(n, sizeof *s->received);
  if (!s->received) {
    ST_LOG_E("restart", "out of memory taking %llu descriptors", (unsigned long long)n);
    return;
  }
  const char *p = names ? names : "";
  for (uint64_t i = 0; i < n; i++) {
    st__fdstore_entry_t *e = &s->received[i];
    int fd = LISTEN_FDS_START + (int)i;
    size_t len = strcspn(p, ":");
    if (len == 0 || len > ST__FDNAME_MAX) snprintf(e->name, sizeof e->name, "unknown");
    else memcpy(e->name, p, len);
    p += len;
    if (*p == ':') p++;
    if (fcntl(fd, F_GETFD) < 0) {
      ST_LOG_W("restart", "received descriptor %d ('%s') is not open", fd, e->name);
      e->fd = -1;
      continue;
    }
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    e->fd = fd;
  }
  s->nreceived = n;
  ST_LOG_I("restart", "received %llu descriptors from the service manager",
           (unsigned long long)n);
}

/* See fdstore.h. Loop thread, at start. */
void st__fdstore_init(st__fdstore_t *s) {
  memset(s, 0, sizeof *s);
  const char *notify = getenv("NOTIFY_SOCKET");
  s->max = positive(getenv("FDSTORE"), UINT64_MAX);
  s->enabled = notify && notify[0] && s->max > 0;
  take_listen_fds(s);
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
}

/* See fdstore.h. Loop thread, at start. */
void st__fdstore_adopt(st__fdstore_t *s, st__fdstore_entry_t *handed, size_t n) {
  st__fdstore_entry_t *mine = n ? calloc(n, sizeof *mine) : NULL;
  if (n && !mine) {
    ST_LOG_E("restart", "out of memory taking %zu descriptors handed over", n);
    return;
  }
  st__fdstore_free(s);
  for (size_t i = 0; i < n; i++) {
    mine[i] = handed[i];
    handed[i].fd = -1;
  }
  s->received = mine;
  s->nreceived = n;
}

/* See fdstore.h. Loop thread. */
int st__fdstore_claim(st__fdstore_t *s, const char *name) {
  for (size_t i = 0; i < s->nreceived; i++) {
    st__fdstore_entry_t *e = &s->received[i];
    if (e->fd >= 0 && strcmp(e->name, name) == 0) {
      int fd = e->fd;
      e->fd = -1;
      s->stored++;
      return fd;
    }
  }
  return -1;
}

/* See fdstore.h. Loop thread. */
void st__fdstore_drop_unclaimed(st__fdstore_t *s) {
  size_t n = 0;
  char names[200] = "";
  for (size_t i = 0; i < s->nreceived; i++) {
    st__fdstore_entry_t *e = &s->received[i];
    if (e->fd < 0) continue;
    size_t used = strlen(names);
    if (used + strlen(e->name) + 8 < sizeof names)
      snprintf(names + used, sizeof names - used, "%s'%s'", n ? ", " : "", e->name);
    else if (!strstr(names, "..."))
      snprintf(names + used, sizeof names - used, ", ...");
    n++;
    close(e->fd);
    e->fd = -1;
    if (s->enabled && name_ok(e->name)) {
      s->stored++;   /* st__fdstore_remove counts it out */
      st__fdstore_remove(s, e->name);
    }
  }
  if (n)
    ST_LOG_W("restart", "%zu received descriptor%s belong%s to no restored state (%s): closed "
             "and removed from the store", n, n == 1 ? "" : "s", n == 1 ? "s" : "", names);
}

/* See fdstore.h. Loop thread. */
int st__fdstore_put(st__fdstore_t *s, const char *name, int fd, int fresh, char *err,
                    size_t errlen) {
  if (!name_ok(name))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "'%s' is no fd store name", name);
  if (fresh && s->stored >= s->max)
    return st__fail(ST_ERR_LIMIT, err, errlen,
                    "the service's fd store keeps at most %llu descriptors (FileDescriptorStoreMax= "
                    "of the unit, $FDSTORE) and holds %llu",
                    (unsigned long long)s->max, (unsigned long long)s->stored);
  char msg[ST__FDNAME_MAX + 64];
  int len = snprintf(msg, sizeof msg, "FDSTORE=1\nFDNAME=%s\nFDPOLL=0", name);
  int rc = st__notify_send(msg, (size_t)len, &fd, 1, err, errlen);
  if (rc == ST_OK && fresh) s->stored++;
  return rc;
}

/* See fdstore.h. Loop thread. */
void st__fdstore_remove(st__fdstore_t *s, const char *name) {
  char msg[ST__FDNAME_MAX + 64], err[400];
  int len = snprintf(msg, sizeof msg, "FDSTOREREMOVE=1\nFDNAME=%s", name);
  if (st__notify_send(msg, (size_t)len, NULL, 0, err, sizeof err) != ST_OK)
    ST_LOG_W("restart", "removing '%s' from the fd store: %s", name, err);
  if (s->stored) s->stored--;
}

/* See fdstore.h. Loop thread, at exit. */
void st__fdstore_free(st__fdstore_t *s) {
  for (size_t i = 0; i < s->nreceived; i++)
    if (s->received[i].fd >= 0) close(s->received[i].fd);
  free(s->received);
  s->received = NULL;
  s->nreceived = 0;
}
