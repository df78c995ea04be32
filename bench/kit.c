/* See kit.h. */
#include "kit.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

void bk_setup(void) {
  setenv("ST_SERVER_BIN", ST_BENCH_SERVER_BIN, 0);
  setenv("ST_SOURCE_DIR", ST_BENCH_SOURCE_DIR, 0);
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
}

void bk_server_config(stt_server_t *s, int spin_us) {
  char fields[128];
  int n = snprintf(fields, sizeof fields, "log_level = 'warn', workers = 2,");
  if (spin_us >= 0) snprintf(fields + n, sizeof fields - (size_t)n, " spin_us = %d,", spin_us);
  stt_server_config(s, fields);
}

void bk_report(const char *what, double *us, int n) {
  qsort(us, (size_t)n, sizeof *us, cmp_double);
  double sum = 0;
  for (int i = 0; i < n; i++) sum += us[i];
  printf("%-44s n=%-7d p50 %8.1f us   p99 %8.1f us   mean %8.1f us\n", what, n, us[n / 2],
         us[(int)(n * 0.99)], sum / n);
}

st_client_t *bk_connect(const char *sock) {
  st_client_t *c;
  char err[256];
  if (st_client_connect(sock, &c, err, sizeof err) != ST_OK) {
    fprintf(stderr, "connect: %s\n", err);
    exit(1);
  }
  return c;
}

long bk_throughput(const char *label, const char *sock, int nproc, double seconds,
                   int (*prepare)(st_client_t *c, st_result_t **keep),
                   int (*call)(st_client_t *c)) {
  int pipefd[2];
  if (pipe(pipefd) != 0) exit(1);
  pid_t *pids = calloc((size_t)nproc, sizeof *pids);
  for (int p = 0; p < nproc; p++) {
    if ((pids[p] = fork()) == 0) {
      close(pipefd[0]);
      st_client_t *c = bk_connect(sock);
      st_result_t *keep = NULL;
      if (prepare && prepare(c, &keep) != 0) _exit(1);
      long count = 0;
      double end = stt_now_ms() + seconds * 1e3;
      while (stt_now_ms() < end) {
        if (call(c) != 0) _exit(1);
        count++;
      }
      st_result_free(keep);
      st_client_close(c);
      if (write(pipefd[1], &count, sizeof count) != (ssize_t)sizeof count) _exit(1);
      _exit(0);
    }
  }
  close(pipefd[1]);
  long total = 0, one;
  int got = 0;
  while (read(pipefd[0], &one, sizeof one) == (ssize_t)sizeof one) {
    total += one;
    got++;
  }
  close(pipefd[0]);
  for (int p = 0; p < nproc; p++) waitpid(pids[p], NULL, 0);
  free(pids);
  char what[96];
  snprintf(what, sizeof what, "%s, %d client process%s", label, nproc, nproc == 1 ? "" : "es");
  printf("%-44s %.0f calls/s (%d of %d processes reported)\n", what, total / seconds, got,
         nproc);
  return total;
}

void bk_raw_pingpong(const char *dir, double *us, int iters) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if ((size_t)snprintf(sa.sun_path, sizeof sa.sun_path, "%s/raw.sock", dir) >= sizeof sa.sun_path) {
    fprintf(stderr, "socket path too long under %s\n", dir);
    exit(1);
  }
  int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(lfd, 1) != 0) {
    perror("raw bind");
    exit(1);
  }
  pid_t pid = fork();
  if (pid == 0) {
    int c = accept(lfd, NULL, NULL);
    char buf[64];
    for (;;) {
      size_t got = 0;
      while (got < sizeof buf) {
        ssize_t n = read(c, buf + got, sizeof buf - got);
        if (n <= 0) _exit(0);
        got += (size_t)n;
      }
      if (write(c, buf, sizeof buf) != (ssize_t)sizeof buf) _exit(0);
    }
  }
  close(lfd);
  int fd = stt_connect(sa.sun_path);
  char buf[64] = {1};
  for (int i = -100; i < iters; i++) {
    double t0 = stt_now_ms();
    if (write(fd, buf, sizeof buf) != (ssize_t)sizeof buf) exit(1);
    size_t got = 0;
    while (got < sizeof buf) {
      ssize_t n = read(fd, buf + got, sizeof buf - got);
      if (n <= 0) exit(1);
      got += (size_t)n;
    }
    if (i >= 0) us[i] = (stt_now_ms() - t0) * 1e3;
  }
  close(fd);
  waitpid(pid, NULL, 0);
  unlink(sa.sun_path);
}

/* A loopback TCP port free now (bound to port 0, read back, closed). */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof sa;
  int port = -1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
      getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
    port = ntohs(sa.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

void bk_ucx_perftest(const char *test, unsigned long long bytes, const char *what) {
  if (system("command -v ucx_perftest > /dev/null 2>&1") != 0) {
    printf("ucx_perftest not installed (Debian: ucx-utils): no engine figure\n");
    return;
  }
  printf("ucx_perftest %s, %llu-byte messages (%s):\n", test, bytes, what);
  fflush(stdout);
  char cmd[512];
  int port = free_port();
  snprintf(cmd, sizeof cmd,
           "(ucx_perftest -p %d > /dev/null 2>&1 &) ; sleep 1; ucx_perftest 127.0.0.1 -p "
           "%d -t %s -s %llu -n 200 2>&1 | tail -2",
           port, port, test, bytes);
  if (system(cmd) != 0) printf("ucx_perftest failed\n");
}
