/* src/lua/scope.c: the regions and tensor arguments of a call's tensors go
 * when the call ends (scope.h says what and why). The registry holds one table with weak
 * values: index -> tensor or module made during the current call. Weak, so
 * that the collector still takes a temporary during a long call (its __gc
 * drops the reference as before, and the entry goes); what is alive at the
 * end is released here. The state's context counts the entries. Thread of
 * the lua_State only.
 */
#include "lua/scope.h"

#include "lua/module.h"
#include "lua/tensor.h"

static char scope_key;   /* registry: the call's table */

void st__lua_scope_open(lua_State *L) {
  lua_pushlightuserdata(L, &scope_key);
  lua_newtable(L);                            /* key, t */
  lua_createtable(L, 0, 1);                   /* key, t, mt */
  lua_pushliteral(L, "v");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_rawset(L, LUA_REGISTRYINDEX);
  st__lua_ctx(L)->scope_n = 0;
}

void st__lua_scope_add(lua_State *L, int idx) {
  st__lua_ctx_t *c = st__lua_ctx(L);
  if (!c->tensor.in_call) return;
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  lua_pushlightuserdata(L, &scope_key);
  lua_rawget(L, LUA_REGISTRYINDEX);           /* ..., t */
  lua_pushvalue(L, idx);
  lua_rawseti(L, -2, (int)++c->scope_n);
  lua_pop(L, 1);
}

int st__lua_scope_region(const st__arena_t *a) {
  void *owner;
  uint32_t slot;
  return a && st__arena_region(a, &owner, &slot);
}

/* 1 when `a` is one of the current call's tensor arguments. */
static int is_argument(const st__lua_ctx_t *c, const st__arena_t *a) {
  for (size_t i = 0; a && i < c->narg_arenas; i++)
    if (c->arg_arenas[i] == a) return 1;
  return 0;
}

/* Drops *a: at once when the call's streams are known idle, else after
 * the thread's stream on its device (st__tensor_arena_release). */
static void release(st__arena_t **a, int synced) {
  if (synced) st__arena_unref(*a);
  else st__tensor_arena_release(*a);
  *a = NULL;
}

size_t st__lua_scope_end(lua_State *L, int synced) {
  st__lua_ctx_t *c = st__lua_ctx(L);
  if (!c->scope_n) return 0;
  size_t released = 0;
  lua_pushlightuserdata(L, &scope_key);
  lua_rawget(L, LUA_REGISTRYINDEX);           /* t */
  for (size_t i = 1; i <= c->scope_n; i++) {
    lua_rawgeti(L, -1, (int)i);               /* t, v? */
    st__tensor_t *tensor = st__lua_totensor(L, -1);
    st__lmodule_t *m = tensor ? NULL : st__lua_tomodule(L, -1);
    st__arena_t **a = tensor ? &tensor->arena : m ? &m->arena : NULL;
    if (a && (st__lua_scope_region(*a) || is_argument(c, *a))) {
      release(a, synced);
      released++;
    }
    lua_pop(L, 1);
    lua_pushnil(L);
    lua_rawseti(L, -2, (int)i);
  }
  lua_pop(L, 1);
  c->scope_n = 0;
  return released;
}

void st__lua_check_alive(lua_State *L, const st__arena_t *a, const char *fn) {
  if (!a) st__lua_raise(L, "%s: " ST__LUA_ENDED_MSG, fn);
}
