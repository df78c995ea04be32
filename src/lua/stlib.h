/* src/lua/stlib.h: the `st` module table (stlib.c): st.endpoint,
 * required, cancelled, sleep, progress, array, tensor_param, version, and
 * the tensors and modules of construct.c, module.c and safetensors.c;
 * declaration lists of a file. */
#ifndef ST_LUA_STLIB_H
#define ST_LUA_STLIB_H

#include "lua/state.h"

/* [-0, +1] Pushes the read-only st module (built on first use). */
void st__lua_push_st(lua_State *L);

/* Nonzero if the value at idx is st.required. */
int st__lua_is_required(lua_State *L, int idx);

/* Nonzero when the value at idx was made by st.tensor_param{...}; then
 * *dtype is its st_dtype_t (-1: any) and *device an st__tensor_device_t
 * (engine/generation.h). */
int st__lua_is_tensor_param(lua_State *L, int idx, int *dtype, int *device);

/* [-0, +1] Normalizes what an endpoint file returned (at idx): one
 * st.endpoint{...} or an array of them. Pushes an array of declaration
 * tables and returns its length, or pushes an error message and returns -1. */
int st__lua_decl_list(lua_State *L, int idx);

/* Line of the st.endpoint{...} call that made the table at idx (0 if it
 * was not made by st.endpoint). */
int st__lua_decl_line(lua_State *L, int idx);

/* Records the table at idx as a declaration made at `line`, as
 * st.endpoint{...} does (zerobranch.c's app:endpoint). The st module must
 * exist (st__lua_push_st). */
void st__lua_decl_mark(lua_State *L, int idx, int line);

/* [-0, +1] Pushes the marker metatable of tables that serialize as arrays
 * even when empty. */
void st__lua_push_array_mt(lua_State *L);

#endif
