/* src/client: calls and methods: ping, st_client_call*, st_client_rpc
 * and the internal method plumbing every public method goes through
 * (st__client_method, st__client_args_method, st__client_endpoint_method,
 * st__client_rpc_exchange); the bytes of one exchange: rpc.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/client_internal.h"

/* Why arguments with an open list or map cannot go. */
#define UNFINISHED \
  "the arguments have an unfinished list or map (st_args_begin_* without its st_args_end)"

/* ping: one round trip; see client.h. Thread of the client. */
ST_API int st_client_ping(st_client_t *c, double *rtt_us) {
  if (!c) return ST_ERR_INVALID_ARGUMENT;
  st__message_t m;
  int *fds;
  size_t nfds;
  int64_t t0 = st__now_mono_ns();
  int rc = st__client_exchange(c, "ping", NULL, 0, NULL, 0, &m, &fds, &nfds);
  int64_t t1 = st__now_mono_ns();
  if (rc != ST_OK) return rc;
  for (size_t i = 0; i < nfds; i++) close(fds[i]);
  free(fds);
  if (!st__str_eq(&m.result, "pong"))
    rc = st__client_fail(c, ST_ERR_PROTOCOL, "ping was not answered with \"pong\"");
  st__message_destroy(&m);
  if (rc == ST_OK && rtt_us) *rtt_us = (double)(t1 - t0) / 1000.0;
  return rc;
}

/* The reply of an exchange that succeeded, decoded into a new result
 * (*out, as st__client_result_decode); m and fds are released. */
static int decode_reply(st_client_t *c, st__message_t *m, int *fds, size_t nfds, int unwrap,
                        st_result_t **out) {
  int rc = st__client_result_decode(c, &m->result, unwrap, fds, nfds, out);
  free(fds);
  st__message_destroy(m);
  return rc;
}

/* One exchange of `method` decoded into a new result; see
 * client_internal.h. Thread of the client. */
int st__client_method(st_client_t *c, const char *method, const st__cbuf_t *params, int unwrap,
                      st_result_t **out) {
  st__message_t m;
  int *fds;
  size_t nfds;
  int rc = st__client_exchange(c, method, params ? params->sb.data : NULL,
                               params ? params->sb.size : 0, params ? params->fds : NULL,
                               params ? params->nfds : 0, &m, &fds, &nfds);
  return rc == ST_OK ? decode_reply(c, &m, fds, nfds, unwrap, out) : rc;
}

/* Runs `method` with {head pairs[, args_key: args]}; see
 * client_internal.h. */
int st__client_args_method(st_client_t *c, const char *method, const st__client_head_t *head,
                           const char *args_key, const st_args_t *args, int unwrap,
                           st_result_t **out) {
  int with_args = args_key != NULL;
  if (with_args && st__client_args_open(args))
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "%s: %s", method, UNFINISHED);
  st__mapping_t *const *arenas = NULL;
  size_t narenas = with_args ? st__client_args_arenas(args, &arenas) : 0;
  if (narenas && strcmp(method, "call") != 0 && strcmp(method, "submit") != 0 &&
      strcmp(method, "put") != 0)
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT,
                           "%s: tensor arguments go only to call, submit and put", method);
  int fds[ST_MAX_FDS_PER_MESSAGE];
  if (narenas > ST_MAX_FDS_PER_MESSAGE)
    return st__client_fail(c, ST_ERR_LIMIT,
                           "the arguments use %zu allocations; one request carries at most %d",
                           narenas, ST_MAX_FDS_PER_MESSAGE);
  /* A server that no longer keeps an allocation the request names by its
   * id says `uncached`: the request goes once more with every descriptor
   * (nothing ran: the server refused it before anything else). */
  int rc = ST_OK;
  for (int attempt = 0; attempt < 2; attempt++) {
    st__cbuf_t b;
    st__client_cbuf_init(&b);
    msgpack_pack_map(&b.pk, head->npairs + (uint32_t)with_args + (narenas ? 1u : 0u));
    head->pack(&b.pk, head->ud);
    if (with_args) {
      st__pack_cstr(&b.pk, args_key);
      st__client_args_pack(&b.pk, args);
    }
    if (narenas) {
      st__pack_cstr(&b.pk, "arenas");
      b.nfds = st__client_argcache_pack(c, &b.pk, arenas, narenas, fds);
      b.fds = b.nfds ? fds : NULL;
    }
    /* A call's reply may name these allocations {arg: i} (arg_results.c). */
    int is_call = narenas && unwrap && strcmp(method, "call") == 0;
    c->call_args = is_call ? arenas : NULL;
    c->ncall_args = is_call ? narenas : 0;
    rc = b.oom ? st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory packing '%s'", method)
               : st__client_method(c, method, &b, unwrap, out);
    c->call_args = NULL;
    c->ncall_args = 0;
    st__client_cbuf_destroy(&b);
    if (!(rc == ST_ERR_INVALID_ARGUMENT && c->uncached && narenas)) break;
    st__client_argcache_unkeep(c, arenas, narenas);
  }
  return rc;
}

static void pack_endpoint(msgpack_packer *pk, const void *ud) {
  st__pack_cstr(pk, "endpoint");
  st__pack_cstr(pk, ud);
}

/* Runs `method` with {endpoint[, args]}; see client_internal.h. */
int st__client_endpoint_method(st_client_t *c, const char *method, const char *endpoint,
                               const st_args_t *args, int with_args, int unwrap,
                               st_result_t **out) {
  if (!endpoint || !*endpoint)
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "no endpoint name given");
  st__client_head_t head = {.npairs = 1, .pack = pack_endpoint, .ud = endpoint};
  return st__client_args_method(c, method, &head, with_args ? "args" : NULL, args, unwrap, out);
}

typedef struct call_head {
  const char *endpoint, *view;
  int readonly;
} call_head_t;

static void pack_call_head(msgpack_packer *pk, const void *ud) {
  const call_head_t *h = ud;
  pack_endpoint(pk, h->endpoint);
  if (h->readonly) st__pack_kv_bool(pk, "readonly", 1);
  if (h->view) st__pack_kv_str(pk, "view", h->view);
}

/* rc, with r's read-only memory (a call asked read-only, an endpoint
 * declared readonly) named in the message of a write there (fault.c). */
static int described(const char *endpoint, int rc, st_result_t *const *r) {
  if (rc == ST_OK) st__client_result_describe(*r, ST__FAULT_RESULT, "the result of endpoint '%s'",
                                              endpoint);
  return rc;
}

/* ST_OK, or INVALID_ARGUMENT for a flag st_call_flags_t does not have. */
static int flags_ok(st_client_t *c, int flags) {
  if (!(flags & ~(ST_CALL_LEND_SAME | ST_CALL_READONLY))) return ST_OK;
  return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "call: unknown flags 0x%x (allowed: "
                         "ST_CALL_LEND_SAME, ST_CALL_READONLY)", (unsigned)flags);
}

/* Calls an endpoint with flags and a view; see client.h. Thread of the
 * client. */
ST_API int st_client_call_view(st_client_t *c, const char *endpoint, const st_args_t *args,
                               int flags, const char *view, st_result_t **out) {
  if (out) *out = NULL;
  if (!c || !out) return ST_ERR_INVALID_ARGUMENT;
  if (!endpoint || !*endpoint)
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "no endpoint name given");
  if (flags_ok(c, flags) != ST_OK) return ST_ERR_INVALID_ARGUMENT;
  call_head_t h = {.endpoint = endpoint, .view = view && *view ? view : NULL,
                   .readonly = (flags & ST_CALL_READONLY) != 0};
  st__client_head_t head = {.npairs = 1 + (uint32_t)h.readonly + (h.view != NULL),
                            .pack = pack_call_head, .ud = &h};
  return described(endpoint,
                   st__client_args_method(c, "call", &head, args ? "args" : NULL, args, 1, out),
                   out);
}

/* Calls an endpoint with flags; see client.h. Thread of the client. */
ST_API int st_client_call_flags(st_client_t *c, const char *endpoint, const st_args_t *args,
                                int flags, st_result_t **out) {
  if (out) *out = NULL;
  if (!c || !out) return ST_ERR_INVALID_ARGUMENT;
  if (flags_ok(c, flags) != ST_OK) return ST_ERR_INVALID_ARGUMENT;
  if (!(flags & ST_CALL_READONLY)) return st_client_call(c, endpoint, args, out);
  return st_client_call_view(c, endpoint, args, flags, NULL, out);
}

/* Calls an endpoint; see client.h. Thread of the client. */
ST_API int st_client_call(st_client_t *c, const char *endpoint, const st_args_t *args,
                          st_result_t **out) {
  if (out) *out = NULL;
  if (!c || !out) return ST_ERR_INVALID_ARGUMENT;
  return described(endpoint, st__client_endpoint_method(c, "call", endpoint, args, 1, 1, out),
                   out);
}

/* See client_internal.h. Thread of the client. */
int st__client_rpc_exchange(st_client_t *c, const char *method, const st_args_t *params,
                            st__message_t *reply, int **fds, size_t *nfds) {
  if (!method || !*method)
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "no method name given");
  if (!params) return st__client_exchange(c, method, NULL, 0, NULL, 0, reply, fds, nfds);
  if (st__client_args_open(params))
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "%s: %s", method, UNFINISHED);
  st__mapping_t *const *arenas;
  if (st__client_args_arenas(params, &arenas))
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT,
                           "%s: tensor arguments go only to call, submit and put", method);
  st__cbuf_t b;
  st__client_cbuf_init(&b);
  st__client_args_pack(&b.pk, params);
  int rc = b.oom ? st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory packing the parameters")
                 : st__client_exchange(c, method, b.sb.data, b.sb.size, NULL, 0, reply, fds, nfds);
  st__client_cbuf_destroy(&b);
  return rc;
}

/* Any method with named parameters; see client.h. Thread of the client. */
ST_API int st_client_rpc(st_client_t *c, const char *method, const st_args_t *params,
                         st_result_t **out) {
  if (out) *out = NULL;
  if (!c || !out) return ST_ERR_INVALID_ARGUMENT;
  st__message_t m;
  int *fds;
  size_t nfds;
  int rc = st__client_rpc_exchange(c, method, params, &m, &fds, &nfds);
  return rc == ST_OK ? decode_reply(c, &m, fds, nfds, 0, out) : rc;
}

/* st_client_rpc(c, "info" / "endpoints", NULL, out). */
ST_API int st_client_info(st_client_t *c, st_result_t **out) {
  return st_client_rpc(c, "info", NULL, out);
}

ST_API int st_client_endpoints(st_client_t *c, st_result_t **out) {
  return st_client_rpc(c, "endpoints", NULL, out);
}

/* st_client_rpc(c, "peers", NULL, out). */
ST_API int st_client_peers(st_client_t *c, st_result_t **out) {
  return st_client_rpc(c, "peers", NULL, out);
}
