/* src/lua: the limits of running Lua code: the counting allocator, the
 * count hook, and st__lua_run (guard.h says how each limit stops code).
 *
 * The contract of each non-static function (what it does, returns and owns)
 * is its comment in guard.h; all of them run on the thread that owns the
 * lua_State (and its context) they are given. The allocator runs inside
 * LuaJIT on that thread and only reads and writes the context.
 */
#include "lua/guard.h"
#include "common/clock.h"
#include "lua/pcall.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st/errors.h"

/* ------------------------------------------------------------ memory */

/* Whether the state may grow by `grow` bytes now. Records the stop that
 * refuses it: the cap (ST_ERR_OUT_OF_MEMORY), or a deadline or cancel the
 * allocator noticed (a refused allocation is how LuaJIT can be stopped
 * between two hook checks: it raises, and ctx->stop says why). */
static int may_grow(st__lua_ctx_t *c, size_t grow) {
  if (!c->guarded) return 1;
  if (c->mem_limit) {
    size_t cap = c->stop ? c->mem_limit + ST__LUA_MEM_RESERVE : c->mem_limit;
    if (grow > cap || c->mem_used > cap - grow) {
      if (!c->stop) c->stop = ST_ERR_OUT_OF_MEMORY;
      return 0;
    }
  }
  if (c->stop || (c->deadline <= 0 && !c->cancel)) return 1;
  c->mem_clock += grow;
  if (c->mem_clock < ST__LUA_CLOCK_BYTES) return 1;
  c->mem_clock = 0;
  c->stop = st__lua_stop_due(c);
  return c->stop == 0;
}

/* lua_Alloc wrapped around LuaJIT's own allocator (c->base_alloc): counts
 * into the context (ud) and refuses a growth may_grow does not allow.
 * Shrinking and freeing never fail. */
static void *counting_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  st__lua_ctx_t *c = ud;
  size_t old = ptr ? osize : 0;
  if (nsize > old && !may_grow(c, nsize - old)) return NULL;
  void *p = c->base_alloc(c->base_ud, ptr, osize, nsize);
  if (nsize == 0) {
    c->mem_used -= old;
    return NULL;
  }
  if (!p) return NULL;
  c->mem_used = c->mem_used - old + nsize;
  if (c->mem_used > c->mem_peak) c->mem_peak = c->mem_used;
  return p;
}

lua_State *st__lua_newstate(st__lua_ctx_t *ctx) {
  ctx->mem_used = ctx->mem_peak = ctx->mem_clock = 0;
  ctx->guarded = 0;
  ctx->base_alloc = NULL;
  lua_State *L = luaL_newstate();
  if (!L || !ctx->mem_limit) return L;
  /* Wrap LuaJIT's allocator rather than replace it: lua_newstate with an
   * allocator of ours fails in 64-bit builds without GC64 (their memory
   * must lie in the low 2 GiB), and LuaJIT's own is faster than malloc.
   * What the state holds already is LuaJIT's exact count. */
  ctx->base_alloc = lua_getallocf(L, &ctx->base_ud);
  ctx->mem_used = (size_t)lua_gc(L, LUA_GCCOUNT, 0) * 1024 + (size_t)lua_gc(L, LUA_GCCOUNTB, 0);
  ctx->mem_peak = ctx->mem_used;
  lua_setallocf(L, counting_alloc, ctx);
  return L;
}

void st__lua_close(lua_State *L) {
  if (!L) return;
  void *ud;
  if (lua_getallocf(L, &ud) == counting_alloc) {
    /* LuaJIT releases its whole arena at close only when it sees its own
     * allocator: give it back first. */
    const st__lua_ctx_t *c = ud;
    lua_setallocf(L, c->base_alloc, c->base_ud);
  }
  lua_close(L);
}

/* ------------------------------------------------------------ time limits */

/* Runs every ST__LUA_HOOK_COUNT instructions of interpreted code. Raising
 * from a count hook is allowed; the sandbox's pcall re-raises a stop error,
 * so endpoint code cannot swallow it. */
static void count_hook(lua_State *L, lua_Debug *ar) {
  if (ar->event == LUA_HOOKLINE) {
    if (lua_getinfo(L, "S", ar) && ar->what[0] == 'm') st__lua_ctx(L)->main_line = ar->currentline;
    return;
  }
  st__lua_check_stop(L);
}

void st__lua_arm(lua_State *L, double limit_s, const volatile int *cancel) {
  st__lua_ctx_t *c = st__lua_ctx(L);
  c->stop = 0;
  st__tensor_ctx_clear_error(&c->tensor);
  c->cancel = cancel;
  c->limit_s = limit_s;
  c->deadline = limit_s > 0 ? st__now_mono() + limit_s : 0;
  c->main_line = 0;
  c->mem_clock = 0;
  int mask = limit_s > 0 || cancel ? LUA_MASKCOUNT : 0;
  if (c->mode == ST__LUA_LOAD) mask |= LUA_MASKLINE;
  if (mask) lua_sethook(L, count_hook, mask, ST__LUA_HOOK_COUNT);
  else lua_sethook(L, NULL, 0, 0);
}

void st__lua_disarm(lua_State *L) {
  st__lua_ctx_t *c = st__lua_ctx(L);
  lua_sethook(L, NULL, 0, 0);
  c->deadline = 0;
  c->cancel = NULL;
}

/* ------------------------------------------------------------ running */

int st__lua_run(lua_State *L, int nargs, int nresults, double limit_s,
                const volatile int *cancel, char *err, size_t errlen) {
  st__lua_arm(L, limit_s, cancel);
  int status = st__lua_pcall(L, nargs, nresults, err, errlen);
  st__lua_disarm(L);
  if (status == 0) return ST_OK;
  const st__lua_ctx_t *c = st__lua_ctx(L);
  if (c->stop) return c->stop;
  return status == LUA_ERRMEM ? ST_ERR_OUT_OF_MEMORY : ST_ERR_ENDPOINT;
}
