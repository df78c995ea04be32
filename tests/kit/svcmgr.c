/* A service manager for tests (svcmgr.h). */
#include "svcmgr.h"

#include "common/fdpass.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/kcmp.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static void die(const char *what) {
  fprintf(stderr, "svcmgr: %s: %s\n", what, strerror(errno));
  exit(1);
}

/* The value of line "KEY=" in msg (NUL-terminated lines), copied into
 * out; 0 when absent. */
static int field(const char *msg, const char *key, char *out, size_t cap) {
  size_t klen = strlen(key);
  for (const char *p = msg; p && *p;) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) : strlen(p);
    if (len >= klen && memcmp(p, key, klen) == 0) {
      size_t v = len - klen;
      if (v >= cap) v = cap - 1;
      memcpy(out, p + klen, v);
      out[v] = '\0';
      return 1;
    }
    p = nl ? nl + 1 : NULL;
  }
  return 0;
}

/* Whether a and b are one open file, as systemd decides before it stores
 * a descriptor (a second descriptor of a file it holds is dropped): kcmp,
 * else the same inode, flags and position. */
static int same_fd(int a, int b) {
  pid_t me = getpid();
  long k = syscall(SYS_kcmp, me, me, KCMP_FILE, a, b);
  if (k >= 0) return k == 0;
  struct stat sa, sb;
  if (fstat(a, &sa) != 0 || fstat(b, &sb) != 0) return 0;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino &&
         fcntl(a, F_GETFL) == fcntl(b, F_GETFL) && lseek(a, 0, SEEK_CUR) == lseek(b, 0, SEEK_CUR);
}

/* Handles one datagram with its descriptors (taken). */
static void handle(stt_svcmgr_t *m, const char *msg, int *fds, int nfds) {
  char name[256] = "stored", flag[8];
  field(msg, "FDNAME=", name, sizeof name);
  pthread_mutex_lock(&m->lock);
  if (field(msg, "READY=", flag, sizeof flag) && strcmp(flag, "1") == 0) m->ready++;
  if (field(msg, "FDSTORE=", flag, sizeof flag) && strcmp(flag, "1") == 0) {
    m->stored++;
    for (int i = 0; i < nfds; i++) {
      int dup = 0;
      for (int k = 0; k < m->nfds && !dup; k++) dup = same_fd(fds[i], m->fds[k].fd);
      if (dup) {   /* systemd: "Suppressing duplicate fd in fd store" */
        m->duplicates++;
        close(fds[i]);
        continue;
      }
      if (m->nfds == STT_SVCMGR_MAX_FDS) {
        m->overflow = 1;
        close(fds[i]);
        continue;
      }
      snprintf(m->fds[m->nfds].name, sizeof m->fds[m->nfds].name, "%s", name);
      m->fds[m->nfds++].fd = fds[i];
    }
    nfds = 0;
  }
  if (field(msg, "FDSTOREREMOVE=", flag, sizeof flag) && strcmp(flag, "1") == 0) {
    m->removed++;
    for (int i = 0; i < m->nfds;) {
      if (strcmp(m->fds[i].name, name) == 0) {
        close(m->fds[i].fd);
        m->fds[i] = m->fds[--m->nfds];
      } else {
        i++;
      }
    }
  }
  pthread_mutex_unlock(&m->lock);
  for (int i = 0; i < nfds; i++) close(fds[i]);   /* descriptors of no store message */
}

static void *reader(void *arg) {
  stt_svcmgr_t *m = arg;
  while (!m->stop) {
    struct pollfd p = {m->sock, POLLIN, 0};
    if (poll(&p, 1, 20) != 1) continue;
    char buf[4096];
    union {
      struct cmsghdr align;
      char b[CMSG_SPACE(sizeof(int) * 16)];
    } cm;
    struct iovec iov = {buf, sizeof buf - 1};
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cm.b;
    mh.msg_controllen = sizeof cm.b;
    __atomic_store_n(&m->busy, 1, __ATOMIC_SEQ_CST);
    ssize_t n = recvmsg(m->sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      __atomic_store_n(&m->busy, 0, __ATOMIC_SEQ_CST);
      continue;
    }
    buf[n] = '\0';
    int fds[16];
    size_t nfds = 0;
    st__fdpass_take(&mh, fds, 16, &nfds);
    handle(m, buf, fds, (int)nfds);
    __atomic_store_n(&m->busy, 0, __ATOMIC_SEQ_CST);
  }
  return NULL;
}

void stt_svcmgr_start(stt_svcmgr_t *m, const char *dir, uint64_t max) {
  memset(m, 0, sizeof *m);
  pthread_mutex_init(&m->lock, NULL);
  m->max = max;
  snprintf(m->path, sizeof m->path, "%s/notify", dir);
  m->sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (m->sock < 0) die("socket");
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  if (strlen(m->path) >= sizeof a.sun_path) {
    errno = ENAMETOOLONG;
    die(m->path);
  }
  memcpy(a.sun_path, m->path, strlen(m->path) + 1);
  unlink(m->path);
  if (bind(m->sock, (struct sockaddr *)&a, sizeof a) != 0) die("bind");
  int big = 8 << 20;   /* as systemd's notify socket */
  setsockopt(m->sock, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
  if (pthread_create(&m->thread, NULL, reader, m) != 0) die("pthread_create");
}

/* In the server's process, before exec: the stored descriptors at 3..,
 * and the environment. */
static void before_exec(void *ud) {
  stt_svcmgr_t *m = ud;
  int n = m->nexec, tmp[STT_SVCMGR_MAX_FDS];
  for (int i = 0; i < n; i++) tmp[i] = fcntl(m->exec_fds[i], F_DUPFD, 3 + n + 16);
  for (int i = 0; i < n; i++) {
    dup2(tmp[i], 3 + i);
    close(tmp[i]);
  }
  putenv(m->env_notify);
  if (m->max) putenv(m->env_max);
  if (n) {
    static char pid[32];
    snprintf(pid, sizeof pid, "LISTEN_PID=%ld", (long)getpid());
    putenv(pid);
    putenv(m->env_count);
    putenv(m->env_names);
  }
}

void stt_svcmgr_attach(stt_svcmgr_t *m, stt_server_t *s) {
  stt_svcmgr_sync(m);
  pthread_mutex_lock(&m->lock);
  m->nexec = m->nfds;
  size_t cap = 32;
  for (int i = 0; i < m->nfds; i++) {
    m->exec_fds[i] = m->fds[i].fd;
    cap += strlen(m->fds[i].name) + 1;
  }
  free(m->env_names);
  m->env_names = malloc(cap);
  if (!m->env_names) die("malloc");
  size_t off = (size_t)snprintf(m->env_names, cap, "LISTEN_FDNAMES=");
  for (int i = 0; i < m->nfds; i++)
    off += (size_t)snprintf(m->env_names + off, cap - off, "%s%s", i ? ":" : "", m->fds[i].name);
  pthread_mutex_unlock(&m->lock);
  snprintf(m->env_notify, sizeof m->env_notify, "NOTIFY_SOCKET=%s", m->path);
  snprintf(m->env_max, sizeof m->env_max, "FDSTORE=%llu", (unsigned long long)m->max);
  snprintf(m->env_count, sizeof m->env_count, "LISTEN_FDS=%d", m->nexec);
  s->before_exec = before_exec;
  s->before_exec_ud = m;
}

void stt_svcmgr_sync(stt_svcmgr_t *m) {
  for (int quiet = 0; quiet < 3;) {
    int pending = 0;
    ioctl(m->sock, FIONREAD, &pending);
    if (pending || __atomic_load_n(&m->busy, __ATOMIC_SEQ_CST)) {
      quiet = 0;
    } else {
      quiet++;
    }
    usleep(2000);
  }
}

int stt_svcmgr_count(stt_svcmgr_t *m, const char *prefix) {
  pthread_mutex_lock(&m->lock);
  int n = 0;
  for (int i = 0; i < m->nfds; i++) n += strncmp(m->fds[i].name, prefix, strlen(prefix)) == 0;
  pthread_mutex_unlock(&m->lock);
  return n;
}

int stt_svcmgr_fd(stt_svcmgr_t *m, const char *name) {
  pthread_mutex_lock(&m->lock);
  int fd = -1;
  for (int i = 0; i < m->nfds && fd < 0; i++)
    if (strcmp(m->fds[i].name, name) == 0) fd = m->fds[i].fd;
  pthread_mutex_unlock(&m->lock);
  return fd;
}

int stt_svcmgr_replace(stt_svcmgr_t *m, const char *name, int fd) {
  pthread_mutex_lock(&m->lock);
  int done = -1;
  for (int i = 0; i < m->nfds && done < 0; i++)
    if (strcmp(m->fds[i].name, name) == 0) {
      close(m->fds[i].fd);
      m->fds[i].fd = fd;
      done = 0;
    }
  pthread_mutex_unlock(&m->lock);
  if (done < 0) close(fd);
  return done;
}

int stt_svcmgr_name_of(stt_svcmgr_t *m, unsigned long long ino, char *name, size_t cap) {
  pthread_mutex_lock(&m->lock);
  int done = -1;
  for (int i = 0; i < m->nfds && done < 0; i++) {
    struct stat st;
    if (fstat(m->fds[i].fd, &st) == 0 && (unsigned long long)st.st_ino == ino) {
      snprintf(name, cap, "%s", m->fds[i].name);
      done = 0;
    }
  }
  pthread_mutex_unlock(&m->lock);
  return done;
}

int stt_svcmgr_ready(stt_svcmgr_t *m) {
  pthread_mutex_lock(&m->lock);
  int n = m->ready;
  pthread_mutex_unlock(&m->lock);
  return n;
}

void stt_svcmgr_stop(stt_svcmgr_t *m) {
  m->stop = 1;
  pthread_join(m->thread, NULL);
  close(m->sock);
  unlink(m->path);
  for (int i = 0; i < m->nfds; i++) close(m->fds[i].fd);
  m->nfds = 0;
  free(m->env_names);
  m->env_names = NULL;
}
