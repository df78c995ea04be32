/* src/lua/tensor.h: the tensor userdata (tensor.c; docs/endpoints.md,
 * "Tensors"): a Lua binding of the tensor core (src/tensor/tensor.h). The
 * userdata holds one st__tensor_t; its __gc drops the arena reference
 * (st__tensor_arena_release). Methods parse their Lua arguments, call the
 * core with the state's tensor context, raise on error (the core's
 * message; the call fails with the code the core recorded, see
 * st__vm_build) and push the result.
 *
 * Arenas are memory Lua's collector does not see: every arena a binding
 * makes goes through st__lua_tensor_begin/end (or st__lua_new_arena),
 * which run a full collection once 256 MiB of arena bytes were made since
 * the last one.
 */
#ifndef ST_LUA_TENSOR_H
#define ST_LUA_TENSOR_H

#include "lua/state.h"
#include "tensor/tensor.h"

/* Registers the tensor metatable: tensor.c's methods (geometry, views)
 * plus `ops` (tensor_ops.c's st__lua_tensor_ops). Once per state. */
void st__lua_open_tensor(lua_State *L, const luaL_Reg *ops);

/* [-0, +1] Pushes a tensor userdata with no arena yet (the caller fills it
 * with the core: a view, st__tensor_new, a constructor; a failure leaves
 * arena NULL and the userdata is collected as it is). */
st__tensor_t *st__lua_push_tensor(lua_State *L);

/* The tensor at idx, or NULL if the value is not one. */
st__tensor_t *st__lua_totensor(lua_State *L, int idx);

/* The tensor at idx; raises "fn: expected a tensor" otherwise. */
st__tensor_t *st__lua_check_tensor(lua_State *L, int idx, const char *fn);

/* [-0, +1] st__lua_push_tensor before the core makes a tensor with a new
 * arena, with the collection the GC debt asks for. st__lua_tensor_end
 * then raises err unless rc is ST_OK, and counts the tensor's arena in the
 * GC debt. */
st__tensor_t *st__lua_tensor_begin(lua_State *L);
void st__lua_tensor_end(lua_State *L, const st__tensor_t *t, int rc, const char *err);

/* A new arena of `bytes` on `device` (st__tensor_arena_new), counted in
 * the GC debt; raises on failure. The caller owns the reference. */
st__arena_t *st__lua_new_arena(lua_State *L, int device, uint64_t bytes);

/* Parses the device value at idx for function fn: nil gives the call's
 * default (tensor.device), otherwise st__tensor_device_parse of the name
 * (a value that is no string is named by its type). Raises on failure. */
int st__lua_device_arg(lua_State *L, int idx, const char *fn);

/* The data methods of tensor_ops.c (for st__lua_open_tensor). */
extern const luaL_Reg st__lua_tensor_ops[];

#endif
