/* See proc.h. Test-only code: the parent's setup failures abort. */
#include "proc.h"

#include <dirent.h>
#include <stdint.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture.h"

/* A pipe, or a pseudo-terminal (read end = master, write end opened by
 * name in the child). */
typedef struct chan {
  int rd, wr;
  char slave[64];
} chan_t;

static int chan_open(chan_t *c, int pty) {
  c->slave[0] = '\0';
  if (!pty) {
    int p[2];
    if (pipe(p) != 0) return -1;
    c->rd = p[0];
    c->wr = p[1];
    return 0;
  }
  c->rd = posix_openpt(O_RDWR | O_NOCTTY);
  const char *name = c->rd >= 0 && grantpt(c->rd) == 0 && unlockpt(c->rd) == 0
                         ? ptsname(c->rd) : NULL;
  if (!name) return -1;
  snprintf(c->slave, sizeof c->slave, "%s", name);
  c->wr = -1;
  return 0;
}

/* In the child: makes the channel its descriptor `to`. */
static void chan_attach(chan_t *c, int to) {
  int fd = c->slave[0] ? open(c->slave, O_RDWR | O_NOCTTY) : c->wr;
  if (fd < 0) _exit(126);
  dup2(fd, to);
}

int stt_proc_start(stt_proc_t *p, const char *prog, const char *const *args, const char *env,
                   int pty) {
  memset(p, 0, sizeof *p);
  p->status = -1;
  chan_t o, e;
  if (chan_open(&o, pty & STT_PTY_OUT) != 0 || chan_open(&e, pty & STT_PTY_ERR) != 0) abort();
  p->pid = fork();
  if (p->pid < 0) return -1;
  if (p->pid == 0) {
    chan_attach(&o, 1);
    chan_attach(&e, 2);
    close(o.rd);
    close(e.rd);
    unsetenv("SHARED_TENSOR_BASE_PATH");
    /* Nor the default socket places of this host: with neither, a server
     * without a base path chooses the /tmp fallback, never the host's
     * /run (tests run as root on CI) or a login's runtime directory. */
    unsetenv("XDG_RUNTIME_DIR");
    setenv("SHARED_TENSOR_TEST_RUN_DIR", "/nonexistent/st-test-run", 1);
    for (char *v = env ? strdup(env) : NULL, *next; v; v = next) {
      next = strchr(v, '\n');
      if (next) *next++ = '\0';
      if (*v) putenv(v);
    }
    const char *argv[40];
    int n = 0;
    argv[n++] = prog;
    for (int i = 0; args[i] && n < 39; i++) argv[n++] = args[i];
    argv[n] = NULL;
    execv(prog, (char *const *)argv);
    _exit(127);
  }
  if (o.wr >= 0) close(o.wr);
  if (e.wr >= 0) close(e.wr);
  p->fd_out = o.rd;
  p->fd_err = e.rd;
  return 0;
}

/* Appends what one read gives to buf; closes *fd at EOF, on an error or
 * when buf is full. */
static void drain(int *fd, char *buf, size_t cap, size_t *used) {
  ssize_t k = *used < cap - 1 ? read(*fd, buf + *used, cap - 1 - *used) : 0;
  if (k <= 0) {
    close(*fd);
    *fd = -1;
    return;
  }
  *used += (size_t)k;
  buf[*used] = '\0';
}

void stt_proc_read(stt_proc_t *p, int ms) {
  struct pollfd f[2] = {{.fd = p->fd_out, .events = POLLIN}, {.fd = p->fd_err, .events = POLLIN}};
  if (poll(f, 2, ms) <= 0) return;
  if (p->fd_out >= 0 && f[0].revents) drain(&p->fd_out, p->out, sizeof p->out, &p->nout);
  if (p->fd_err >= 0 && f[1].revents) drain(&p->fd_err, p->err, sizeof p->err, &p->nerr);
}

int stt_proc_finish(stt_proc_t *p, int timeout_ms) {
  double end = stt_now_ms() + timeout_ms;
  while ((p->fd_out >= 0 || p->fd_err >= 0) && stt_now_ms() < end) stt_proc_read(p, 100);
  if (p->fd_out >= 0 || p->fd_err >= 0) kill(p->pid, SIGKILL);
  if (p->fd_out >= 0) close(p->fd_out);
  if (p->fd_err >= 0) close(p->fd_err);
  p->fd_out = p->fd_err = -1;
  int st;
  waitpid(p->pid, &st, 0);
  p->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  if (getenv("STT_VERBOSE"))
    fprintf(stderr, "[exit %d]\n--stdout--\n%s--stderr--\n%s", p->status, p->out, p->err);
  return p->status;
}

int stt_run(stt_proc_t *p, const char *prog, const char *const *args, const char *env, int pty) {
  if (stt_proc_start(p, prog, args, env, pty) != 0) return -1;
  return stt_proc_finish(p, 30000);
}

int stt_count_lines(const char *s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

int stt_proc_fd_count(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  DIR *d = opendir(path);
  if (!d) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* One line of /proc/PID/maps: its range and inode. 1 when it parses. */
static int maps_line(const char *line, unsigned long *lo, unsigned long *hi,
                     unsigned long long *ino) {
  unsigned long off;
  char perm[8], dev[16];
  return sscanf(line, "%lx-%lx %7s %lx %15s %llu", lo, hi, perm, &off, dev, ino) == 6;
}

unsigned long long stt_proc_inode_at(pid_t pid, const void *addr) {
  char path[64], line[512];
  snprintf(path, sizeof path, "/proc/%ld/maps", (long)pid);
  FILE *f = fopen(path, "r");
  unsigned long long found = 0;
  while (f && !found && fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    unsigned long long ino;
    if (maps_line(line, &lo, &hi, &ino) && (uintptr_t)addr >= lo && (uintptr_t)addr < hi)
      found = ino;
  }
  if (f) fclose(f);
  return found;
}

int stt_proc_maps_inode(pid_t pid, unsigned long long ino) {
  char path[64], line[512];
  snprintf(path, sizeof path, "/proc/%ld/maps", (long)pid);
  FILE *f = fopen(path, "r");
  int found = 0;
  while (f && !found && fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    unsigned long long i;
    found = maps_line(line, &lo, &hi, &i) && i == ino;
  }
  if (f) fclose(f);
  return found;
}
