/* src/server: the wire methods (docs/protocol.md, "Methods").
 *
 * One table, st__methods (methods.c), has a row per method: its name, its
 * handler and its parameters (name, type, required). st__dispatch
 * (dispatch.c) finds the row of a request and checks the request's
 * parameters against it (rpc.c: unknown names, types, required ones, in
 * the order of the row, each failure an INVALID_ARGUMENT reply naming the
 * method) before the handler runs; a handler reads its checked
 * parameters with the accessors below and answers the request. Handlers
 * are grouped by concern:
 *
 *   rpc_admin.c     ping, hello, info, metrics, endpoints, reload, peers
 *   rpc_calls.c     call, submit
 *   rpc_tasks.c     status, wait, result, cancel, tasks
 *   rpc_objects.c   release, object_info, ensure_live, objects,
 *                   invalidate_call, invalidate_endpoint
 *   rpc_handoff.c   handoff_create, handoff_open, handoff_close,
 *                   handoff_delete
 *   rpc_buffer.c    buffer_create, buffer_open, buffer_close,
 *                   buffer_unlink, buffers
 *   rpc_keys.c      put, get, keys, delete
 *
 * Adding a method: its row in methods.c, its handler in the file of its
 * concern (declared below), its section in docs/protocol.md.
 *
 * Everything here runs on the loop thread.
 */
#ifndef ST_SERVER_RPC_H
#define ST_SERVER_RPC_H

#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/generation.h"
#include "engine/named.h"
#include "server/conn.h"

/* ------------------------------------------------------------- rows */

typedef enum {
  ST_RPC_ANY = 0,      /* any value: the handler checks it */
  ST_RPC_U64,          /* an integer >= 0 ("'x' must be an integer >= 0") */
  ST_RPC_STR,          /* a string ("'x' must be a string"; a required one:
                          "'x' (a string) is required", absent or not) */
  ST_RPC_SECONDS,      /* a number in [lo, hi] ("'x' must be a number of
                          seconds in lo..hi") */
  ST_RPC_WORD,         /* one of `choices` ("'x' must be one of a, b, c") */
  ST_RPC_BOOL          /* true or false ("'x' must be true or false") */
} st__rpc_type_t;

/* Parameter flags. Without ST_RPC_NIL_IS_VALUE a nil value counts as an
 * absent parameter. */
#define ST_RPC_REQUIRED 1u      /* absent: "'x' is required" */
#define ST_RPC_NIL_IS_VALUE 2u  /* nil is a value (of the wrong type) */

typedef struct st__rpc_param {
  const char *name;            /* NULL ends a row's parameters */
  st__rpc_type_t type;
  unsigned flags;
  double lo, hi;               /* SECONDS */
  const char *choices;         /* WORD: "a|b|c"; the value is the index */
} st__rpc_param_t;

#define ST_RPC_MAX_PARAMS 8

typedef struct st__rpc_req st__rpc_req_t;

typedef struct st__rpc_method {
  const char *name;
  size_t len;                  /* strlen(name) */
  void (*handler)(st__rpc_req_t *r);
  st__rpc_param_t params[ST_RPC_MAX_PARAMS];   /* in the order they are checked */
} st__rpc_method_t;

/* One request of a connection, parameters checked. Borrowed by the
 * handler for the duration of its call. */
struct st__rpc_req {
  st__conn_t *c;
  uint32_t id;
  const st__rpc_method_t *method;
  const msgpack_object *params;                /* the named map; NULL for [] */
  const msgpack_object *values[ST_RPC_MAX_PARAMS];   /* per parameter of the row:
                                                        the value, NULL if absent */
  st__message_t *msg;          /* the request: params and values point into its
                                  `unpacked`, which a handler that answers
                                  later may take (put_job.c) */
};

/* ------------------------------------------------------------- methods.c */

/* The row of the method named by (name, len), or NULL. Borrowed. */
const st__rpc_method_t *st__rpc_method_find(const char *name, size_t len);

/* The index of row m in the table (0 .. st__rpc_method_count() - 1). */
size_t st__rpc_method_index(const st__rpc_method_t *m);

/* The number of rows, and the name of row i (static): what the request
 * accounting (st__stats_init) is given at start. */
size_t st__rpc_method_count(void);
const char *st__rpc_method_name(size_t i);

/* ------------------------------------------------------------- dispatch.c */

/* Handles one decoded message of c (borrowed; a handler may take its
 * `unpacked`, leaving it empty): a request runs its method
 * (BUSY past max_inflight, UNKNOWN_METHOD, parameter errors), a
 * notification goes to st__notified, a response closes the connection. The
 * connection's message hook (server.h). */
void st__dispatch(st__conn_t *c, st__message_t *msg);

/* ------------------------------------------------------------- fastcall.c */

/* Answers msg (borrowed) when it is a `call` that the cache answers with
 * the short form {object, same: true} and nothing else about it needs
 * the write side of the server lock (no tensor arguments, no ids freed,
 * not managed, not a task; docs/pool.md, section 7): 1 then, the reply
 * queued on c and counted. 0 when st__dispatch must handle it: nothing
 * was changed. Either side of the lock, on c's own loop's thread; the
 * connection's fast message hook (server.h). */
int st__fast_call(st__conn_t *c, const st__message_t *msg);

/* ------------------------------------------------------------- rpc.c */

/* Checks the request's parameter map against r->method's row and fills
 * r->values. ST_OK, or the error (INVALID_ARGUMENT) after its reply was
 * sent. */
int st__rpc_check(st__rpc_req_t *r);

/* The checked value of parameter `name` of the row (NULL when absent or
 * nil). `name` must be a parameter of the row: anything else is a broken
 * invariant and aborts. Borrowed from the request. */
const msgpack_object *st__rpc_arg(const st__rpc_req_t *r, const char *name);

/* Typed reads of checked parameters, `dflt` when absent: U64, SECONDS,
 * WORD (the index; dflt when absent), BOOL (0 or 1). */
uint64_t st__rpc_u64(const st__rpc_req_t *r, const char *name, uint64_t dflt);
double st__rpc_seconds(const st__rpc_req_t *r, const char *name, double dflt);
int st__rpc_word(const st__rpc_req_t *r, const char *name, int dflt);
int st__rpc_bool(const st__rpc_req_t *r, const char *name, int dflt);

/* Who the request's peer is (engine/named.h): its uid and primary gid,
 * admin for root and the server's uid, and its supplementary groups read
 * from the socket (SO_PEERGROUPS) only when a grant asks. rpc_owner.c. */
void st__rpc_who(const st__rpc_req_t *r, st__who_t *w);

/* A listing's caller (*w, as st__rpc_who) and its `all` parameter: 1 to
 * list every uid's (root and the server's uid only), 0 the caller's, -1
 * after the AUTH reply ("<method>: 'all' lists every uid's <what>: root
 * and the server's uid only"). rpc_owner.c. */
int st__rpc_listing_all(st__rpc_req_t *r, const char *method, const char *what, st__who_t *w);

/* The request's `readers` parameter ({uids?: [uid], gids?: [gid]}, at
 * most ST__GRANT_MAX each) in *g: 1 when given, 0 when absent (g
 * zeroed), -1 after an INVALID_ARGUMENT reply. rpc_owner.c. */
int st__rpc_readers(st__rpc_req_t *r, st__grant_t *g);

/* The device of the request's `device` parameter (a checked STR of the
 * row): "cpu" (absent too) is -1, "cuda" the socket's own device, "cuda:N"
 * ordinal N. -2 after an error reply: INVALID_ARGUMENT for another text,
 * CAPABILITY for a CUDA device the server does not have. Used by
 * handoff_create and buffer_create. */
int st__rpc_device(const st__rpc_req_t *r);

/* The endpoint of the current generation named by the request's
 * `endpoint` parameter (a checked, required string), or NULL after an
 * UNKNOWN_ENDPOINT reply ("unknown endpoint 'x'"). Borrowed. */
const st__endpoint_decl_t *st__rpc_endpoint(const st__rpc_req_t *r);

/* Answers the request with an error; the message is formatted as printf
 * does (no "<method>: " is added). Results go out with st__reply_begin
 * and st__reply_send (work.h). */
void st__rpc_error(const st__rpc_req_t *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ------------------------------------------------------------- handlers */

/* rpc_admin.c */
void st__rpc_ping(st__rpc_req_t *r);
void st__rpc_hello(st__rpc_req_t *r);
void st__rpc_info(st__rpc_req_t *r);
void st__rpc_endpoints(st__rpc_req_t *r);
void st__rpc_reload(st__rpc_req_t *r);
void st__rpc_metrics(st__rpc_req_t *r);
void st__rpc_peers(st__rpc_req_t *r);

/* rpc_pull.c, rpc_replicate.c */
void st__rpc_pull(st__rpc_req_t *r);
/* replica.c: a live replica's subscription ended; a key's replicas. */
void st__rpc_unsubscribe(st__rpc_req_t *r);
void st__rpc_replicas(st__rpc_req_t *r);
void st__rpc_replicate(st__rpc_req_t *r);

/* rpc_calls.c */
void st__rpc_call(st__rpc_req_t *r);
void st__rpc_submit(st__rpc_req_t *r);

/* rpc_tasks.c */
void st__rpc_status(st__rpc_req_t *r);
void st__rpc_wait(st__rpc_req_t *r);
void st__rpc_result(st__rpc_req_t *r);
void st__rpc_cancel(st__rpc_req_t *r);
void st__rpc_tasks(st__rpc_req_t *r);

/* rpc_objects.c */
void st__rpc_release(st__rpc_req_t *r);
/* A notification of c (msg, borrowed; no reply ever): `release`
 * {object_id} gives back the lease as the request does (hello feature
 * "release_notify", docs/protocol.md); any other is counted and ignored,
 * and so is a release without exactly one object_id (a debug line). */
void st__notified(st__conn_t *c, const st__message_t *msg);
void st__rpc_object_info(st__rpc_req_t *r);
void st__rpc_ensure_live(st__rpc_req_t *r);
void st__rpc_objects(st__rpc_req_t *r);
void st__rpc_invalidate_call(st__rpc_req_t *r);
void st__rpc_invalidate_endpoint(st__rpc_req_t *r);

/* rpc_handoff.c */
void st__rpc_handoff_create(st__rpc_req_t *r);
/* Answers request `id` of c with hand-off h ({value, arenas}: the data
 * and the page), as its producer (slot -1) or the consumer of `slot`. */
struct st__handoff;
void st__handoff_reply(st__conn_t *c, uint32_t id, const struct st__handoff *h, int slot);
void st__rpc_handoff_open(st__rpc_req_t *r);
void st__rpc_handoff_close(st__rpc_req_t *r);
void st__rpc_handoff_delete(st__rpc_req_t *r);

/* rpc_buffer.c */
void st__rpc_buffer_create(st__rpc_req_t *r);
/* Makes the file of memfd arena a mode 0400, so that a read-only
 * descriptor of it cannot be reopened read-write by a process of another
 * uid than the server's (rpc_buffer.c; docs/streams.md). CUDA arenas: no-op. */
void st__rpc_owner_read_only(st__arena_t *a);
/* The limits of config.lua a buffer is checked against. */
struct st__buffer_limits st__rpc_buffer_limits(const st__config_t *cfg);
void st__rpc_buffer_open(st__rpc_req_t *r);
void st__rpc_buffer_close(st__rpc_req_t *r);
void st__rpc_buffer_unlink(st__rpc_req_t *r);
void st__rpc_buffers(st__rpc_req_t *r);
void st__rpc_handoffs(st__rpc_req_t *r);
/* rpc_keys.c */
/* What a get reply says besides value and arenas (docs/protocol.md,
 * "Published keys"): key, version, readonly, and for a live key its page
 * (borrowed: sent as one more arena, last, with `live: {page,
 * publisher}`). */
typedef struct st__key_reply {
  const char *key;
  uint64_t version;
  int readonly;
  st__arena_t *page;
  int publisher;
} st__key_reply_t;

/* Sends r as the reply `id` of a get on c, with k's pairs: the one way a
 * key goes out, with or without a view (views.c). Loop thread. */
void st__rpc_reply_key(st__conn_t *c, uint32_t id, const char *what, const st__build_result_t *r,
                       const st__key_reply_t *k);

void st__rpc_put(st__rpc_req_t *r);
void st__rpc_get(st__rpc_req_t *r);
void st__rpc_keys(st__rpc_req_t *r);
void st__rpc_delete(st__rpc_req_t *r);

#endif
