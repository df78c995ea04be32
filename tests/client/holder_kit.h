/* A client process that holds results: for tests of what a SIGKILLed
 * client gives back (test_pool.c, test_gpu_pool.c); the churn of random
 * frees and a server of its own for budget tests, shared by both. */
#ifndef STT_HOLDER_KIT_H
#define STT_HOLDER_KIT_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <st/client.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture.h"

typedef st_result_t *(*pk_make_fn)(st_client_t *c, float v);

/* The holder is a fresh image of the test binary (fork + exec of
 * /proc/self/exe with PK_HOLDER_FLAG): a CUDA context does not survive
 * fork, and a holder of CUDA results must import their slab. Every test
 * that uses pk_holder calls pk_holder_main first thing in main, once
 * whatever `make` depends on is set up. */
#define PK_HOLDER_FLAG "--pk-holder"

/* In the holder image (argv: PK_HOLDER_FLAG, socket, n): connects, makes
 * n results with make(c, i), holds them, writes 'k' to descriptor 3 and
 * waits to be killed; never returns. Elsewhere returns at once. */
static inline void pk_holder_main(int argc, char **argv, pk_make_fn make) {
  if (argc != 4 || strcmp(argv[1], PK_HOLDER_FLAG) != 0) return;
  st_client_t *c = NULL;
  char err[256];
  if (st_client_connect(argv[2], &c, err, sizeof err) != ST_OK) _exit(2);
  for (int i = 0; i < atoi(argv[3]); i++)
    if (!make(c, (float)i)) _exit(3);
  if (write(3, "k", 1) != 1) _exit(4);
  for (;;) pause();
}

/* A holder process for `sock` that made `n` results and holds them:
 * returns its pid once they are made (-1 when it failed); pk_kill
 * SIGKILLs and reaps it. */
static inline pid_t pk_holder(const char *sock, int n) {
  int pfd[2];
  if (pipe(pfd) != 0) return -1;
  char nbuf[16];
  snprintf(nbuf, sizeof nbuf, "%d", n);
  pid_t pid = fork();
  if (pid == 0) {
    close(pfd[0]);
    if (dup2(pfd[1], 3) != 3) _exit(5);
    execl("/proc/self/exe", "pk-holder", PK_HOLDER_FLAG, sock, nbuf, (char *)NULL);
    _exit(127);
  }
  close(pfd[1]);
  char ch = 0;
  int ok = pid > 0 && read(pfd[0], &ch, 1) == 1 && ch == 'k';
  close(pfd[0]);
  if (!ok && pid > 0) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
  }
  return ok ? pid : -1;
}

static inline void pk_kill(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

/* `calls` calls of make(c, i + 1), holding at most `hold` results: before
 * a call a random held one goes (when full, else one time in three)
 * through drop(r, v, seed), which must free it. Every new result must
 * hold its value (holds) and lie apart from every held one (`bytes`
 * each); every `check_every` calls each held one must still hold its
 * own. The held ones are freed at the end. 0, or -1 at the first
 * failure (printed). */
static inline int pk_churn(st_client_t *c, int calls, int hold, unsigned seed, size_t bytes,
                           int check_every, pk_make_fn make,
                           int (*holds)(const st_result_t *r, float v),
                           void (*drop)(st_result_t *r, float v, unsigned *seed)) {
  st_result_t *held[64];
  float val[64];
  int n = 0, rc = 0;
  if (hold > 64) hold = 64;
  for (int i = 0; i < calls && rc == 0; i++) {
    if (n == hold || (n > 0 && rand_r(&seed) % 3 == 0)) {
      int k = (int)(rand_r(&seed) % (unsigned)n);
      drop(held[k], val[k], &seed);
      held[k] = held[n - 1];
      val[k] = val[--n];
    }
    float v = (float)(i + 1);
    st_result_t *r = make(c, v);
    if (!r || !holds(r, v)) {
      fprintf(stderr, "   call %d: a wrong result\n", i);
      st_result_free(r);
      rc = -1;
      break;
    }
    const char *p = st_result_tensor(r, 0)->data;
    for (int k = 0; k < n && rc == 0; k++) {
      const char *q = st_result_tensor(held[k], 0)->data;
      if (!(p + bytes <= q || q + bytes <= p) || (i % check_every == 0 && !holds(held[k], val[k]))) {
        fprintf(stderr, "   call %d: held result %d overlapped or changed\n", i, k);
        rc = -1;
      }
    }
    held[n] = r;
    val[n++] = v;
  }
  for (int k = 0; k < n; k++) {
    if (rc == 0 && !holds(held[k], val[k])) rc = -1;
    st_result_free(held[k]);
  }
  return rc;
}

/* Runs body against a server of its own with config `config` serving
 * `eps` (a test of budgets, which needs a small one). 0 when it ran. */
static inline int pk_run_own_server(const char *config, const stt_endpoint_t *eps,
                                    void (*body)(stt_server_t *)) {
  stt_server_t s;
  stt_server_init(&s);
  stt_server_config(&s, config);
  stt_write_endpoints(&s, eps);
  return stt_server_run(&s, body);
}

#endif
