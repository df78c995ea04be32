/* src/engine: binding a call's arguments to an endpoint's parameters.
 *
 * The loop thread binds before it queues a job, so a worker only ever sees
 * a complete, type-checked map: every parameter of the declaration present,
 * defaults filled from the declaration's msgpack bytes.
 */
#ifndef ST_ENGINE_BIND_H
#define ST_ENGINE_BIND_H

#include <msgpack.h>
#include <stddef.h>

#include "engine/generation.h"
#include "engine/targs.h"

/* Binds `args` (NULL, a msgpack NIL, or a MAP with string keys, as sent by
 * the client) to the parameters of `ep`. On success appends one msgpack map
 * with exactly ep->nparams entries, in the declaration's (sorted) order, to
 * `out` (the caller owns the buffer) and returns ST_OK. On failure returns
 * ST_ERR_INVALID_ARGUMENT with a message in `err` and leaves `out` as it
 * was:
 *   unknown argument 'x' (endpoint e takes: a, b)
 *   missing required argument 'x'
 *   argument 'x' must be integer, got string
 * Type rules: an integer is accepted for a NUMBER parameter, a binary for a
 * STRING one (both are Lua strings), an array or a map for a TABLE one; ANY
 * accepts every value; a TENSOR one only a tensor that meets its dtype and
 * device. Tensor values (under any parameter, at any depth) must name an
 * arena of `targs` (NULL: the request carries none) and lie inside it
 * (st__targs_check); an endpoint that caches or joins calls
 * (cache/singleflight) takes none. Any thread; borrows ep and targs. */
int st__bind_args(const st__endpoint_decl_t *ep, const msgpack_object *args,
                  const st__targs_t *targs, msgpack_sbuffer *out, char *err, size_t errlen);

/* Name of a parameter type as the messages above print it ("integer"). */
const char *st__param_type_name(st__param_type_t t);

#endif
