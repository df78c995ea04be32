/* src/server: the part of a `put` that grows with its value, run on a
 * worker for a large value (docs/views.md, "What runs where"; docs/keys.md,
 * section 1; wire: docs/protocol.md, "Published keys").
 *
 * What a put does per tensor is a live key's take-over's check (every
 * tensor's descriptor decoded and compared with the key's,
 * st__keys_take_check) or an adoption (every tensor checked against the
 * request's arenas, the arenas imported, the value packed: st__put_adopt).
 * For a value of at most ST__PUT_LOOP_OBJECTS msgpack objects the loop
 * does it in the request's handler. A larger one goes to a worker: the job
 * takes the request's decoded message and its tensor arguments, the
 * request waits (in flight on its connection, which the loop goes on
 * serving), and when the work is back the loop finishes the put
 * (st__rpc_put_resume, rpc_keys.c) against the table as it is then:
 *
 *   - a take-over's check counts for the key whose control page it was
 *     checked against (the job holds a reference to the page, so no other
 *     key can have it); an adoption counts while the put still adopts;
 *   - otherwise (the key was deleted, put again, or turned live
 *     meanwhile) the work is done again, at most ST__PUT_TRIES times in
 *     all; past that the put is BUSY.
 *
 * The table changes on the loop thread only; a put whose connection
 * closed before its work came back changes nothing. `info` counts the puts
 * handed to a worker in `counters.puts_on_workers`.
 *
 * Loop thread, except where a function says otherwise.
 */
#ifndef ST_SERVER_PUT_JOB_H
#define ST_SERVER_PUT_JOB_H

#include <msgpack.h>
#include <stddef.h>

#include "engine/job.h"
#include "engine/keys.h"
#include "engine/targs.h"
#include "server/rpc.h"
#include "server/server.h"

/* The most msgpack objects (maps and arrays, their entries, a map's keys
 * too; a tensor is one) a put's value may have for the loop to do its
 * per-tensor work: a state dict of up to 511 tensors. Past it, a worker
 * does (the figures: docs/benchmarks.md, "Loop stalls"). */
#define ST__PUT_LOOP_OBJECTS 1024

/* How many times a put's work may be done before the put is BUSY (the
 * key changed under it every time). */
#define ST__PUT_TRIES 3

/* The work a worker did for a put. */
typedef struct st__put_work {
  int take;                   /* 1: a take-over's check; 0: an adoption */
  st__arena_t *page;          /* take: the control page of the key it was
                                 checked against (a reference) */
  int rc;                     /* the outcome: ST_OK or the error, err */
  char err[1024];
  st__build_result_t res;     /* adoption: the new version's value and
                                 arena references (moved out when used) */
  int tries;                  /* times the work was done for this put */
} st__put_work_t;

/* The adoption of a put's `value`: every tensor checked against the
 * request's arenas `t`, every arena imported, the value packed and a
 * reference to each arena in *out (which the caller initialized). ST_OK
 * or an error with the reason in err. Any thread that owns t. */
int st__put_adopt(st__targs_t *t, const msgpack_object *value, st__build_result_t *out, char *err,
                  size_t errlen);

/* Whether w (NULL: none) is the work put r needs now: a take-over's check
 * of live key `live` (NULL: the put adopts). */
int st__put_work_fits(const st__put_work_t *w, const st__key_t *live);

/* How a put goes on once its work is back: st__rpc_put_resume. */
typedef void (*st__put_resume_fn)(st__rpc_req_t *r, st__put_work_t *w);

/* Hands put r (its key `name`, len; a take-over of live key `live`, NULL
 * for an adoption) to a worker when its value has more than
 * ST__PUT_LOOP_OBJECTS objects: the job takes r's message and tensor
 * arguments, and the request stays in flight on its connection until
 * `resume` finishes it. `w` is the work done for it before (NULL: none),
 * which counts its tries. Returns 1 when the put was handed over or
 * answered (an error: BUSY past ST__PUT_TRIES, OUT_OF_MEMORY,
 * SHUTTING_DOWN), 0 when the loop does the work now (a small value;
 * nothing was taken). */
int st__put_offload(st__rpc_req_t *r, const char *name, size_t len, const st__key_t *live,
                    const st__put_work_t *w, st__put_resume_fn resume);

/* Whether job is a put's (lifecycle.c routes it to st__put_done). Any
 * thread. */
int st__put_job_is(const st__job_t *job);

/* A put's work came back from a worker: the put goes on (its `resume`)
 * when its connection is still there. Takes the job. */
void st__put_done(st__server_t *srv, st__job_t *job);

/* rpc_keys.c: the put of r once the worker's work w is back (NULL: none,
 * as st__rpc_put). Uses w when it fits the put as the table is now (its
 * result moves out), else does the work again. */
void st__rpc_put_resume(st__rpc_req_t *r, st__put_work_t *w);

#endif
