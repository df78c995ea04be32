/* src/server: builds, tasks and objects as the loop thread runs them
 * (docs/protocol.md: call, submit ... reload; docs/lifecycle.md).
 *
 * A build is one run of an endpoint body: a job on the workers (or waiting in
 * the queue of a serialized endpoint) plus the consumers that wait for its
 * result. A consumer is a call (a connection and a request id) or a task.
 * Calls of a singleflight or cached endpoint with the same key join the
 * build in flight instead of starting one (the flight table). When the
 * build ends, an object-producing endpoint registers one object and every
 * consumer receives it; a plain result goes to its only consumer.
 *
 * Everything here belongs to the loop thread. Files (the wire methods
 * that use them are rpc.h's):
 *   builds.c    the scheduler: a consumer's build starts (cache hit, join
 *               or new), completes, or is cancelled when nobody waits
 *   queue.c     the list of builds, the flight table, the hand-off to the
 *               workers and the queues of serialized endpoints
 *   deliver.c   what consumers receive: errors, objects, plain results
 *   tasks.c     the task table, states, retention, waiters (wait)
 *   reply.c     replies shared by the above (results, object maps)
 */
#ifndef ST_SERVER_WORK_H
#define ST_SERVER_WORK_H

#include <ev.h>
#include <msgpack.h>
#include <stdint.h>

#include "engine/objects.h"
#include "engine/targs.h"
#include "server/conn.h"

/* ------------------------------------------------------------- builds */

typedef enum { ST_CONSUMER_CALL = 0, ST_CONSUMER_TASK = 1 } st__consumer_kind_t;

typedef struct st__consumer {
  struct st__consumer *next;
  st__consumer_kind_t kind;
  uint64_t conn_id;           /* CALL: who asked ... */
  uint32_t request_id;        /* ... and the request to answer */
  int readonly;               /* CALL: its reply maps read-only (call's
                                 `readonly`; docs/keys.md, section 5) */
  const char *view;           /* CALL: the `view` spec's normalized text
                                 (server/views.h), NULL: none; a consumer
                                 copied onto a build keeps it in the same
                                 allocation */
  size_t view_len;
  struct st__task *task;      /* TASK */
} st__consumer_t;

typedef enum {
  ST_BUILD_WAITING = 0,       /* in its serialized endpoint's queue */
  ST_BUILD_SUBMITTED = 1      /* on the workers: queued or running */
} st__build_state_t;

typedef struct st__build {
  st__job_t *job;             /* owned while WAITING; the workers' while SUBMITTED */
  st__build_state_t state;
  char *endpoint;             /* owned name */
  int serialized;             /* holds (or waits for) its endpoint's turn */
  int object;                 /* produces a server object */
  int cacheable;              /* cache the object when done (invalidation clears it) */
  char *cache_key;            /* owned, NULL for plain endpoints */
  size_t cache_key_len;
  char where[16];             /* the device it builds on: "cpu", "cuda:N" */
  char *flight;               /* owned flight-table key while joinable, else NULL */
  size_t flight_len;
  int cancelled;              /* nobody waits: the job was asked to stop */
  st__consumer_t *consumers;
  struct st__build *prev, *next;        /* every build */
  struct st__build *qnext;              /* serialized queue */
  /* Submitted builds whose job may still be queued on the workers, in
   * the order they were submitted (st__work_t.queued): the workers take
   * jobs in that order, so those that started are at its head. */
  struct st__build *fprev, *fnext;
  int in_queued;                        /* on that list */
} st__build_t;

/* Per-endpoint state of concurrency = "serialized" (by name). */
typedef struct st__serial {
  int busy;                   /* one build of the endpoint is on the workers */
  st__build_t *head, *tail;   /* builds waiting for their turn, FIFO */
} st__serial_t;

/* ------------------------------------------------------------- tasks */

typedef enum {
  ST_TASK_PENDING = 0,
  ST_TASK_RUNNING,
  ST_TASK_COMPLETED,
  ST_TASK_FAILED,
  ST_TASK_CANCELLED,
  ST_TASK_NSTATES
} st__task_status_t;

/* Their names, in that order (the `tasks` method's status filter). */
#define ST__TASK_STATUS_NAMES "pending|running|completed|failed|cancelled"

/* Task info entries in one `tasks` reply: without `limit`, and at most. */
#define ST__TASKS_PAGE_DEFAULT 100
#define ST__TASKS_PAGE_MAX 1000

typedef enum { ST_WAIT_INFO = 0, ST_WAIT_RESULT = 1 } st__wait_kind_t;

/* A request parked until a task ends: `wait` (answered with task info, or
 * at its timeout) or a `call` of an execution = "task" endpoint (answered
 * like `result`). Holds no thread: a list entry and a timer. */
typedef struct st__waiter {
  ev_timer timer;             /* ST_WAIT_INFO only */
  st__server_t *srv;
  struct st__task *task;
  st__wait_kind_t kind;
  uint64_t conn_id;
  uint32_t request_id;
  struct st__waiter *tprev, *tnext;     /* the task's waiters */
  struct st__waiter *gprev, *gnext;     /* every waiter */
} st__waiter_t;

typedef struct st__task {
  uint64_t id;
  uid_t uid;                  /* the submitter's: only it (and root, the
                                 server's uid) may see or cancel it; charged
                                 to its quotas.tasks                       */
  char *endpoint;             /* owned */
  st__task_status_t status;
  double created_at, started_at, completed_at;   /* unix; 0 = not yet */
  double completed_mono;      /* for the TTL */
  int err_code;               /* failed/cancelled: ST_ERR_* */
  char *err_msg;              /* owned */
  st__progress_t progress;    /* last report (copied from the job at the end) */
  st__build_t *build;         /* while pending/running */
  int cancel_requested;       /* running: cancel asked, ends cancelled */
  uint64_t object_id;         /* completed object task (0: none) */
  int holds_object;           /* the task holds object_id until fetched */
  st__build_result_t result;  /* completed plain task: kept until fetched */
  int taken;                  /* the result was handed over */
  st__waiter_t *waiters;
  /* A task that runs no build (a pull, docs/multihost.md): `cancel`
   * stops what it runs (the operation then ends the task), `op` is its
   * state; NULL for a build's task. */
  void (*cancel)(st__server_t *srv, struct st__task *t);
  void *op;
  struct st__task *newer, *older;       /* every task, by creation */
  struct st__task *dnext, *dprev;       /* finished tasks, by completion */
} st__task_t;

/* ------------------------------------------------------------- state */

typedef struct st__work {
  st__smap_t flights;         /* flight key -> build */
  st__smap_t serial;          /* endpoint name -> st__serial_t */
  st__build_t *builds;        /* every build in flight */
  st__build_t *queued, *queued_tail;    /* submitted, maybe not started yet
                                 (st__build_t.fprev): st__tasks_refresh */
  size_t nwaiting;            /* builds in serialized queues */
  st__smap_t tasks;           /* id -> task */
  st__task_t *newest, *oldest;
  st__task_t *done_head, *done_tail;
  size_t ntasks;
  size_t nstatus[ST_TASK_NSTATES];
  uint64_t next_task_id;
  st__waiter_t *waiters;
  ev_timer sweep;             /* drops expired tasks */
} st__work_t;

/* ------------------------------------------------------------- builds.c */

/* Starts the tables. Loop thread, at start. */
void st__work_init(st__server_t *srv);

/* Frees every build, task and waiter (jobs still on the workers are the
 * workers'). Loop thread, after the workers stopped. */
void st__work_destroy(st__server_t *srv);

/* A job came back from the workers: delivers it to its consumers and starts
 * the next build of a serialized endpoint. Takes the job. */
void st__build_complete(st__server_t *srv, st__job_t *job);

/* Where a call goes: its device (-1: the CPU) and CUDA device, the
 * device's name ("cpu", "cuda:N"), its cache key (owned, NULL when ep
 * neither caches nor singleflights) and the cached object of that key
 * (borrowed, NULL: none). */
typedef struct st__call_place {
  int device, cuda_device;
  char where[16];
  char *key;
  size_t klen;
  st__object_t *cached;
} st__call_place_t;

/* Fills *at for a call of ep with bound arguments on socket `socket`;
 * ST_OK, or an error with a message in err (at->key is then NULL). Only
 * reads the server: either side of the server lock (fastcall.c). */
int st__build_locate(const st__server_t *srv, const st__endpoint_decl_t *ep, const char *bound,
                     size_t bound_len, int socket, st__call_place_t *at, char *err,
                     size_t errlen);

/* Starts (or joins, or answers from the cache) a build of `ep` (of the
 * current generation) with bound arguments for one consumer whose request
 * came in on socket `socket` (which decides the call's device: devices.c).
 * Builds, flights and cache entries are per device. `targs` (may be NULL)
 * holds the request's tensor arguments: a new build takes them (*targs is
 * left empty); otherwise they stay the caller's. On failure returns an
 * error (CAPABILITY for a CUDA device the server does not have) and a
 * message in err; the consumer was not added. */
int st__build_start(st__server_t *srv, const st__endpoint_decl_t *ep, const char *bound,
                    size_t bound_len, st__targs_t *targs, const st__consumer_t *who, int socket,
                    char *err, size_t errlen);

/* cancel (docs/protocol.md): a pending task ends now; a running one alone
 * in its build is asked to stop and ends when it does; one that shares
 * its build leaves it and ends now. */
void st__task_cancel(st__server_t *srv, st__task_t *t);

/* A connection closed: its calls stop waiting (builds nobody waits for
 * any more are cancelled). The release of the "calls" row of
 * holdings.h, the row after the result pool's and before the tasks'. */
void st__work_conn_closed(st__server_t *srv, st__conn_t *c);

/* Shutdown grace expired: builds still waiting in serialized queues end
 * CANCELLED without running. */
void st__builds_cancel_waiting(st__server_t *srv);

/* Builds in flight that would cache under (endpoint[, key]) no longer do,
 * and later calls no longer join them. key NULL: all of the endpoint. */
void st__builds_forget(st__server_t *srv, const char *endpoint, const char *key, size_t key_len);

/* ------------------------------------------------------------- queue.c */

/* Frees b's consumers and everything b owns except its job. */
void st__build_free(st__build_t *b);

/* Adds b to, or takes it out of, the list of every build (w->builds). */
void st__build_link(st__work_t *w, st__build_t *b);
void st__build_unlink(st__work_t *w, st__build_t *b);

/* Takes b out of the flight table (later calls stop joining it) and
 * frees its key. */
void st__build_forget_flight(st__work_t *w, st__build_t *b);

/* Hands b to the workers, or queues it (WAITING) behind the running build of
 * its serialized endpoint. ST_OK, SHUTTING_DOWN when the workers stopped,
 * OUT_OF_MEMORY. */
int st__queue_enqueue(st__server_t *srv, st__build_t *b);

/* A serialized build of `endpoint` left the workers: the next one waiting
 * gets the turn (builds the stopped workers refuse end with the error). */
void st__queue_next(st__server_t *srv, const char *endpoint);

/* Ends a build that has not run: out of its queue or the workers'. Returns
 * 1 when it did (b and its job are freed; consumers are not told), 0
 * when a worker already runs it. */
int st__queue_abort(st__server_t *srv, st__build_t *b);

/* Frees the serialized queues and the jobs of the builds waiting in them
 * (the builds stay on w->builds). At exit. */
void st__queue_destroy(st__work_t *w);

/* ------------------------------------------------------------- deliver.c */

/* Every consumer of *list gets the error (a call its reply, a task ends
 * failed or cancelled); the list is freed and *list left empty. */
void st__deliver_error(st__server_t *srv, st__consumer_t **list, int code, const char *msg);

/* One consumer receives obj: a task holds it until fetched; a call gets
 * the reply, with a lease first when the endpoint is managed. k stays the
 * caller's. */
void st__deliver_object(st__server_t *srv, const st__consumer_t *k, st__object_t *obj);

/* The one consumer of a plain build receives the job's result: a task
 * takes it; a call's reply carries it (the job keeps the arenas). */
void st__deliver_plain(st__server_t *srv, const st__consumer_t *k, st__job_t *job);

/* ------------------------------------------------------------- tasks.c */

/* A new pending task of `endpoint` submitted by `uid`, or NULL with err
 * set (LIMIT when tasks.capacity tasks are unfinished, or when uid keeps
 * quotas.tasks tasks none of which is finished; OUT_OF_MEMORY). */
st__task_t *st__task_new(st__server_t *srv, const char *endpoint, uid_t uid, char *err,
                         size_t errlen, int *code);

/* The task of an id (borrowed), or NULL. */
st__task_t *st__task_find(st__server_t *srv, uint64_t id);

/* The task's build was taken by a worker. */
void st__task_started(st__server_t *srv, st__task_t *t, double started_unix);

/* Ends a task (answers its waiters). With an object: the task holds it
 * until fetched. With a plain result: takes *result. With an error: code
 * and message (NULL: "task N was cancelled"). */
void st__task_finish_object(st__server_t *srv, st__task_t *t, st__object_t *obj);
void st__task_finish_plain(st__server_t *srv, st__task_t *t, st__build_result_t *result);
void st__task_finish_error(st__server_t *srv, st__task_t *t, int code, const char *message);

/* Current status (pending becomes running once its job started). */
st__task_status_t st__task_status(st__server_t *srv, st__task_t *t);

/* Brings the status counts (st__work_t.nstatus) up to date: each pending
 * task whose job a worker took becomes running. Looks at the submitted
 * builds (st__work_t.queued) from the oldest only until the first whose
 * job is still queued, and takes those that started off the list: a
 * build is looked at once after it started, whatever the task table
 * holds. Loop thread. */
void st__tasks_refresh(st__server_t *srv);

/* A build was handed to the workers: it joins st__work_t.queued. */
void st__tasks_build_submitted(st__work_t *w, st__build_t *b);

/* Packs task info (docs/protocol.md, "Task info"); st__reply_task answers
 * a request with it. */
void st__pack_task(msgpack_packer *pk, st__server_t *srv, st__task_t *t);
void st__reply_task(st__conn_t *c, uint32_t request_id, st__task_t *t);

/* Answers `request_id` on c as `result` would (consumes a result). */
void st__task_reply_result(st__conn_t *c, uint32_t request_id, st__task_t *t);

/* Parks a request until t ends: ST_WAIT_INFO with a timeout in seconds,
 * or ST_WAIT_RESULT. Counts as in flight on c. ST_OK or OUT_OF_MEMORY. */
int st__task_add_waiter(st__server_t *srv, st__task_t *t, st__conn_t *c, uint32_t request_id,
                        st__wait_kind_t kind, double timeout_s);

/* Drops every waiter of a connection. The ids of unfinished tasks its
 * calls waited for (ST_WAIT_RESULT: nobody will fetch their results) go
 * to orphans[] (at most cap; *more counts the others). Returns how many
 * were stored. */
size_t st__tasks_conn_closed(st__server_t *srv, uint64_t conn_id, uint64_t *orphans, size_t cap,
                             size_t *more);

/* Frees every task and waiter. */
void st__tasks_destroy(st__server_t *srv);

/* Drops finished tasks older than tasks.ttl_s (the sweep timer). */
void st__tasks_sweep(st__server_t *srv);

/* Name of a status ("pending"; static). */
const char *st__task_status_name(st__task_status_t s);

/* ------------------------------------------------------------- reply.c */

/* [1, id, nil, <the caller packs the result>] into a fresh buffer. */
void st__reply_begin(msgpack_sbuffer *sb, msgpack_packer *pk, uint32_t id);
/* Sends the buffer (no descriptors) as the result of request `id` (the
 * id st__reply_begin packed; counted as answered, stats.c) and frees it. */
void st__reply_send(st__conn_t *c, uint32_t id, msgpack_sbuffer *sb);
/* Sends `true` as the result of request id. Loop thread. */
void st__reply_true(st__conn_t *c, uint32_t id);

/* The reply of call/result: {value, arenas[, object]} with one descriptor
 * per arena that is not a legacy CUDA IPC arena. `obj` NULL: a plain result. `lease`: this reply gives c a
 * lease. Counted as the answer to request id (stats.c). Sends an error reply instead when a descriptor
 * cannot be made or the arenas do not fit one message, and returns that
 * error (ST_OK when the result went out). */
int st__reply_result(st__conn_t *c, uint32_t id, const char *endpoint,
                      const st__build_result_t *r, const st__object_t *obj, int lease);

/* What a reply of a published key adds to {value, arenas} (rpc_keys.c):
 * `npairs` key/value pairs that pack(pk, ud) writes, and whether its
 * arenas may go by id to a client that keeps them mapped from an earlier
 * reply on this connection (as an object's: docs/protocol.md, "Arenas
 * sent once"), and whether they go read-only. */
typedef struct st__reply_more {
  uint32_t npairs;
  void (*pack)(msgpack_packer *pk, const void *ud);
  const void *ud;
  int keep_arenas;
  int readonly;               /* the arenas go read-only, never by id
                                 (docs/keys.md, "Read-only mappings") */
  const unsigned char *readonly_each;  /* or those of these flags (one per
                                 arena of the result; NULL: none)         */
} st__reply_more_t;

/* As st__reply_result for a call's plain result (no object): each arena
 * whose result_args entry (NULL: none; st__targs_match_result) is 1 + i
 * goes as {arg: i}, with no descriptor, when c's hello asked for
 * "arg_results" (docs/protocol.md, "Tensor arguments"). Loop thread. */
int st__reply_call_result(st__conn_t *c, uint32_t id, const char *endpoint,
                          const st__build_result_t *r, const uint32_t *result_args);

/* As st__reply_result with no object, plus `more`'s pairs; `what` names
 * the request in errors. Loop thread. */
int st__reply_more(st__conn_t *c, uint32_t id, const char *what, const st__build_result_t *r,
                   const st__reply_more_t *more);
/* Whether a call's reply of obj to c, giving a lease when `lease`, may
 * be {object, same: true}: obj is cached, the reply gives a lease exactly
 * when obj is managed, and c's client holds obj in full from an earlier
 * reply on c (docs/protocol.md, "Objects sent once"). */
int st__reply_same_for(const st__conn_t *c, const st__object_t *obj, int lease);

/* Packs that reply to request id into a new *sb (the caller queues or
 * destroys it); `lease` as st__reply_same_for's. */
void st__reply_pack_same(msgpack_sbuffer *sb, msgpack_packer *pk, const st__server_t *srv,
                         uint32_t id, const st__object_t *obj, int lease);

/* The reply of a call whose result is object obj: as st__reply_result,
 * or, when c's client holds obj in full from an earlier reply on this
 * connection (docs/protocol.md, "Objects sent once"), {object, same:
 * true} with no value and no arenas. A full reply that c's client may
 * keep is marked `object_kept`. */
int st__reply_object(st__conn_t *c, uint32_t id, const st__object_t *obj, int lease);
/* st__reply_object with every arena read-only (never the short form, no
 * arena by id; docs/keys.md, section 5). */
int st__reply_object_readonly(st__conn_t *c, uint32_t id, const st__object_t *obj, int lease);

/* A call's reply of obj whose value and arenas are r (obj's result seen
 * through a view, server/views.h), never the short form; read-only as
 * st__reply_object_readonly when `readonly`. */
int st__reply_object_view(st__conn_t *c, uint32_t id, const st__build_result_t *r,
                          const st__object_t *obj, int lease, int readonly);

/* Takes back a lease given to c on obj whose reply could not be sent.
 * obj stays valid (the caller still holds it through a hold, the cache or
 * the delivery in progress). */
void st__drop_lease(st__server_t *srv, st__conn_t *c, st__object_t *obj);

/* object_info map (docs/protocol.md). */
void st__pack_object_info(msgpack_packer *pk, st__server_t *srv, const st__object_t *o);

#endif
