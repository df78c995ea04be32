/* src/client: named buffers, the handle's life (include/st/client.h,
 * "buffers and streams"; docs/streams.md). Writes, reads, waits and the
 * writer lock are buffer_io.c.
 *
 * buffer_create / buffer_open are one exchange each: the reply describes
 * the buffer and carries two descriptors (its `arenas`: the data and the
 * control page), which this file maps itself rather than through the
 * open-cache of results (map.c), because a read-only handle maps them
 * read-only: a memfd the server reopened O_RDONLY with PROT_READ, a CUDA
 * import with read-only access. Every descriptor is checked first
 * (fdcheck.c), as the result path does; sizes come from the reply and
 * are checked against the mappings once, never read from the page.
 *
 * Threads: the handle functions of buffer_io.c may run on any thread at
 * once; close must not run concurrently with them.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/buffer.h"
#include "common/fail.h"

#define fail st__client_handle_fail

/* map[key]: an integer >= 0, a boolean as 0 or 1, or -1. */
static int64_t int_of(const msgpack_object *map, const char *key) {
  const msgpack_object *o = st__map_get(map, key);
  if (o && o->type == MSGPACK_OBJECT_BOOLEAN) return o->via.boolean;
  int ok = o && o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX;
  return ok ? (int64_t)o->via.u64 : -1;
}

/* Maps descriptor fd (consumed) of arena `a` (a map of the reply) of at
 * least `need` bytes; CPU memory read-only when `readonly`. ST_OK with
 * *base, *len, or PROTOCOL / IO / CAPABILITY with the reason in why. */
static int map_one(const msgpack_object *a, int fd, uint64_t need, int readonly, int allow_cuda,
                   void **base, size_t *len, st__cuda_mapping_t *cm, char *why, size_t n) {
  st__arena_desc_t d;
  int rc = st__parse_arena(a, &d, why, n);
  /* The handle decides how its memory maps: a read-only one read-only (a
   * memfd PROT_READ, a VMM import with read-only access: device.c), a
   * writable one read-write, which an arena marked read-only cannot be. */
  if (rc == ST_OK && d.readonly && !readonly)
    rc = st__fail(ST_ERR_PROTOCOL, why, n, "arena %llu comes read-only, and this handle writes it",
                  (unsigned long long)d.id);
  d.readonly = readonly;
  if (rc == ST_OK && d.bytes < need)
    rc = st__fail(ST_ERR_PROTOCOL, why, n, "arena %llu has %llu bytes; the buffer needs %llu",
                  (unsigned long long)d.id, (unsigned long long)d.bytes,
                  (unsigned long long)need);
  if (rc == ST_OK && d.cuda && !allow_cuda)
    rc = st__fail(ST_ERR_PROTOCOL, why, n, "%s", "the control page is not CPU memory");
  if (rc == ST_OK && d.cuda) {
    rc = st__client_check_vmm_fd(&d, fd, why, n);
    if (rc == ST_OK) rc = st__client_cuda_import(&d, fd, cm, why, n);
    if (rc == ST_OK) {
      *base = (void *)(uintptr_t)cm->dptr;
      *len = (size_t)cm->bytes;
    }
  } else if (rc == ST_OK) {
    struct stat st;
    rc = fstat(fd, &st) == 0 ? st__client_check_memfd(&d, fd, &st, why, n)
                             : st__fail(ST_ERR_IO, why, n, "fstat failed: %s", strerror(errno));
    void *p = MAP_FAILED;
    if (rc == ST_OK)
      p = mmap(NULL, (size_t)need, readonly ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED,
               fd, 0);
    int e = errno;
    /* EACCES, EPERM: the descriptor cannot be mapped as the handle needs. */
    if (rc == ST_OK && p == MAP_FAILED)
      rc = st__fail(e == EACCES || e == EPERM ? ST_ERR_PROTOCOL : ST_ERR_IO, why, n,
                    "mmap %s of %llu bytes failed: %s", readonly ? "read-only" : "read-write",
                    (unsigned long long)need, strerror(e));
    if (rc == ST_OK) {
      *base = p;
      *len = (size_t)need;
    }
  }
  close(fd);
  return rc;
}

static void unmap_all(st_buffer_t *b) {
  st__client_fault_remove(b->fault_data);
  st__client_fault_remove(b->fault_page);
  b->fault_data = b->fault_page = 0;
  if (b->cm.dptr) st__client_cuda_unmap(&b->cm);
  else if (b->data) munmap(b->data, b->data_len);
  if (b->page) munmap(b->page, b->page_len);
  b->data = NULL;
  b->page = NULL;
}

/* Fills b from the reply's result r and maps its descriptors (all of
 * them consumed). b->info.readonly says what the caller asked: the handle
 * is read-only, and maps read-only, when it asked so whatever the reply
 * says; a read-only reply to a writable handle is PROTOCOL (its memory
 * would map read-only where writes go). ST_OK or a recorded failure. */
static int adopt(st_client_t *c, st_buffer_t *b, const msgpack_object *r, int *fds, size_t nfds) {
  int asked_ro = b->info.readonly;
  const msgpack_object *arenas = st__map_get(r, "arenas"), *shape = st__map_get(r, "shape"),
                       *dtype = st__map_get(r, "dtype");
  int64_t slots = int_of(r, "slots"), frame = int_of(r, "frame_bytes"),
          stride = int_of(r, "stride"), handle = int_of(r, "handle"),
          conn = int_of(r, "connection"), ro = int_of(r, "readonly");
  char dt[32] = "";
  if (dtype && dtype->type == MSGPACK_OBJECT_STR && dtype->via.str.size < sizeof dt)
    memcpy(dt, dtype->via.str.ptr, dtype->via.str.size);
  b->info.dtype = st_dtype_from_name(dt);
  int ok = arenas && arenas->type == MSGPACK_OBJECT_ARRAY && arenas->via.array.size == 2 &&
           nfds == 2 && shape && shape->type == MSGPACK_OBJECT_ARRAY &&
           shape->via.array.size <= 16 && slots >= 1 && slots <= ST__BUFFER_MAX_SLOTS &&
           frame >= 1 && stride >= frame && handle >= 1 && conn >= 1 && ro >= 0 &&
           b->info.dtype != ST_DTYPE_INVALID;
  uint64_t elems = 1;
  for (uint32_t i = 0; ok && i < shape->via.array.size; i++) {
    const msgpack_object *e = &shape->via.array.ptr[i];
    ok = e->type == MSGPACK_OBJECT_POSITIVE_INTEGER && e->via.u64 >= 1 &&
         e->via.u64 <= (UINT64_C(1) << 48) / elems;
    if (ok) {
      b->shape[i] = (int64_t)e->via.u64;
      elems *= e->via.u64;
    }
  }
  if (ok) ok = elems * st_dtype_size(b->info.dtype) == (uint64_t)frame;
  if (ok) ok = (uint64_t)stride <= (UINT64_C(1) << 50) / (uint64_t)slots;
  char why[300] = "";
  int rc = ok ? ST_OK : st__fail(ST_ERR_PROTOCOL, why, sizeof why, "%s", "the reply is not a buffer");
  if (rc == ST_OK && ro == 1 && !asked_ro)
    rc = st__fail(ST_ERR_PROTOCOL, why, sizeof why, "%s", "the reply makes a handle asked "
                  "writable read-only (its page and data would come read-only where it writes)");
  b->info.ndim = ok ? (int)shape->via.array.size : 0;
  b->info.slots = (int)slots;
  b->info.frame_bytes = (uint64_t)frame;
  b->info.readonly = asked_ro;
  b->info.handle = (uint64_t)handle;
  b->info.connection = b->me = (uint64_t)conn;
  b->pid = (int)getpid();
  atomic_store(&b->spin_ns, st__buffer_default_spin_ns());
  b->info.name = b->name;
  b->info.shape = b->shape;
  b->info.device_index = -1;
  b->slots = (uint32_t)slots;
  b->stride = (uint64_t)stride;
  void *base = NULL;
  size_t len = 0;
  if (rc == ST_OK) {
    rc = map_one(&arenas->via.array.ptr[0], fds[0], b->stride * b->slots, b->info.readonly, 1,
                 &base, &len, &b->cm, why, sizeof why);
    fds[0] = -1;
    b->data = base;
    b->data_len = len;
    if (b->cm.dptr) b->info.device_index = b->cm.ordinal;
  }
  if (rc == ST_OK) {
    rc = map_one(&arenas->via.array.ptr[1], fds[1], ST__BUFFER_PAGE_BYTES(b->slots),
                 b->info.readonly, 0, &base, &len, NULL, why, sizeof why);
    fds[1] = -1;
    b->page = base;
    b->page_len = len;
  }
  for (size_t i = 0; i < nfds; i++)
    if (fds[i] >= 0) close(fds[i]);
  if (rc == ST_OK && (b->page->geometry.magic != ST__BUFFER_MAGIC ||
                        b->page->geometry.version != ST__BUFFER_VERSION))
    rc = st__fail(ST_ERR_PROTOCOL, why, sizeof why, "the control page is not version %u",
                  ST__BUFFER_VERSION);
  if (rc != ST_OK) return st__client_fail(c, rc, "buffer '%s': %s", b->name, why);
  if (b->info.readonly) {
    /* Named in the message of a write to its memory (fault.c). */
    char what[96];
    snprintf(what, sizeof what, "buffer '%s' (opened read-only)", b->name);
    if (!b->cm.dptr)
      b->fault_data = st__client_fault_add(b->data, b->data_len, ST__FAULT_BUFFER, what);
    b->fault_page = st__client_fault_add(b->page, b->page_len, ST__FAULT_BUFFER, what);
  }
  atomic_store(&b->last_read, atomic_load(&b->page->write_sequence));
  return ST_OK;
}

/* One exchange of `method` with params {name, ...} (`extra` packs n
 * more pairs). With `b` the reply is adopted into it, else it must be
 * `true`. */
static int buffer_method(st_client_t *c, const char *method, const char *name,
                         void (*extra)(msgpack_packer *, const void *), const void *arg,
                         uint32_t n, st_buffer_t *b) {
  st__cbuf_t cb;
  int rc = st__client_named_params(c, method, "buffer", name, extra, arg, n, &cb);
  if (rc != ST_OK) return rc;
  st__message_t m;
  int *fds = NULL;
  size_t nfds = 0;
  rc = st__client_exchange(c, method, cb.sb.data, cb.sb.size, NULL, 0, &m, &fds, &nfds);
  st__client_cbuf_destroy(&cb);
  if (rc != ST_OK) return rc;
  if (b && m.result.type == MSGPACK_OBJECT_MAP) {
    rc = adopt(c, b, &m.result, fds, nfds);
  } else {
    for (size_t i = 0; i < nfds; i++) close(fds[i]);
    if (b || m.result.type != MSGPACK_OBJECT_BOOLEAN)
      rc = st__client_fail(c, ST_ERR_PROTOCOL, "%s: unexpected reply", method);
  }
  free(fds);
  st__message_destroy(&m);
  return rc;
}

typedef struct close_args {
  uint64_t handle;
} close_args_t;

static void pack_close(msgpack_packer *pk, const void *arg) {
  st__pack_kv_uint(pk, "handle", ((const close_args_t *)arg)->handle);
}

/* Creates or opens (read-only when `readonly`): one exchange, then the
 * handle. */
static int attach(st_client_t *c, const char *method, const char *name,
                  void (*extra)(msgpack_packer *, const void *), const void *arg, uint32_t n,
                  int readonly, st_buffer_t **out) {
  st_buffer_t *b = calloc(1, sizeof *b);
  if (!b) return st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory");
  b->c = c;
  b->info.readonly = readonly;
  snprintf(b->name, sizeof b->name, "%s", name ? name : "");
  int rc = buffer_method(c, method, name, extra, arg, n, b);
  if (rc != ST_OK) {
    unmap_all(b);
    if (b->info.handle) {
      /* Mapped badly: let the server forget the handle; the first error stays. */
      char why[512];
      snprintf(why, sizeof why, "%s", st_client_error(c));
      close_args_t a = {b->info.handle};
      buffer_method(c, "buffer_close", b->name, pack_close, &a, 1, NULL);
      st__client_fail(c, rc, "%s", why);
    }
    free(b);
    return rc;
  }
  *out = b;
  return ST_OK;
}

typedef struct create_args {
  const char *device, *dtype;
  int ndim;
  const int64_t *shape;
  int slots;
  const st_readers_t *readers;
} create_args_t;

static void pack_create(msgpack_packer *pk, const void *arg) {
  const create_args_t *a = arg;
  st__pack_kv_str(pk, "device", a->device);
  st__pack_kv_str(pk, "dtype", a->dtype);
  st__pack_cstr(pk, "shape");
  msgpack_pack_array(pk, (size_t)a->ndim);
  for (int i = 0; i < a->ndim; i++) msgpack_pack_int64(pk, a->shape[i]);
  st__pack_kv_uint(pk, "slots", (uint64_t)a->slots);
  if (a->readers) st__client_pack_readers(pk, a->readers);
}

/* See client.h. Thread of the client. */
ST_API int st_buffer_create(st_client_t *c, const char *name, const char *device,
                            st_dtype_t dtype, int ndim, const int64_t *shape, int slots,
                            st_buffer_t **out) {
  return st_buffer_create_ex(c, name, device, dtype, ndim, shape, slots, NULL, out);
}

/* See client.h. Thread of the client. */
ST_API int st_buffer_create_ex(st_client_t *c, const char *name, const char *device,
                               st_dtype_t dtype, int ndim, const int64_t *shape, int slots,
                               const st_readers_t *readers, st_buffer_t **out) {
  if (out) *out = NULL;
  if (!c || !out) return ST_ERR_INVALID_ARGUMENT;
  if (ndim < 0 || ndim > 16 || (ndim > 0 && !shape))
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT,
                           "buffer_create: 'shape' must have 0 to 16 dimensions");
  if (slots < 1)
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "buffer_create: 'slots' must be 1 to %u",
                           ST__BUFFER_MAX_SLOTS);
  const char *dt = st_dtype_name(dtype);
  int rc = st__client_readers_check(c, "buffer_create", readers);
  if (rc != ST_OK) return rc;
  create_args_t a = {device && *device ? device : "cpu", dt ? dt : "invalid", ndim, shape, slots,
                     readers};
  return attach(c, "buffer_create", name, pack_create, &a, 4 + (readers != NULL), 0, out);
}

static void pack_open(msgpack_packer *pk, const void *arg) {
  st__pack_kv_bool(pk, "readonly", *(const int *)arg);
}

/* See client.h. Thread of the client. */
ST_API int st_buffer_open(st_client_t *c, const char *name, int readonly, st_buffer_t **out) {
  if (out) *out = NULL;
  if (!c || !out) return ST_ERR_INVALID_ARGUMENT;
  int ro = readonly != 0;
  return attach(c, "buffer_open", name, pack_open, &ro, 1, ro, out);
}

/* See client.h. Any thread. */
ST_API int st_buffer_info(const st_buffer_t *b, st_buffer_info_t *out) {
  if (!b || !out) return fail(ST_ERR_INVALID_ARGUMENT, "no buffer");
  *out = b->info;
  return ST_OK;
}

/* See client.h. Thread of the client. */
ST_API int st_buffer_close(st_buffer_t *b) {
  if (!b) return ST_OK;
  int rc = ST_OK;
  if (atomic_load(&b->holds)) st__buffer_unlock(b->page, b->me);
  if (b->c && b->c->fd >= 0) {
    close_args_t a = {b->info.handle};
    rc = buffer_method(b->c, "buffer_close", b->name, pack_close, &a, 1, NULL);
  }
  unmap_all(b);
  free(b);
  return rc;
}

/* See client.h. Thread of the client. */
ST_API int st_buffer_unlink(st_client_t *c, const char *name) {
  if (!c) return ST_ERR_INVALID_ARGUMENT;
  return buffer_method(c, "buffer_unlink", name, NULL, NULL, 0, NULL);
}
