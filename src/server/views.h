/* src/server: replies seen through a view spec (docs/views.md, section
 * 1; the spec is proto/viewspec.h).
 *
 * `get {view}` and `call {view}` answer with the same arenas as without a
 * view and new descriptors in the value: every step is a window, so no
 * memory is added. A rule that ends with `contiguous` on a window that is
 * not contiguous needs a copy: a worker gathers those tensors into one new
 * arena per device (views_job.c; the tensor core's copy, a gather kernel
 * on CUDA; a module one of whose tensors is copied has all of them copied,
 * as its tensors share one arena), and the result is cached as a derived
 * object whose endpoint names its source ("key:<name>" for a published
 * key, "object:<id>" for a server object) and whose cache key is
 * "<source version>|<normalized spec>" ("v3|*:shard(1,0,2)|contiguous").
 * The derived object holds only the copies (references of its own); it
 * is charged to the memory budget and evicted like any cached object.
 * Requests for the same (source, spec) while a copy runs wait for that
 * copy; later ones get the cached object. A put or delete of a key drops
 * its derived objects (and a copy in flight for it is not cached). A
 * plain result's copy is made for its one reply and cached nowhere.
 *
 * Loop thread only, except st__views_gather (a worker).
 */
#ifndef ST_SERVER_VIEWS_H
#define ST_SERVER_VIEWS_H

#include <stdint.h>

#include "engine/job.h"
#include "engine/keys.h"
#include "proto/viewspec.h"
#include "server/rpc.h"
#include "server/server.h"

typedef struct st__views st__views_t;

/* The most a view's walk of a value (viewspec.h, "steps": glob word
 * operations and value objects) may cost on the loop thread; a walk past
 * it is handed to a worker and the request waits for it
 * (docs/views.md, "What runs where"; the figures: docs/benchmarks.md,
 * "Loop stalls"). */
#define ST__VIEWS_LOOP_STEPS 200000

typedef enum {
  ST__VIEW_TO_KEY = 0,        /* get: {value, arenas, key, version[, readonly]} */
  ST__VIEW_TO_OBJECT,         /* call of an object: {value, arenas, object} */
  ST__VIEW_TO_PLAIN           /* call of a plain endpoint: {value, arenas} */
} st__view_to_kind_t;

/* Who gets the reply, and what it says besides value and arenas. */
typedef struct st__view_to {
  st__view_to_kind_t kind;
  uint64_t conn_id;
  uint32_t request_id;
  int readonly;               /* the arenas go read-only (docs/keys.md) */
  char what[ST__KEY_NAME_MAX + 16];   /* "get 'k'", the endpoint: errors */
  char key[ST__KEY_NAME_MAX + 1];     /* KEY: the key and version */
  uint64_t version;
  st__arena_t *live_page;     /* KEY of a live key: its control page
                               * (borrowed: its views are windows,
                               * answered at once) */
  int publisher;              /* KEY of a live key: this connection's */
  uint64_t object_id;         /* OBJECT: held while the reply waits */
  int lease;                  /* OBJECT: the reply gives a lease */
} st__view_to_t;

/* The result a view sees: `result` (borrowed; the views take their own
 * references when they must wait), the endpoint name of its derived
 * objects ("key:<name>", "object:<id>"; NULL: never cached) and its
 * version in their cache key ("v3"; may be NULL). */
typedef struct st__view_source {
  const st__build_result_t *result;
  const char *owner;
  const char *version;
} st__view_source_t;

/* Answers to->request_id on c with src seen through spec: at once, or
 * after a worker made the copies `contiguous` asks for. Returns 1 when the
 * reply waits (the request stays in flight on c: whoever counted it
 * there must not count it done; the views do, with
 * st__conn_request_done, when they answer) and 0 when it was answered (a
 * result or an error: INVALID_ARGUMENT with the spec's message for a
 * bound, OUT_OF_MEMORY, SHUTTING_DOWN). An OBJECT reply holds its object
 * (st__objects_hold) while it waits. */
int st__views_reply(st__server_t *srv, st__conn_t *c, const st__viewspec_t *spec,
                    const st__view_source_t *src, const st__view_to_t *to);

/* Parses a request's `view` string parameter (msgpack STR) into *out
 * (NULL when absent); replies INVALID_ARGUMENT and returns the error
 * otherwise ("<method>: view: ..."). */
int st__views_param(st__rpc_req_t *r, st__viewspec_t **out);

/* A copy for the views came back from the workers (lifecycle.c routes jobs
 * with `run` here): caches it and answers its waiting requests. Takes the
 * job. */
void st__views_done(st__server_t *srv, st__job_t *job);

/* Key `name` got a new version or was deleted: its derived objects leave
 * the cache, and copies in flight for it are not cached. */
void st__views_forget_key(st__server_t *srv, const char *name);

/* Frees the table (requests still waiting get no reply: the server is
 * exiting). At exit, after the workers stopped. */
void st__views_destroy(st__server_t *srv);

/* ------------------------------------------------------------ views_job.c */

/* What a copy job gathers: windows of `arenas` (references) made
 * contiguous, in order. */
typedef struct st__views_gather {
  st__arena_t **arenas;       /* owned references */
  size_t narenas;
  st__tensor_desc_t *windows; /* owned; arena indexes into `arenas` */
  size_t n;
} st__views_gather_t;

/* The job's run (job.h): copies each window of the job's
 * st__views_gather_t into one new arena per device, contiguous, each
 * tensor 256-byte aligned; the result's value is the array of the copies,
 * in order. Worker thread. */
int st__views_gather(st__job_t *job, char *err, size_t errlen);

/* Frees an st__views_gather_t (the job's free_ud). Any thread. */
void st__views_gather_free(void *ud);

#endif
