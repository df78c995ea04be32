/* src/engine: the workers.
 *
 * N threads take jobs from one locked queue (mutex + condition variable),
 * run them in their own Lua state, and push them onto a completion queue
 * (its own mutex). After each push the workers call `notify` (the server
 * passes a function that does ev_async_send), and the loop thread drains the
 * completion queue with st__workers_take_done.
 *
 * Thread ownership:
 *  - st__workers_start / submit / set_generation / take_done / shutdown /
 *    free are called by the loop thread (one owner thread).
 *  - Worker threads own their st__vm_t; nothing else touches it. A worker
 *    keeps one state for the generation of the last job it ran: when a job
 *    of another generation arrives (after a reload) it frees the old state
 *    and builds one for the job's generation. An idle worker also rebuilds
 *    eagerly after st__workers_set_generation, so the old generation is freed
 *    as soon as its last job ends and the first call after a reload does
 *    not pay for compiling.
 *  - Workers block every signal: signals are the loop thread's.
 */
#ifndef ST_ENGINE_WORKERS_H
#define ST_ENGINE_WORKERS_H

#include <stddef.h>
#include <stdint.h>

#include "engine/generation.h"
#include "engine/job.h"

typedef struct st__workers st__workers_t;

/* How a worker runs endpoint code. The engine does not depend on the Lua
 * module: the server passes src/lua's functions (st__vm_new, st__vm_free,
 * st__vm_generation, st__vm_build; see lua/st_lua.h for their contracts),
 * and unit tests may pass their own. */
typedef struct st__vm st__vm_t;

/* Limits of each worker's state (config.lua `limits`, docs/operations.md),
 * given to every vm_new. */
typedef struct st__vm_limits {
  uint64_t lua_memory_bytes;  /* bytes one state's Lua heap may hold; 0 = none */
  double default_timeout_s;   /* the timeout of an endpoint that declares none;
                                 0 = none */
} st__vm_limits_t;

typedef struct st__workers_runner {
  int (*vm_new)(st__generation_t *gen, int worker_id, const st__vm_limits_t *limits,
                st__vm_t **out, char *err, size_t errlen);
  void (*vm_free)(st__vm_t *vm);
  st__generation_t *(*vm_generation)(const st__vm_t *vm);
  int (*vm_build)(st__vm_t *vm, const st__endpoint_decl_t *ep, const char *args,
                  size_t args_len, const volatile int *cancel, st__progress_t *progress,
                  st__build_result_t *res, char *err, size_t errlen);
  st__vm_limits_t limits;     /* passed to each vm_new */
} st__workers_runner_t;

/* Tells a worker's state about the next job right before its vm_build:
 * where it builds (job.h: device and cuda_device) and its tensor arguments
 * (job->targs, mapped by then); the server passes st__vm_prepare. */
typedef void (*st__workers_prepare_fn)(st__vm_t *vm, const st__job_t *job);

/* Called by a worker after it pushed a completion for `home` (job.h);
 * must be async-safe with respect to the loops (ev_async_send is). */
typedef void (*st__workers_notify_fn)(void *ud, int home);

/* Starts `nworkers` threads (1..1024) that run jobs with `runner` (copied).
 * `gen` (may be NULL) is the current generation: the workers take a
 * reference and workers build their states for it before the first job
 * arrives. On success *out is owned by the caller (st__workers_free). ST_OK,
 * ST_ERR_INVALID_ARGUMENT or ST_ERR_OUT_OF_MEMORY (with a reason in err).
 * Loop thread. */
int st__workers_start(int nworkers, const st__workers_runner_t *runner, st__generation_t *gen,
                   st__workers_notify_fn notify, void *ud, st__workers_t **out, char *err,
                   size_t errlen);

/* Sets the function workers call right before each vm_build (NULL: none,
 * the default). Call before the first submit. Loop thread. */
void st__workers_set_prepare_fn(st__workers_t *p, st__workers_prepare_fn fn);

/* Queues a job; the workers own it from now on. ST_OK, or
 * ST_ERR_SHUTTING_DOWN after st__workers_shutdown (the caller keeps the job).
 * Loop thread. */
int st__workers_submit(st__workers_t *p, st__job_t *job);

/* Takes a job that is still waiting in the queue back out of it: returns
 * 1 when it was there (the caller owns it again and it counts as
 * outstanding no more), 0 when a worker already took it (it runs or ran
 * and comes back through st__workers_take_done). Loop thread. */
int st__workers_remove(st__workers_t *p, st__job_t *job);

/* Makes `gen` the generation idle workers prepare for (takes a reference,
 * drops the previous one). Jobs always run on their own generation. Loop
 * thread. */
void st__workers_set_generation(st__workers_t *p, st__generation_t *gen);

/* Completions go back to `nhomes` queues (1..ST__WORKERS_MAX_HOMES; 1 at
 * start): a job's completion goes to queue job->home, and `notify` names
 * it. Before the first submit. Loop thread. */
#define ST__WORKERS_MAX_HOMES 256
int st__workers_set_homes(st__workers_t *p, int nhomes);

/* Takes every completed job of queue `home`, oldest first, as a list
 * linked by `next` (NULL if none). The caller owns them. The thread that
 * serves `home`. */
st__job_t *st__workers_take_done(st__workers_t *p, int home);

/* Jobs submitted and not yet taken back with st__workers_take_done: all of
 * them (home < 0), or those of one home. Any thread (a relaxed read). */
size_t st__workers_outstanding(st__workers_t *p, int home);

/* 1 when a completed job waits in queue `home`: a peek without the
 * completion lock, for a loop that polls instead of sleeping. Any
 * thread. */
int st__workers_done_pending(st__workers_t *p, int home);

/* A worker that just ran a job polls the queue for up to spin_s seconds
 * before it sleeps (one worker at a time; 0, the default: never), so
 * that the next job starts without a thread wake-up. Loop thread. */
void st__workers_set_spin(st__workers_t *p, double spin_s);

/* Sets the cancel flag of every queued and running job. Loop thread. */
void st__workers_cancel_all(st__workers_t *p);

/* Stops taking jobs: st__workers_submit fails from now on. Workers finish the
 * job they run and every queued one, then exit. Does not wait. Loop
 * thread. */
void st__workers_shutdown(st__workers_t *p);

/* Waits up to `timeout_s` for the workers to exit (shutting down first if
 * needed), then frees the workers and every job they still hold (their results
 * are destroyed). Returns the number of workers that did not exit in time
 * (their threads are left running, the workers are then leaked on purpose so
 * that they never touch freed memory; the process is about to exit).
 * Loop thread. */
int st__workers_free(st__workers_t *p, double timeout_s);

/* Number of worker threads. */
int st__workers_size(const st__workers_t *p);

/* Jobs run to completion, per status, since start (for info). */
void st__workers_stats(st__workers_t *p, uint64_t *done, uint64_t *failed);

#endif
