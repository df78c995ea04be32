/* src/engine: jobs (job.h). */
#include "engine/job.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "mem/pool.h"
#include "st/errors.h"

/* A new job holding a generation reference and a copy of the bound
 * args; see job.h. Loop thread. */
st__job_t *st__job_new(uint64_t conn_id, uint32_t request_id, st__generation_t *gen,
                       const st__endpoint_decl_t *ep, const char *args, size_t args_len) {
  st__job_t *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  j->args = malloc(args_len ? args_len : 1);
  if (!j->args) {
    free(j);
    return NULL;
  }
  if (args_len) memcpy(j->args, args, args_len);
  j->args_len = args_len;
  j->conn_id = conn_id;
  j->request_id = request_id;
  if (gen) st__generation_ref(gen);
  j->gen = gen;
  j->ep = ep;
  j->queued_at = st__now_mono();
  j->status = ST_OK;
  j->worker = -1;
  j->device = -1;
  j->cuda_device = -1;
  j->state = ST_JOB_QUEUED;
  pthread_mutex_init(&j->progress.mu, NULL);
  st__build_result_init(&j->result);
  return j;
}

/* A job of C code; see job.h. Loop thread. */
st__job_t *st__job_new_native(uint64_t conn_id, uint32_t request_id,
                              int (*run)(st__job_t *job, char *err, size_t errlen), void *ud,
                              void (*free_ud)(void *ud)) {
  st__job_t *j = st__job_new(conn_id, request_id, NULL, NULL, NULL, 0);
  if (!j) return NULL;
  j->run = run;
  j->ud = ud;
  j->free_ud = free_ud;
  return j;
}

/* Frees a job and everything it owns; see job.h. */
void st__job_free(st__job_t *job) {
  if (!job) return;
  st__build_result_destroy(&job->result);
  free(job->result_args);
  st__targs_clear(&job->targs);
  st__mpool_close(job->alloc_pool);
  free(job->args);
  if (job->gen) st__generation_unref(job->gen);
  if (job->free_ud) job->free_ud(job->ud);
  pthread_mutex_destroy(&job->progress.mu);
  free(job);
}

/* Sets the cancel flag (atomic store). Any thread. */
void st__job_cancel(st__job_t *job) {
  __atomic_store_n(&job->cancel, 1, __ATOMIC_RELAXED);
}

/* Acquire load of the state the worker published. Any thread. */
st__job_state_t st__job_state(const st__job_t *job) {
  return (st__job_state_t)__atomic_load_n(&job->state, __ATOMIC_ACQUIRE);
}

/* Worker thread that runs the job. */
void st__progress_set(st__progress_t *p, double fraction, const char *note, size_t note_len) {
  if (!(fraction >= 0)) fraction = 0;
  if (fraction > 1) fraction = 1;
  if (note && note_len > ST_PROGRESS_NOTE_MAX) note_len = ST_PROGRESS_NOTE_MAX;
  pthread_mutex_lock(&p->mu);
  p->set = 1;
  p->fraction = fraction;
  if (note) {
    memcpy(p->note, note, note_len);
    p->note[note_len] = '\0';
    p->has_note = 1;
  }
  pthread_mutex_unlock(&p->mu);
}

/* Any thread; copies under the lock. */
int st__progress_get(st__progress_t *p, st__progress_t *out) {
  pthread_mutex_lock(&p->mu);
  out->set = p->set;
  out->fraction = p->fraction;
  out->has_note = p->has_note;
  memcpy(out->note, p->note, sizeof out->note);
  pthread_mutex_unlock(&p->mu);
  return out->set;
}
