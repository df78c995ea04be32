/* src/lua/module.h: st.module, several tensors packed in one arena
 * (module.c); safetensors.c makes the same userdata. */
#ifndef ST_LUA_MODULE_H
#define ST_LUA_MODULE_H

#include "lua/state.h"

typedef struct st__lmodule {
  st__arena_t *arena;              /* owned reference */
  size_t ntensors;
} st__lmodule_t;

/* The module's environment table holds these slots. */
#define ST__MODULE_NAMES    1      /* array of names, in order */
#define ST__MODULE_TENSORS  2      /* name -> tensor (a view in the arena) */
#define ST__MODULE_METADATA 3      /* table or absent */

/* Registers the module metatable and adds st.module to the table at idx. */
void st__lua_open_module(lua_State *L, int idx);

/* The module at idx, or NULL if the value is not one. */
st__lmodule_t *st__lua_tomodule(lua_State *L, int idx);

#endif
