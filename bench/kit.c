/* See kit.h. */
#include "kit.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
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
