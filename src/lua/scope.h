/* src/lua/scope.h: memory a call lends its tensors (scope.c; docs/pool.md,
 * section 8).
 *
 * A build whose result the server does not keep makes its tensors in the
 * caller's result pool (mem/pool.h): each is a region of a slab the client
 * maps. Such regions belong to the call: when the body has returned (and
 * its CUDA work is synchronized), every tensor and module the call made
 * that holds a region drops it at once, instead of when Lua collects it.
 * The result keeps its own references; a temporary's region goes back to
 * the pool without a full collection after every build. The call's tensor
 * arguments likewise (the caller's memory, docs/protocol.md, "Tensor
 * arguments"): every tensor and view the call made on one drops it when
 * the call ends, so the server maps the caller's memory no longer than
 * the call and its result need it, again without a full collection. A
 * tensor stashed past its call (in an upvalue or a global) is then empty:
 * using it raises ST__LUA_ENDED_MSG. Tensors made while a file loads, or
 * with any other arena, are never touched.
 *
 * All of it runs on the thread that owns the lua_State.
 */
#ifndef ST_LUA_SCOPE_H
#define ST_LUA_SCOPE_H

#include "lua/state.h"
#include "mem/arena.h"

/* What a tensor or module whose region its call released says when used. */
#define ST__LUA_ENDED_MSG                                                                   \
  "a tensor made by an earlier call in the caller's result pool, or on its tensor "        \
  "argument (its memory was lent to that call, released when the call ended): make "       \
  "tensors that outlive a call when the file loads, or in an endpoint with cache = true"

/* Makes the state's table of the current call's tensors and modules (weak
 * values, in the registry). Once per state. */
void st__lua_scope_open(lua_State *L);

/* Records the userdata at idx (a tensor or a module) when a call runs
 * (tensor.in_call); nothing otherwise. */
void st__lua_scope_add(lua_State *L, int idx);

/* After a call, before the context's argument arenas are cleared: every
 * recorded tensor and module still alive that holds a pool region or one
 * of the call's tensor arguments releases it (arena NULL from now);
 * forgets all. Returns how
 * many were released. `synced`: every stream the call used was
 * synchronized after its last work (st__tensor_sync_used succeeded), so
 * the references go without waiting for the thread's streams again;
 * otherwise each release waits for its device's stream as __gc does. */
size_t st__lua_scope_end(lua_State *L, int synced);

/* 1 when `a` is a pool region (released at the end of its call). */
int st__lua_scope_region(const st__arena_t *a);

/* Raises "fn: " ST__LUA_ENDED_MSG when a is NULL (the object's call
 * released its region); returns otherwise. */
void st__lua_check_alive(lua_State *L, const st__arena_t *a, const char *fn);

#endif
