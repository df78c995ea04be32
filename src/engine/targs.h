/* src/engine: tensor arguments, the client allocations a request carries
 * (docs/protocol.md, "Tensor arguments").
 *
 * A `call` or `submit` may list arenas in params.arenas and send one
 * descriptor per arena with the request. The loop thread takes those
 * descriptors from the connection (st__targs_take), checks every tensor
 * value of the arguments against the list while it binds (st__targs_check),
 * and moves the set into the job. The worker that runs the job imports the
 * arenas (st__targs_import: a memfd mmap, or for CUDA an fstat of the
 * descriptor; a CUDA arena is imported and mapped when the body's tensors
 * are made of it, st__tensor_from_desc) and the Lua body sees
 * tensors that live in the client's memory: it reads and writes them in
 * place.
 *
 * An arena that names an `arg_id` comes from the connection's argument cache
 * (argcache.h) when it carries no descriptor, and is imported at most once
 * for all the requests that name it.
 *
 * Ownership: a st__targs_t holds one reference to the source of each arena
 * (argcache.h: its descriptor, then its import), and after import one
 * reference to each arena (tensors of the body take their own).
 * st__targs_clear drops whatever is left. One thread at a time (loop
 * thread, then the worker).
 */
#ifndef ST_ENGINE_TARGS_H
#define ST_ENGINE_TARGS_H

#include <msgpack.h>
#include <stddef.h>

#include "engine/argcache.h"
#include "engine/generation.h"
#include "engine/result.h"
#include "mem/arena.h"
#include "proto/proto.h"

typedef struct st__targs {
  size_t n;
  st__arena_desc_t *descs;    /* owned, n entries: as this request describes them */
  st__targ_src_t **srcs;      /* owned references, n entries */
  st__arena_t **arenas;       /* owned references after import, else NULL */
} st__targs_t;

/* How many descriptors a request with params.arenas `list` (an ARRAY)
 * carries: one per entry, except the maps that have an `arg_id` and no
 * `fd` (they name an allocation the connection's cache holds). */
size_t st__targs_count_fds(const msgpack_object *list);

/* Parses params.arenas (`list`, an ARRAY of arena maps whose entries carry
 * nfds descriptors: st__targs_count_fds) into *t, taking ownership of the
 * nfds descriptors in `fds` (closed on failure too). Each entry must be a
 * "memfd" (cpu) or "vmm" (cuda) arena whose `fd` is its index among the
 * entries that have one, or an entry with an `arg_id` and no `fd` that
 * `cache` (NULL: none) holds with the same backend and device and at
 * least its bytes. ST_OK, or ST_ERR_INVALID_ARGUMENT with "arenas[i]:
 * reason" in err; when the only fault is ids the cache does not hold, they
 * are in uncached[] (room for one per entry of list; *nuncached counts
 * them, else it is 0). A cached source whose import failed is dropped from the cache
 * and counts as not held. Loop thread. */
int st__targs_take(st__targs_t *t, const msgpack_object *list, int *fds, size_t nfds,
                   st__argcache_t *cache, uint64_t *uncached, size_t *nuncached, char *err,
                   size_t errlen);

/* Checks one argument value (any nesting) against the arena list: every
 * ext value must be a tensor (modules are not arguments) whose arena
 * exists in `t` (t may be NULL: no arenas) and whose bytes lie inside it.
 * When `p` is a TENSOR parameter the value itself must be a tensor that
 * meets its dtype and device. `*ntensors` (may be NULL) counts the tensors
 * found. ST_OK or ST_ERR_INVALID_ARGUMENT naming the argument, e.g.
 *   argument 'x' (tensor): arena 2 is not in this request (it lists 1)
 *   argument 'x' is on cpu; endpoint scale wants cuda
 * Any thread. */
int st__targs_check(const st__targs_t *t, const st__param_t *p, const msgpack_object *v,
                    size_t *ntensors, char *err, size_t errlen);

/* Imports every arena (st__targ_src_import: once per source; a CUDA one
 * is not mapped yet: st__arena_map). ST_OK, or the first failure with
 * "tensor argument arena i: reason"; arenas imported before it stay in t
 * until st__targs_clear. Worker thread, or the loop thread for a put. */
int st__targs_import(st__targs_t *t, char *err, size_t errlen);

/* Which arenas of result r are tensor arguments of t (the body returned
 * an argument, or a view of it): a new array (owned by the caller) of
 * r->narenas entries, 1 + the argument's index in t for such an arena and
 * 0 for the others; NULL when none is (or memory is short: the result
 * then travels as it would otherwise). Compares arenas, so it is called
 * after the body and before st__targs_clear. Worker thread. */
uint32_t *st__targs_match_result(const st__targs_t *t, const st__build_result_t *r);

/* Drops the source and arena references and frees the lists; *t is empty
 * afterwards. Any thread that owns t. */
void st__targs_clear(st__targs_t *t);

#endif
