/* src/lua: st.key, a key a client published (docs/keys.md, "Endpoints";
 * docs/endpoints.md, "Published keys"; the table is engine/keys.h).
 *
 *   local value, version = st.key(name [, version])
 *
 * value is what the client put (a table of tensors for a state dict),
 * each tensor a view of the publisher's allocation: no copy. The tensors
 * hold their own references, so a result or cached object built from them
 * keeps the memory whatever happens to the key later (delete, eviction, a
 * newer version). A missing key or version returns nil and the reason, and
 * so does a tensor whose memory the server cannot map (a CUDA allocation
 * is mapped in the server the first time an endpoint reads it: arena.h);
 * a bad name or version raises. A live key has one version, its current
 * one (its page's): st.key(name, v) finds it only when v is that number,
 * and `version` is always the page's (docs/keys.md, section 8).
 */
#include "lua/keys.h"

#include <stdio.h>
#include <string.h>

#include "common/fail.h"
#include "engine/keys.h"
#include "lua/value.h"

/* st.key(name [, version]) -> value, version | nil, err */
static int l_key(lua_State *L) {
  if (lua_type(L, 1) != LUA_TSTRING)
    return st__lua_raise(L, "st.key: name must be a string, got %s", luaL_typename(L, 1));
  size_t len;
  const char *name = lua_tolstring(L, 1, &len);
  uint64_t version = 0;
  if (!lua_isnoneornil(L, 2)) {
    lua_Number n = lua_type(L, 2) == LUA_TNUMBER ? lua_tonumber(L, 2) : -1;
    if (!(n >= 1 && n <= 9007199254740992.0) || n != (lua_Number)(uint64_t)n)
      return st__lua_raise(L, "st.key: version must be an integer >= 1");
    version = (uint64_t)n;
  }
  char err[400];
  if (st__keys_name_ok(name, len, err, sizeof err) != ST_OK)
    return st__lua_raise(L, "st.key: %s", err);
  st__build_result_t r;
  uint64_t got = 0;
  if (st__keys_read(name, len, version, &r, &got, err, sizeof err) != ST_OK) {
    lua_pushnil(L);
    lua_pushstring(L, err);
    return 2;
  }
  /* The value's tensors name r's arenas by index, as a call's tensor
   * arguments name the request's: push it with those in their place. */
  st__lua_ctx_t *c = st__lua_ctx(L);
  st__arena_t *const *saved = c->arg_arenas;
  size_t nsaved = c->narg_arenas;
  c->arg_arenas = r.arenas;
  c->narg_arenas = r.narenas;
  int top = lua_gettop(L);
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  int rc = msgpack_unpack_next(&u, r.value.data, r.value.size, &off) == MSGPACK_UNPACK_SUCCESS
               ? st__lua_push_msgpack(L, &u.data, err, sizeof err)
               : st__fail(ST_ERR_INTERNAL, err, sizeof err, "its stored value does not unpack");
  c->arg_arenas = saved;
  c->narg_arenas = nsaved;
  /* Its tensors keep the key's memory until Lua collects them: the call's
   * end collects (vm.c) when the debt moved. */
  c->gc_debt++;
  msgpack_unpacked_destroy(&u);
  st__build_result_destroy(&r);   /* the tensors hold their own references */
  if (rc != ST_OK) {
    char msg[600];
    snprintf(msg, sizeof msg, "key '%s' version %llu: %s", name, (unsigned long long)got, err);
    lua_settop(L, top);   /* drops what the value's push left */
    lua_pushnil(L);
    lua_pushstring(L, msg);
    return 2;
  }
  lua_pushnumber(L, (lua_Number)got);
  return 2;
}

void st__lua_open_keys(lua_State *L, int idx) {
  static const luaL_Reg funcs[] = {{"key", l_key}, {NULL, NULL}};
  st__lua_set_funcs(L, idx, funcs);
}
