/* src/lua/state.h: what every file of src/lua shares about one state: its
 * context (reachable from every C function of the state), the clock and
 * the stop checks of the running call, raising errors with the endpoint's
 * position, read-only proxies, and the integer checks of arguments.
 * Nothing here depends on another file of src/lua (state.c is the bottom
 * of the module), and nothing outside src/lua includes it.
 *
 * Threads: a lua_State is used by one thread at a time; nothing here keeps
 * global mutable state (registry keys are addresses of static chars).
 */
#ifndef ST_LUA_STATE_H
#define ST_LUA_STATE_H

#include <lauxlib.h>
#include <lua.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/job.h"
#include "mem/arena.h"
#include "tensor/tensor.h"

/* How long a file's top level (config.lua, an endpoint file) may run while
 * it is loaded: a file that loops forever is a load error, not a hang.
 * The fuzz build sets a shorter one (tests/fuzz/CMakeLists.txt): an input
 * that loops then costs a tenth of a second, not ten. */
#ifndef ST__LUA_LOAD_LIMIT_S
#define ST__LUA_LOAD_LIMIT_S 10.0
#endif

/* How much Lua memory a file's top level may hold while it is loaded: a
 * file that builds a huge string or table is a load error, not an
 * exhausted host (a file holds declarations; 64 MiB is far past any). */
#define ST__LUA_LOAD_MEMORY_BYTES ((size_t)64 << 20)

/* Instructions between two checks of the deadline and the cancel flag. */
#define ST__LUA_HOOK_COUNT 1000

typedef enum {
  ST__LUA_CONFIG = 0,    /* config.lua: no st module */
  ST__LUA_LOAD,          /* validation of endpoint files (loop thread) */
  ST__LUA_VM             /* a worker's state */
} st__lua_mode_t;

/* Per-state context. */
typedef struct st__lua_ctx {
  st__lua_mode_t mode;
  const char *who;                 /* log name ("lua") */
  double deadline;                 /* monotonic seconds; 0 = none */
  double limit_s;                  /* the limit, for messages */
  const volatile int *cancel;      /* may be NULL; read with atomic loads */
  st__progress_t *progress;        /* st.progress goes here; may be NULL */
  int stop;                        /* 0, ST_ERR_TIMEOUT, ST_ERR_CANCELLED or
                                      ST_ERR_OUT_OF_MEMORY */
  /* Memory of the state (guard.c). */
  size_t mem_limit;                /* bytes the state may hold; 0 = none */
  size_t mem_used;                 /* bytes it holds now (with a limit) */
  size_t mem_peak;                 /* the most it held */
  size_t mem_clock;                /* bytes allocated since the allocator last
                                      checked the deadline */
  lua_Alloc base_alloc;            /* LuaJIT's allocator, wrapped while
                                      mem_limit is set; NULL: not wrapped */
  void *base_ud;
  int guarded;                     /* inside st__lua_pcall: the allocator may
                                      refuse (never outside a protected call) */
  uint64_t gc_debt;                /* arena bytes made since the last full GC
                                      (not counting pool regions: scope.h) */
  size_t scope_n;                  /* entries of the call's scope table (scope.c) */
  int main_line;                   /* ST__LUA_LOAD: last line run by a main chunk */
  const char *src_text;            /* ST__LUA_LOAD: the file being run (borrowed) */
  size_t src_len;
  /* The tensor core's context of the call (src/tensor/tensor.h): devices,
   * CUDA streams used, the last failure of the call's resources. Set to
   * the CPU by st__lua_state_new; a worker's st__vm_build sets it for each
   * call (tensor.in_call: a build body runs and may use CUDA). */
  st__tensor_ctx_t tensor;
  /* Tensor arguments of the current call (engine/targs.h): the arenas
   * mapped from the client's descriptors, borrowed from the job while the
   * body runs; tensor values of the arguments index them. */
  st__arena_t *const *arg_arenas;
  size_t narg_arenas;
} st__lua_ctx_t;

/* Makes ctx (borrowed; it must outlive the state) the state's context. */
void st__lua_set_ctx(lua_State *L, st__lua_ctx_t *ctx);

/* The context of a state (never NULL for states made by st__lua_state_new). */
st__lua_ctx_t *st__lua_ctx(lua_State *L);

/* The context's tensor core context (&st__lua_ctx(L)->tensor). */
st__tensor_ctx_t *st__lua_tensor_ctx(lua_State *L);


/* The stop that is due now and was not recorded yet: ST_ERR_CANCELLED
 * when the cancel flag is set, ST_ERR_TIMEOUT past the deadline, else 0.
 * Reads only c (any code that runs the state, the allocator included). */
int st__lua_stop_due(const st__lua_ctx_t *c);

/* Raises the stop error if one is recorded, the deadline passed or cancel
 * is set (sets ctx->stop); returns otherwise. Used by the hook, st.sleep
 * and C functions that wait. */
void st__lua_check_stop(lua_State *L);

/* The message of c->stop ("timed out after 5 s", "cancelled", "out of
 * memory: ...") into buf; "" when there is none. Returns buf. */
const char *st__lua_stop_message(const st__lua_ctx_t *c, char *buf, size_t len);

/* Nonzero once the cancel flag of the running call is set (an atomic
 * load; 0 when there is no flag). */
int st__lua_cancel_requested(const st__lua_ctx_t *c);

/* Raises an error "where: message" where `where` is the innermost Lua
 * frame (C functions called through pcall or metamethods still report the
 * endpoint's file:line). Never returns. */
int st__lua_raise(lua_State *L, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), noreturn));

/* Writes "file:line" of the innermost Lua frame into buf ("?" if none). */
void st__lua_where(lua_State *L, char *buf, size_t len);

/* [-0, +1] Pushes a read-only proxy of the table at idx: reads go to the
 * table, writes raise, the metatable is hidden, rawset refuses it. */
void st__lua_push_readonly(lua_State *L, int idx);

/* Nonzero when the value at idx is a proxy of st__lua_push_readonly. */
int st__lua_is_readonly(lua_State *L, int idx);

/* Sets each function of `funcs` (up to its {NULL, NULL} entry; NULL:
 * none) as a field of the table at idx. */
void st__lua_set_funcs(lua_State *L, int idx, const luaL_Reg *funcs);

/* [-0, +1] Pushes a new metatable holding the functions of `meta`
 * (__index, __gc, ...) and __metatable = false, so that Lua code can
 * neither read nor replace it. */
void st__lua_push_metatable(lua_State *L, const luaL_Reg *meta);

/* [-0, +0] Stores in the registry under `key` a new metatable holding the
 * functions of `meta` (st__lua_push_metatable) whose __index is a table of
 * the functions of `methods`, then of `more` (NULL: none). */
void st__lua_register_class(lua_State *L, void *key, const luaL_Reg *meta,
                            const luaL_Reg *methods, const luaL_Reg *more);

/* [-0, +1] Pushes the registry's value under `key`, calling build(L) first
 * when there is none yet; build leaves the stack as it found it and sets
 * that value. */
void st__lua_push_built(lua_State *L, void *key, void (*build)(lua_State *L));

/* Reads an integral Lua number at idx for argument checks; raises
 * "fn: what must be an integer" otherwise. */
int64_t st__lua_check_int(lua_State *L, int idx, const char *fn, const char *what);

/* The string at idx when it is a Lua string without a NUL byte (a dtype,
 * a device name), else NULL: C code reads names as C strings, so
 * "float32\0junk" must not pass for "float32". Borrowed from the stack. */
const char *st__lua_name(lua_State *L, int idx);

/* What a value at idx that is no name is, for messages: its type name,
 * or "a string with a NUL byte". */
const char *st__lua_not_name(lua_State *L, int idx);

/* Converts a double to int64 when it is integral and in range. */
int st__lua_num_to_int(double d, int64_t *out);

#endif
