/* src/engine: one call of an endpoint, on its way from the loop thread to a
 * worker and back.
 *
 * Ownership and threads:
 *  - The loop thread creates a job (st__job_new), fills the request fields
 *    and hands it to the workers (st__workers_submit). From then on the workers own
 *    it: exactly one worker runs it and writes the completion fields.
 *  - The worker pushes the finished job onto the workers' completion queue;
 *    the loop thread takes it back (st__workers_take_done), replies if the
 *    connection still exists, and frees it with st__job_free.
 *  - `cancel` is the only field both sides touch while a job runs: the loop
 *    thread sets it (atomically) and the worker's Lua hook reads it.
 * A job names its connection by id, never by pointer: a connection may be
 * gone by the time the job completes.
 */
#ifndef ST_ENGINE_JOB_H
#define ST_ENGINE_JOB_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/generation.h"
#include "engine/result.h"
#include "engine/targs.h"

/* Longest note st.progress keeps (bytes, without the NUL). */
#define ST_PROGRESS_NOTE_MAX 200

/* What a running body reported with st.progress(fraction, note). The
 * worker writes it, the loop thread reads it (status, wait, tasks): both
 * under `mu`, which is held only to copy these few bytes. */
typedef struct st__progress {
  pthread_mutex_t mu;
  int set;                         /* st.progress was called */
  double fraction;                 /* in [0, 1] */
  int has_note;
  char note[ST_PROGRESS_NOTE_MAX + 1];
} st__progress_t;

/* Where a job is; written by the worker with a release store, read by the
 * loop thread with an acquire load. */
typedef enum {
  ST_JOB_QUEUED = 0,               /* in the workers' queue */
  ST_JOB_RUNNING = 1,              /* a worker took it (started_unix is set) */
  ST_JOB_DONE = 2                  /* finished (completion fields are set) */
} st__job_state_t;

typedef struct st__job {
  struct st__job *next;            /* link of whichever queue holds the job */

  /* request, written by the loop thread before submit, then read-only */
  uint64_t conn_id;                /* connection that asked; 0 = none */
  uint32_t request_id;
  st__generation_t *gen;           /* owned reference */
  const st__endpoint_decl_t *ep;   /* borrowed from gen */
  char *args;                      /* owned: bound msgpack map */
  size_t args_len;
  double queued_at;                /* monotonic seconds */
  int device;                      /* where the body builds by default: -1
                                      the CPU, N cuda:N (st__job_new: -1) */
  int cuda_device;                 /* what "cuda" names in the body: the
                                      socket's CUDA device, -1 none */
  int home;                        /* the completion queue it goes back to
                                      (workers.h: the loop thread that takes
                                      it; st__job_new: 0) */
  st__targs_t targs;               /* tensor arguments: descriptors moved in
                                      by the loop thread, mapped and dropped
                                      by the worker (targs.h) */

  volatile int cancel;             /* set by the loop thread (atomic store) */
  int state;                       /* st__job_state_t, atomic (see above) */
  st__progress_t progress;         /* st.progress of the body (locked) */
  struct st__mpool *alloc_pool;    /* owned reference or NULL: the pool the
                                      body's CPU arenas come from (the
                                      connection's, for builds that keep
                                      nothing; mem/pool.h) */
  void *owner;                     /* loop thread only: the server's record
                                      of this build (never touched here) */
  /* A job of C code instead of an endpoint body (st__job_new_native: gen
   * and ep NULL): the worker calls run(job, ...) in place of the body,
   * which fills `result` and returns ST_OK or an error with the message
   * in err. `ud` is run's input, freed by free_ud (may be NULL) with the
   * job. */
  int (*run)(struct st__job *job, char *err, size_t errlen);
  void *ud;
  void (*free_ud)(void *ud);
  /* Optional: who takes the job when it comes back (the loop thread
   * calls back_on_loop(back_ctx, job), which then owns it); NULL: the
   * server's own dispatch of builds, puts and views. */
  void (*back_on_loop)(void *back_ctx, struct st__job *job);
  void *back_ctx;

  /* completion, written by the worker before it pushes the job back */
  int status;                      /* ST_OK or a negative ST_ERR_* */
  char error[1024];                /* message when status != ST_OK */
  st__build_result_t result;       /* owned when status == ST_OK */
  uint32_t *result_args;           /* owned or NULL: per arena of `result`,
                                      1 + the index of the tensor argument
                                      it is, else 0 (st__targs_match_result) */
  int worker;                      /* index of the worker that ran it */
  double started_at, finished_at;  /* monotonic seconds */
  double started_unix;             /* wall clock, written before state RUNNING */
} st__job_t;

/* Creates a job for `ep` of `gen`: takes a new reference on gen and copies
 * `args` (the bound map). Returns NULL when out of memory. Loop thread. */
st__job_t *st__job_new(uint64_t conn_id, uint32_t request_id, st__generation_t *gen,
                       const st__endpoint_decl_t *ep, const char *args, size_t args_len);

/* A job of C code (see `run` above) that owns ud. NULL when out of
 * memory (ud is then the caller's). Loop thread. */
st__job_t *st__job_new_native(uint64_t conn_id, uint32_t request_id,
                              int (*run)(st__job_t *job, char *err, size_t errlen), void *ud,
                              void (*free_ud)(void *ud));

/* Destroys the result (dropping its arena references), the args, the
 * generation reference and a native job's ud, then the job. NULL is a no-op. Any thread that owns
 * the job. */
void st__job_free(st__job_t *job);

/* Asks a queued or running job to stop (the body sees ST_ERR_CANCELLED at
 * its next hook check). Any thread. */
void st__job_cancel(st__job_t *job);

/* Current state of a job (acquire load). Any thread. */
st__job_state_t st__job_state(const st__job_t *job);

/* Records a progress report: fraction in [0, 1] (clamped), note NULL (the
 * previous note stays) or a string cut to ST_PROGRESS_NOTE_MAX bytes.
 * Worker thread that runs the job. */
void st__progress_set(st__progress_t *p, double fraction, const char *note, size_t note_len);

/* Copies the last report into *out (out->mu is not touched). Returns
 * nonzero when st.progress was called at least once. Any thread. */
int st__progress_get(st__progress_t *p, st__progress_t *out);

#endif
