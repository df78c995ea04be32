/* src/engine: named buffers and streams (docs/streams.md; docs/protocol.md,
 * "Buffers").
 *
 * A buffer is `slots` frames of one shape and dtype (a memfd arena on the
 * CPU, a VMM arena on CUDA) and a control page (shm/buffer_page.h, a
 * memfd arena), created by a connection and opened by connections of the
 * creator's uid, read-write or read-only; each open is a handle with an
 * id. Per frame nothing reaches the server: writes, reads, waits and the
 * writer lock are atomic operations and futex waits in the page. The
 * server acts when a handle opens or closes: a connection that leaves
 * (buffer_close of its last handle, or its connection closed, SIGKILL
 * included) has the writer lock freed when it held it, and a read-only
 * handle leaving is counted out of the page's readonly_handles.
 *
 * A buffer lives until buffer_unlink: the name goes at once; the memory
 * (and its budget charge) when no handle is left. Clients' mappings stay
 * valid until they unmap.
 *
 * The table knows no server: the caller passes connection ids, uids and
 * limits. Loop thread only.
 */
#ifndef ST_ENGINE_BUFFER_H
#define ST_ENGINE_BUFFER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "shm/buffer_page.h"
#include "engine/named.h"
#include "mem/arena.h"
#include "st/dtype.h"
#include "st/wire.h"

typedef struct st__buffer_handle {
  uint64_t id;                  /* server-wide, never reused              */
  uint64_t conn;
  int readonly;
} st__buffer_handle_t;

typedef struct st__buffer {
  st__named_t named;            /* name, uid, device, data, page (first) */
  st_dtype_t dtype;
  int ndim;
  int64_t shape[ST_MAX_NDIM];
  uint32_t slots;
  uint64_t frame_bytes, stride;
  st__buffer_page_t *page;      /* named.page                             */
  int unlinked;                 /* on the unlinked list (never the page's flag) */
  st__buffer_handle_t *handles;
  size_t nhandles, cap;
} st__buffer_t;

/* Named buffers, and unlinked ones that handles still hold (no name to
 * find them by; freed with their last handle). */
typedef struct st__buffers {
  st__named_list_t named, unlinked;
  uint64_t next_handle;
} st__buffers_t;

/* The limits a request is checked against (config.h). */
typedef struct st__buffer_limits {
  uint64_t max_buffers;         /* limits.max_buffers                     */
  uint64_t max_bytes;           /* limits.max_buffer_bytes (0: derived)   */
  int max_handles;              /* limits.max_buffer_handles_per_connection */
} st__buffer_limits_t;

/* What buffer_create asks for. */
typedef struct st__buffer_spec {
  st_dtype_t dtype;
  int ndim;
  int64_t shape[ST_MAX_NDIM];
  uint64_t slots;
  int device;                   /* -1 or a CUDA ordinal the server has     */
  size_t name_len;
  const char *name;
  const st__grant_t *readers;   /* may be NULL: nobody else reads it       */
} st__buffer_spec_t;

/* Creates buffer s->name for connection `conn` of uid `uid` and opens
 * one read-write handle for it: checks the name, shape, slots and
 * limits, allocates the data arena and the page (charged to the memory
 * budgets) and initializes the page. On ST_OK *out is the new entry and
 * *handle its handle (borrowed from the table). Errors with a message in
 * err: INVALID_ARGUMENT (name, shape, dtype, slots; the name is taken),
 * LIMIT (max_buffers, max_buffer_bytes, the connection's handles, the
 * uid's quotas.buffers, fds, pinned_bytes), the arena's OUT_OF_MEMORY /
 * LIMIT / CAPABILITY. Loop thread. */
int st__buffer_create(st__buffers_t *t, const st__buffer_spec_t *s,
                      const st__buffer_limits_t *l, uint64_t conn, uid_t uid, st__buffer_t **out,
                      st__buffer_handle_t *handle, char *err, size_t errlen);

/* A restore (server/restart.c): buffer s->name of uid `uid` again, on
 * the arenas it had (`data`, `page`: references are taken), with no
 * handle. The spec is checked as buffer_create checks it (name unused,
 * shape, dtype, slots, limits), then the arenas against it: `data` on
 * s->device and at least slots * stride bytes, `page` a CPU arena whose
 * geometry words are this buffer's. The writer lock a connection held
 * when the last process ended is freed (that connection is gone), and
 * the count of read-only handles starts at 0 again. Errors as
 * st__buffer_create; INVALID_ARGUMENT for arenas that do not match.
 * Loop thread. */
int st__buffer_restore(st__buffers_t *t, const st__buffer_spec_t *s,
                       const st__buffer_limits_t *l, uid_t uid, st__arena_t *data,
                       st__arena_t *page, st__buffer_t **out, char *err, size_t errlen);

/* Opens a handle of buffer `name` for connection `conn` of `who`
 * (named.h: a reader granted read opens read-only). Errors: NOT_FOUND (no
 * such name, or not visible to who), AUTH (a reader asking read-write),
 * LIMIT (the connection's handles). Loop thread. */
int st__buffer_open(st__buffers_t *t, const char *name, size_t name_len, int readonly,
                    int max_handles, uint64_t conn, const st__who_t *who, st__buffer_t **out,
                    st__buffer_handle_t *handle, char *err, size_t errlen);

/* Closes handle `handle` of buffer `name` that connection `conn` opened
 * (unlinked buffers included: they are found by handle). NOT_FOUND when
 * the connection has no such handle. Loop thread. */
int st__buffer_close(st__buffers_t *t, const char *name, size_t name_len, uint64_t handle,
                     uint64_t conn, char *err, size_t errlen);

/* Removes the name `name` (its creator's uid; an admin's with force:
 * named.h): the page says UNLINKED, the memory goes with the last handle.
 * ST_OK, NOT_FOUND, AUTH. Loop thread. */
int st__buffer_unlink(st__buffers_t *t, const char *name, size_t name_len, const st__who_t *who,
                      int force, char *err, size_t errlen);

/* Handles connection `conn` has open, of named and unlinked buffers: what
 * limits.max_buffer_handles_per_connection counts. Loop thread. */
int st__buffer_conn_handles(const st__buffers_t *t, uint64_t conn);

/* Connection `conn` closed: closes its handles (frees the writer lock it
 * held). Loop thread. */
void st__buffer_conn_closed(st__buffers_t *t, uint64_t conn);

/* Frees every buffer (server exit). Loop thread. */
void st__buffer_free_all(st__buffers_t *t);

#endif
