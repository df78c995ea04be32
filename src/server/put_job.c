/* src/server: a put's per-tensor work on a worker (put_job.h). Loop
 * thread only, but put_run (a worker) and st__put_adopt (any thread). */
#include "server/put_job.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fail.h"
#include "common/log.h"
#include "engine/workers.h"
#include "st/errors.h"

/* Two descriptors of one memfd are one allocation too: refused, never
 * charged twice to the budget and the quotas. One fstat per arena, then
 * pairs of numbers (at most ST_MAX_FDS_PER_MESSAGE arenas). */
static int distinct_files(const st__targs_t *t, char *err, size_t errlen) {
  uint64_t dev[ST_MAX_FDS_PER_MESSAGE], ino[ST_MAX_FDS_PER_MESSAGE];
  int has[ST_MAX_FDS_PER_MESSAGE];
  size_t n = t->n < ST_MAX_FDS_PER_MESSAGE ? t->n : ST_MAX_FDS_PER_MESSAGE;
  for (size_t i = 0; i < n; i++) {
    has[i] = st__arena_file_id(t->arenas[i], &dev[i], &ino[i]);
    for (size_t k = 0; has[i] && k < i; k++)
      if (has[k] && dev[k] == dev[i] && ino[k] == ino[i])
        return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                        "arenas[%zu] names the same allocation as arenas[%zu] (two descriptors "
                        "of one memory file)", i, k);
  }
  return ST_OK;
}

/* See put_job.h. Any thread that owns t. */
int st__put_adopt(st__targs_t *t, const msgpack_object *value, st__build_result_t *out, char *err,
                  size_t errlen) {
  st__param_t p = {.name = "value", .type = ST_PARAM_ANY};
  size_t ntensors = 0;
  int rc = st__targs_check(t, &p, value, &ntensors, err, errlen);
  if (rc != ST_OK) return rc;
  size_t n = t ? t->n : 0;
  for (size_t i = 0; i < n; i++)
    for (size_t k = 0; k < i; k++)
      if (t->srcs[i] == t->srcs[k])
        return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                        "arenas[%zu] names the same allocation as arenas[%zu]", i, k);
  if (n && (rc = st__targs_import(t, err, errlen)) != ST_OK) return rc;
  if (n && (rc = distinct_files(t, err, errlen)) != ST_OK) return rc;
  msgpack_packer pk;
  msgpack_packer_init(&pk, &out->value, msgpack_sbuffer_write);
  msgpack_pack_object(&pk, *value);
  if (n && !(out->arenas = calloc(n, sizeof *out->arenas)))
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  for (size_t i = 0; i < n; i++) {
    st__arena_ref(t->arenas[i]);
    out->arenas[i] = t->arenas[i];
    out->bytes += st__arena_bytes(t->arenas[i]);
  }
  out->narenas = n;
  return ST_OK;
}

/* See put_job.h. */
int st__put_work_fits(const st__put_work_t *w, const st__key_t *live) {
  if (!w) return 0;
  if (!live) return !w->take;
  return w->take && w->page == live->page_arena;
}

/* Whether v has more objects than *left: counts them down, and stops as
 * soon as the count passes, so it looks at no more than the bound (a map
 * or an array larger than what is left is past it at once). */
static int over(const msgpack_object *v, size_t *left) {
  if (*left == 0) return 1;
  (*left)--;
  if (v->type == MSGPACK_OBJECT_MAP) {
    if ((size_t)v->via.map.size * 2 > *left) return 1;
    for (uint32_t i = 0; i < v->via.map.size; i++)
      if (over(&v->via.map.ptr[i].key, left) || over(&v->via.map.ptr[i].val, left)) return 1;
  } else if (v->type == MSGPACK_OBJECT_ARRAY) {
    if ((size_t)v->via.array.size > *left) return 1;
    for (uint32_t i = 0; i < v->via.array.size; i++)
      if (over(&v->via.array.ptr[i], left)) return 1;
  }
  return 0;
}

/* ------------------------------------------------------------ the job */

typedef struct put_job {
  uint64_t conn_id;
  st__put_resume_fn resume;   /* how the put goes on */
  st__rpc_req_t r;            /* the request (c and msg renewed at the end) */
  st__message_t msg;          /* owned: r's params and values point into it */
  st__targs_t targs;          /* owned: the request's tensor arguments */
  st__keys_t *keys;           /* the table (a take-over's check reads it) */
  char name[ST__KEY_NAME_MAX + 1];
  size_t len;
  const msgpack_object *value;   /* r's value */
  st__put_work_t work;
} put_job_t;

static void put_job_free(void *ud) {
  put_job_t *j = ud;
  if (!j) return;
  st__message_destroy(&j->msg);
  st__targs_clear(&j->targs);
  st__build_result_destroy(&j->work.res);
  if (j->work.page) st__arena_unref(j->work.page);
  free(j);
}

/* The job's run. Worker thread: the outcome stays in j->work. */
static int put_run(st__job_t *job, char *err, size_t errlen) {
  put_job_t *j = job->ud;
  st__put_work_t *w = &j->work;
  (void)err, (void)errlen;
  if (w->take)
    w->rc = st__keys_take_check(j->keys, j->name, j->len, w->page, j->value, w->err,
                                sizeof w->err);
  else
    w->rc = st__put_adopt(&j->targs, j->value, &w->res, w->err, sizeof w->err);
  return ST_OK;
}

/* See put_job.h. Any thread. */
int st__put_job_is(const st__job_t *job) { return job->run == put_run; }

/* See put_job.h. */
int st__put_offload(st__rpc_req_t *r, const char *name, size_t len, const st__key_t *live,
                    const st__put_work_t *w, st__put_resume_fn resume) {
  const msgpack_object *value = st__rpc_arg(r, "value");
  size_t left = ST__PUT_LOOP_OBJECTS;
  if (!value || !r->msg || !over(value, &left)) return 0;
  st__conn_t *c = r->c;
  st__server_t *srv = c->srv;
  int tries = (w ? w->tries : 0) + 1;
  if (tries > ST__PUT_TRIES) {
    st__rpc_error(r, ST_ERR_BUSY,
                  "put: key '%.*s' changed %d times while the put's value was checked; put it "
                  "again",
                  (int)len, name, ST__PUT_TRIES);
    return 1;
  }
  put_job_t *j = calloc(1, sizeof *j);
  st__job_t *job = j ? st__job_new_native(0, 0, put_run, j, put_job_free) : NULL;
  if (!job) {
    free(j);
    st__rpc_error(r, ST_ERR_OUT_OF_MEMORY, "put: out of memory");
    return 1;
  }
  if (srv->shutting_down || !srv->workers) {
    st__job_free(job);
    st__rpc_error(r, ST_ERR_SHUTTING_DOWN, "put: the server is shutting down");
    return 1;
  }
  /* The request's objects and descriptors move into the job. */
  j->conn_id = c->id;
  j->resume = resume;
  j->r = *r;
  j->msg = *r->msg;
  msgpack_unpacked_init(&r->msg->unpacked);
  if (c->targs) {
    j->targs = *c->targs;
    memset(c->targs, 0, sizeof *c->targs);
  }
  j->keys = &srv->keys;
  memcpy(j->name, name, len);
  j->len = len;
  j->value = value;
  st__build_result_init(&j->work.res);
  j->work.take = live != NULL;
  j->work.tries = tries;
  if (live) {
    j->work.page = live->page_arena;
    st__arena_ref(j->work.page);
  }
  int rc = st__workers_submit(srv->workers, job);
  if (rc != ST_OK) {
    /* Not queued: the message and descriptors go back to the request. */
    *r->msg = j->msg;
    msgpack_unpacked_init(&j->msg.unpacked);
    if (c->targs) {
      *c->targs = j->targs;
      memset(&j->targs, 0, sizeof j->targs);
    }
    st__job_free(job);
    st__rpc_error(r, rc, "put: %s",
                  rc == ST_ERR_SHUTTING_DOWN ? "the server is shutting down"
                                             : "cannot queue the put's check");
    return 1;
  }
  srv->counters.puts_on_workers++;
  c->inflight++;
  ST_LOG_D("keys", "conn %llu: put '%.*s' (%s) handed to a worker", (unsigned long long)c->id,
           (int)len, name, live ? "take-over" : "adoption");
  return 1;
}

/* See put_job.h. */
void st__put_done(st__server_t *srv, st__job_t *job) {
  put_job_t *j = job->ud;
  st__conn_t *c = st__conn_find(srv, j->conn_id);
  if (c && !c->dead) {
    st__rpc_req_t r = j->r;
    r.c = c;
    r.msg = &j->msg;
    if (job->status != ST_OK) {
      /* Not run (cancelled at a shutdown). */
      st__rpc_error(&r, job->status, "put: %s", job->error);
    } else {
      st__targs_t *was = c->targs;
      c->targs = &j->targs;
      j->resume(&r, &j->work);
      c->targs = was;
    }
    st__conn_request_done(c);
  }
  st__job_free(job);
}
