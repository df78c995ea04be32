/* src/engine: tensor arguments, the client allocations a request carries
 * (docs/protocol.md, "Tensor arguments").
 *
 * A `call` or `submit` may list arenas in params.arenas and send one
 * descriptor per arena with the request. The loop thread takes those
 * descriptors from the connection (st__targs_take), checks every tensor
 * value of the arguments against the list while it binds (st__targs_check),
 * and moves the set into the job. The worker that runs the job maps the
 * arenas (st__targs_import: a memfd mmap or a CUDA import, which must not
 * run on the loop thread) and the Lua body sees tensors that live in the
 * client's memory: it reads and writes them in place.
 *
 * Ownership: a st__targs_t owns its descriptors until import, then its arena
 * references (tensors of the body take their own). st__targs_clear frees
 * whatever is left. One thread at a time (loop thread, then the worker).
 */
#ifndef ST_ENGINE_TARGS_H
#define ST_ENGINE_TARGS_H

#include <msgpack.h>
#include <stddef.h>

#include "engine/generation.h"
#include "mem/arena.h"
#include "proto/proto.h"

typedef struct st__targs {
  size_t n;
  st__arena_desc_t *descs;    /* owned, n entries */
  int *fds;                   /* owned, n entries; -1 once moved to an arena */
  st__arena_t **arenas;       /* owned references after import, else NULL */
} st__targs_t;

/* Parses params.arenas (`list`, an ARRAY of arena maps, already checked to
 * have nfds entries) into *t, taking ownership of the nfds descriptors in
 * `fds` (closed on failure too). Each entry must be a "memfd" (cpu) or
 * "vmm" (cuda) arena whose `fd` is its own index. ST_OK, or
 * ST_ERR_INVALID_ARGUMENT with "arenas[i]: reason" in err. Loop thread. */
int st__targs_take(st__targs_t *t, const msgpack_object *list, int *fds, size_t nfds, char *err,
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

/* Maps every arena (st__arena_import), consuming the descriptors. ST_OK,
 * or the first failure with "tensor argument arena i: reason"; arenas
 * mapped before it stay in t until st__targs_clear. Worker thread. */
int st__targs_import(st__targs_t *t, char *err, size_t errlen);

/* Closes the descriptors, drops the arena references and frees the lists;
 * *t is empty afterwards. Any thread that owns t. */
void st__targs_clear(st__targs_t *t);

#endif
