/* src/lua: the sandbox's built-in "st.zerobranch" module (docs/zero-branch.md).
 *
 * A zero-branch script is one Lua file that declares endpoints and holds
 * the program that calls them. The server loads that same file as its
 * endpoint file; there, require("st.zerobranch") is this module, not
 * lua/st/zerobranch.lua (which needs the FFI and starts servers):
 *
 *   local app = require("st.zerobranch").app()
 *   app:endpoint { name = "x", build = function(a) ... end }   -- st.endpoint
 *   app:main(function(c) ... end)          -- the server stops reading here
 *   ... the program's code after main ...  -- never runs on the server
 *
 * app:endpoint records each declaration for the file being run; the file
 * returns nothing, and st__lua_file_decls hands the recorded list to the
 * loader (and to worker states, which compile the same text). app:main
 * marks the state and raises, which unwinds the rest of the top level
 * (the sandbox's pcall re-raises it); the loader and the worker states
 * see the mark (st__lua_main_reached) and treat the file as finished.
 * Both are top-level statements: in a build body they raise. The misuse
 * rules are otherwise those of the client side: main takes a function and
 * runs once.
 *
 * The contract of each non-static function is its comment in zerobranch.h;
 * all of them run on the thread that owns the lua_State they are given.
 */
#include "lua/zerobranch.h"
#include "lua/stlib.h"

#include <string.h>

static char module_key;       /* registry: the read-only module proxy       */
static char app_mt_key;       /* registry: metatable of app objects         */
static char file_decls_key;   /* registry: declarations of the running file
                                 (an array), or nil when it made no app    */
static char main_key;         /* registry: true once the running file
                                 reached app:main                          */

typedef struct app {
  int main_called;
} app_t;

static app_t *check_app(lua_State *L, const char *what, int top_level) {
  app_t *a = lua_touserdata(L, 1);
  int ok = a && lua_getmetatable(L, 1);
  if (ok) {                                   /* ..., mt */
    lua_pushlightuserdata(L, &app_mt_key);
    lua_rawget(L, LUA_REGISTRYINDEX);         /* ..., mt, app_mt */
    ok = lua_rawequal(L, -1, -2);
    lua_pop(L, 2);
  }
  if (!ok) st__lua_raise(L, "%s: call it as app:%s(...)", what, what + 4);
  if (top_level && st__lua_tensor_ctx(L)->in_call)
    st__lua_raise(L, "%s: only at the top level of a script, not in a build function", what);
  return a;
}

/* [-0, +1] The running file's declaration list, created when missing. */
static void push_file_decls(lua_State *L) {
  lua_pushlightuserdata(L, &file_decls_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  if (lua_istable(L, -1)) return;
  lua_pop(L, 1);
  lua_newtable(L);
  lua_pushlightuserdata(L, &file_decls_key);
  lua_pushvalue(L, -2);
  lua_rawset(L, LUA_REGISTRYINDEX);
}

/* app:endpoint{...}: st.endpoint{...}, recorded as one of the file's
 * declarations, at the line of the call. Returns the declaration. */
static int l_app_endpoint(lua_State *L) {
  app_t *a = check_app(L, "app:endpoint", 1);
  if (a->main_called)
    return st__lua_raise(L, "app:endpoint: called after app:main (declare every endpoint "
                            "before main)");
  if (lua_type(L, 2) != LUA_TTABLE || lua_gettop(L) != 2)
    return st__lua_raise(L, "app:endpoint expects one table: app:endpoint{ name = ..., "
                            "build = ... }");
  lua_Debug ar;
  int line = 0;
  if (lua_getstack(L, 1, &ar) && lua_getinfo(L, "l", &ar)) line = ar.currentline;
  if (line <= 0) line = st__lua_ctx(L)->main_line;
  if (line <= 0) line = 1;
  st__lua_push_st(L);                         /* self, decl, st (built first) */
  lua_pop(L, 1);
  st__lua_decl_mark(L, 2, line);
  push_file_decls(L);                         /* self, decl, list */
  lua_pushvalue(L, 2);
  lua_rawseti(L, -2, (int)lua_objlen(L, -2) + 1);
  lua_pop(L, 1);                              /* self, decl */
  return 1;
}

/* app:main(fn): where the program's part starts, which the server never
 * runs: marks the state and unwinds the rest of the file's top level. */
static int l_app_main(lua_State *L) {
  app_t *a = check_app(L, "app:main", 1);
  if (lua_type(L, 2) != LUA_TFUNCTION)
    return st__lua_raise(L, "app:main expects a function, got %s", luaL_typename(L, 2));
  if (a->main_called) return st__lua_raise(L, "app:main: called twice");
  a->main_called = 1;
  lua_pushlightuserdata(L, &main_key);
  lua_pushboolean(L, 1);
  lua_rawset(L, LUA_REGISTRYINDEX);
  return st__lua_raise(L, "app:main: the program starts here; the server reads no further");
}

static int l_app_role(lua_State *L) {
  check_app(L, "app:role", 0);
  lua_pushliteral(L, "server");
  return 1;
}

static int l_app_tostring(lua_State *L) {
  lua_pushliteral(L, "st.zerobranch app (server)");
  return 1;
}

static int l_app_newindex(lua_State *L) {
  return st__lua_raise(L, "attempt to modify an app (field '%s')",
                       lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : "?");
}

/* app([opts]): a new app. opts (host-side settings: file, workers,
 * config) are checked by name only; the server has its own settings. */
static int l_app(lua_State *L) {
  if (!lua_isnoneornil(L, 1)) {
    if (lua_type(L, 1) != LUA_TTABLE)
      return st__lua_raise(L, "app: options must be a table, got %s", luaL_typename(L, 1));
    lua_pushnil(L);
    while (lua_next(L, 1)) {                  /* opts, k, v */
      const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?";
      if (strcmp(k, "file") != 0 && strcmp(k, "workers") != 0 && strcmp(k, "config") != 0)
        return st__lua_raise(L, "app: unknown option '%s' (options: file, workers, config)", k);
      lua_pop(L, 1);
    }
  }
  push_file_decls(L);                         /* the file makes an app */
  lua_pop(L, 1);
  app_t *a = lua_newuserdata(L, sizeof *a);   /* app */
  a->main_called = 0;
  lua_pushlightuserdata(L, &app_mt_key);
  lua_rawget(L, LUA_REGISTRYINDEX);           /* app, mt */
  lua_setmetatable(L, -2);
  return 1;
}

/* Builds the app metatable and the module table, keeps the proxy. */
static void build_module(lua_State *L) {
  static const luaL_Reg meta[] = {
    {"__newindex", l_app_newindex}, {"__tostring", l_app_tostring}, {NULL, NULL}
  };
  static const luaL_Reg methods[] = {
    {"endpoint", l_app_endpoint}, {"main", l_app_main}, {"role", l_app_role}, {NULL, NULL}
  };
  st__lua_register_class(L, &app_mt_key, meta, methods, NULL);

  lua_createtable(L, 0, 1);                   /* mod */
  lua_pushcfunction(L, l_app);
  lua_setfield(L, -2, "app");
  lua_pushlightuserdata(L, &module_key);
  st__lua_push_readonly(L, -2);               /* mod, key, proxy */
  lua_rawset(L, LUA_REGISTRYINDEX);
  lua_pop(L, 1);                              /* (empty) */
}

void st__lua_push_zerobranch(lua_State *L) { st__lua_push_built(L, &module_key, build_module); }

int st__lua_main_reached(lua_State *L) {
  lua_pushlightuserdata(L, &main_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  int reached = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return reached;
}

int st__lua_file_decls(lua_State *L, int idx) {
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  lua_pushlightuserdata(L, &main_key);
  lua_pushnil(L);
  lua_rawset(L, LUA_REGISTRYINDEX);           /* the next file starts before main */
  lua_pushlightuserdata(L, &file_decls_key);
  lua_rawget(L, LUA_REGISTRYINDEX);           /* list? */
  lua_pushlightuserdata(L, &file_decls_key);
  lua_pushnil(L);
  lua_rawset(L, LUA_REGISTRYINDEX);           /* taken: the next file starts empty */
  if (!lua_istable(L, -1)) {
    lua_pop(L, 1);
    return st__lua_decl_list(L, idx);
  }
  int n = (int)lua_objlen(L, -1);
  if (!lua_isnil(L, idx)) {
    lua_pop(L, 1);
    if (n == 0) return st__lua_decl_list(L, idx);
    lua_pushliteral(L, "declare the endpoints either with app:endpoint{...} or by returning "
                       "them, not both");
    return -1;
  }
  if (n == 0) {
    lua_pop(L, 1);
    lua_pushliteral(L, "the script makes an app but declares no endpoint "
                       "(app:endpoint{ name = ..., build = ... })");
    return -1;
  }
  return n;                                   /* list */
}
