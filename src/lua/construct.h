/* src/lua/construct.h: st.empty/zeros/ones/full/arange/rand/randn
 * (construct.c), bindings of the tensor core's constructors. */
#ifndef ST_LUA_CONSTRUCT_H
#define ST_LUA_CONSTRUCT_H

#include "lua/state.h"

/* Adds st.empty, zeros, ones, full, arange, rand, randn to the table at
 * idx. */
void st__lua_open_construct(lua_State *L, int idx);

#endif
