/* src/engine: the workers (workers.h).
 *
 * Locks: `mu` guards the job queue, `stopping`, `current` and each worker's
 * `job`; `done_mu` guards the completion queues (one per home: the loop
 * thread that takes a job's completion, job.h). A worker never holds both,
 * and never holds either while it runs Lua. `qhead`, `stopping` and each
 * completion queue's head are written under their lock with atomic
 * stores, so that a spinning worker (qhead, stopping) and a loop (a head,
 * through st__workers_done_pending) may peek at them without it.
 *
 * Spinning (st__workers_set_spin): a worker that just ran a job polls the
 * queue for up to the spin time before it sleeps on `cv`, one such worker
 * at a time (`spinners`); st__workers_submit skips the condition signal
 * when the queue was empty and a spinner polls, since the spinner takes
 * the job. Every spinner looks at the queue under `mu` after it stopped
 * polling, so no job waits for a signal that was skipped.
 */
#include "engine/workers.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/spin.h"
#include "mem/pool.h"
#include "st/errors.h"

typedef struct worker {
  struct st__workers *workers;
  int id;
  pthread_t thread;
  int started;
  int exited;                 /* under workers->mu */
  st__job_t *job;             /* the job it runs now; under workers->mu */
} worker_t;

struct st__workers {
  pthread_mutex_t mu;
  pthread_cond_t cv;          /* jobs queued, stop requested, new generation */
  pthread_cond_t exit_cv;     /* a worker exited */
  st__job_t *qhead, *qtail;
  int stopping;
  st__generation_t *current;  /* owned reference; may be NULL */

  pthread_mutex_t done_mu;
  struct done_queue {
    st__job_t *head, *tail;
    size_t outstanding;       /* submitted, not taken back (atomic) */
  } *done;                    /* nhomes queues (job->home) */
  int nhomes;

  double spin_s;               /* under mu; 0: workers never spin       */
  int spinners;               /* workers polling the queue (atomic)   */

  st__workers_notify_fn notify;
  void *ud;
  st__workers_runner_t run;
  st__workers_prepare_fn prepare;   /* under mu until the first job; may be NULL */

  size_t outstanding;         /* every home's (atomic) */
  uint64_t ndone, nfailed;    /* atomic */
  int nworkers;
  worker_t *workers;
};

/* Builds `vm` for gen on this worker, replacing the one it has. On failure
 * *vm is NULL and err says why. Worker thread, without locks. */
static int switch_vm(worker_t *w, st__vm_t **vm, st__generation_t *gen, char *err,
                     size_t errlen) {
  w->workers->run.vm_free(*vm);
  *vm = NULL;
  int rc = w->workers->run.vm_new(gen, w->id, &w->workers->run.limits, vm, err, errlen);
  if (rc != ST_OK) *vm = NULL;
  return rc;
}

/* Runs one job to completion, filling its completion fields. Worker
 * thread, without locks. */
static void run_job(worker_t *w, st__vm_t **vm, st__job_t *job) {
  job->worker = w->id;
  job->started_at = st__now_mono();
  job->started_unix = st__now_unix();
  __atomic_store_n(&job->state, ST_JOB_RUNNING, __ATOMIC_RELEASE);
  if (__atomic_load_n(&job->cancel, __ATOMIC_RELAXED)) {
    job->status = ST_ERR_CANCELLED;
    snprintf(job->error, sizeof job->error, "cancelled before it started");
  } else if (job->run) {
    job->error[0] = '\0';
    job->status = job->run(job, job->error, sizeof job->error);
    if (job->status != ST_OK && !job->error[0])
      snprintf(job->error, sizeof job->error, "%s", st_strerror(job->status));
  } else {
    int rc = ST_OK;
    if (!*vm || w->workers->run.vm_generation(*vm) != job->gen) {
      char why[768];
      rc = switch_vm(w, vm, job->gen, why, sizeof why);
      if (rc != ST_OK) {
        snprintf(job->error, sizeof job->error, "worker %d could not load generation %llu: %s",
                 w->id, (unsigned long long)job->gen->number, why);
        job->status = rc;
      }
    }
    if (rc == ST_OK) {
      /* Tensor arguments are imported here, not on the loop thread: a CUDA
       * import talks to the driver (and its mapping is made when the
       * body's tensors are, on this thread too). */
      job->error[0] = '\0';
      rc = st__targs_import(&job->targs, job->error, sizeof job->error);
      if (rc != ST_OK) job->status = rc;
    }
    if (rc == ST_OK) {
      if (w->workers->prepare) w->workers->prepare(*vm, job);
      job->status = w->workers->run.vm_build(*vm, job->ep, job->args, job->args_len, &job->cancel,
                                          &job->progress, &job->result, job->error,
                                          sizeof job->error);
      st__mpool_use(NULL);   /* the prepare hook may have made the job's pool current */
      if (job->status != ST_OK && !job->error[0])
        snprintf(job->error, sizeof job->error, "%s", st_strerror(job->status));
    }
  }
  /* The body's tensors and the result hold their own references: the
   * client's memory is not kept for the job's sake. What of the result is
   * an argument is noted first: its caller is answered by reference. */
  if (job->status == ST_OK) job->result_args = st__targs_match_result(&job->targs, &job->result);
  st__targs_clear(&job->targs);
  job->finished_at = st__now_mono();
  __atomic_store_n(&job->state, ST_JOB_DONE, __ATOMIC_RELEASE);
  if (job->status == ST_OK) __atomic_add_fetch(&w->workers->ndone, 1, __ATOMIC_RELAXED);
  else __atomic_add_fetch(&w->workers->nfailed, 1, __ATOMIC_RELAXED);
}

static void push_done(st__workers_t *p, st__job_t *job) {
  job->next = NULL;
  struct done_queue *q = &p->done[job->home];
  pthread_mutex_lock(&p->done_mu);
  if (q->tail) q->tail->next = job;
  else __atomic_store_n(&q->head, job, __ATOMIC_RELEASE);
  q->tail = job;
  pthread_mutex_unlock(&p->done_mu);
  p->notify(p->ud, job->home);
}

/* An idle worker should (re)build its state when the workers have a current
 * generation its state is not for, unless that very generation already
 * failed to build here (then the next job reports the error). */
static int wants_refresh(const st__workers_t *p, st__vm_t *vm, uint64_t failed_number) {
  if (!p->current) return 0;
  if (vm && p->run.vm_generation(vm) == p->current) return 0;
  return failed_number != p->current->number;
}

/* Polls the queue for up to `spin_s` seconds unless another worker polls
 * already; returns when a job is queued, the workers stop or time is up.
 * Worker thread, without locks: the caller looks again under mu. */
static void spin_for_job(st__workers_t *p, double spin_s) {
  if (__atomic_fetch_add(&p->spinners, 1, __ATOMIC_ACQ_REL) == 0) {
    double deadline = st__now_mono() + spin_s;
    for (unsigned i = 1;; i++) {
      if (__atomic_load_n(&p->qhead, __ATOMIC_ACQUIRE) ||
          __atomic_load_n(&p->stopping, __ATOMIC_ACQUIRE))
        break;
      st__cpu_relax();
      if ((i & 31) == 0 && st__now_mono() > deadline) break;
    }
  }
  __atomic_fetch_sub(&p->spinners, 1, __ATOMIC_ACQ_REL);
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  st__workers_t *p = w->workers;
  st__vm_t *vm = NULL;
  uint64_t failed_number = 0;   /* generation numbers start at 1 */
  int just_ran = 0;             /* spin before the next wait */
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->qhead && !p->stopping && !wants_refresh(p, vm, failed_number)) {
      if (just_ran && p->spin_s > 0) {
        double spin_s = p->spin_s;
        just_ran = 0;
        pthread_mutex_unlock(&p->mu);
        spin_for_job(p, spin_s);
        pthread_mutex_lock(&p->mu);
        continue;
      }
      pthread_cond_wait(&p->cv, &p->mu);
    }
    if (p->qhead) {
      st__job_t *job = p->qhead;
      __atomic_store_n(&p->qhead, job->next, __ATOMIC_RELEASE);
      if (!p->qhead) p->qtail = NULL;
      job->next = NULL;
      w->job = job;
      pthread_mutex_unlock(&p->mu);
      run_job(w, &vm, job);
      pthread_mutex_lock(&p->mu);
      w->job = NULL;
      pthread_mutex_unlock(&p->mu);
      push_done(p, job);
      just_ran = 1;
      pthread_mutex_lock(&p->mu);
      continue;
    }
    if (p->stopping) break;
    /* Idle and the current generation changed: prepare for it. */
    st__generation_t *gen = p->current;
    st__generation_ref(gen);
    pthread_mutex_unlock(&p->mu);
    char err[512];
    if (switch_vm(w, &vm, gen, err, sizeof err) != ST_OK) {
      failed_number = gen->number;
      ST_LOG_E("worker", "worker %d: generation %llu: %s", w->id,
               (unsigned long long)gen->number, err);
    }
    st__generation_unref(gen);
    pthread_mutex_lock(&p->mu);
  }
  pthread_mutex_unlock(&p->mu);
  if (vm) p->run.vm_free(vm);
  pthread_mutex_lock(&p->mu);
  w->exited = 1;
  pthread_cond_broadcast(&p->exit_cv);
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

/* Starts the workers; see workers.h. Loop thread. */
int st__workers_start(int nworkers, const st__workers_runner_t *runner, st__generation_t *gen,
                   st__workers_notify_fn notify, void *ud, st__workers_t **out, char *err,
                   size_t errlen) {
  *out = NULL;
  if (!runner || !runner->vm_new || !runner->vm_free || !runner->vm_generation ||
      !runner->vm_build || !notify) {
    snprintf(err, errlen, "incomplete workers runner");
    return ST_ERR_INVALID_ARGUMENT;
  }
  if (nworkers < 1 || nworkers > 1024) {
    snprintf(err, errlen, "workers must be between 1 and 1024 (got %d)", nworkers);
    return ST_ERR_INVALID_ARGUMENT;
  }
  st__workers_t *p = calloc(1, sizeof *p);
  worker_t *ws = calloc((size_t)nworkers, sizeof *ws);
  struct done_queue *dq = calloc(1, sizeof *dq);
  if (!p || !ws || !dq) {
    free(p);
    free(ws);
    free(dq);
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_mutex_init(&p->done_mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  pthread_cond_init(&p->exit_cv, NULL);
  p->notify = notify;
  p->ud = ud;
  p->done = dq;
  p->nhomes = 1;
  p->run = *runner;
  p->workers = ws;
  p->nworkers = nworkers;
  if (gen) {
    st__generation_ref(gen);
    p->current = gen;
  }
  /* Threads inherit the creator's mask: block everything while creating
   * them so that signals always go to the loop thread. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = ST_OK;
  for (int i = 0; i < nworkers; i++) {
    ws[i].workers = p;
    ws[i].id = i;
    int e = pthread_create(&ws[i].thread, NULL, worker_main, &ws[i]);
    if (e != 0) {
      snprintf(err, errlen, "cannot start worker %d: %s", i, strerror(e));
      rc = ST_ERR_OUT_OF_MEMORY;
      break;
    }
    ws[i].started = 1;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != ST_OK) {
    st__workers_free(p, 30.0);
    return rc;
  }
  *out = p;
  return ST_OK;
}

/* The per-job hook; see workers.h. Loop thread. Workers read it only after
 * taking a job under mu, which orders them after this store. */
void st__workers_set_prepare_fn(st__workers_t *p, st__workers_prepare_fn fn) {
  pthread_mutex_lock(&p->mu);
  p->prepare = fn;
  pthread_mutex_unlock(&p->mu);
}

/* See workers.h. Loop thread. */
int st__workers_set_homes(st__workers_t *p, int nhomes) {
  if (nhomes < 1 || nhomes > ST__WORKERS_MAX_HOMES) return ST_ERR_INVALID_ARGUMENT;
  if (nhomes == p->nhomes) return ST_OK;
  struct done_queue *dq = calloc((size_t)nhomes, sizeof *dq);
  if (!dq) return ST_ERR_OUT_OF_MEMORY;
  pthread_mutex_lock(&p->done_mu);
  struct done_queue *old = p->done;
  p->done = dq;
  p->nhomes = nhomes;
  pthread_mutex_unlock(&p->done_mu);
  free(old);
  return ST_OK;
}

/* Queues a job (the workers own it on ST_OK). Loop thread. */
int st__workers_submit(st__workers_t *p, st__job_t *job) {
  job->next = NULL;
  if (job->home < 0 || job->home >= p->nhomes) job->home = 0;
  pthread_mutex_lock(&p->mu);
  if (p->stopping) {
    pthread_mutex_unlock(&p->mu);
    return ST_ERR_SHUTTING_DOWN;
  }
  int was_empty = !p->qhead;
  if (p->qtail) p->qtail->next = job;
  else __atomic_store_n(&p->qhead, job, __ATOMIC_RELEASE);
  p->qtail = job;
  __atomic_add_fetch(&p->outstanding, 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&p->done[job->home].outstanding, 1, __ATOMIC_RELAXED);
  /* A polling worker takes the only queued job without a wake-up. */
  if (!was_empty || !__atomic_load_n(&p->spinners, __ATOMIC_ACQUIRE))
    pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
  return ST_OK;
}

/* Unlinks a job that no worker took yet. Loop thread. */
int st__workers_remove(st__workers_t *p, st__job_t *job) {
  int found = 0;
  pthread_mutex_lock(&p->mu);
  st__job_t *prev = NULL;
  for (st__job_t *j = p->qhead; j; prev = j, j = j->next) {
    if (j != job) continue;
    if (prev) prev->next = j->next;
    else __atomic_store_n(&p->qhead, j->next, __ATOMIC_RELEASE);
    if (p->qtail == j) p->qtail = prev;
    j->next = NULL;
    __atomic_sub_fetch(&p->outstanding, 1, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&p->done[j->home].outstanding, 1, __ATOMIC_RELAXED);
    found = 1;
    break;
  }
  pthread_mutex_unlock(&p->mu);
  return found;
}

/* New current generation for idle workers. Loop thread. */
void st__workers_set_generation(st__workers_t *p, st__generation_t *gen) {
  if (gen) st__generation_ref(gen);
  pthread_mutex_lock(&p->mu);
  st__generation_t *old = p->current;
  p->current = gen;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  if (old) st__generation_unref(old);
}

/* Takes the completed jobs of one home, oldest first; see workers.h. */
st__job_t *st__workers_take_done(st__workers_t *p, int home) {
  struct done_queue *q = &p->done[home];
  pthread_mutex_lock(&p->done_mu);
  st__job_t *list = q->head;
  __atomic_store_n(&q->head, NULL, __ATOMIC_RELAXED);
  q->tail = NULL;
  pthread_mutex_unlock(&p->done_mu);
  size_t n = 0;
  for (st__job_t *j = list; j; j = j->next) n++;
  __atomic_sub_fetch(&p->outstanding, n, __ATOMIC_RELAXED);
  __atomic_sub_fetch(&q->outstanding, n, __ATOMIC_RELAXED);
  return list;
}

/* Jobs submitted and not yet taken back; see workers.h. */
size_t st__workers_outstanding(st__workers_t *p, int home) {
  return __atomic_load_n(home < 0 ? &p->outstanding : &p->done[home].outstanding,
                         __ATOMIC_RELAXED);
}

/* Whether a completion waits in queue `home`, without the lock; see
 * workers.h. */
int st__workers_done_pending(st__workers_t *p, int home) {
  return __atomic_load_n(&p->done[home].head, __ATOMIC_ACQUIRE) != NULL;
}

/* How long a worker that just ran a job polls for the next; see workers.h.
 * Loop thread. */
void st__workers_set_spin(st__workers_t *p, double spin_s) {
  pthread_mutex_lock(&p->mu);
  p->spin_s = spin_s > 0 ? spin_s : 0;
  pthread_mutex_unlock(&p->mu);
}

/* Cancels every queued and running job. Loop thread. */
void st__workers_cancel_all(st__workers_t *p) {
  pthread_mutex_lock(&p->mu);
  for (st__job_t *j = p->qhead; j; j = j->next) st__job_cancel(j);
  for (int i = 0; i < p->nworkers; i++)
    if (p->workers[i].job) st__job_cancel(p->workers[i].job);
  pthread_mutex_unlock(&p->mu);
}

/* Refuses new jobs; workers drain the queue and exit. Loop thread. */
void st__workers_shutdown(st__workers_t *p) {
  pthread_mutex_lock(&p->mu);
  __atomic_store_n(&p->stopping, 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

/* Waits for the workers and frees them; see workers.h. Loop thread. */
int st__workers_free(st__workers_t *p, double timeout_s) {
  if (!p) return 0;
  st__workers_shutdown(p);
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  double whole = (double)(long)timeout_s;
  deadline.tv_sec += (time_t)whole;
  deadline.tv_nsec += (long)((timeout_s - whole) * 1e9);
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec++;
    deadline.tv_nsec -= 1000000000L;
  }
  int stuck = 0;
  pthread_mutex_lock(&p->mu);
  for (int i = 0; i < p->nworkers; i++) {
    if (!p->workers[i].started) continue;
    while (!p->workers[i].exited) {
      if (pthread_cond_timedwait(&p->exit_cv, &p->mu, &deadline) == ETIMEDOUT) break;
    }
    if (!p->workers[i].exited) stuck++;
  }
  pthread_mutex_unlock(&p->mu);
  if (stuck) return stuck;   /* leaked on purpose: see workers.h */
  for (int i = 0; i < p->nworkers; i++)
    if (p->workers[i].started) pthread_join(p->workers[i].thread, NULL);
  st__job_t *j = p->qhead;
  while (j) {
    st__job_t *next = j->next;
    st__job_free(j);
    j = next;
  }
  for (int h = 0; h < p->nhomes; h++) {
    j = p->done[h].head;
    while (j) {
      st__job_t *next = j->next;
      st__job_free(j);
      j = next;
    }
  }
  free(p->done);
  if (p->current) st__generation_unref(p->current);
  pthread_mutex_destroy(&p->mu);
  pthread_mutex_destroy(&p->done_mu);
  pthread_cond_destroy(&p->cv);
  pthread_cond_destroy(&p->exit_cv);
  free(p->workers);
  free(p);
  return 0;
}

/* Number of workers. */
int st__workers_size(const st__workers_t *p) {
  return p->nworkers;
}

/* Completed and failed job counts. Any thread. */
void st__workers_stats(st__workers_t *p, uint64_t *done, uint64_t *failed) {
  *done = __atomic_load_n(&p->ndone, __ATOMIC_RELAXED);
  *failed = __atomic_load_n(&p->nfailed, __ATOMIC_RELAXED);
}
