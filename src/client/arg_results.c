/* src/client: a call's result arena that is one of the call's own tensor
 * arguments (docs/protocol.md, "Tensor arguments", {arg: i}). The endpoint
 * returned its argument, or a view of it, and the server names the
 * allocation by its index in the request's `arenas` instead of sending a
 * descriptor: the result maps it through the caller's own mapping (the
 * one the argument map holds, map.c's own allocations), with no
 * descriptor, no import and no new mapping. The call being exchanged
 * lends its allocations in c->call_args (call.c); an index outside them
 * is PROTOCOL, and the tensors on it are bounds-checked against the
 * allocation like any arena's (result.c). Thread of the client.
 */
#include "client/client_internal.h"

/* See client_internal.h. */
int st__client_arg_result_is(const msgpack_object *a) {
  return a->type == MSGPACK_OBJECT_MAP && a->via.map.size == 1 && st__map_get(a, "arg") != NULL;
}

/* See client_internal.h. Thread of the client. */
int st__client_arg_result_arena(st_client_t *c, const msgpack_object *a, st__arena_desc_t *d,
                                st__mapping_t **out) {
  *out = NULL;
  const msgpack_object *v = st__map_get(a, "arg");
  if (!v || v->type != MSGPACK_OBJECT_POSITIVE_INTEGER || v->via.u64 >= c->ncall_args)
    return st__client_fail(c, ST_ERR_PROTOCOL,
                           "the reply names tensor argument %s%llu, but the call sent %zu",
                           v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? "" : "(not an index) ",
                           v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER
                               ? (unsigned long long)v->via.u64
                               : 0ull,
                           c->ncall_args);
  st__mapping_t *m = c->call_args[v->via.u64];
  st__client_own_describe(m, d);   /* the argument map holds m: alive */
  st__client_mapping_ref(m, 0);
  *out = m;
  return ST_OK;
}
