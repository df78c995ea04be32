/* src/client: internals shared by the files of libstclient.
 *
 * Files of src/client (headers of their own: buffer.h, copy_batch.h,
 * result.h; docs/architecture.md, "The per-call path", has more on the
 * per-call ones):
 *   util.c    buffers that remember an allocation failure, per-client
 *             error recording, monotonic time
 *   conn.c    socket, connect, send/recv with deadlines, the fd FIFO
 *   rpc.c     request ids, one synchronous exchange, server errors
 *   connect.c connect + hello, reconnect, close, the connection's accessors
 *   call.c    ping, calls, st_client_rpc and the method plumbing of every
 *             public method (st__client_method and its kin)
 *   sockpath.c socket paths (the default bases), connecting by device
 *   tasks.c   submit, status, wait, result, cancel, tasks
 *   objects.c release, object_info, ensure_live, objects, invalidation,
 *             reload
 *   result.c  result memory, decoding replies into st_value_t trees
 *   value.c   accessors of values, results and tensors
 *   map.c     the process-wide open-cache of mapped arenas
 *   fdcheck.c what a received descriptor must be before it is mapped
 *   device.c  CUDA: device lookup, import, unmap, copies (contexts kept)
 *   tensor.c  reading tensors: st_tensor_get, st_tensor_copy_to_host
 *   dlpack.c  DLPack export of mapped tensors (include/st/dlpack.h)
 *   copies.c  every device copy of the library: ranges merged, then the
 *             batched copy kernel (kernels/copy_ranges.cu, copy_batch.h)
 *             or cuMemcpyAsync
 *   args.c    the st_args_t map, placing values, scalar setters
 *   args_nest.c  lists and maps: begin/end, queued keys, bulk values
 *   args_text.c  arguments from "key=value" words and JSON text (read
 *             by src/common/json.c)
 *   targs.c   tensor arguments: st_tensor_alloc, st_args_tensor
 *   argcache.c which tensor arguments the server keeps per connection
 *   json_write.c  values as JSON text
 *   binding.c st_result_summary, st_client_call_summary (for bindings)
 *   marshal.c a result's value in CPython's marshal format
 *   pool.c    result pools: the connection's slabs and control page,
 *             regions of a reply, frees written into the page
 *   kept.c    what a server sends in full once per connection and names
 *             by id after: the table both of these use
 *   kept_arenas.c  arenas of objects sent once per connection
 *   kept_objects.c whole results of objects sent once per connection
 *   handoff.c hand-offs: create and open, then acquire, publish, read and
 *             acknowledge in the page
 *   fault.c   the message of a write to read-only memory the library
 *             mapped: a table of those mappings, a chained SIGSEGV handler
 *   buffer.c  named buffers and streams: the handle's life (buffer.h)
 *   buffer_io.c  buffers per frame: writes, reads, waits and the writer
 *             lock in the page, no server round trip
 *   keys.c    published keys: put, get, keys, delete
 *   live.c    live keys: the get and the page, updates, waits, consistent
 *             reads
 *   into.c    loading into caller-owned tensors: st_result_copy_into,
 *             st_get_into
 *
 * Nothing here is exported: the shared library is built with
 * -fvisibility=hidden and only ST_API functions are visible.
 */
#ifndef ST_CLIENT_INTERNAL_H
#define ST_CLIENT_INTERNAL_H

#include <msgpack.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "cudadrv/import.h"
#include "common/clock.h"
#include "proto/proto.h"
#include "st/client.h"

/* Largest reply frame the client accepts (replies are descriptors and
 * metadata, never tensor bytes). */
#define ST_CLIENT_MAX_REPLY (64u << 20)
/* Limit for connect + hello together when the caller gave no timeout
 * (st_client_options_t.timeout_ms 0). */
#define ST_CLIENT_CONNECT_TIMEOUT_MS ST_CONNECT_TIMEOUT_MS

/* ------------------------------------------------------------- buffers */

/* A msgpack_sbuffer whose packer records allocation failure instead of
 * losing it: pack freely, then check `oom` once. */
typedef struct st__cbuf {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  int oom;
  const int *fds;              /* descriptors that go with the request (tensor
                                  arguments; borrowed), or NULL           */
  size_t nfds;
} st__cbuf_t;

/* ---------------------------------------------------------------- kept
 *
 * kept.c: what a server sends in full once per connection and names by
 * id alone afterwards, until the client says in a request that it let it
 * go (docs/protocol.md, "Arenas sent once" and "Objects sent once"): one
 * table per connection and kind, guarded by the library's process-wide
 * lock (st__client_lock). An entry pins what it names while the client
 * may be named it: a mapping (kept_arenas.c) or a result (kept_objects.c). */
enum {
  ST__KEPT_USED,               /* pinned, used                              */
  ST__KEPT_IDLE,               /* used no more: waits to be told            */
  ST__KEPT_TOLD                /* told in the request in flight             */
};

typedef struct st__kept {
  uint64_t id;
  void *pin;                   /* NULL once let go (IDLE, TOLD)             */
  int state;
  st__arena_desc_t d;          /* kept_arenas.c: the arena as received (its fd
                                  is meaningless); unused by kept_objects.c     */
} st__kept_t;

typedef struct st__kepttab {
  st__kept_t *e;               /* oldest first                              */
  size_t n, cap;
  size_t idle;                 /* entries in ST__KEPT_IDLE                  */
} st__kepttab_t;

/* What a table does with its pins, and its lock (the library's
 * process-wide lock, st__client_lock: kept.c sits below map.c). */
typedef struct st__kept_ops {
  void (*lock)(void);
  void (*unlock)(void);
  /* Under the lock: nothing but the table uses pin, which is idle. */
  int (*unused)(void *pin);
  /* Under the lock: the table lets pin go; returns what to release once
   * the lock is let go, or NULL. */
  void *(*detach)(void *pin);
  /* Without the lock: releases what detach returned. */
  void (*release)(void *pin);
} st__kept_ops_t;

void st__client_cbuf_init(st__cbuf_t *b);
void st__client_cbuf_destroy(st__cbuf_t *b);
/* Appends raw (already msgpack) bytes through the packer. */
/* The params {name, ...} of a method on a named thing (hand-offs,
 * buffers): checks the name's length (1 to 64 bytes; the server checks
 * the rest), inits *b and packs the map; `extra` (may be NULL) packs the
 * n more pairs. ST_OK, or a recorded failure (INVALID_ARGUMENT "<method>:
 * a <kind> name is 1 to 64 bytes", OUT_OF_MEMORY) with *b destroyed. */
typedef void (*st__client_pack_fn)(msgpack_packer *pk, const void *arg);
int st__client_named_params(st_client_t *c, const char *method, const char *kind,
                            const char *name, st__client_pack_fn extra, const void *arg,
                            uint32_t n, st__cbuf_t *b);
void st__client_cbuf_raw(msgpack_packer *pk, const void *data, size_t len);

/* Growable NUL-terminated text with a sticky out-of-memory flag. */
typedef struct st__text {
  char *ptr;
  size_t len, cap;
  int oom;
} st__text_t;

void st__client_text_put(st__text_t *t, const char *s, size_t n);
void st__client_text_puts(st__text_t *t, const char *s);
void st__client_text_printf(st__text_t *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* -------------------------------------------------------------- client */

struct st_client {
  int fd;                      /* -1 once closed or broken                  */
  char path[108];
  st__reader_t reader;
  int reader_ready;
  /* Received descriptors not yet claimed by a response, arrival order. */
  int *fifo;
  size_t fifo_head, fifo_len, fifo_cap;
  uint32_t next_id;
  int timeout_ms;              /* 0: no limit                               */
  int64_t server_uid;          /* the uid the server must run as; -1: this
                                  process's effective uid or root           */
  int reply_pending;           /* a request was just sent: poll before recv */
  /* hello */
  char server_id[128];
  char server_version[64];
  int server_pid;
  int device;
  int release_notify;          /* the server's hello listed "release_notify" */
  /* last failure */
  int err;
  char err_name[32];
  char err_msg[512];
  char closed_why[160];        /* why fd is -1, for later calls             */
  int uncached;                /* the last error named tensor arguments the
                                  server does not keep (error `uncached`)   */
  /* The tensor arguments' allocations of the call being exchanged
   * (borrowed from its argument map; NULL/0 otherwise): a reply arena
   * {arg: i} is the i-th (arg_results.c). */
  struct st__mapping *const *call_args;
  size_t ncall_args;
  /* Tensor arguments the server keeps for this connection (argcache.c):
   * guarded by argcache.c's lock, since frees come from any thread. */
  int arg_cache;               /* the server's hello listed "arg_cache"     */
  uint64_t *arg_kept;          /* ids sent with their descriptor, sorted    */
  size_t arg_nkept, arg_kept_cap;
  uint64_t *arg_forget;        /* ids freed since, for params.forget        */
  size_t arg_nforget, arg_forget_cap;
  st_client_t *arg_next;       /* argcache.c's list of such connections     */
  /* Arenas the server sends once on this connection (kept_arenas.c):
   * guarded by the same lock, since frees come from any thread. */
  int arena_refs;              /* we asked and the server's hello listed it */
  st__kepttab_t kept_arenas;   /* arenas received with `kept`, pinned       */
  /* Whole results of objects the server sends once on this connection
   * (kept_objects.c): guarded by the same lock. */
  int object_refs;             /* we asked in hello                         */
  size_t objects_max;          /* results kept at most (kept_objects.c)          */
  st__kepttab_t kept_objects;  /* results received with `object_kept`      */
  int in_request;              /* a reply may still name arenas or objects
                                  by id (kept.c)                            */
  int reply_same;              /* this request's reply said `same`          */
  st_result_t *lent;           /* a `same` result lent to the caller
                                  (ST_CALL_LEND_SAME): the reference it was
                                  not given, dropped at the next request    */
  /* Result pool (pool.c): slabs held for the connection's life and its
   * control page; thread of the client. */
  struct st__client_pool *pool; /* we asked and the server listed "pool"  */
  st_client_t *kept_next;      /* kept_arenas.c's list of such connections    */
  /* st_get_into's kept sources (into.c): per key, the result of its last
   * st_get_into, so that the next one maps nothing new. */
  struct st__into_kept *into;
  size_t into_n;
  uint64_t into_uses;
  /* Lets go of `into` at st_client_close: set by into.c when it keeps
   * its first source (so that closing needs nothing of into.c). */
  void (*into_reset)(st_client_t *c);
  /* st_client_rpc_marshal's bytes (marshal.c), valid until the next call. */
  unsigned char *marshal_buf;
  size_t marshal_cap;
};

/* Records a failure (a negative ST_ERR_*) with the local error name and a
 * formatted message; returns err. */
/* A non-negative integer of a reply as a uint64_t in *out: an INT, or the
 * FLOAT a msgpack uint past INT64_MAX decodes to when it is below 2^64.
 * 1, or 0 for anything else (NULL, negative, out of range). */
static inline int st__client_value_u64(const st_value_t *v, uint64_t *out) {
  if (v && v->kind == ST_VALUE_INT && v->as.integer >= 0) {
    *out = (uint64_t)v->as.integer;
    return 1;
  }
  if (v && v->kind == ST_VALUE_FLOAT && v->as.number >= 0 &&
      v->as.number < 18446744073709551616.0) {   /* 2^64 */
    *out = (uint64_t)v->as.number;
    return 1;
  }
  return 0;
}

int st__client_fail(st_client_t *c, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Records a failure named by the server. Returns err. */
int st__client_fail_remote(st_client_t *c, int err, const char *name, size_t name_len,
                           const char *msg, size_t msg_len);
void st__client_clear_error(st_client_t *c);
/* Failures of handle functions that have no client to record them on
 * (hand-offs, buffers): the message goes to a thread-local buffer that
 * st__client_handle_error returns. Returns code. Any thread. */
int st__client_handle_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *st__client_handle_error(void);

/* keys.c: a live key's part of a get reply (docs/protocol.md, "Live
 * keys"). */
typedef struct st__key_live {
  int live;                    /* the reply named a control page          */
  uint32_t page;               /* its index in the reply's arenas         */
  int publisher;               /* this connection publishes the key       */
} st__key_live_t;
/* keys.c: st_client_get_since (view may be NULL; have 0: always the
 * whole reply), and the reply's `live` map into *live (may be NULL).
 * Thread of the client. */
int st__client_key_get(st_client_t *c, const char *key, uint64_t version, int flags,
                       const char *view, uint64_t have, st_result_t **out,
                       uint64_t *got_version, st__key_live_t *live);
/* live.c: after a put that took live key `key` over (the reply said
 * `taken`): copies the top-level tensors of `value` into the key's
 * memory by name as one update; *version (may be NULL) gets the new
 * version. ST_OK or a recorded failure. Thread of the client. */
int st__client_key_take(st_client_t *c, const char *key, const st_args_t *value,
                        uint64_t *version);

/* Deadline for a limit in ms (0 = none -> -1). */
int64_t st__client_deadline(int timeout_ms);

/* conn.c. Each returns ST_OK or a recorded failure. */
/* Connects to `path` by `deadline` (limit_ms: the limit it came from, for
 * messages) and checks that the listening side runs as c->server_uid
 * (ST_ERR_AUTH otherwise, before anything is sent). */
int st__client_conn_open(st_client_t *c, const char *path, int64_t deadline, int limit_ms);
/* Sends buf; the nfds descriptors `fds` (borrowed, may be NULL) go as one
 * SCM_RIGHTS message with its first byte. */
int st__client_conn_send(st_client_t *c, const void *buf, size_t len, const int *fds,
                         size_t nfds, int64_t deadline);
/* Reads what is available (waiting until the deadline for something) into
 * the reader, queueing any descriptors. */
int st__client_conn_fill(st_client_t *c, int64_t deadline);
/* Closes the socket and every queued descriptor; records `why` for later
 * calls. Safe to call twice. */
void st__client_conn_shutdown(st_client_t *c, const char *why);
/* Moves the first n queued descriptors to out[] (owned by the caller).
 * ST_OK, or ST_ERR_PROTOCOL when fewer are queued. */
int st__client_fifo_take(st_client_t *c, int *out, size_t n);

/* rpc.c: one request and its reply. `params` (may be NULL) is the bytes of
 * one msgpack map of named parameters; `req_fds` (req_nfds of them,
 * borrowed) go with the request. On ST_OK *reply holds the response
 * (caller destroys it), and when its result is a map with an `arenas` array
 * *fds receives that many descriptors (owned by the caller, *nfds set;
 * *fds NULL when none). On failure nothing is left to free. */
int st__client_exchange(st_client_t *c, const char *method, const void *params,
                        size_t params_len, const int *req_fds, size_t req_nfds,
                        st__message_t *reply, int **fds, size_t *nfds);
/* st__client_exchange with the limit given as an absolute `deadline`
 * (st__now_mono_ns time; -1: none) instead of c->timeout_ms from now:
 * connect + hello share one deadline. */
int st__client_exchange_until(st_client_t *c, const char *method, const void *params,
                              size_t params_len, const int *req_fds, size_t req_nfds,
                              int64_t deadline, st__message_t *reply, int **fds, size_t *nfds);

/* rpc.c: sends `method` with params (the bytes of one msgpack map) as a
 * notification: no id, no reply (docs/protocol.md, "Messages"). ST_OK
 * once written; a failed write closes the connection. */
int st__client_notify(st_client_t *c, const char *method, const void *params, size_t params_len);

/* call.c: one exchange of `method` (params: the bytes of one msgpack map
 * and the descriptors that go with it, or NULL for none) decoded into a new result owned by the caller; with
 * `unwrap` the value is result["value"] and result["object"] is kept (call,
 * task result). Thread of the client. */
int st__client_method(st_client_t *c, const char *method, const st__cbuf_t *params, int unwrap,
                      st_result_t **out);
/* call.c: the exchange of st_client_rpc (method and parameters checked,
 * the parameters packed); *reply, *fds and *nfds as st__client_exchange
 * gives them. Thread of the client. */
int st__client_rpc_exchange(st_client_t *c, const char *method, const st_args_t *params,
                            st__message_t *reply, int **fds, size_t *nfds);
/* The pairs a request with an argument map starts with: npairs
 * key/value pairs that pack(pk, ud) writes. */
/* keys.c: checks read grants `r` for `method` (NULL: none): ST_OK, or a
 * recorded INVALID_ARGUMENT (a NULL list with a count; more than
 * ST__READERS_MAX uids or gids, the server's bound). */
#define ST__READERS_MAX 16
int st__client_readers_check(st_client_t *c, const char *method, const st_readers_t *r);
/* keys.c: the map entry readers = {uids: [..], gids: [..]} of checked `r`
 * (not NULL); the caller counted it. */
void st__client_pack_readers(msgpack_packer *pk, const st_readers_t *r);

typedef struct st__client_head {
  uint32_t npairs;
  void (*pack)(msgpack_packer *pk, const void *ud);
  const void *ud;
} st__client_head_t;
/* call.c: st__client_method of `method` with params {head's pairs[,
 * args_key: args][, arenas]} (args_key NULL: no argument map); tensor
 * arguments go with call, submit and put only, sent again with their
 * descriptors when the server no longer holds an id. Thread of the
 * client. */
int st__client_args_method(st_client_t *c, const char *method, const st__client_head_t *head,
                           const char *args_key, const st_args_t *args, int unwrap,
                           st_result_t **out);
/* call.c: st__client_method of `method` with params {endpoint[, args]}
 * (`with_args`); an empty endpoint name is ST_ERR_INVALID_ARGUMENT. Used by
 * call, submit and invalidate_*. Thread of the client. */
int st__client_endpoint_method(st_client_t *c, const char *method, const char *endpoint,
                               const st_args_t *args, int with_args, int unwrap,
                               st_result_t **out);
/* connect.c: closes the connection and connects again to c->path with a new
 * hello (server_id and the rest updated), waiting at most timeout_ms.
 * ST_OK or a recorded failure (ST_ERR_IO when nothing listens). */
int st__client_reconnect(st_client_t *c, int timeout_ms);

/* ------------------------------------------------------------- results */

typedef struct st__mapping st__mapping_t;

/* map.c: maps arena `d` received as `fd` (always consumed: closed or kept
 * by nobody) for the allocation (server_id, d->id), or reuses the mapping
 * this process already has. On ST_OK *out holds one reference. Errors:
 * ST_ERR_CAPABILITY (CUDA), ST_ERR_PROTOCOL (descriptor and file
 * disagree), ST_ERR_IO / ST_ERR_OUT_OF_MEMORY, with a reason. Any thread. */
int st__client_map_arena(const char *server_id, const st__arena_desc_t *d, int fd,
                         st__mapping_t **out, char *err, size_t errlen);
/* map.c: maps pool slab `d` (a memfd, or with d->cuda a VMM allocation
 * on the device d->uuid names, imported once; checked as any arena; fd
 * consumed) as a mapping in no list: never shared, never kept; *out holds
 * the caller's one reference. ST_OK or an error with a reason. Any
 * thread. */
int st__client_map_slab(const st__arena_desc_t *d, int fd, st__mapping_t **out, char *err,
                        size_t errlen);
/* map.c: the references m has now (a pool slab: the connection's and
 * one per region of it). Any thread. */
size_t st__client_mapping_refs(st__mapping_t *m);
/* map.c: nonzero when mapping m is on the device `d` names (the CPU, or
 * the CUDA device of d->uuid). */
int st__client_mapping_is(const st__mapping_t *m, const st__arena_desc_t *d);
/* map.c: a region of `slab` ([offset, offset+size), checked) as a mapping
 * of its own (one reference in *out; it holds one on the slab). Its last
 * release calls freed(page, slot, gen, slab, ordinal) (pool.c's
 * pool_freed, which takes over the page reference the caller
 * gave and the region's slab reference); ordinal is the region's CUDA
 * device when its free must wait for that device's work
 * (st__client_mapping_release_after_device), else -1. ST_OK,
 * ST_ERR_PROTOCOL (out of the slab), ST_ERR_OUT_OF_MEMORY. Any thread. */
struct st__pool_page;
typedef void (*st__region_freed_fn)(struct st__pool_page *page, uint32_t slot, uint32_t gen,
                                    st__mapping_t *slab, int ordinal);
int st__client_map_region(st__mapping_t *slab, uint64_t offset, uint64_t size,
                          st__region_freed_fn freed, struct st__pool_page *page, uint32_t slot,
                          uint32_t gen, st__mapping_t **out);
/* Drops one reference; the last one unmaps. NULL ok. Any thread. */
void st__client_mapping_release(st__mapping_t *m);
/* st__client_mapping_release for a holder whose memory a device may still
 * read (a DLPack consumer let its tensor go: result.c): when m is a CUDA
 * pool region of this process, its free waits, whichever release is its
 * last, for the work queued on its device's legacy default stream up to
 * that last release (pool.c). Other mappings: st__client_mapping_release.
 * Any thread. */
void st__client_mapping_release_after_device(st__mapping_t *m);
/* One more reference on m: a result's (pin 0) or a connection's pin (pin
 * 1, kept_arenas.c; st__client_mapping_unpin drops it). Any thread. */
void st__client_mapping_ref(st__mapping_t *m, int pin);
void st__client_mapping_unpin(st__mapping_t *m);
/* Marks m as an object's arena (the reply's `kept` named it): only such a
 * mapping is kept mapped after its last reference (st_open_cache_keep),
 * since the server may send it again; a plain result's never comes back.
 * Any thread. */
void st__client_mapping_mark_reusable(st__mapping_t *m);
/* Whether only pins hold m (no result uses it). Under the lock. */
int st__client_mapping_only_pinned_locked(const st__mapping_t *m);
/* fdcheck.c: ST_OK when `fd` (borrowed; `st` its fstat) is what a "memfd"
 * arena `d` must be: a tmpfs regular file sealed with F_SEAL_SHRINK, of
 * at least d->bytes, open for reading when d->readonly (it is mapped
 * PROT_READ), else open read-write and not sealed against writing (it is
 * mapped PROT_READ | PROT_WRITE). Else ST_ERR_PROTOCOL with a reason
 * naming the arena. Any thread. */
struct stat;
int st__client_check_memfd(const st__arena_desc_t *d, int fd, const struct stat *st, char *err,
                           size_t errlen);
/* fdcheck.c: ST_OK when `fd` (borrowed) can be the exported VMM handle of
 * a "vmm" arena: a descriptor of the NVIDIA control device, open
 * read-write. Else ST_ERR_PROTOCOL (ST_ERR_IO when fstat fails) with a
 * reason. Any thread. */
int st__client_check_vmm_fd(const st__arena_desc_t *d, int fd, char *err, size_t errlen);
/* The library's one process-wide lock (map.c: the open-cache's, also
 * argcache.c's lists; taken around fork). Not recursive. Any thread. */
void st__client_lock(void);
void st__client_unlock(void);
/* Own allocations (tensor arguments): memory this process makes and
 * passes to endpoints (map.c). st__client_own_alloc makes a zero-filled
 * sealed memfd (cuda_ordinal < 0) or exportable VMM allocation on that
 * ordinal of at least `bytes`, mapped read-write; *out holds one
 * reference (st__client_mapping_release). Errors: ST_ERR_OUT_OF_MEMORY,
 * ST_ERR_LIMIT, ST_ERR_CAPABILITY, with a reason. Any thread. */
int st__client_own_alloc(int cuda_ordinal, uint64_t bytes, st__mapping_t **out, char *err,
                         size_t errlen);
/* The own allocation on `cuda_ordinal` (-1: CPU memory) that holds the
 * `len` bytes at p, with one more reference in *out and p's byte offset
 * from its base in *offset. ST_OK or ST_ERR_NOT_FOUND. Any thread. */
int st__client_own_find(const void *p, uint64_t len, int cuda_ordinal, st__mapping_t **out,
                        uint64_t *offset);
/* The arena descriptor of an own allocation for a request (fd left 0). */
void st__client_own_describe(const st__mapping_t *m, st__arena_desc_t *d);
/* Its descriptor (borrowed: the mapping owns it); -1 for other mappings. */
int st__client_own_fd(const st__mapping_t *m);
/* Base address (NULL for an empty arena; a device address for CUDA). */
void *st__client_mapping_base(const st__mapping_t *m);
/* CUDA ordinal of the mapping in this process; -1 for CPU memory. */
int st__client_mapping_ordinal(const st__mapping_t *m);
/* The bytes a mapping makes usable (0 for an empty arena). */
uint64_t st__client_mapping_bytes(const st__mapping_t *m);
/* Nonzero when m may be written: a memfd mapped PROT_READ | PROT_WRITE
 * (its descriptor checked to allow it, fdcheck.c), or a VMM import given
 * read-write access (this library sets a CUDA mapping's access itself:
 * read-only exactly when the arena was marked or asked read-only). A
 * pool region is as its slab. */
int st__client_mapping_writable(const st__mapping_t *m);
/* map.c: describes m's memory (when it is a read-only CPU mapping with a
 * place in fault.c's table) as `what` of `kind`, for the message of a
 * fault there. Any thread holding a reference. */
void st__client_mapping_describe(st__mapping_t *m, int kind, const char *what);
/* Nonzero when m has such a place (st__client_mapping_describe would
 * describe it). */
int st__client_mapping_describable(const st__mapping_t *m);

/* fault.c: the message a process that writes to read-only memory of the
 * library prints before it dies (docs/client.md, "A write to read-only
 * memory"). What a mapping is, for the message: */
typedef enum st__fault_kind {
  ST__FAULT_ARENA,      /* a server arena, not described further        */
  ST__FAULT_KEY,        /* a key got read-only                          */
  ST__FAULT_LIVE_KEY,   /* a live key, mapped by a handle that is not its
                           publisher's (st_key_open, Python's bind)     */
  ST__FAULT_RESULT,     /* a call's result, called read-only            */
  ST__FAULT_BUFFER      /* a buffer opened read-only                    */
} st__fault_kind_t;
/* Mappings the table describes at most; one more is not described. */
#define ST__FAULT_SLOTS 4096
/* Records [start, start+len), read-only memory this library mapped, as
 * `what` (copied; cut at 175 bytes), e.g. "key 'w' (version 3)", and
 * installs the handler on the first call. Returns the entry's slot (> 0),
 * or 0 when the table is full or the handler is turned off
 * (ST_NO_FAULT_HANDLER): nothing to remove then. Any thread. */
int st__client_fault_add(const void *start, size_t len, int kind, const char *what);
/* Describes slot's memory anew (0: nothing). Any thread. */
void st__client_fault_describe(int slot, int kind, const char *what);
/* Forgets slot (0: nothing), before its memory is unmapped. Any thread. */
void st__client_fault_remove(int slot);

/* device.c: CUDA for the client. Every function leaves the calling
 * thread's current CUDA context as it found it. Any thread. */
/* Ordinal in this process of the device arena `d` names by UUID, with its
 * primary context created. ST_OK; ST_ERR_CAPABILITY "no CUDA device:
 * <reason> (arena N is on GPU-...)" without a driver or when no visible
 * device has that UUID; ST_ERR_PROTOCOL for a malformed UUID. */
int st__client_cuda_device(const st__arena_desc_t *d, int *ordinal, char *err, size_t errlen);
/* st__cuda_import of `fd` (borrowed; the caller closes it) as `d` says,
 * with client errors: ST_ERR_PROTOCOL when the descriptor and its
 * allocation disagree (size, not an exported allocation),
 * ST_ERR_CAPABILITY, ST_ERR_OUT_OF_MEMORY. */
int st__client_cuda_import(const st__arena_desc_t *d, int fd, st__cuda_mapping_t *out,
                           char *err, size_t errlen);
/* Allocates zero-filled, exportable device memory of at least `bytes` on
 * device `ordinal` (st__cuda_create_fd + st__cuda_import): *fd (owned by
 * the caller) names it, *out maps it here, `uuid` (ST_CUDA_UUID_LEN bytes)
 * receives the device's UUID. ST_ERR_CAPABILITY, ST_ERR_OUT_OF_MEMORY,
 * ST_ERR_INVALID_ARGUMENT (bad ordinal), with a reason. */
int st__client_cuda_alloc(int ordinal, uint64_t bytes, int *fd, st__cuda_mapping_t *out,
                          char *uuid, char *err, size_t errlen);
/* st__cuda_unmap. NULL or unmapped: no-op. */
void st__client_cuda_unmap(st__cuda_mapping_t *m);
/* Synchronous copy of `bytes` from device address `src` on device
 * `ordinal` to host memory. ST_OK or a negative ST_ERR_*. */
int st__client_cuda_to_host(void *dst, const void *src, size_t bytes, int ordinal);
/* The other way: host memory to device address `dst`, waited for. */
int st__client_cuda_from_host(void *dst, const void *src, size_t bytes, int ordinal);
/* Synchronous copy of `bytes` between device addresses on device
 * `ordinal` (cuMemcpyDtoD; unified addressing). ST_OK or a negative
 * ST_ERR_*. Any thread. */
int st__client_cuda_dtod(void *dst, const void *src, size_t bytes, int ordinal);
/* Waits for the work queued on CUstream `stream` of device `ordinal`'s
 * primary context, or (stream NULL) for all of that context's work
 * (cuCtxSynchronize). ST_OK, ST_ERR_CAPABILITY, or the driver's error
 * (a failed kernel's) with a reason. Any thread. */
int st__client_cuda_sync(int ordinal, void *stream, char *err, size_t errlen);
/* device.c: one copy of st__client_cuda_copies; host or device
 * addresses either side. */
typedef struct st__client_copy {
  void *dst;
  const void *src;
  size_t bytes;
} st__client_copy_t;
/* copies.c: queues the n copies on `stream` (a CUstream of device
 * `ordinal`; NULL: the legacy default stream of its primary context),
 * copies that follow each other in both destination and source merged
 * into one; two or more device ranges of that device go by the batched
 * copy kernel, the others by cuMemcpyAsync. Destinations must not overlap
 * (the copies of one call run concurrently). `flags` are st_copy_ranges':
 * ST_COPY_DEVICE skips the check that both sides are memory of the
 * device; with ST_COPY_SYNC, waits for the stream. ST_OK, or
 * ST_ERR_CAPABILITY (no driver) or the driver's error with a reason in
 * err (copies queued before a failure stay queued). Any thread. */
int st__client_cuda_copies(const st__client_copy_t *copies, size_t n, int ordinal, void *stream,
                           int flags, char *err, size_t errlen);
#ifdef ST_HAVE_CUDA
/* device.c: the calling thread's current context (NULL: none), to put
 * back with st__client_ctx_restore once done (a library must not change
 * its caller's thread state). Call only once st__cuda_api() succeeded. */
CUcontext st__client_ctx_save(void);
void st__client_ctx_restore(const st__cuda_api_t *a, CUcontext c);
#endif
/* A CUDA event of device `ordinal` (taken from that device's free list,
 * or created), recorded on the device's legacy default stream
 * (CU_STREAM_LEGACY of its primary context): it completes once every
 * piece of work queued there before now, and on the blocking streams the
 * legacy stream waits for, is done. ST_OK with *out; ST_ERR_CAPABILITY
 * (no driver), ST_ERR_INVALID_ARGUMENT (ordinal), or the driver's error
 * (a stream capture in progress refuses the legacy stream). */
typedef struct st__client_event st__client_event_t;
int st__client_event_record(int ordinal, st__client_event_t **out);
/* 1 when e completed (or its context failed, or the driver is gone: no
 * work of it runs any more), 0 while it has not. Never blocks. */
int st__client_event_done(st__client_event_t *e);
/* Blocks until e completed (or its context failed). */
void st__client_event_wait(st__client_event_t *e);
/* Gives e back to its device's free list (NULL ok). */
void st__client_event_put(st__client_event_t *e);

/* result.c: decodes a reply's result into a new result. When `unwrap` the
 * value is result["value"] (call); otherwise the whole result (rpc). fds
 * (nfds of them, may be NULL) are consumed. */
int st__client_result_decode(st_client_t *c, const msgpack_object *result, int unwrap,
                             int *fds, size_t nfds, st_result_t **out);
/* result.c: st__client_result_decode of the reply to a request that asked
 * for read-only memory (a get with ST_GET_READONLY): every arena is mapped
 * read-only whatever the reply says, and a pool region or an arena named
 * by id (both writable mappings of this connection) is ST_ERR_PROTOCOL. */
int st__client_result_decode_readonly(st_client_t *c, const msgpack_object *result, int unwrap,
                                      int *fds, size_t nfds, st_result_t **out);
/* result.c: nonzero when every mapping of r holding bytes of tensor t (of
 * r; NULL: every mapping of r) is writable (st__client_mapping_writable):
 * what a handle checks before it, or its caller, writes there. */
int st__client_result_writable(const st_result_t *r, const st_tensor_t *t);
/* result.c: st__client_mapping_describe of every mapping of r, as the
 * printf-style `fmt` says. Any thread holding a reference. */
void st__client_result_describe(st_result_t *r, int kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* -------------------------------------------------------------- args */

/* The argument map (args.c, args_nest.c). Values are packed as they are
 * set: a scalar at the top level is packed into `build` and copied into
 * its entry at once; a list or map opened at the top level is packed into
 * `build` element by element and becomes an entry when its outermost
 * st_args_end closes it. */

/* Levels of lists and maps in one argument. The server reads a request
 * with at most ST_MAX_DEPTH levels of msgpack containers (the depth of
 * msgpack-c's unpacker; src/proto/reader.c), and a call's argument values
 * sit inside four of them: the request, its params array, the params map
 * and the argument map. Deeper values would cost the connection. */
#define ST__ARGS_MAX_OPEN (ST_MAX_DEPTH - 4)

typedef struct st__arg {
  char *key;                   /* NUL-terminated; key_len bytes (may hold NUL) */
  size_t key_len;
  char *data;                  /* msgpack bytes of the value */
  size_t len;
} st__arg_t;

/* An open list or map. Keys queued for a map's next members (st_args_key,
 * st_args_keys) wait in st_args.keys, as msgpack strings, from kq_pos; the
 * queue of an inner frame follows its parent's (from kq_base). */
typedef struct st__args_frame {
  size_t head;                 /* offset of the container's header in build */
  uint32_t count;              /* elements or members placed so far */
  int map;
  size_t kq_base, kq_pos;      /* this frame's key queue in st_args.keys */
  uint32_t kq_count;           /* keys queued, not yet used */
} st__args_frame_t;

struct st_args {
  st__arg_t *items;
  size_t n, cap;
  /* Own allocations that tensor values name by index (st_args_tensor,
   * targs.c): one reference each, dropped by st_args_free. */
  st__mapping_t **arenas;
  size_t narenas, arenas_cap;
  /* The value being built (empty between top-level calls). */
  st__cbuf_t build;
  st__cbuf_t keys;             /* queued map keys of the open frames */
  char *build_key;             /* name of the open top-level value */
  st__args_frame_t *open;      /* ST__ARGS_MAX_OPEN frames, from the first
                                  st_args_begin_* on                        */
  int depth;                   /* open containers with a frame */
  int lost;                    /* open containers past the limit (after a failure) */
  int build_rc;                /* first failure inside the open value, or ST_OK */
  char err[256];
};

/* Records a failure's message (st_args_error); inside an open value the
 * first failure sticks (build_rc) and is what every later call returns.
 * Returns that failure. */
int st__client_args_fail(st_args_t *a, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The name of the open top-level value, for messages. */
const char *st__client_args_name(const st_args_t *a);
/* Checks where one more value goes (top level: the argument `key`; a
 * list: key NULL; a map: `key`, or NULL and a queued key) and, in a map,
 * writes its key into build. `nest`: the value is a container. ST_OK or a
 * recorded failure. */
int st__client_args_place(st_args_t *a, const char *key, int nest);
/* The same for n values of a bulk setter (`what`, for messages) in the
 * innermost open container; writes no key (st__client_args_next_key does,
 * before each value). */
int st__client_args_place_many(st_args_t *a, size_t n, const char *what);
/* Writes the next queued key when the innermost container is a map. */
void st__client_args_next_key(st_args_t *a);
/* After nvalues values were packed into build: a top-level value becomes
 * the entry `key`; inside a container they count. ST_OK or a recorded
 * failure (out of memory). */
int st__client_args_placed(st_args_t *a, const char *key, size_t nvalues);

/* 1 while a list or map of a's builder is open (the calls refuse such
 * arguments), else 0; NULL gives 0. */
int st__client_args_open(const st_args_t *a);
/* Packs the arguments as one msgpack map (NULL packs {}). */
void st__client_args_pack(msgpack_packer *pk, const st_args_t *a);
/* The own allocations the arguments' tensors live in (targs.c), in the
 * order their `arena` indices name them; NULL/0 when none. Borrowed. */
size_t st__client_args_arenas(const st_args_t *a, st__mapping_t *const **out);
/* Index of own allocation m in a's arena list, appended when new; takes
 * the caller's reference on m. -1 when out of memory. */
long st__client_args_arena_index(st_args_t *a, st__mapping_t *m);
/* arg_results.c: nonzero when reply arena entry `a` names one of the
 * call's tensor arguments ({arg: i}, docs/protocol.md, "Tensor
 * arguments"). */
int st__client_arg_result_is(const msgpack_object *a);
/* arg_results.c: the allocation such an entry names, with its description
 * (*d) and one more reference on its mapping (*out): the caller's own
 * memory, mapped already. ST_ERR_PROTOCOL when it names no tensor argument
 * of the call being exchanged (c->call_args). Thread of the client. */
int st__client_arg_result_arena(st_client_t *c, const msgpack_object *a, st__arena_desc_t *d,
                                st__mapping_t **out);

/* kept.c (see "kept" above). Every function but params, answered,
 * resolved and reset runs under the lock. */
/* Entry of id in t, or NULL. */
st__kept_t *st__kept_find(st__kepttab_t *t, uint64_t id);
/* Entry of id (appended when new) now pinning pin, KEPT; *old receives
 * the pin it had (NULL if none). NULL when out of memory (t unchanged). */
st__kept_t *st__kept_keep(st__kepttab_t *t, uint64_t id, void *pin, void **old);
/* Entry e of t is used no more: it waits for the next request to tell the
 * server. With no request of c in flight its pin is let go at once (no
 * reply can name it before the server is told): returns 1, the caller
 * releases it; else 0, the pin stays until the request is over. */
int st__kept_idle(const st_client_t *c, st__kepttab_t *t, st__kept_t *e);
/* The ids of t's idle entries as `key: [ids]` in params (as
 * st__client_argcache_params), which are TOLD from now on; the request
 * being packed opens c's window (in_request). Returns 1 when out was
 * packed. Takes the lock. Thread of the client. */
int st__kept_params(st_client_t *c, st__kepttab_t *t, const st__kept_ops_t *ops,
                    const char *key, const void *params, size_t len, st__cbuf_t *out);
/* The reply to the request that told t's TOLD entries came: they go (their
 * pins detached and released). Unless the reply names things by id
 * (`names_by_id`), the request is over: idle pins that nothing else uses
 * go too. Takes the lock. Thread of the client. */
void st__kept_answered(st_client_t *c, st__kepttab_t *t, const st__kept_ops_t *ops,
                       int names_by_id);
/* The reply's names by id are resolved: the request is over, idle pins
 * that nothing else uses go. Takes the lock. Thread of the client. */
void st__kept_resolved(st_client_t *c, st__kepttab_t *t, const st__kept_ops_t *ops);
/* Empties t, detaching and releasing every pin. Takes the lock. Thread of
 * the client. */
void st__kept_reset(st__kepttab_t *t, const st__kept_ops_t *ops);

/* kept_arenas.c: arenas of objects the server sends once per connection
 * (see the top of that file). */
/* Starts c's table afresh (a hello, a reconnect, the close): every pin is
 * dropped; with `on` (we asked in hello and the server listed
 * "arena_refs") c joins the connections that use it. Thread of the
 * client. */
void st__client_kept_arenas_reset(st_client_t *c, int on);
/* Whether arena map `a` of a reply is a {ref: id} entry (no descriptor). */
int st__client_kept_arenas_is_ref(const st_client_t *c, const msgpack_object *a);
/* The mapping and descriptor of a {ref: id} entry: ST_OK with one result
 * reference in *out, or a recorded PROTOCOL failure when c was never sent
 * that arena with `kept` (or let it go). Thread of the client. */
int st__client_kept_arenas_find(st_client_t *c, const msgpack_object *a, st__arena_desc_t *d,
                              st__mapping_t **out);
/* The reply's `kept` named arena d, mapped as m: c pins m until it tells
 * the server that it let it go. Thread of the client. */
void st__client_kept_arenas_keep(st_client_t *c, const st__arena_desc_t *d, st__mapping_t *m);
/* m has no reference left but the pins of connections: each connection
 * that pins it queues its id for params.unmapped; one with no request in
 * flight lets its pin go at once. Returns how many pins were let go: the
 * caller (map.c, under the lock) drops them from m's counts. */
size_t st__client_kept_arenas_idle_locked(st__mapping_t *m);
/* As st__client_argcache_params, for `unmapped: [ids]`. */
int st__client_kept_arenas_params(st_client_t *c, const void *params, size_t len, st__cbuf_t *out);
/* The server answered the request that carried `unmapped`: the pins of
 * those arenas go (unmapping what nothing else uses). Unless the reply
 * names arenas by id (`names_refs`), the request is over: idle pins go
 * too. Thread of the client. */
void st__client_kept_arenas_answered(st_client_t *c, int names_refs);
/* The reply's arenas are resolved (result.c): the request is over, idle
 * pins go. Thread of the client. */
void st__client_kept_arenas_resolved(st_client_t *c);

/* kept_objects.c: whole results of objects the server sends once per
 * connection (see the top of that file). */
/* $ST_CLIENT_KEEP_OBJECTS: results kept per connection (default 1024; 0:
 * hello does not ask for "object_refs"). Any thread. */
size_t st__client_kept_objects_max(void);
/* Starts c's table afresh (a hello, a reconnect, the close): every kept
 * result is let go (one its user holds stays valid); `on`: our hello asked
 * for "object_refs". Thread of the client. */
void st__client_kept_objects_reset(st_client_t *c, int on);
/* r was decoded from a reply that says `object_kept`: c keeps it, so that
 * a later `same` reply returns it; r's references are counted under the
 * lock from now on. Before r is returned to its user. Thread of the
 * client. */
void st__client_kept_objects_keep(st_client_t *c, st_result_t *r);
/* A `same` reply (result: {object, same}): ST_OK with *out one more
 * reference to the result c keeps of that object, or a recorded PROTOCOL
 * failure when c keeps none (never sent with `object_kept`, or let go) or
 * the reply's object map differs from it. Thread of the client. */
int st__client_kept_objects_same(st_client_t *c, const msgpack_object *result, st_result_t **out);
/* Starts a request of c (any method, hello included): the reply of the
 * last one is over, so the result lent of it goes (one reference dropped:
 * the last one lets the server be told in this very request). Thread of
 * the client. */
void st__client_kept_objects_request(st_client_t *c);
/* The caller's reference to r, the result of a `same` reply, is lent
 * (ST_CALL_LEND_SAME): c holds it until its next request or close.
 * Thread of the client. */
void st__client_kept_objects_lend(st_client_t *c, st_result_t *r);
/* st_result_ref and st_result_free of a kept result (r->kept): under the
 * lock. unref returns 1 when the caller frees r now, 0 when r lives on
 * (other references, or parked in its connection's table). Any thread. */
void st__client_kept_objects_ref(st_result_t *r);
int st__client_kept_objects_unref(st_result_t *r);
/* As st__client_kept_arenas_params, for `objects_freed: [ids]`. */
int st__client_kept_objects_params(st_client_t *c, const void *params, size_t len, st__cbuf_t *out);
/* As st__client_kept_arenas_answered and _resolved, for kept results. */
void st__client_kept_objects_answered(st_client_t *c, int names_by_id);
void st__client_kept_objects_resolved(st_client_t *c);

/* pool.c: result pools (docs/pool.md). */
/* Starts c's pool afresh (hello, reconnect, close): the connection lets
 * its slabs go (regions still used keep theirs, and the page, alive);
 * with `on` c takes regions from now on. Thread of the client. */
void st__client_pool_reset(st_client_t *c, int on);
/* Whether ST_CLIENT_POOL asks for no pool ("0"). Any thread. */
int st__client_pool_disabled(void);
/* Whether arena map `a` of a reply is a region (has `pool`). */
int st__client_pool_is_region(const msgpack_object *a);
/* Whether region entry `a` carries its slab's descriptor. */
int st__client_pool_has_fd(const msgpack_object *a);
/* Takes the reply's `pool_page` (may be NULL) when c has none yet: maps
 * the descriptor it names (fds[i] set to -1). ST_OK or a recorded
 * failure. Thread of the client. */
int st__client_pool_take_page(st_client_t *c, const msgpack_object *pp, int *fds, size_t nfds);
/* Region entry `a`: its slab mapped once for the connection (the
 * descriptor taken from fds when the entry names one), then a region
 * mapping with one reference in *out; *d gets the region's size and id.
 * ST_OK or a recorded PROTOCOL/IO failure. Thread of the client. */
int st__client_pool_region(st_client_t *c, const msgpack_object *a, int *fds, size_t nfds,
                           st__arena_desc_t *d, st__mapping_t **out);
/* Writes the deferred frees of c's page whose events completed (oldest
 * first, up to the first that has not), without blocking. Thread of the
 * client, before each request. */
void st__client_pool_poll(st_client_t *c);

/* argcache.c: tensor arguments the server keeps (see the top of that
 * file). */
/* kept.c: params (len bytes of one msgpack map; NULL: an empty map) packed into
 * out (initialized, empty) with `key: [ids]` first. 0, or -1 when params
 * is not a map (out untouched). Any thread. */
int st__client_params_with_ids(const void *params, size_t len, const char *key,
                               const uint64_t *ids, size_t nids, st__cbuf_t *out);
/* Starts c's lists afresh after a hello: with `on` (the server has the
 * "arg_cache" feature) c joins the connections that use the cache, else
 * it leaves them and its lists are freed. Thread of the client. */
void st__client_argcache_reset(st_client_t *c, int on);
/* Own allocation arg_id was freed: every connection that kept it queues
 * it for params.forget. Any thread. */
void st__client_argcache_freed(uint64_t arg_id);
/* Packs params.arenas for the n own allocations (an arena named by its id
 * alone when c's server holds it, else with a descriptor, then kept) and
 * fills fds[] (room for n; borrowed from the mappings) with the
 * descriptors that go, in order. Returns how many. Thread of the client. */
size_t st__client_argcache_pack(st_client_t *c, msgpack_packer *pk, st__mapping_t *const *arenas,
                                size_t n, int *fds);
/* The server said it does not keep them: the n allocations are no longer
 * kept by c (their next request sends the descriptors). */
void st__client_argcache_unkeep(st_client_t *c, st__mapping_t *const *arenas, size_t n);
/* When c has freed ids queued and `params` (len bytes of one msgpack map;
 * NULL: none) is a map: packs it into out (initialized, empty) with
 * `forget: [ids]` added, and returns 1 (the ids are then the request's);
 * else returns 0 and out is untouched. Thread of the client. */
int st__client_argcache_params(st_client_t *c, const void *params, size_t len, st__cbuf_t *out);
/* Sets `key` (key_len bytes) to a copy of msgpack bytes. ST_OK /
 * ST_ERR_OUT_OF_MEMORY / ST_ERR_INVALID_ARGUMENT (empty or NULL key). */
int st__client_args_set_raw(st_args_t *a, const char *key, size_t key_len, const void *data,
                            size_t len);

#endif
