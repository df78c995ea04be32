/* src/server: the connection side of result pools (docs/pool.md,
 * sections 1-3; the pool itself is mem/pool.h): which connections have
 * one (hello feature "pool"), which builds allocate from it, how a reply
 * carries regions (closing the connection drops its reference).
 * Loop thread, except
 * st__pool_conn_prepare (workers). */
#ifndef ST_SERVER_POOL_CONN_H
#define ST_SERVER_POOL_CONN_H

#include <msgpack.h>

#include "engine/job.h"
#include "engine/result.h"
#include "mem/pool.h"
#include "st/wire.h"

typedef struct st__conn st__conn_t;
typedef struct st__server st__server_t;

/* Whether the server offers "pool" in hello (pool.max_regions > 0 and a
 * nonzero per-connection cap). */
int st__pool_offered(const st__server_t *srv);

/* Retires idle slabs of every pool (mem/pool.h st__mpool_trim_all): the
 * server's sweep timer, every half pool.idle_s at most. */
void st__pool_conn_sweep(st__server_t *srv);

/* hello: when `features` (an array of strings, or NULL) lists "pool" and
 * the server offers it, the connection gets a pool (once). Errors are
 * logged and leave the connection without one. */
void st__pool_conn_hello(st__conn_t *c, const msgpack_object *features);

/* A build of `ep` for connection c (a call, or the task it submits; NULL:
 * none): gives the job a reference on c's pool when no other connection
 * can be handed the result (not cached, not singleflight; a managed
 * object is its caller's). */
void st__pool_conn_job(const st__endpoint_decl_t *ep, st__conn_t *c, st__job_t *job);

/* The workers' prepare hook (engine/workers.h): the VM's own, then the job's
 * pool made current on the worker's thread. */
struct st__vm;
void st__pool_conn_prepare(struct st__vm *vm, const st__job_t *job);

/* What one reply carries: the arenas (borrowed, or copies it owns), and
 * for each whether it goes as a region of the connection's pool. */
typedef struct st__pool_reply {
  size_t n;
  st__arena_t *arenas[ST_MAX_FDS_PER_MESSAGE];
  unsigned char own[ST_MAX_FDS_PER_MESSAGE];     /* a copy: unref after */
  unsigned char pooled[ST_MAX_FDS_PER_MESSAGE];
  unsigned char ref[ST_MAX_FDS_PER_MESSAGE];     /* named by id: {ref} */
  uint32_t arg[ST_MAX_FDS_PER_MESSAGE];          /* with ref: 1 + the index of
                                 the request's tensor argument it is, named
                                 {arg: index} (set by reply.c after
                                 st__pool_reply_prepare)                   */
  st__mpool_desc_t desc[ST_MAX_FDS_PER_MESSAGE];
  int page;                   /* the control page goes with this reply */
  unsigned char readonly[ST_MAX_FDS_PER_MESSAGE];  /* this arena, when it
                                 goes as an arena of its own, goes
                                 read-only (st__arena_dup_fd_readonly;
                                 desc.readonly)                           */
} st__pool_reply_t;

/* Decides how each arena of r travels to c: a region of c's pool that
 * was never handed out goes as a region (the slab's descriptor only the
 * first time); a region of another pool, or one handed out before, is
 * copied into an arena of its own; for an object's result (`obj`), an
 * arena c already keeps mapped (kept.h) goes by id alone. ST_OK,
 * or the error of the copy with the reason. Release with
 * st__pool_reply_done. */
int st__pool_reply_prepare(st__conn_t *c, const st__build_result_t *r, int obj,
                           st__pool_reply_t *pr, char *err, size_t errlen);

/* Descriptors the reply sends (*nfds) and bytes they pin (*pinned). */
void st__pool_reply_count(const st__pool_reply_t *pr, int *nfds, uint64_t *pinned);

/* Appends the descriptors to fds[*nfds...] in wire order: each arena's
 * (or its slab's) then the page's. ST_OK or the dup's error (what was
 * appended stays for the caller to close). */
int st__pool_reply_fds(st__conn_t *c, const st__pool_reply_t *pr, int *fds, int *nfds, char *err,
                       size_t errlen);

/* Packs the `arenas` array (a {ref} entry for each arena named by id); then, when the page goes, "pool_page" and its
 * value (the caller counted one more key with pr->page). */
void st__pool_reply_pack(st__conn_t *c, msgpack_packer *pk, const st__pool_reply_t *pr);
void st__pool_reply_pack_page(st__conn_t *c, msgpack_packer *pk, const st__pool_reply_t *pr,
                              uint32_t fd_index);

/* sent: the reply was queued (the client holds the regions now). Drops
 * the copies either way. */
void st__pool_reply_done(st__conn_t *c, st__pool_reply_t *pr, int sent);

#endif
