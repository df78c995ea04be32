/* bench/soak: what the soak driver (soak.c) and its client processes
 * (worker.c) share. The driver maps one sk_shared_t (MAP_SHARED, anonymous)
 * before it forks; each client process counts into its own slot with
 * atomics, so the figures of a process the driver SIGKILLs stay readable.
 * Benchmark code: failures print a message and exit. */
#ifndef ST_SOAK_H
#define ST_SOAK_H

#include <stdatomic.h>
#include <sys/types.h>

#define SK_NERR 32      /* error counters by code: -ST_ERR_* < SK_NERR */
#define SK_NHIST 256    /* ping latency buckets, 8 per octave of microseconds */

/* The kinds of operation a client thread picks from (the warm-up runs
 * them once each, in this order: a writer before its reader). */
typedef enum {
  SK_PING, SK_FRESH, SK_CACHED, SK_LEASE, SK_TARG, SK_TASK, SK_INVALIDATE, SK_PUT, SK_GET,
  SK_LIVE_PUB, SK_LIVE_READ, SK_BUF_WRITE, SK_BUF_READ, SK_HANDOFF, SK_CUDA, SK_TARG_CUDA,
  SK_NOPS
} sk_op_t;

typedef enum { SK_FREE, SK_RUNNING, SK_KILLED, SK_EXITED } sk_state_t;

/* One client process. */
typedef struct sk_slot {
  atomic_int pid;
  atomic_int state;             /* sk_state_t */
  atomic_long sent;             /* requests sent */
  atomic_long answered;         /* replies (results or errors) received */
  atomic_long lost;             /* requests of this live process with no reply */
  atomic_long wrong;            /* replies whose values were not what was asked */
  atomic_long local;            /* waits, reads and writes of shared pages (no request) */
  atomic_long ops[SK_NOPS];
  atomic_long errors[SK_NERR];  /* error replies by -code */
  atomic_long ping_hist[SK_NHIST];
  atomic_int threads_up;        /* threads connected at least once */
  int use_cuda;                 /* set by the driver: run the CUDA operations */
} sk_slot_t;

/* The options the workers need (the driver's flags). */
typedef struct sk_opts {
  char socket[320];
  int conns_per_proc;
  int think_ms;                 /* mean pause between two operations */
  int cuda;                     /* 1: the server has a CUDA device */
  int cuda_procs;               /* client processes that run CUDA operations */
  int warmup;                   /* 1: one thread runs each operation once */
} sk_opts_t;

typedef struct sk_shared {
  atomic_int stop;              /* 1: workers finish their operation and exit */
  int nslots;
  sk_opts_t opts;
  sk_slot_t slots[];
} sk_shared_t;

/* Runs client process `slot`: conns_per_proc threads, one connection each,
 * until sh->stop. Never returns (exits 0, or 1 when it could not start). */
void sk_worker_main(sk_shared_t *sh, int slot) __attribute__((noreturn));

/* Bucket of a latency in microseconds, and the upper bound of a bucket. */
int sk_hist_bucket(double us);
double sk_hist_upper(int bucket);

#endif
