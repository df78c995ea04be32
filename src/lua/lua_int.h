/* src/lua: declarations of decl.c (the validation of one st.endpoint{...}
 * table), and the headers that decl.c, config_load.c and loader.c use.
 * Everything here may use Lua types; nothing outside src/lua includes
 * this header.
 *
 * Files of src/lua, each with its own header (lua/<file>.h) unless noted:
 *   state.c        the context of a state, raising with a position, the
 *                  stop checks, read-only proxies, integer arguments (the
 *                  bottom of the module: it calls no other file of it)
 *   sandbox.c      states, the allow-listed environment, strict globals,
 *                  safe load/require/print/pcall
 *   guard.c        the limits of running code: the counting allocator
 *                  (memory cap), the count hook (time limit, cancel),
 *                  st__lua_run (a function under all of them)
 *   pcall.c        the one protected-call wrapper (adds a traceback)
 *   stlib.c        the `st` module table: endpoint, required, cancelled,
 *                  sleep, progress, array; declaration lists of a file
 *   zerobranch.c   the built-in "st.zerobranch" module of zero-branch
 *                  scripts (app:endpoint, app:main, app:role)
 *   tensor.c       tensor userdata, geometry methods and views: bindings
 *                  of the tensor core (src/tensor)
 *   tensor_ops.c   tensor methods that touch data (fill, copies, to, get,
 *                  set, tolist, mul_, add_) on either device
 *   construct.c    st.empty/zeros/ones/full/arange/rand/randn
 *   module.c       st.module: several tensors packed in one arena
 *   safetensors.c  st.load_safetensors
 *   keys.c         st.key: a published key's value in an endpoint
 *   scope.c        the pool regions of a call's tensors and modules,
 *                  released when the call ends
 *   value.c        msgpack <-> Lua, result serialization
 *   decl.c         validation of one st.endpoint{...} table (this header)
 *   loader.c       st__generation_load (st_lua.h)
 *   vm.c           worker states: st__vm_new/build/free (st_lua.h)
 *   config_load.c  st__settings_load (st_lua.h): config.lua by a settings schema
 *
 * Threads: a lua_State is used by one thread at a time; nothing here keeps
 * global mutable state (registry keys are addresses of static chars).
 */
#ifndef ST_LUA_INT_H
#define ST_LUA_INT_H

#include <lauxlib.h>
#include <lua.h>
#include <msgpack.h>
#include <stdint.h>

#include "engine/generation.h"
#include "engine/result.h"
#include "lua/pcall.h"
#include "lua/sandbox.h"
#include "lua/st_lua.h"
#include "lua/state.h"
#include "lua/stlib.h"
#include "lua/value.h"
#include "st/dtype.h"
#include "st/errors.h"
#include "st/wire.h"

/* ------------------------------------------------------------ decl.c */

/* Validates the declaration table at idx (made by st.endpoint at
 * file:line) into *out (zeroed first; on errors everything is freed again
 * and the problems are in errs). Returns the number of errors added. */
int st__lua_decl_parse(lua_State *L, int idx, const char *file, int line,
                       st__endpoint_decl_t *out, st__errlist_t *errs);

/* Frees what a declaration owns (not the struct). */
void st__lua_decl_free(st__endpoint_decl_t *d);

/* 64-bit FNV-1a, continued from h (start with ST__FNV_OFFSET). */
#define ST__FNV_OFFSET 0xcbf29ce484222325ull
uint64_t st__lua_fnv1a(uint64_t h, const void *data, size_t len);

#endif
