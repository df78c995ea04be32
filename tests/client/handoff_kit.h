/* Helpers of the hand-off tests (test_handoff.c, test_gpu_handoff.c): a
 * consumer in a process of its own, driven over two pipes, and the
 * server's figures that must come back when everything closed. */
#ifndef STT_HANDOFF_KIT_H
#define STT_HANDOFF_KIT_H

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
#include "proc.h"

enum { HK_TAKE = 1, HK_ACK = 2, HK_EXIT = 3 };

typedef struct hk_cmd {
  int op;
  int chunk;
  uint64_t seq;
  uint64_t sum;       /* HK_TAKE: the checksum the chunk must have */
  uint64_t bytes;
} hk_cmd_t;

typedef struct hk_consumer {
  pid_t pid;
  int to, from;       /* pipes: commands in, answers out */
  int slot;
} hk_consumer_t;

/* FNV-1a of n bytes. */
static inline uint64_t hk_sum(const void *p, uint64_t n) {
  const unsigned char *b = p;
  uint64_t h = 1469598103934665603ull;
  for (uint64_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* Fills n bytes at p (host memory) from seq. */
static inline void hk_fill(void *p, uint64_t n, uint64_t seq) {
  unsigned char *b = p;
  for (uint64_t i = 0; i < n; i++) b[i] = (unsigned char)((i * 31u + seq * 7u) >> 2);
}

static inline int hk_read_all(int fd, void *p, size_t n) {
  char *c = p;
  while (n) {
    ssize_t k = read(fd, c, n);
    if (k <= 0) return -1;
    c += k;
    n -= (size_t)k;
  }
  return 0;
}

/* The child: opens `name` on its own connection and answers commands.
 * TAKE reads the chunk and compares its checksum (1: a mismatch), ACK
 * acknowledges; every answer is the st_* return code. `host_copy` copies
 * a chunk to host memory first (CUDA), may be NULL. */
typedef int (*hk_copy_fn)(void *dst, const void *src, uint64_t n, int device_index);

static inline void hk_child(const char *socket, const char *name, int in, int out,
                            hk_copy_fn host_copy) {
  st_client_t *c = stt_client_open(socket);
  st_handoff_t *h = NULL;
  int slot = -2, dev = -1;
  if (c && st_handoff_open(c, name, &h) == ST_OK) st_handoff_shape(h, NULL, NULL, NULL, &slot, &dev);
  else if (c) fprintf(stderr, "consumer: open %s: %s\n", name, st_client_error(c));
  if (write(out, &slot, sizeof slot) != sizeof slot || !h) _exit(2);
  hk_cmd_t m;
  while (hk_read_all(in, &m, sizeof m) == 0) {
    int rc = ST_OK;
    if (m.op == HK_EXIT) break;
    if (m.op == HK_TAKE) {
      void *data;
      uint64_t bytes;
      rc = st_handoff_read(h, m.chunk, m.seq, 1000, &data, &bytes);
      if (rc == ST_OK && bytes != m.bytes) rc = 1;
      if (rc == ST_OK) {
        void *buf = data;
        if (host_copy) {
          buf = malloc(bytes ? bytes : 1);
          if (!buf || host_copy(buf, data, bytes, dev) != 0) rc = 2;
        }
        if (rc == ST_OK && hk_sum(buf, bytes) != m.sum) rc = 1;
        if (host_copy) free(buf);
      }
    } else if (m.op == HK_ACK) {
      rc = st_handoff_ack(h, m.chunk, m.seq);
    }
    if (rc < 0) fprintf(stderr, "consumer %d: %s\n", slot, st_handoff_error(h));
    if (write(out, &rc, sizeof rc) != sizeof rc) break;
  }
  st_handoff_close(h);
  st_client_close(c);
  _exit(0);
}

/* Starts a consumer process of hand-off `name`. With `self` (argv[0] of a
 * test whose main calls hk_consumer_main first) the child runs as a new
 * program, as a CUDA consumer must (a child forked from a process that
 * used the driver cannot use it); else it only forks. 0, or -1 (it did
 * not open: *k->slot says -2). */
static inline int hk_spawn_exec(hk_consumer_t *k, const char *socket, const char *name,
                                hk_copy_fn host_copy, const char *self);
static inline int hk_spawn(hk_consumer_t *k, const char *socket, const char *name,
                           hk_copy_fn host_copy) {
  return hk_spawn_exec(k, socket, name, host_copy, NULL);
}

/* In main of a test that spawns with `self`: runs the consumer when argv
 * says so (never returns then). */
static inline void hk_consumer_main(int argc, char **argv, hk_copy_fn host_copy) {
  if (argc == 6 && strcmp(argv[1], "--consumer") == 0)
    hk_child(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), host_copy);
}

static inline int hk_spawn_exec(hk_consumer_t *k, const char *socket, const char *name,
                                hk_copy_fn host_copy, const char *self) {
  int a[2], b[2];
  if (pipe(a) != 0 || pipe(b) != 0) return -1;
  fflush(NULL);
  k->pid = fork();
  if (k->pid < 0) return -1;
  if (k->pid == 0) {
    close(a[1]);
    close(b[0]);
    if (self) {
      char in[16], out[16];
      snprintf(in, sizeof in, "%d", a[0]);
      snprintf(out, sizeof out, "%d", b[1]);
      execl(self, self, "--consumer", socket, name, in, out, (char *)NULL);
      _exit(127);
    }
    hk_child(socket, name, a[0], b[1], host_copy);
  }
  close(a[0]);
  close(b[1]);
  k->to = a[1];
  k->from = b[0];
  if (hk_read_all(k->from, &k->slot, sizeof k->slot) != 0) k->slot = -2;
  return k->slot >= 0 ? 0 : -1;
}

/* Sends one command and returns the consumer's answer (-1000: it is gone). */
static inline int hk_do(hk_consumer_t *k, int op, int chunk, uint64_t seq, uint64_t sum,
                        uint64_t bytes) {
  hk_cmd_t m = {op, chunk, seq, sum, bytes};
  int rc;
  if (write(k->to, &m, sizeof m) != sizeof m || hk_read_all(k->from, &rc, sizeof rc) != 0)
    return -1000;
  return rc;
}

/* Ends a consumer: politely (HK_EXIT), or with SIGKILL. Returns its wait
 * status. */
static inline int hk_end(hk_consumer_t *k, int kill_it) {
  if (kill_it) {
    kill(k->pid, SIGKILL);
  } else {
    hk_cmd_t m = {HK_EXIT, 0, 0, 0, 0};
    if (write(k->to, &m, sizeof m) != sizeof m) kill(k->pid, SIGKILL);
  }
  int st = 0;
  waitpid(k->pid, &st, 0);
  close(k->to);
  close(k->from);
  return st;
}

/* info's integer at a.b[.c] on c, or -1 (stt_info_int). */
static inline int64_t hk_info(st_client_t *c, const char *a, const char *b, const char *d) {
  return stt_info_int(c, a, b, d);
}

/* What must come back once every hand-off closed. */
typedef struct hk_figures {
  int64_t fds, used, arenas;
} hk_figures_t;

static inline hk_figures_t hk_figures(st_client_t *c, pid_t server, const char *dev) {
  hk_figures_t f;
  /* info first, in that order (an initializer list's are unordered): it
   * waits for the server's queued releases, which close descriptors. */
  f.used = hk_info(c, "memory", dev, "used_bytes");
  f.arenas = hk_info(c, "arenas", "count", NULL);
  f.fds = stt_proc_fd_count(server);
  return f;
}

/* Polls until the figures are `want` again (5 s). 1 when they are. */
static inline int hk_back_to(st_client_t *c, pid_t server, const char *dev, hk_figures_t want) {
  double end = stt_now_ms() + 5000;
  for (;;) {
    hk_figures_t f = hk_figures(c, server, dev);
    if (f.fds == want.fds && f.used == want.used && f.arenas == want.arenas) return 1;
    if (stt_now_ms() > end) {
      fprintf(stderr, "   figures: fds %lld (want %lld), used %lld (%lld), arenas %lld (%lld)\n",
              (long long)f.fds, (long long)want.fds, (long long)f.used, (long long)want.used,
              (long long)f.arenas, (long long)want.arenas);
      return 0;
    }
    stt_sleep_ms(5);
  }
}

/* A server with `config` and `eps` and a client of it (stt_serve_client:
 * exits when it cannot connect); *base gets the CPU figures the tests
 * come back to. */
static inline st_client_t *hk_start(stt_server_t *s, const char *config,
                                    const stt_endpoint_t *eps, hk_figures_t *base) {
  st_client_t *c = stt_serve_client(s, config, eps);
  *base = hk_figures(c, s->pid, "cpu");
  return c;
}

#ifdef ST_HAVE_CUDA
#include "mem/cuda.h"

/* The start of a test of CUDA memory: skips (exit 77) without a usable
 * device, else a server of one worker and a client of it with a 60 s
 * timeout (NULL when it cannot connect). */
static inline st_client_t *hk_gpu_start(stt_server_t *s) {
  char err[512];
  uint64_t f;
  if (st__cuda_available(err, sizeof err) != ST_OK ||
      st__cuda_mem_info(0, &f, NULL, err, sizeof err) != ST_OK)
    stt_skip(err);
  return stt_one_worker_client(s, NULL);
}
#endif

#endif
