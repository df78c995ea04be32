/* src/client: what language bindings read of a reply in one call
 * (st_result_summary, st_client_call_summary, st_result_tensor_is;
 * include/st/client.h, "Bindings"). Each crossing of a binding into C (ctypes, LuaJIT's FFI)
 * costs more than the C it runs, so a call's reply is described in one
 * struct instead of one accessor per field. */
#include <string.h>

#include "client/result.h"

/* FNV-1a over `len` bytes, continuing from h. */
static uint64_t mix(uint64_t h, const void *p, size_t len) {
  const unsigned char *b = p;
  for (size_t i = 0; i < len; i++) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}

/* The identity of r's tensors (client.h, st_result_summary_t). */
static uint64_t identity_of(const st_result_t *r, size_t ntensors) {
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < ntensors; i++) {
    const st_tensor_t *t = st_result_tensor(r, i);
    int head[4] = {(int)t->dtype, t->ndim, (int)t->device, t->device_index};
    h = mix(h, &t->data, sizeof t->data);
    h = mix(h, head, sizeof head);
    h = mix(h, t->shape, sizeof *t->shape * (size_t)t->ndim);
    h = mix(h, t->strides, sizeof *t->strides * (size_t)t->ndim);
  }
  return h;
}

/* See client.h. Any thread while r lives. */
ST_API int st_result_summary(const st_result_t *r, st_result_summary_t *out) {
  if (!r || !out) return ST_ERR_INVALID_ARGUMENT;
  memset(out, 0, sizeof *out);
  out->value = st_result_value(r);
  out->kind = out->value ? (int)out->value->kind : ST_VALUE_NIL;
  out->ntensors = st_result_tensor_count(r);
  out->has_object = st_result_object(r, &out->object) == ST_OK;
  /* A result never changes once decoded, and one its connection keeps
   * comes back for every call of its object (kept_objects.c): the identity is
   * computed once. Racing threads compute the same value. */
  st_result_t *m = (st_result_t *)r;
  if (__atomic_load_n(&m->identity_known, __ATOMIC_ACQUIRE)) {
    out->identity = __atomic_load_n(&m->identity, __ATOMIC_RELAXED);
    return ST_OK;
  }
  out->identity = identity_of(r, out->ntensors);
  __atomic_store_n(&m->identity, out->identity, __ATOMIC_RELAXED);
  __atomic_store_n(&m->identity_known, 1, __ATOMIC_RELEASE);
  return ST_OK;
}

/* See client.h. Thread of the client. */
ST_API int st_client_call_summary(st_client_t *c, const char *endpoint, const st_args_t *args,
                                  int flags, st_result_t **out, st_result_summary_t *summary) {
  int rc = st_client_call_flags(c, endpoint, args, flags, out);
  if (rc != ST_OK) return rc;
  int same = c->reply_same;
  /* The caller's reference stays with the connection until its next
   * request: a binding that holds the result already needs no crossing to
   * free one. */
  if (same && (flags & ST_CALL_LEND_SAME)) st__client_kept_objects_lend(c, *out);
  if (!summary) return ST_OK;
  rc = st_result_summary(*out, summary);
  summary->same = same;
  return rc;
}

/* See client.h. Any thread while r lives. */
ST_API int st_result_tensor_is(const st_result_t *r, size_t i, const st_tensor_t *t) {
  const st_tensor_t *u = r && t ? st_result_tensor(r, i) : NULL;
  if (!u || !u->data || u->data != t->data || u->dtype != t->dtype || u->ndim != t->ndim ||
      u->device != t->device || u->device_index != t->device_index)
    return 0;
  if (u->ndim && (!t->shape || !t->strides)) return 0;
  for (int d = 0; d < u->ndim; d++)
    if (u->shape[d] != t->shape[d] || u->strides[d] != t->strides[d]) return 0;
  return 1;
}
