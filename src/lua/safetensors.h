/* src/lua/safetensors.h: st.load_safetensors (safetensors.c). */
#ifndef ST_LUA_SAFETENSORS_H
#define ST_LUA_SAFETENSORS_H

#include "lua/state.h"

/* Adds st.load_safetensors to the st table at idx; call after
 * st__lua_open_module (it keeps st.module as an upvalue). */
void st__lua_open_safetensors(lua_State *L, int idx);

#endif
