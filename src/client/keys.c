/* src/client: published keys (include/st/client.h, "published keys";
 * docs/keys.md; wire: docs/protocol.md, "Published keys"). put sends an
 * argument map as the key's value, with its tensors' descriptors as a
 * call does; get maps the reply like a call's result. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/client_internal.h"
#include "common/fail.h"

/* The copy of a tensor that is not in st_tensor_alloc memory into a fresh
 * allocation (*out, one tensor). */
static int copy_tensor(const st_tensor_t *t, const char *key, st_result_t **out, char *err,
                       size_t errlen) {
  char dev[24] = "cpu";
  if (t->device == ST_DEVICE_CUDA) {
    if (t->device_index < 0 || !st_tensor_is_contiguous(t))
      return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                      "argument '%s': a CUDA tensor is copied only when contiguous and with "
                      "its device_index (make it contiguous first)",
                      key);
    snprintf(dev, sizeof dev, "cuda:%d", t->device_index);
  }
  int rc = st_tensor_alloc(dev, t->dtype, t->ndim, t->shape, out, err, errlen);
  if (rc != ST_OK) return rc;
  const st_tensor_t *dst = st_result_tensor(*out, 0);
  rc = t->device == ST_DEVICE_CUDA
           ? st__client_cuda_dtod(dst->data, t->data, t->nbytes, t->device_index)
           : st_tensor_copy_to_host(t, dst->data, dst->nbytes);
  if (rc != ST_OK) {
    st_result_free(*out);
    *out = NULL;
    return st__fail(rc, err, errlen, "argument '%s': the copy failed: %s", key, st_strerror(rc));
  }
  return ST_OK;
}

/* See client.h. Any thread that owns a. */
ST_API int st_args_tensor_copy(st_args_t *a, const char *key, const st_tensor_t *t, int *copied,
                               char *err, size_t errlen) {
  if (copied) *copied = 0;
  if (!t) return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "NULL tensor");
  if (st_tensor_is_shareable(t)) return st_args_tensor(a, key, t, err, errlen);
  if (!a || !key || !*key)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "NULL argument map or key");
  st_result_t *copy = NULL;
  int rc = copy_tensor(t, key, &copy, err, errlen);
  if (rc != ST_OK) return rc;
  /* The map keeps the allocation's mapping; the result may go. */
  rc = st_args_tensor(a, key, st_result_tensor(copy, 0), err, errlen);
  st_result_free(copy);
  if (rc == ST_OK && copied) *copied = 1;
  return rc;
}

/* See client_internal.h. */
int st__client_readers_check(st_client_t *c, const char *method, const st_readers_t *r) {
  if (!r) return ST_OK;
  if ((r->nuids && !r->uids) || (r->ngids && !r->gids))
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "%s: readers: a NULL list with a count",
                           method);
  if (r->nuids > ST__READERS_MAX || r->ngids > ST__READERS_MAX)
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT,
                           "%s: readers: %zu uids and %zu gids; at most %d of each", method,
                           r->nuids, r->ngids, ST__READERS_MAX);
  return ST_OK;
}

/* See client_internal.h. */
void st__client_pack_readers(msgpack_packer *pk, const st_readers_t *r) {
  st__pack_cstr(pk, "readers");
  msgpack_pack_map(pk, 2);
  st__pack_cstr(pk, "uids");
  msgpack_pack_array(pk, r->nuids);
  for (size_t i = 0; i < r->nuids; i++) msgpack_pack_uint32(pk, r->uids[i]);
  st__pack_cstr(pk, "gids");
  msgpack_pack_array(pk, r->ngids);
  for (size_t i = 0; i < r->ngids; i++) msgpack_pack_uint32(pk, r->gids[i]);
}

typedef struct put_head {
  const char *key;
  int policy;
  int readonly;
  int live;
  const st_readers_t *readers;
} put_head_t;

static void pack_put_head(msgpack_packer *pk, const void *ud) {
  const put_head_t *h = ud;
  st__pack_cstr(pk, "key");
  st__pack_cstr(pk, h->key);
  st__pack_kv_str(pk, "policy", h->policy == ST_KEY_EVICTABLE ? "evictable" : "pinned");
  st__pack_kv_bool(pk, "readonly", h->readonly);
  if (h->live) st__pack_kv_bool(pk, "live", 1);
  if (h->readers) st__client_pack_readers(pk, h->readers);
}

/* See client.h. Thread of the client. */
ST_API int st_client_put(st_client_t *c, const char *key, const st_args_t *value, int policy,
                         int flags, uint64_t *version) {
  return st_client_put_ex(c, key, value, policy, flags, NULL, version);
}

/* See client.h. Thread of the client. */
ST_API int st_client_put_ex(st_client_t *c, const char *key, const st_args_t *value, int policy,
                            int flags, const st_readers_t *readers, uint64_t *version) {
  if (version) *version = 0;
  if (!c) return ST_ERR_INVALID_ARGUMENT;
  if (!key || !*key || !value)
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "put: a key and a value are required");
  if (policy != ST_KEY_PINNED && policy != ST_KEY_EVICTABLE)
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "put: unknown policy %d (allowed: "
                           "ST_KEY_PINNED, ST_KEY_EVICTABLE)", policy);
  if (flags & ~(ST_PUT_READONLY | ST_PUT_LIVE))
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "put: unknown flags 0x%x (allowed: "
                           "ST_PUT_READONLY, ST_PUT_LIVE)", (unsigned)flags);
  int rc = st__client_readers_check(c, "put", readers);
  if (rc != ST_OK) return rc;
  put_head_t h = {.key = key, .policy = policy, .readonly = (flags & ST_PUT_READONLY) != 0,
                  .live = (flags & ST_PUT_LIVE) != 0, .readers = readers};
  st__client_head_t head = {.npairs = 3 + h.live + (readers != NULL), .pack = pack_put_head,
                            .ud = &h};
  st_result_t *r = NULL;
  rc = st__client_args_method(c, "put", &head, "value", value, 0, &r);
  if (rc != ST_OK) return rc;
  const st_value_t *v = st_value_get(st_result_value(r), "version");
  const st_value_t *taken = st_value_get(st_result_value(r), "taken");
  if (version && v && v->kind == ST_VALUE_INT) *version = (uint64_t)v->as.integer;
  st_result_free(r);
  /* An existing live key: this connection publishes it now; the value
   * goes into its memory as one update (docs/views.md, section 3). */
  if (taken && taken->kind == ST_VALUE_BOOL && taken->as.boolean)
    rc = st__client_key_take(c, key, value, version);
  return rc;
}

/* See client.h. Thread of the client. */
ST_API int st_client_get(st_client_t *c, const char *key, uint64_t version, int flags,
                         st_result_t **out, uint64_t *got_version) {
  return st__client_key_get(c, key, version, flags, NULL, 0, out, got_version, NULL);
}

/* See client.h. Thread of the client. */
ST_API int st_client_get_view(st_client_t *c, const char *key, uint64_t version, int flags,
                              const char *view, st_result_t **out, uint64_t *got_version) {
  return st__client_key_get(c, key, version, flags, view, 0, out, got_version, NULL);
}

/* See client.h. Thread of the client. */
ST_API int st_client_get_since(st_client_t *c, const char *key, uint64_t version, int flags,
                               const char *view, uint64_t have, st_result_t **out,
                               uint64_t *got_version) {
  return st__client_key_get(c, key, version, flags, view, have, out, got_version, NULL);
}

/* The reply's `live` map into *live (zeroed when there is none). */
static void live_of(const msgpack_object *result, st__key_live_t *live) {
  memset(live, 0, sizeof *live);
  const msgpack_object *l = st__map_get(result, "live"), *page = l ? st__map_get(l, "page") : NULL,
                       *pub = l ? st__map_get(l, "publisher") : NULL;
  if (!page || page->type != MSGPACK_OBJECT_POSITIVE_INTEGER || page->via.u64 > UINT32_MAX) return;
  live->live = 1;
  live->page = (uint32_t)page->via.u64;
  live->publisher = pub && pub->type == MSGPACK_OBJECT_BOOLEAN && pub->via.boolean;
}

/* See client_internal.h. Thread of the client. */
int st__client_key_get(st_client_t *c, const char *key, uint64_t version, int flags,
                       const char *view, uint64_t have, st_result_t **out,
                       uint64_t *got_version, st__key_live_t *live) {
  if (live) memset(live, 0, sizeof *live);
  if (out) *out = NULL;
  if (got_version) *got_version = 0;
  if (!c || !out) return ST_ERR_INVALID_ARGUMENT;
  if (!key || !*key) return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "get: no key given");
  if (flags & ~ST_GET_READONLY)
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "get: unknown flags 0x%x (allowed: "
                           "ST_GET_READONLY)", (unsigned)flags);
  st__cbuf_t b;
  st__client_cbuf_init(&b);
  int with_view = view && *view;
  msgpack_pack_map(&b.pk, 1 + (version > 0) + ((flags & ST_GET_READONLY) != 0) + with_view +
                              (have > 0));
  st__pack_cstr(&b.pk, "key");
  st__pack_cstr(&b.pk, key);
  if (version) st__pack_kv_uint(&b.pk, "version", version);
  if (have) st__pack_kv_uint(&b.pk, "have", have);
  if (with_view) st__pack_kv_str(&b.pk, "view", view);
  if (flags & ST_GET_READONLY) st__pack_kv_bool(&b.pk, "readonly", 1);
  st__message_t m;
  int *fds = NULL;
  size_t nfds = 0;
  int rc = b.oom ? st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory packing 'get'")
                 : st__client_exchange(c, "get", b.sb.data, b.sb.size, NULL, 0, &m, &fds, &nfds);
  st__client_cbuf_destroy(&b);
  if (rc != ST_OK) return rc;
  const msgpack_object *v = st__map_get(&m.result, "version");
  if (st__map_get(&m.result, "same")) {
    /* Nothing came but the version: the caller keeps what it has. A
     * `same` it did not ask for, or for another version, is a lie. */
    if (have && !nfds && v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 == have) {
      if (got_version) *got_version = have;
    } else {
      rc = st__client_fail(c, ST_ERR_PROTOCOL, "get '%s': a `same` reply for version %llu, "
                           "which this client did not say it has", key, (unsigned long long)have);
    }
    for (size_t i = 0; i < nfds; i++) close(fds[i]);
    free(fds);
    st__message_destroy(&m);
    return rc;
  }
  /* Asked read-only: mapped read-only, whatever the reply says. */
  rc = flags & ST_GET_READONLY ? st__client_result_decode_readonly(c, &m.result, 1, fds, nfds, out)
                               : st__client_result_decode(c, &m.result, 1, fds, nfds, out);
  uint64_t ver = v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? v->via.u64 : 0;
  if (rc == ST_OK && got_version) *got_version = ver;
  st__key_live_t l;
  live_of(&m.result, &l);
  if (rc == ST_OK && live) *live = l;
  /* Named in the message of a write to its read-only memory (fault.c). */
  if (rc == ST_OK && l.live && !l.publisher)
    st__client_result_describe(*out, ST__FAULT_LIVE_KEY, "live key '%s'", key);
  else if (rc == ST_OK)
    st__client_result_describe(*out, ST__FAULT_KEY, "key '%s' (version %llu)", key,
                               (unsigned long long)ver);
  free(fds);
  st__message_destroy(&m);
  return rc;
}

/* See client.h. Thread of the client. */
ST_API int st_client_keys(st_client_t *c, const char *prefix, st_result_t **out) {
  if (out) *out = NULL;
  if (!c || !out) return ST_ERR_INVALID_ARGUMENT;
  st__cbuf_t b;
  st__client_cbuf_init(&b);
  msgpack_pack_map(&b.pk, prefix ? 1 : 0);
  if (prefix) st__pack_kv_str(&b.pk, "prefix", prefix);
  int rc = b.oom ? st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory packing 'keys'")
                 : st__client_method(c, "keys", &b, 0, out);
  st__client_cbuf_destroy(&b);
  return rc;
}

/* See client.h. Thread of the client. */
ST_API int st_client_delete(st_client_t *c, const char *key) {
  if (!c) return ST_ERR_INVALID_ARGUMENT;
  if (!key || !*key) return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "delete: no key given");
  st__cbuf_t b;
  st__client_cbuf_init(&b);
  msgpack_pack_map(&b.pk, 1);
  st__pack_kv_str(&b.pk, "key", key);
  st_result_t *r = NULL;
  int rc = b.oom ? st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory packing 'delete'")
                 : st__client_method(c, "delete", &b, 0, &r);
  st__client_cbuf_destroy(&b);
  st_result_free(r);
  return rc;
}
