/* src/client: live keys (include/st/client.h, "live keys"; docs/views.md,
 * section 3). A handle is a get of the key (its tensors mapped once, so
 * their addresses never change) and the key's control page
 * (shm/key_page.h), which the reply carries as its last arena: mapped
 * read-write for the publisher's connection, read-only for every other.
 * Updates, versions, waits and consistent reads are atomic operations and
 * futex waits on that page; nothing goes to the server.
 *
 * Threads: the read functions may run on any thread at once; an update
 * runs on one thread from begin to end; close not concurrently with
 * anything else on the handle.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "client/result.h"
#include "common/clock.h"
#include "shm/key_page.h"
#include "proto/proto.h"

#define fail st__client_handle_fail

struct st_key {
  char name[129];
  st_result_t *r;               /* owned: the get's tensors and the page   */
  st__key_page_t *page;         /* in r's last mapping                     */
  int publisher;
  uint64_t me;                  /* the page's owner word when publisher    */
  int ordinal;                  /* the CUDA device of its tensors; -1: CPU */
  int updating;                 /* an update is begun on this handle       */
  uint64_t useq;                /* its odd sequence word                   */
};

/* The CUDA ordinal of r's first CUDA tensor, or -1. */
static int ordinal_of(const st_result_t *r) {
  for (size_t i = 0; i < st_result_tensor_count(r); i++) {
    const st_tensor_t *t = st_result_tensor(r, i);
    if (t->device == ST_DEVICE_CUDA) return t->device_index;
  }
  return -1;
}

/* See client.h. Thread of the client. */
ST_API int st_key_open(st_client_t *c, const char *key, int flags, st_key_t **out) {
  return st_key_open_view(c, key, flags, NULL, out);
}

/* See client.h. Thread of the client. */
ST_API int st_key_open_view(st_client_t *c, const char *key, int flags, const char *view,
                            st_key_t **out) {
  if (out) *out = NULL;
  if (!c || !key || !out) return fail(ST_ERR_INVALID_ARGUMENT, "NULL client, key or handle");
  if (strlen(key) > 128) return fail(ST_ERR_INVALID_ARGUMENT, "a key name is 1 to 128 characters");
  st__key_live_t live;
  st_result_t *r = NULL;
  int rc = st__client_key_get(c, key, 0, flags, view, 0, &r, NULL, &live);
  if (rc != ST_OK) return fail(rc, "%s", st_client_error(c));
  st__mapping_t *m = live.live && live.page < r->nmaps ? r->maps[live.page] : NULL;
  st__key_page_t *p = m ? st__client_mapping_base(m) : NULL;
  if (!live.live) rc = fail(ST_ERR_INVALID_ARGUMENT, "key '%s' is not live (put it with "
                            "ST_PUT_LIVE)", key);
  else if (!p || st__client_mapping_ordinal(m) >= 0 ||
           st__client_mapping_bytes(m) < sizeof(st__key_page_t) ||
           p->magic != ST__KEY_PAGE_MAGIC || p->layout != ST__KEY_PAGE_LAYOUT)
    rc = fail(ST_ERR_PROTOCOL, "key '%s': the reply's control page is not one", key);
  /* A publisher writes the page and the tensors: a reply that makes this
   * handle one must map them writable, never read-only memory that the
   * first update would fault on. */
  else if (live.publisher && (flags & ST_GET_READONLY))
    rc = fail(ST_ERR_PROTOCOL, "key '%s': the reply makes a handle opened read-only the key's "
              "publisher", key);
  else if (live.publisher && !st__client_mapping_writable(m))
    rc = fail(ST_ERR_PROTOCOL, "key '%s': the reply makes this connection the key's publisher "
              "but its control page comes read-only (the publisher writes it)", key);
  else if (live.publisher && !st__client_result_writable(r, NULL))
    rc = fail(ST_ERR_PROTOCOL, "key '%s': the reply makes this connection the key's publisher "
              "but its tensors come read-only (an update writes them)", key);
  st_key_t *k = NULL;
  if (rc != ST_OK || (k = calloc(1, sizeof *k)) == NULL) {
    st_result_free(r);
    return rc != ST_OK ? rc : fail(ST_ERR_OUT_OF_MEMORY, "out of memory");
  }
  snprintf(k->name, sizeof k->name, "%s", key);
  k->r = r;
  k->page = p;
  k->publisher = live.publisher;
  k->me = live.publisher ? atomic_load(&p->owner) : 0;
  k->ordinal = ordinal_of(r);
  *out = k;
  return ST_OK;
}

/* See client.h. */
ST_API void st_key_close(st_key_t *k) {
  if (!k) return;
  st_result_free(k->r);
  free(k);
}

/* See client.h. */
ST_API st_result_t *st_key_result(const st_key_t *k) { return k ? k->r : NULL; }

/* See client.h. */
ST_API int st_key_is_publisher(const st_key_t *k) { return k && k->publisher; }

/* See client.h. Any thread. */
ST_API uint64_t st_key_version(const st_key_t *k) {
  return k ? atomic_load_explicit(&k->page->version, memory_order_acquire) : 0;
}

/* See client.h. */
ST_API const char *st_key_error(const st_key_t *k) {
  (void)k;
  return st__client_handle_error();
}

static int64_t deadline_of(int64_t timeout_ms) {
  return timeout_ms < 0 ? -1 : st__now_mono_ns() + timeout_ms * 1000000;
}

/* The failure a page's flags mean for a reader, or ST_OK. */
static int flags_check(const st_key_t *k, int deleted_too) {
  uint32_t f = atomic_load(&k->page->flags);
  if (f & ST__KEY_TORN)
    return fail(ST_ERR_STALE_HANDLE, "live key '%s' is torn: its publisher left in the middle "
                "of an update (readable again after the next complete update: a put by its uid)",
                k->name);
  if (deleted_too && (f & ST__KEY_DELETED))
    return fail(ST_ERR_NOT_FOUND, "live key '%s' was deleted: no version will follow", k->name);
  return ST_OK;
}

/* See client.h. Any thread. */
ST_API int st_key_wait_version(st_key_t *k, uint64_t version, int64_t timeout_ms, uint64_t *got) {
  if (got) *got = 0;
  if (!k) return fail(ST_ERR_INVALID_ARGUMENT, "NULL key handle");
  int64_t deadline = deadline_of(timeout_ms);
  for (;;) {
    uint32_t seen = atomic_load(&k->page->futex);
    uint64_t v = atomic_load_explicit(&k->page->version, memory_order_acquire);
    if (v >= version) {
      if (got) *got = v;
      return ST_OK;
    }
    int rc = flags_check(k, 1);
    if (rc != ST_OK) return rc;
    if (!st__shm_wait(&k->page->futex, NULL, seen, deadline))
      return fail(ST_ERR_TIMEOUT, "live key '%s': no version %llu within %lld ms (it is at %llu)",
                  k->name, (unsigned long long)version, (long long)timeout_ms,
                  (unsigned long long)v);
  }
}

/* See client.h. Any thread. */
ST_API int st_key_read_begin(st_key_t *k, int64_t timeout_ms, uint64_t *seq) {
  if (seq) *seq = 0;
  if (!k || !seq) return fail(ST_ERR_INVALID_ARGUMENT, "NULL key handle or sequence");
  int64_t deadline = deadline_of(timeout_ms);
  for (;;) {
    uint32_t seen = atomic_load(&k->page->futex);
    int rc = flags_check(k, 0);
    if (rc != ST_OK) return rc;
    uint64_t s = atomic_load_explicit(&k->page->seq, memory_order_acquire);
    if (!(s & 1)) {
      *seq = s;
      return ST_OK;
    }
    if (!st__shm_wait(&k->page->futex, NULL, seen, deadline))
      return fail(ST_ERR_TIMEOUT, "live key '%s': an update still runs after %lld ms", k->name,
                  (long long)timeout_ms);
  }
}

/* See client.h. Any thread. */
ST_API int st_key_read_end(st_key_t *k, uint64_t seq, void *stream, int *consistent) {
  if (consistent) *consistent = 0;
  if (!k || !consistent) return fail(ST_ERR_INVALID_ARGUMENT, "NULL key handle or result");
  char why[400];
  /* The GPU fence: the reads are done before the sequence is read again. */
  if (k->ordinal >= 0) {
    int rc = st__client_cuda_sync(k->ordinal, stream, why, sizeof why);
    if (rc != ST_OK) return fail(rc, "live key '%s': %s", k->name, why);
  }
  atomic_thread_fence(memory_order_acquire);
  uint64_t s = atomic_load_explicit(&k->page->seq, memory_order_relaxed);
  int rc = flags_check(k, 0);
  if (rc != ST_OK) return rc;
  *consistent = s == seq && !(seq & 1);
  return ST_OK;
}

/* See client.h. */
ST_API int st_key_begin_update(st_key_t *k) {
  if (!k) return fail(ST_ERR_INVALID_ARGUMENT, "NULL key handle");
  if (!k->publisher)
    return fail(ST_ERR_INVALID_ARGUMENT, "live key '%s': this handle does not publish it (only "
                "the connection that put it does, with a handle opened writable)", k->name);
  if (k->updating)
    return fail(ST_ERR_INVALID_ARGUMENT, "live key '%s': an update is already begun", k->name);
  if (atomic_load(&k->page->owner) != k->me)
    return fail(ST_ERR_STALE_HANDLE, "live key '%s': another connection took it over (a put "
                "into it)", k->name);
  /* A replication reading the key as one version holds the update back
   * (bounded: st__key_page_begin_fenced). */
  int overran;
  k->useq = st__key_page_begin_fenced(k->page, &overran);
  k->updating = 1;
  return ST_OK;
}

/* See client.h. */
ST_API int st_key_end_update(st_key_t *k, void *stream) {
  if (!k) return fail(ST_ERR_INVALID_ARGUMENT, "NULL key handle");
  if (!k->updating)
    return fail(ST_ERR_INVALID_ARGUMENT, "live key '%s': no update is begun", k->name);
  char why[400];
  if (k->ordinal >= 0) {
    int rc = st__client_cuda_sync(k->ordinal, stream, why, sizeof why);
    if (rc != ST_OK) return fail(rc, "live key '%s': the update's writes: %s", k->name, why);
  }
  st__key_page_end(k->page, k->useq);
  k->updating = 0;
  return ST_OK;
}

/* Whether src may be copied into dst: same dtype, shape, both
 * contiguous. ST_OK or INVALID_ARGUMENT naming what differs. */
static int same_kind(const st_key_t *k, const st_tensor_t *dst, const st_tensor_t *src) {
  int same = dst->dtype == src->dtype && dst->ndim == src->ndim;
  for (int i = 0; same && i < dst->ndim; i++) same = dst->shape[i] == src->shape[i];
  if (!same)
    return fail(ST_ERR_INVALID_ARGUMENT, "live key '%s': tensor '%s' is %s of %d dims (first "
                "%lld); the update gives %s of %d dims (first %lld)",
                k->name, dst->name, st_dtype_name(dst->dtype), dst->ndim,
                (long long)(dst->ndim ? dst->shape[0] : 0), st_dtype_name(src->dtype), src->ndim,
                (long long)(src->ndim ? src->shape[0] : 0));
  if (!st_tensor_is_contiguous(dst) || !st_tensor_is_contiguous(src) ||
      (src->device == ST_DEVICE_CUDA && src->device_index < 0))
    return fail(ST_ERR_INVALID_ARGUMENT, "live key '%s': tensor '%s': an update copies "
                "contiguous tensors only (CUDA ones with their device_index)", k->name,
                dst->name);
  return ST_OK;
}

/* Copies src into dst (checked by same_kind). */
static int copy_one(const st_tensor_t *dst, const st_tensor_t *src) {
  if (dst->nbytes == 0) return ST_OK;
  int to_cuda = dst->device == ST_DEVICE_CUDA, from_cuda = src->device == ST_DEVICE_CUDA;
  if (to_cuda && from_cuda)
    return st__client_cuda_dtod(dst->data, src->data, dst->nbytes, dst->device_index);
  if (to_cuda) return st__client_cuda_from_host(dst->data, src->data, dst->nbytes,
                                                dst->device_index);
  if (from_cuda)
    return st__client_cuda_to_host(dst->data, src->data, dst->nbytes, src->device_index);
  memcpy(dst->data, src->data, dst->nbytes);
  return ST_OK;
}

/* See client.h. */
ST_API int st_key_update(st_key_t *k, const st_tensor_t *const *tensors, size_t n) {
  if (!k || (n && !tensors)) return fail(ST_ERR_INVALID_ARGUMENT, "NULL key handle or tensors");
  for (size_t i = 0; i < n; i++) {
    const st_tensor_t *src = tensors[i];
    const st_tensor_t *dst = src && src->name ? st_result_find(k->r, src->name) : NULL;
    if (!dst)
      return fail(ST_ERR_INVALID_ARGUMENT, "live key '%s' has no tensor named '%s'", k->name,
                  src && src->name ? src->name : "(NULL)");
    int rc = same_kind(k, dst, src);
    if (rc != ST_OK) return rc;
  }
  int rc = k->updating ? ST_OK : st_key_begin_update(k);
  for (size_t i = 0; rc == ST_OK && i < n; i++) {
    rc = copy_one(st_result_find(k->r, tensors[i]->name), tensors[i]);
    if (rc != ST_OK)
      rc = fail(rc, "live key '%s': the copy of tensor '%s' failed: %s (the update stays begun)",
                k->name, tensors[i]->name, st_strerror(rc));
  }
  return rc == ST_OK ? st_key_end_update(k, NULL) : rc;
}

/* The top-level tensor arguments of a, at most max, into t[] with their
 * descriptors in d[] (shapes and strides point there). */
static size_t args_tensors(const st_args_t *a, st_tensor_t *t, st__tensor_desc_t *d, size_t max) {
  size_t n = 0;
  for (size_t i = 0; i < a->n && n < max; i++) {
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    char why[8];
    if (msgpack_unpack_next(&u, a->items[i].data, a->items[i].len, NULL) == MSGPACK_UNPACK_SUCCESS &&
        st__parse_tensor(&u.data, &d[n], why, sizeof why) == ST_OK && d[n].arena < a->narenas) {
      const st__mapping_t *m = a->arenas[d[n].arena];
      int ordinal = st__client_mapping_ordinal(m);
      memset(&t[n], 0, sizeof t[n]);
      t[n].name = a->items[i].key;
      t[n].data = (char *)st__client_mapping_base(m) + d[n].offset;
      t[n].dtype = d[n].dtype;
      t[n].ndim = d[n].ndim;
      t[n].shape = d[n].shape;
      t[n].strides = d[n].strides;
      t[n].numel = st__tensor_numel(&d[n]);
      t[n].nbytes = (size_t)t[n].numel * st_dtype_size(d[n].dtype);
      t[n].device = ordinal >= 0 ? ST_DEVICE_CUDA : ST_DEVICE_CPU;
      t[n].device_index = ordinal;
      t[n].device_uuid = "";
      n++;
    }
    msgpack_unpacked_destroy(&u);
  }
  return n;
}

/* See client_internal.h. Thread of the client. */
int st__client_key_take(st_client_t *c, const char *key, const st_args_t *value,
                        uint64_t *version) {
  size_t max = value->n;
  st_tensor_t *t = calloc(max ? max : 1, sizeof *t);
  st__tensor_desc_t *d = calloc(max ? max : 1, sizeof *d);
  const st_tensor_t **list = calloc(max ? max : 1, sizeof *list);
  st_key_t *k = NULL;
  int rc = t && d && list ? st_key_open(c, key, 0, &k) : fail(ST_ERR_OUT_OF_MEMORY, "out of memory");
  if (rc == ST_OK && !k->publisher)
    rc = fail(ST_ERR_STALE_HANDLE, "live key '%s': another put took it over after this one "
              "(its value is the key's now)", key);
  if (rc == ST_OK) {
    size_t n = args_tensors(value, t, d, max);
    for (size_t i = 0; i < n; i++) list[i] = &t[i];
    rc = st_key_update(k, list, n);
  }
  if (rc != ST_OK) st__client_fail(c, rc, "put into live key '%s': %s", key, st__client_handle_error());
  if (rc == ST_OK && version) *version = st_key_version(k);
  st_key_close(k);
  free(t);
  free(d);
  free(list);
  return rc;
}
