/* src/client: keys between servers (docs/multihost.md, "Pulling a key";
 * docs/protocol.md, `pull` and `replicate`): each packs its named
 * parameters, sends them through the one request/response path
 * (st__client_method) and returns the id of the task the server started;
 * the task functions (tasks.c) follow it. */
#include <stdio.h>
#include <string.h>

#include "client/client_internal.h"

/* Reads {task_id} of reply r (freed) into *task_id. */
static int take_task_id(st_client_t *c, const char *method, st_result_t *r, uint64_t *task_id) {
  int rc = ST_OK;
  if (!st__client_value_u64(st_value_get(st_result_value(r), "task_id"), task_id) || !*task_id)
    rc = st__client_fail(c, ST_ERR_PROTOCOL, "the %s reply has no task_id", method);
  st_result_free(r);
  return rc;
}

/* See client.h. Thread of the client. */
ST_API int st_client_pull(st_client_t *c, const char *key, const char *from,
                          const st_pull_opts_t *opts, uint64_t *task_id) {
  if (task_id) *task_id = 0;
  if (!c || !task_id) return ST_ERR_INVALID_ARGUMENT;
  if (!key || !*key || !from || !*from)
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "pull: a key and a peer id are required");
  st_pull_opts_t o;
  memset(&o, 0, sizeof o);
  if (opts) o = *opts;
  if (o.policy != ST_KEY_PINNED && o.policy != ST_KEY_EVICTABLE)
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "pull: unknown policy %d (allowed: "
                           "ST_KEY_PINNED, ST_KEY_EVICTABLE)", o.policy);
  if (o.as && !*o.as)
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "pull: 'as' is empty (NULL keeps the "
                           "key's name)");
  if (o.device && !*o.device)
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "pull: 'device' is empty (NULL: the "
                           "memory kind of the peer's key)");
  int rc = st__client_readers_check(c, "pull", o.readers);
  if (rc != ST_OK) return rc;
  st__cbuf_t b;
  st__client_cbuf_init(&b);
  msgpack_pack_map(&b.pk, 3 + (o.version != 0) + (o.as != NULL) + (o.device != NULL) +
                              (o.readers != NULL) + (o.live != 0));
  st__pack_kv_str(&b.pk, "key", key);
  st__pack_kv_str(&b.pk, "from", from);
  st__pack_kv_str(&b.pk, "policy", o.policy == ST_KEY_EVICTABLE ? "evictable" : "pinned");
  if (o.version) st__pack_kv_uint(&b.pk, "version", o.version);
  if (o.as) st__pack_kv_str(&b.pk, "as", o.as);
  if (o.device) st__pack_kv_str(&b.pk, "device", o.device);
  if (o.readers) st__client_pack_readers(&b.pk, o.readers);
  if (o.live) st__pack_kv_bool(&b.pk, "live", 1);
  st_result_t *r = NULL;
  rc = b.oom ? st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory packing 'pull'")
             : st__client_method(c, "pull", &b, 0, &r);
  st__client_cbuf_destroy(&b);
  return rc == ST_OK ? take_task_id(c, "pull", r, task_id) : rc;
}

/* See client.h. Thread of the client. */
ST_API int st_client_replicate(st_client_t *c, const char *key, const char *const *to,
                               size_t nto, const st_replicate_opts_t *opts,
                               uint64_t *task_id) {
  if (task_id) *task_id = 0;
  if (!c || !task_id) return ST_ERR_INVALID_ARGUMENT;
  if (!key || !*key)
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "replicate: a key is required");
  if (!to || nto == 0)
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "replicate: name at least one peer");
  if (nto > UINT32_MAX)
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "replicate: %zu peers", nto);
  for (size_t i = 0; i < nto; i++)
    if (!to[i] || !*to[i])
      return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "replicate: peer %zu of %zu is %s", i,
                             nto, to[i] ? "empty" : "NULL");
  st_replicate_opts_t o;
  memset(&o, 0, sizeof o);
  if (opts) o = *opts;
  if (o.as && !*o.as)
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "replicate: 'as' is empty (NULL keeps "
                           "the key's name)");
  st__cbuf_t b;
  st__client_cbuf_init(&b);
  msgpack_pack_map(&b.pk, 2 + (o.version != 0) + (o.as != NULL));
  st__pack_kv_str(&b.pk, "key", key);
  st__pack_cstr(&b.pk, "to");
  msgpack_pack_array(&b.pk, (uint32_t)nto);
  for (size_t i = 0; i < nto; i++) st__pack_cstr(&b.pk, to[i]);
  if (o.version) st__pack_kv_uint(&b.pk, "version", o.version);
  if (o.as) st__pack_kv_str(&b.pk, "as", o.as);
  st_result_t *r = NULL;
  int rc = b.oom ? st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory packing 'replicate'")
                 : st__client_method(c, "replicate", &b, 0, &r);
  st__client_cbuf_destroy(&b);
  return rc == ST_OK ? take_task_id(c, "replicate", r, task_id) : rc;
}

/* {key: key}, the params of unsubscribe and replicas. */
static int key_method(st_client_t *c, const char *method, const char *key, st_result_t **out) {
  if (!key || !*key)
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "%s: a key is required", method);
  st__cbuf_t b;
  st__client_cbuf_init(&b);
  msgpack_pack_map(&b.pk, 1);
  st__pack_kv_str(&b.pk, "key", key);
  int rc = b.oom ? st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory packing '%s'", method)
                 : st__client_method(c, method, &b, 0, out);
  st__client_cbuf_destroy(&b);
  return rc;
}

/* See client.h. Thread of the client. */
ST_API int st_client_unsubscribe(st_client_t *c, const char *key, uint64_t *version) {
  if (version) *version = 0;
  if (!c) return ST_ERR_INVALID_ARGUMENT;
  st_result_t *r = NULL;
  int rc = key_method(c, "unsubscribe", key, &r);
  if (rc != ST_OK) return rc;
  const st_value_t *v = st_value_get(st_result_value(r), "version");
  if (!v || v->kind != ST_VALUE_INT)
    rc = st__client_fail(c, ST_ERR_PROTOCOL, "the unsubscribe reply is not {key, version}");
  else if (version)
    *version = (uint64_t)v->as.integer;
  st_result_free(r);
  return rc;
}

/* See client.h. Thread of the client. */
ST_API int st_client_replicas(st_client_t *c, const char *key, st_result_t **out) {
  if (out) *out = NULL;
  if (!c || !out) return ST_ERR_INVALID_ARGUMENT;
  return key_method(c, "replicas", key, out);
}
