/* src/lua/sandbox.h: sandboxed states (sandbox.c; docs/endpoints.md,
 * "Sandbox") and the count hook that enforces time limits and cancel. */
#ifndef ST_LUA_SANDBOX_H
#define ST_LUA_SANDBOX_H

#include "lua/state.h"

/* Creates a state with the JIT engine off, the sandbox environment as its
 * globals and, unless mode is ST__LUA_CONFIG, the st module. `ctx` is
 * borrowed and must outlive the state; its tensor context is reset to the
 * CPU. NULL when out of memory. */
lua_State *st__lua_state_new(st__lua_ctx_t *ctx);

/* Arms the count hook: a limit (seconds, 0 = none) and a cancel flag (may
 * be NULL) for the next call into Lua; clears ctx->stop and the recorded
 * failure of the tensor context. In ST__LUA_LOAD states a line hook also
 * tracks ctx->main_line (st.endpoint needs it when it is tail-called:
 * `return st.endpoint{...}` leaves no caller frame to ask).
 * st__lua_disarm removes the hooks. */
void st__lua_arm(lua_State *L, double limit_s, const volatile int *cancel);
void st__lua_disarm(lua_State *L);

#endif
