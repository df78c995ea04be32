/* src/server: the buffer methods (rpc.h; docs/protocol.md, "Buffers"; the
 * table is engine/buffer.h, the page shm/buffer_page.h). A connection
 * that closes leaves its buffers through its row of holdings.h (below).
 * Loop thread only.
 *
 * A read-only handle gets descriptors that cannot be mapped writable: the
 * memfds of a CPU buffer are reopened O_RDONLY through /proc/self/fd (a
 * MAP_SHARED mapping with PROT_WRITE of such a descriptor fails with
 * EACCES, and mprotect cannot add PROT_WRITE later), and their files are
 * mode 0400 from creation on, so that no process of another uid than the
 * server's can reopen them read-write through its own /proc/self/fd.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fail.h"
#include "common/log.h"
#include "engine/buffer.h"
#include "server/holdings.h"
#include "server/restart.h"
#include "server/rpc.h"
#include "server/server.h"
#include "server/work.h"
#include "st/errors.h"

/* The table of buffers: this kind's state in the registry (holdings.h). */
static st__buffers_t *buffers_of(st__server_t *srv) { return ST__HOLDING_STATE(srv, buffers); }

/* A descriptor of arena a for one reply: read-only when `readonly` and a
 * is a memfd (CUDA: the client maps it read-only; docs/security.md).
 * The caller owns it. Negative ST_ERR_* with the reason in err. */
static int reply_fd(st__arena_t *a, int readonly, char *err, size_t errlen) {
  int fd = st__arena_dup_fd(a, err, errlen);
  if (fd < 0 || !readonly || st__arena_device(a) >= 0) return fd;
  char path[48];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  int ro = open(path, O_RDONLY | O_CLOEXEC);
  int e = errno;
  close(fd);
  if (ro < 0)
    return st__fail(ST_ERR_CAPABILITY, err, errlen,
                    "cannot reopen the buffer read-only through %s: %s (is /proc mounted?)", path,
                    strerror(e));
  return ro;
}

/* Makes the file of memfd arena a mode 0400 (see the top); rpc.h. */
void st__rpc_owner_read_only(st__arena_t *a) {
  if (st__arena_device(a) >= 0) return;
  int fd = st__arena_dup_fd(a, NULL, 0);
  if (fd < 0) return;
  if (fchmod(fd, S_IRUSR) != 0)
    ST_LOG_W("buffer", "fchmod of a server memfd failed: %s", strerror(errno));
  close(fd);
}

static void pack_arena_of(msgpack_packer *pk, st__arena_t *a, uint32_t index) {
  st__arena_desc_t d;
  memset(&d, 0, sizeof d);
  st__arena_describe(a, &d);
  d.fd = index;
  st__pack_arena(pk, &d);
}

static const char *device_text(int device, char *buf, size_t n) {
  if (device < 0) snprintf(buf, n, "cpu");
  else snprintf(buf, n, "cuda:%d", device);
  return buf;
}

/* The pairs that describe b (8 of them). */
static void pack_buffer(msgpack_packer *pk, const st__buffer_t *b) {
  char dev[24];
  st__pack_kv_str(pk, "name", b->named.name);
  st__pack_kv_str(pk, "device", device_text(b->named.device, dev, sizeof dev));
  st__pack_kv_str(pk, "dtype", st_dtype_name(b->dtype));
  st__pack_cstr(pk, "shape");
  msgpack_pack_array(pk, (size_t)b->ndim);
  for (int i = 0; i < b->ndim; i++) msgpack_pack_int64(pk, b->shape[i]);
  st__pack_kv_uint(pk, "slots", b->slots);
  st__pack_kv_uint(pk, "frame_bytes", b->frame_bytes);
  st__pack_kv_uint(pk, "stride", b->stride);
  st__pack_kv_uint(pk, "handles", b->nhandles);
}

/* {name, device, dtype, shape, slots, frame_bytes, stride, handles,
 * handle, connection, readonly, arenas: [data, page]} with one
 * descriptor per arena. An error reply instead when a descriptor cannot
 * be made or the connection's limits refuse it; the handle is then
 * closed again. */
static void reply_buffer(st__rpc_req_t *r, st__buffer_t *b, const st__buffer_handle_t *h) {
  st__conn_t *c = r->c;
  char why[300] = "";
  uint64_t pinned = st__arena_bytes(b->named.data) + st__arena_bytes(b->named.page_arena);
  int fds[2] = {-1, -1};
  int rc = st__conn_reply_room(c, 2, pinned, why, sizeof why);
  if (rc == ST_OK) rc = fds[0] = reply_fd(b->named.data, h->readonly, why, sizeof why);
  if (rc >= 0) rc = fds[1] = reply_fd(b->named.page_arena, h->readonly, why, sizeof why);
  if (rc < 0) {
    for (int k = 0; k < 2; k++)
      if (fds[k] >= 0) close(fds[k]);
    char ignored[8];
    st__buffer_close(buffers_of(c->srv), b->named.name, strlen(b->named.name), h->id, c->id,
                     ignored, sizeof ignored);
    st__rpc_error(r, rc, "%s: %s", r->method->name, why);
    return;
  }
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, r->id);
  msgpack_pack_map(&pk, 12);
  pack_buffer(&pk, b);
  st__pack_kv_uint(&pk, "handle", h->id);
  st__pack_kv_uint(&pk, "connection", c->id);
  st__pack_kv_bool(&pk, "readonly", h->readonly);
  st__pack_cstr(&pk, "arenas");
  msgpack_pack_array(&pk, 2);
  pack_arena_of(&pk, b->named.data, 0);
  pack_arena_of(&pk, b->named.page_arena, 1);
  st__stats_answered(c->srv, &c->open, r->id, ST_OK);
  st__conn_send_pinned(c, &sb, fds, 2, pinned);
  msgpack_sbuffer_destroy(&sb);
}

/* See rpc.h. */
st__buffer_limits_t st__rpc_buffer_limits(const st__config_t *cfg) {
  st__buffer_limits_t l = {.max_buffers = cfg->max_buffers,
                           .max_bytes = cfg->max_buffer_bytes,
                           .max_handles = cfg->max_buffer_handles_per_connection};
  return l;
}

/* Fills s->ndim and s->shape from `shape` (an array of integers >= 1).
 * 0 after an error reply. */
static int shape_of(st__rpc_req_t *r, st__buffer_spec_t *s) {
  const msgpack_object *o = st__rpc_arg(r, "shape");
  if (!o || o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > ST_MAX_NDIM) {
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT,
                  "buffer_create: 'shape' must be a list of at most %d integers >= 1",
                  ST_MAX_NDIM);
    return 0;
  }
  s->ndim = (int)o->via.array.size;
  for (int i = 0; i < s->ndim; i++) {
    const msgpack_object *e = &o->via.array.ptr[i];
    if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER && e->type != MSGPACK_OBJECT_NEGATIVE_INTEGER) {
      st__rpc_error(r, ST_ERR_INVALID_ARGUMENT,
                    "buffer_create: 'shape' element %d is not an integer", i);
      return 0;
    }
    s->shape[i] = e->type == MSGPACK_OBJECT_NEGATIVE_INTEGER ? e->via.i64
                  : e->via.u64 > INT64_MAX                   ? INT64_MAX
                                                             : (int64_t)e->via.u64;
  }
  return 1;
}

/* buffer_create {name, shape, dtype, device?, slots?}. */
void st__rpc_buffer_create(st__rpc_req_t *r) {
  st__conn_t *c = r->c;
  st__buffer_spec_t s;
  memset(&s, 0, sizeof s);
  s.device = st__rpc_device(r);
  if (s.device == -2 || !shape_of(r, &s)) return;
  const msgpack_object *name = st__rpc_arg(r, "name"), *dtype = st__rpc_arg(r, "dtype");
  char dt[32], shown[300];
  s.dtype = st__wire_cstr(dtype, dt, sizeof dt) < 0 ? ST_DTYPE_INVALID : st_dtype_from_name(dt);
  if (s.dtype == ST_DTYPE_INVALID) {
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "buffer_create: 'dtype' '%s' is not a dtype",
                  st__wire_shown(dtype->via.str.ptr, dtype->via.str.size, shown, sizeof shown));
    return;
  }
  s.slots = st__rpc_u64(r, "slots", 1);
  s.name = name->via.str.ptr;
  s.name_len = name->via.str.size;
  st__grant_t readers;
  int given = st__rpc_readers(r, &readers);
  if (given < 0) return;
  if (given) s.readers = &readers;
  st__buffer_limits_t l = st__rpc_buffer_limits(c->srv->cfg);
  char err[400];
  st__buffer_t *b = NULL;
  st__buffer_handle_t h;
  int rc = st__buffer_create(buffers_of(c->srv), &s, &l, c->id, c->cred.uid, &b, &h, err,
                             sizeof err);
  if (rc != ST_OK) {
    st__rpc_error(r, rc, "buffer_create: %s", err);
    return;
  }
  st__rpc_owner_read_only(b->named.data);
  st__rpc_owner_read_only(b->named.page_arena);
  /* Kept across restarts before it is acknowledged; a buffer that
   * cannot be is not made. */
  rc = st__restart_buffer_created(c->srv, b, err, sizeof err);
  if (rc != ST_OK) {
    st__who_t who;
    st__rpc_who(r, &who);
    st__buffer_unlink(buffers_of(c->srv), b->named.name, strlen(b->named.name), &who, 0, NULL,
                      0);
    st__buffer_close(buffers_of(c->srv), s.name, s.name_len, h.id, c->id, NULL, 0);
    st__rpc_error(r, rc, "buffer_create: %s", err);
    return;
  }
  reply_buffer(r, b, &h);
}

/* buffer_open {name, readonly?}. */
void st__rpc_buffer_open(st__rpc_req_t *r) {
  st__conn_t *c = r->c;
  const msgpack_object *name = st__rpc_arg(r, "name");
  char err[400];
  st__buffer_t *b = NULL;
  st__buffer_handle_t h;
  st__who_t who;
  st__rpc_who(r, &who);
  int rc = st__buffer_open(buffers_of(c->srv), name->via.str.ptr, name->via.str.size,
                           st__rpc_bool(r, "readonly", 0), c->srv->cfg->max_buffer_handles_per_connection,
                           c->id, &who, &b, &h, err, sizeof err);
  if (rc != ST_OK) st__rpc_error(r, rc, "buffer_open: %s", err);
  else reply_buffer(r, b, &h);
}

/* buffer_close {name, handle} -> true. */
void st__rpc_buffer_close(st__rpc_req_t *r) {
  const msgpack_object *name = st__rpc_arg(r, "name");
  char err[400];
  int rc = st__buffer_close(buffers_of(r->c->srv), name->via.str.ptr, name->via.str.size,
                            st__rpc_u64(r, "handle", 0), r->c->id, err, sizeof err);
  if (rc != ST_OK) st__rpc_error(r, rc, "buffer_close: %s", err);
  else st__reply_true(r->c, r->id);
}

/* buffer_unlink {name, force?} -> true (force: root and the server's uid
 * unlink another uid's buffer). */
void st__rpc_buffer_unlink(st__rpc_req_t *r) {
  const msgpack_object *name = st__rpc_arg(r, "name");
  char err[400];
  st__who_t who;
  st__rpc_who(r, &who);
  /* The unlink may free the buffer: what the journal needs, first. */
  st__named_t *e = st__named_find(&buffers_of(r->c->srv)->named, name->via.str.ptr,
                                  name->via.str.size);
  const st__arena_t *data = e ? e->data : NULL, *page = e ? e->page_arena : NULL;
  int rc = st__buffer_unlink(buffers_of(r->c->srv), name->via.str.ptr, name->via.str.size, &who,
                             st__rpc_bool(r, "force", 0), err, sizeof err);
  if (rc == ST_OK) st__restart_buffer_unlinked(r->c->srv, name->via.str.ptr, name->via.str.size,
                                               data, page);
  if (rc != ST_OK) st__rpc_error(r, rc, "buffer_unlink: %s", err);
  else st__reply_true(r->c, r->id);
}

/* Whether `buffers` lists e for who (all: every uid's, admins only). */
static int listed(const st__named_t *e, const st__who_t *who, int all) {
  return e->uid == who->uid || (all && who->admin);
}

/* buffers {all?} -> [{name, device, dtype, shape, slots, frame_bytes,
 * stride, handles, uid}] of the named buffers of the caller's uid (all:
 * of every uid, for root and the server's uid; AUTH for another). */
void st__rpc_buffers(st__rpc_req_t *r) {
  const st__named_list_t *l = &buffers_of(r->c->srv)->named;
  st__who_t who;
  int all = st__rpc_listing_all(r, "buffers", "buffers", &who);
  if (all < 0) return;
  uint32_t n = 0;
  for (const st__named_t *e = l->head; e; e = e->next) n += listed(e, &who, all);
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, r->id);
  msgpack_pack_array(&pk, n);
  for (const st__named_t *e = l->head; e; e = e->next) {
    if (!listed(e, &who, all)) continue;
    msgpack_pack_map(&pk, 9);
    pack_buffer(&pk, (const st__buffer_t *)e);
    st__pack_kv_uint(&pk, "uid", (uint64_t)e->uid);
  }
  st__reply_send(r->c, r->id, &sb);
}

/* ------------------------------------------------------------- holdings */

static void buffers_release(st__server_t *srv, st__conn_t *c) { st__buffer_conn_closed(buffers_of(srv), c->id); }

static void buffers_count(st__server_t *srv, const st__conn_t *c, st__holding_count_t *n) {
  n->items = (uint64_t)st__buffer_conn_handles(buffers_of(srv), c->id);
}

static void buffers_stop(st__server_t *srv, void *state) {
  (void)srv;
  st__buffer_free_all(state);
}

static int buffers_none(st__server_t *srv) {
  const st__buffers_t *b = buffers_of(srv);
  return !b || (!b->named.count && !b->unlinked.count);
}

const st__holding_kind_t st__holding_buffers = {
    .name = "buffers", .release = buffers_release, .count = buffers_count,
    .state_bytes = sizeof(st__buffers_t), .stop = buffers_stop, .none = buffers_none};
