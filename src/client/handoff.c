/* src/client: hand-offs between processes (include/st/client.h,
 * "Hand-offs"; docs/pool.md, section 5).
 *
 * handoff_create / handoff_open are one exchange each: the reply carries
 * the data allocation and the control page as two arenas (uint8 tensors
 * `data` and `page`), decoded and mapped by the usual result path, so a
 * hand-off is a result this handle keeps. Everything per request happens
 * in the page (shm/handoff_page.h): acquire, publish, read and ack are
 * atomic operations on shared memory and a futex wait when there is
 * nothing to do; the server sees none of them.
 *
 * Geometry (chunks, stride, sizes) comes from the reply and is checked
 * against the mappings once; the page's words are only compared, never
 * used as sizes or offsets, so a page scribbled on by another process can
 * make requests fail but never make a pointer leave the mapping.
 *
 * Threads: acquire, publish, cancel, read, ack and pending may be called
 * from any thread at once; close must not run concurrently with them.
 * Errors of the handle functions go to a thread-local message
 * (st_handoff_error).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/client_internal.h"
#include "shm/handoff_page.h"

struct st_handoff {
  st_client_t *c;               /* borrowed: must outlive the handle */
  char name[65];
  st_result_t *r;               /* owns both mappings                */
  st__handoff_page_t *page;
  uint8_t *data;                /* host or device address            */
  uint64_t chunk_bytes, stride;
  uint32_t chunks, consumers;
  int slot;                     /* -1: the producer                  */
  int device_index;             /* -1: the CPU                       */
  _Atomic uint32_t hint;        /* where acquire looks first         */
};

#define fail st__client_handle_fail

/* The last failure of a hand-off function on this thread. */
ST_API const char *st_handoff_error(const st_handoff_t *h) {
  (void)h;
  return st__client_handle_error();
}

static int64_t uint_of(const st_value_t *map, const char *key) {
  const st_value_t *v = st_value_get(map, key);
  return v && v->kind == ST_VALUE_INT ? v->as.integer : -1;
}

/* Checks the reply and fills h from it. ST_OK or PROTOCOL. */
static int adopt(st_client_t *c, st_handoff_t *h) {
  const st_value_t *v = st_result_value(h->r);
  const st_tensor_t *data = st_result_find(h->r, "data"), *page = st_result_find(h->r, "page");
  int64_t chunks = uint_of(v, "chunks"), consumers = uint_of(v, "consumers");
  int64_t chunk_bytes = uint_of(v, "chunk_bytes"), stride = uint_of(v, "stride");
  int64_t slot = uint_of(v, "slot");
  const st_value_t *role = st_value_get(v, "role");
  if (!data || !page || chunks < 1 || chunks > (1 << 24) || consumers < 1 ||
      consumers > (int64_t)ST__HANDOFF_MAX_CONSUMERS || chunk_bytes < 1 || stride < chunk_bytes ||
      slot < -1 || slot >= consumers || !role || role->kind != ST_VALUE_STRING ||
      page->device != ST_DEVICE_CPU || page->dtype != ST_DTYPE_UINT8 ||
      data->dtype != ST_DTYPE_UINT8)
    return st__client_fail(c, ST_ERR_PROTOCOL, "%s: the reply is not a hand-off", h->name);
  if ((uint64_t)data->nbytes / (uint64_t)chunks < (uint64_t)stride ||
      page->nbytes < st__handoff_page_bytes((uint32_t)chunks))
    return st__client_fail(c, ST_ERR_PROTOCOL, "%s: the hand-off's memory is too small for its "
                           "chunks", h->name);
  h->page = page->data;
  h->data = data->data;
  h->chunks = (uint32_t)chunks;
  h->consumers = (uint32_t)consumers;
  h->chunk_bytes = (uint64_t)chunk_bytes;
  h->stride = (uint64_t)stride;
  h->slot = (int)slot;
  h->device_index = data->device == ST_DEVICE_CUDA ? data->device_index : -1;
  if (h->page->magic != ST__HANDOFF_MAGIC || h->page->version != ST__HANDOFF_VERSION)
    return st__client_fail(c, ST_ERR_PROTOCOL, "%s: the control page is not version %u",
                           h->name, ST__HANDOFF_VERSION);
  /* Both roles write the page, the producer (through the caller) the
   * data: neither may come read-only, to fault at the first write. */
  if (!st__client_result_writable(h->r, page))
    return st__client_fail(c, ST_ERR_PROTOCOL, "%s: the control page comes read-only (every "
                           "role writes it)", h->name);
  if (h->slot < 0 && !st__client_result_writable(h->r, data))
    return st__client_fail(c, ST_ERR_PROTOCOL, "%s: the data comes read-only (the producer "
                           "writes it)", h->name);
  return ST_OK;
}

/* One exchange of `method` whose params are {name, ...}: `extra` packs
 * the rest (n more pairs). create and open answer like a call ({value,
 * arenas}: unwrapped), close and delete with `true`. */
static int handoff_method(st_client_t *c, const char *method, const char *name,
                          void (*extra)(msgpack_packer *, const void *), const void *arg,
                          uint32_t n, st_result_t **out) {
  st__cbuf_t b;
  int rc = st__client_named_params(c, method, "hand-off", name, extra, arg, n, &b);
  if (rc != ST_OK) return rc;
  rc = st__client_method(c, method, &b, extra || !strcmp(method, "handoff_open"), out);
  st__client_cbuf_destroy(&b);
  return rc;
}

static int attach(st_client_t *c, const char *method, const char *name,
                  void (*extra)(msgpack_packer *, const void *), const void *arg, uint32_t n,
                  st_handoff_t **out) {
  *out = NULL;
  st_handoff_t *h = calloc(1, sizeof *h);
  if (!h) return st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory");
  int rc = handoff_method(c, method, name, extra, arg, n, &h->r);
  if (rc == ST_OK) {
    snprintf(h->name, sizeof h->name, "%s", name);
    h->c = c;
    rc = adopt(c, h);
    if (rc != ST_OK) {
      /* Let the server forget us; the reply's error stays the failure. */
      char why[512];
      snprintf(why, sizeof why, "%s", st_client_error(c));
      st_result_t *ignored = NULL;
      if (handoff_method(c, "handoff_close", name, NULL, NULL, 0, &ignored) == ST_OK)
        st_result_free(ignored);
      st__client_fail(c, ST_ERR_PROTOCOL, "%s", why);
    }
  }
  if (rc != ST_OK) {
    st_result_free(h->r);
    free(h);
    return rc;
  }
  *out = h;
  return ST_OK;
}

typedef struct create_args {
  const char *device;
  uint64_t chunk_bytes;
  int chunks, consumers;
  const st_readers_t *readers;
} create_args_t;

static void pack_create(msgpack_packer *pk, const void *arg) {
  const create_args_t *a = arg;
  st__pack_kv_str(pk, "device", a->device);
  st__pack_kv_uint(pk, "chunk_bytes", a->chunk_bytes);
  st__pack_kv_uint(pk, "chunks", (uint64_t)a->chunks);
  st__pack_kv_uint(pk, "consumers", (uint64_t)a->consumers);
  if (a->readers) st__client_pack_readers(pk, a->readers);
}

/* See client.h. Thread of the client. */
ST_API int st_handoff_create(st_client_t *c, const char *name, const char *device,
                             uint64_t chunk_bytes, int chunks, int consumers,
                             st_handoff_t **out) {
  return st_handoff_create_ex(c, name, device, chunk_bytes, chunks, consumers, NULL, out);
}

/* See client.h. Thread of the client. */
ST_API int st_handoff_create_ex(st_client_t *c, const char *name, const char *device,
                                uint64_t chunk_bytes, int chunks, int consumers,
                                const st_readers_t *readers, st_handoff_t **out) {
  if (out) *out = NULL;
  if (!c || !out) return ST_ERR_INVALID_ARGUMENT;
  if (chunks < 1 || consumers < 1)
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT,
                           "handoff_create: 'chunks' and 'consumers' must be at least 1");
  int rc = st__client_readers_check(c, "handoff_create", readers);
  if (rc != ST_OK) return rc;
  create_args_t a = {device && *device ? device : "cpu", chunk_bytes, chunks, consumers, readers};
  return attach(c, "handoff_create", name, pack_create, &a, 4 + (readers != NULL), out);
}

/* See client.h. Thread of the client. */
ST_API int st_handoff_open(st_client_t *c, const char *name, st_handoff_t **out) {
  return st_handoff_open_ex(c, name, 0, NULL, out);
}

typedef struct open_args {
  int consumers;
  const char *device;
} open_args_t;

static void pack_open(msgpack_packer *pk, const void *arg) {
  const open_args_t *a = arg;
  if (a->consumers > 0) st__pack_kv_uint(pk, "consumers", (uint64_t)a->consumers);
  if (a->device) st__pack_kv_str(pk, "device", a->device);
}

/* See client.h. Thread of the client. */
ST_API int st_handoff_open_ex(st_client_t *c, const char *name, int consumers, const char *device,
                              st_handoff_t **out) {
  if (out) *out = NULL;
  if (!c || !out) return ST_ERR_INVALID_ARGUMENT;
  if (consumers < 0)
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT,
                           "handoff_open: 'consumers' must be at least 1 (0: the default)");
  open_args_t a = {consumers, device && *device ? device : NULL};
  uint32_t n = (uint32_t)(a.consumers > 0) + (a.device != NULL);
  return attach(c, "handoff_open", name, n ? pack_open : NULL, &a, n, out);
}

/* See client.h. Any thread. */
ST_API int st_handoff_shape(const st_handoff_t *h, int *chunks, uint64_t *chunk_bytes,
                            int *consumers, int *slot, int *device_index) {
  if (!h) return fail(ST_ERR_INVALID_ARGUMENT, "no hand-off");
  if (chunks) *chunks = (int)h->chunks;
  if (chunk_bytes) *chunk_bytes = h->chunk_bytes;
  if (consumers) *consumers = (int)h->consumers;
  if (slot) *slot = h->slot;
  if (device_index) *device_index = h->device_index;
  return ST_OK;
}

/* ---------------------------------------------------------- waiting */

static int64_t now_ms(void) { return st__now_mono_ns() / 1000000; }

/* st__shm_wait with a deadline in ms of now_ms (-1: none). */
static int wait_word(_Atomic uint32_t *word, _Atomic uint32_t *waiters, uint32_t seen,
                     int64_t deadline) {
  return st__shm_wait(word, waiters, seen, deadline < 0 ? -1 : deadline * 1000000);
}

static int gone(const st_handoff_t *h, const char *what) {
  uint32_t f = atomic_load(&h->page->flags);
  if (f & ST__HANDOFF_DELETED)
    return fail(ST_ERR_STALE_HANDLE, "hand-off '%s' was deleted%s", h->name, what);
  if (h->slot >= 0 && (f & ST__HANDOFF_PRODUCER_GONE))
    return fail(ST_ERR_STALE_HANDLE, "hand-off '%s': the producer closed%s", h->name, what);
  return ST_OK;
}

static int chunk_ok(const st_handoff_t *h, int chunk) {
  if (chunk < 0 || (uint32_t)chunk >= h->chunks)
    return fail(ST_ERR_INVALID_ARGUMENT, "hand-off '%s': chunk %d is not one of its %u chunks",
                h->name, chunk, h->chunks);
  return ST_OK;
}

/* ---------------------------------------------------------- producer */

static int producer_only(const st_handoff_t *h, const char *what) {
  if (!h) return fail(ST_ERR_INVALID_ARGUMENT, "no hand-off");
  if (h->slot >= 0)
    return fail(ST_ERR_INVALID_ARGUMENT, "hand-off '%s': only its producer may %s", h->name,
                what);
  return ST_OK;
}

/* Takes a free chunk (its low word 0) for the producer, or -1. */
static int take_free(st_handoff_t *h) {
  uint32_t start = atomic_fetch_add(&h->hint, 1) % h->chunks;
  for (uint32_t k = 0; k < h->chunks; k++) {
    uint32_t i = (start + k) % h->chunks;
    if (st__handoff_take(h->page, i)) return (int)i;
  }
  return -1;
}

/* See client.h. Any thread. */
ST_API int st_handoff_acquire(st_handoff_t *h, int timeout_ms, int *chunk, void **data) {
  int rc = producer_only(h, "acquire chunks");
  if (rc != ST_OK) return rc;
  int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
  for (;;) {
    uint32_t seen = atomic_load(&h->page->free_futex);
    if ((rc = gone(h, "")) != ST_OK) return rc;
    int i = take_free(h);
    if (i >= 0) {
      if (chunk) *chunk = i;
      if (data) *data = h->data + (uint64_t)i * h->stride;
      return ST_OK;
    }
    if (!wait_word(&h->page->free_futex, &h->page->free_waiters, seen, deadline))
      return fail(ST_ERR_TIMEOUT,
                  "hand-off '%s': no chunk became free within %d ms (all %u chunks wait for "
                  "their consumers' acknowledgements)",
                  h->name, timeout_ms, h->chunks);
  }
}

/* See client.h. Any thread. */
ST_API int st_handoff_publish(st_handoff_t *h, int chunk, uint64_t bytes, uint64_t *seq) {
  int rc = producer_only(h, "publish");
  if (rc == ST_OK) rc = chunk_ok(h, chunk);
  if (rc != ST_OK) return rc;
  if (bytes > h->chunk_bytes)
    return fail(ST_ERR_INVALID_ARGUMENT, "hand-off '%s': %llu bytes do not fit a chunk of %llu",
                h->name, (unsigned long long)bytes, (unsigned long long)h->chunk_bytes);
  st__handoff_page_t *p = h->page;
  if ((uint32_t)atomic_load(&p->chunk[chunk].word) != ST__HANDOFF_PRODUCER_BIT)
    return fail(ST_ERR_INVALID_ARGUMENT, "hand-off '%s': chunk %d is not acquired", h->name,
                chunk);
  uint32_t s = st__handoff_next_seq(p);
  if (st__handoff_publish_as(p, (uint32_t)chunk, bytes, s) != 0)
    return fail(ST_ERR_INVALID_ARGUMENT, "hand-off '%s': chunk %d changed while publishing",
                h->name, chunk);
  if (seq) *seq = s;
  return ST_OK;
}

/* See client.h. Any thread. */
ST_API int st_handoff_cancel(st_handoff_t *h, int chunk) {
  int rc = producer_only(h, "cancel chunks");
  if (rc == ST_OK) rc = chunk_ok(h, chunk);
  if (rc != ST_OK) return rc;
  if (!st__handoff_untake(h->page, (uint32_t)chunk))
    return fail(ST_ERR_INVALID_ARGUMENT, "hand-off '%s': chunk %d is not acquired", h->name,
                chunk);
  return ST_OK;
}

/* ---------------------------------------------------------- consumers */

static int consumer_only(const st_handoff_t *h, const char *what) {
  if (!h) return fail(ST_ERR_INVALID_ARGUMENT, "no hand-off");
  if (h->slot < 0)
    return fail(ST_ERR_INVALID_ARGUMENT, "hand-off '%s': only a consumer may %s", h->name, what);
  return ST_OK;
}

/* See client.h. Any thread. */
ST_API int st_handoff_read(st_handoff_t *h, int chunk, uint64_t seq, int timeout_ms, void **data,
                           uint64_t *bytes) {
  int rc = consumer_only(h, "read chunks");
  if (rc == ST_OK) rc = chunk_ok(h, chunk);
  if (rc != ST_OK) return rc;
  st__handoff_page_t *p = h->page;
  uint32_t bit = 1u << h->slot;
  int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
  for (;;) {
    uint32_t seen = atomic_load(&p->pub_futex);
    uint64_t w = atomic_load(&p->chunk[chunk].word);
    uint32_t tag = st__handoff_tag(w);
    if (seq != 0 && tag == seq && seq <= UINT32_MAX) {
      if (!((uint32_t)w & bit))
        return fail(ST_ERR_INVALID_ARGUMENT,
                    "hand-off '%s': chunk %d sequence %llu was already acknowledged by this "
                    "consumer",
                    h->name, chunk, (unsigned long long)seq);
      uint64_t n = atomic_load(&p->chunk[chunk].bytes);
      if (data) *data = h->data + (uint64_t)chunk * h->stride;
      if (bytes) *bytes = n < h->chunk_bytes ? n : h->chunk_bytes;
      return ST_OK;
    }
    /* A sequence number the chunk has not reached yet may still come;
     * an older one was recycled. */
    if (seq == 0 || seq > UINT32_MAX || (int32_t)((uint32_t)seq - tag) < 0)
      return fail(ST_ERR_STALE_HANDLE,
                  "hand-off '%s': chunk %d sequence %llu is stale (the chunk is at %u)", h->name,
                  chunk, (unsigned long long)seq, tag);
    if ((rc = gone(h, "")) != ST_OK) return rc;
    if (!wait_word(&p->pub_futex, &p->pub_waiters, seen, deadline))
      return fail(ST_ERR_TIMEOUT,
                  "hand-off '%s': chunk %d sequence %llu was not published within %d ms",
                  h->name, chunk, (unsigned long long)seq, timeout_ms);
  }
}

/* See client.h. Any thread. */
ST_API int st_handoff_ack(st_handoff_t *h, int chunk, uint64_t seq) {
  int rc = consumer_only(h, "acknowledge chunks");
  if (rc == ST_OK) rc = chunk_ok(h, chunk);
  if (rc != ST_OK) return rc;
  if (seq == 0 || seq > UINT32_MAX)
    return fail(ST_ERR_STALE_HANDLE, "hand-off '%s': sequence %llu is not one it hands out",
                h->name, (unsigned long long)seq);
  int freed;
  int r = st__handoff_clear(h->page, (uint32_t)chunk, 1u << h->slot, (uint32_t)seq, 0, &freed);
  if (r < 0)
    return fail(ST_ERR_STALE_HANDLE,
                "hand-off '%s': chunk %d is not at sequence %llu (a stale acknowledgement)",
                h->name, chunk, (unsigned long long)seq);
  if (r == 0)
    return fail(ST_ERR_INVALID_ARGUMENT,
                "hand-off '%s': chunk %d sequence %llu was already acknowledged by this consumer",
                h->name, chunk, (unsigned long long)seq);
  if (freed) st__shm_notify(&h->page->free_futex, &h->page->free_waiters);
  return ST_OK;
}

/* See client.h. Any thread. */
ST_API int st_handoff_pending(const st_handoff_t *h, int chunk, uint64_t *seq,
                              uint64_t *pending) {
  if (!h) return fail(ST_ERR_INVALID_ARGUMENT, "no hand-off");
  int rc = chunk_ok(h, chunk);
  if (rc != ST_OK) return rc;
  uint64_t w = atomic_load(&h->page->chunk[chunk].word);
  if (seq) *seq = st__handoff_tag(w);
  if (pending) *pending = (uint32_t)w;
  return ST_OK;
}

/* ---------------------------------------------------------- closing */

/* See client.h. Thread of the client. */
ST_API int st_handoff_close(st_handoff_t *h) {
  if (!h) return ST_OK;
  int rc = ST_OK;
  if (h->c && h->c->fd >= 0) {
    st_result_t *r = NULL;
    rc = handoff_method(h->c, "handoff_close", h->name, NULL, NULL, 0, &r);
    st_result_free(r);
    /* Deleted meanwhile: nothing was left to close. */
    if (rc == ST_ERR_NOT_FOUND) rc = ST_OK;
  }
  st_result_free(h->r);
  free(h);
  return rc;
}

/* See client.h. Thread of the client. */
ST_API int st_handoff_delete(st_client_t *c, const char *name) {
  if (!c) return ST_ERR_INVALID_ARGUMENT;
  st_result_t *r = NULL;
  int rc = handoff_method(c, "handoff_delete", name, NULL, NULL, 0, &r);
  st_result_free(r);
  return rc;
}
