/* src/server/live_stage.c: see live_stage.h. */
#include "server/live_stage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudadrv/driver.h"
#include "engine/workers.h"
#include "mem/arena.h"
#include "st/errors.h"

typedef struct stage_in {
  st__arena_t **src;          /* references, held for the copy */
  size_t n;
  st__live_staged_fn done;
} stage_in_t;

static void in_free(void *ud) {
  stage_in_t *in = ud;
  for (size_t i = 0; i < in->n; i++) st__arena_unref(in->src[i]);
  free(in->src);
  free(in);
}

/* The worker: one new arena per source arena, the bytes copied. */
static int stage_run(st__job_t *job, char *err, size_t errlen) {
  stage_in_t *in = job->ud;
  job->result.arenas = calloc(in->n ? in->n : 1, sizeof *job->result.arenas);
  if (!job->result.arenas) {
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  for (size_t i = 0; i < in->n; i++) {
    if (__atomic_load_n(&job->cancel, __ATOMIC_RELAXED)) {
      snprintf(err, errlen, "cancelled");
      return ST_ERR_CANCELLED;
    }
    st__arena_t *a = in->src[i];
    int dev = st__arena_device(a);
    uint64_t bytes = st__arena_bytes(a);
    char why[400];
    void *from = NULL;
    int rc = st__arena_map(a, &from, why, sizeof why);
    st__arena_t *copy = NULL;
    st__arena_spec_t spec = {.device = dev, .bytes = bytes};
    if (rc == ST_OK) rc = st__arena_new(&spec, &copy, why, sizeof why);
    if (rc != ST_OK) {
      snprintf(err, errlen, "staging arena %zu of %zu (%llu bytes on %s): %s", i, in->n,
               (unsigned long long)bytes, dev >= 0 ? "cuda" : "cpu", why);
      return rc;
    }
    job->result.arenas[job->result.narenas++] = copy;
    job->result.bytes += bytes;
    void *to = st__arena_base(copy);
    if (dev >= 0)
      rc = st__cuda_copy_dtod((uint64_t)(uintptr_t)to, (uint64_t)(uintptr_t)from, bytes, dev, why,
                              sizeof why);
    else
      memcpy(to, from, bytes);
    if (rc != ST_OK) {
      snprintf(err, errlen, "staging arena %zu of %zu: the copy on cuda:%d: %s", i, in->n, dev,
               why);
      return rc;
    }
  }
  return ST_OK;
}

static void staged(void *ctx, st__job_t *job) {
  stage_in_t *in = job->ud;
  if (ctx) {
    if (job->status == ST_OK) {
      in->done(ctx, ST_OK, NULL, &job->result);   /* moves the references */
      st__build_result_init(&job->result);
    } else {
      in->done(ctx, job->status, job->error, NULL);
    }
  }
  st__job_free(job);   /* a copy nobody took goes with it */
}

int st__live_stage(st__server_t *srv, const st__build_result_t *src, st__live_staged_fn done,
                   void *ctx, st__job_t **job, char *err, size_t errlen) {
  *job = NULL;
  stage_in_t *in = calloc(1, sizeof *in);
  st__arena_t **refs = calloc(src->narenas ? src->narenas : 1, sizeof *refs);
  st__job_t *j = in && refs ? st__job_new_native(0, 0, stage_run, in, in_free) : NULL;
  if (!j) {
    free(in);
    free(refs);
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  for (size_t i = 0; i < src->narenas; i++) {
    st__arena_ref(src->arenas[i]);
    refs[i] = src->arenas[i];
  }
  in->src = refs;
  in->n = src->narenas;
  in->done = done;
  j->back_on_loop = staged;
  j->back_ctx = ctx;
  if (srv->shutting_down || !srv->workers || st__workers_submit(srv->workers, j) != ST_OK) {
    st__job_free(j);
    snprintf(err, errlen, "the server is shutting down");
    return ST_ERR_SHUTTING_DOWN;
  }
  *job = j;
  return ST_OK;
}

void st__live_stage_cancel(st__job_t *job) {
  if (!job) return;
  job->back_ctx = NULL;
  st__job_cancel(job);
}
