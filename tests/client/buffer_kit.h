/* Helpers of the buffer tests (test_buffer.c, test_gpu_buffer.c): frames
 * that carry their own checksum, and processes of their own that write or
 * read a buffer over their own connections and report through a pipe. */
#ifndef STT_BUFFER_KIT_H
#define STT_BUFFER_KIT_H

#include <signal.h>
#include <st/client.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_kit.h"
#include "fixture.h"

/* Fills a frame of n bytes (n % 8 == 0, n >= 16) for write number seq:
 * word 0 is seq, the last word the sum of the others times a prime. */
static inline void bk_fill(void *p, uint64_t n, uint64_t seq) {
  uint64_t *w = p, k = n / 8, sum = 0;
  w[0] = seq;
  for (uint64_t i = 1; i + 1 < k; i++) w[i] = seq * 0x9e3779b97f4a7c15ull + i;
  for (uint64_t i = 0; i + 1 < k; i++) sum += w[i];
  w[k - 1] = sum * 1099511628211ull;
}

/* 1 when the frame is whole, and (want != UINT64_MAX) of write `want`. */
static inline int bk_whole(const void *p, uint64_t n, uint64_t want) {
  const uint64_t *w = p;
  uint64_t k = n / 8, sum = 0;
  for (uint64_t i = 0; i + 1 < k; i++) sum += w[i];
  if (w[k - 1] != sum * 1099511628211ull) return 0;
  for (uint64_t i = 1; i + 1 < k; i++)
    if (w[i] != w[0] * 0x9e3779b97f4a7c15ull + i) return 0;
  return want == UINT64_MAX || w[0] == want;
}

static inline int bk_send(int out, const void *buf, size_t n) {
  return write(out, buf, n) == (ssize_t)n ? 0 : -1;
}

/* A child process with a pipe to read its report from. */
typedef struct bk_child {
  pid_t pid;
  int from;
} bk_child_t;

/* Forks fn(socket, name, arg, out) in a child (which _exits with fn's
 * value); the child writes its report to `out`. 0 or -1. */
typedef int (*bk_fn)(const char *socket, const char *name, long arg, int out);

/* Forks with a report pipe: in the child returns the pipe's write end
 * (>= 0), in the parent -2 (k filled), -1 on failure. */
static inline int bk_fork(bk_child_t *k) {
  int p[2];
  if (pipe(p) != 0) return -1;
  fflush(NULL);
  k->pid = fork();
  if (k->pid < 0) return -1;
  if (k->pid == 0) {
    close(p[0]);
    return p[1];
  }
  close(p[1]);
  k->from = p[0];
  return -2;
}

static inline int bk_spawn(bk_child_t *k, const char *socket, const char *name, long arg,
                           bk_fn fn) {
  int out = bk_fork(k);
  if (out >= 0) _exit(fn(socket, name, arg, out));
  return out == -2 ? 0 : -1;
}

/* Runs program `self` again in a child as `self --child ARG SOCKET NAME
 * FD` (FD: the report pipe), as a CUDA child must be (a process forked
 * from one that used the driver cannot use it). 0 or -1. */
static inline int bk_spawn_exec(bk_child_t *k, const char *self, const char *socket,
                                const char *name, long arg) {
  int out = bk_fork(k);
  if (out >= 0) {
    char a[24], fd[16];
    snprintf(a, sizeof a, "%ld", arg);
    snprintf(fd, sizeof fd, "%d", out);
    execl(self, self, "--child", a, socket, name, fd, (char *)NULL);
    _exit(127);
  }
  return out == -2 ? 0 : -1;
}

/* The end of a child: sends its report, closes its handle and client. 0. */
static inline int bk_finish(int out, const void *report, size_t n, st_buffer_t *b,
                            st_client_t *c) {
  bk_send(out, report, n);
  st_buffer_close(b);
  st_client_close(c);
  return 0;
}

/* Reads n bytes of the child's report (within the pipe's life). 0 or -1. */
static inline int bk_report(bk_child_t *k, void *buf, size_t n) {
  char *c = buf;
  while (n) {
    ssize_t r = read(k->from, c, n);
    if (r <= 0) return -1;
    c += r;
    n -= (size_t)r;
  }
  return 0;
}

/* Waits for the child (SIGKILL first with kill_it); its wait status. */
static inline int bk_end(bk_child_t *k, int kill_it) {
  if (kill_it) kill(k->pid, SIGKILL);
  int st = 0;
  waitpid(k->pid, &st, 0);
  close(k->from);
  return st;
}

#endif
