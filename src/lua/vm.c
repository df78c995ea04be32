/* src/lua: a worker's Lua state for one generation (st_lua.h).
 *
 * st__vm_new compiles the generation's source texts (never the files on
 * disk, which may have changed) in a fresh sandbox and keeps each
 * endpoint's build function in a registry table by name. st__vm_build runs
 * one body under the count hook (timeout, cancel) through the pcall
 * wrapper and serializes what it returns.
 *
 * The contract of each non-static function (what it does, returns and owns)
 * is its comment in st_lua.h; a vm is used by the one worker thread that
 * created it.
 */
#include "lua/pcall.h"
#include "lua/scope.h"
#include "lua/sandbox.h"
#include "lua/st_lua.h"
#include "lua/value.h"
#include "lua/zerobranch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

static char builds_key;       /* registry: endpoint name -> build function */

struct st__vm {
  lua_State *L;               /* NULL after a reset that could not rebuild it */
  st__generation_t *gen;      /* owned reference */
  int worker_id;
  st__vm_limits_t limits;
  st__lua_ctx_t ctx;          /* the state points here */
};

/* Runs one source's top level and records its build functions. Runs in
 * protected mode (l_compile), so that nothing here can panic the state. */
static int compile_source(lua_State *L, const st__source_t *src, double limit_s, char *err,
                          size_t errlen) {
  char chunkname[4200];
  snprintf(chunkname, sizeof chunkname, "@%s", src->path);
  if (luaL_loadbufferx(L, src->text, src->len, chunkname, "t") != 0) {
    snprintf(err, errlen, "%s", lua_tostring(L, -1));
    lua_settop(L, 0);
    return ST_ERR_CONFIGURATION;
  }
  int rc = st__lua_run(L, 0, 1, limit_s > 0 ? limit_s : ST__LUA_LOAD_LIMIT_S, NULL, err,
                       errlen);   /* ret */
  if (rc == ST_ERR_ENDPOINT && st__lua_main_reached(L)) {
    lua_pushnil(L);                                 /* app:main ended the file */
    rc = ST_OK;
  }
  if (rc != ST_OK) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", err);
    snprintf(err, errlen, "%s%s%s%s", st__lua_has_position(tmp) ? "" : src->path,
             st__lua_has_position(tmp) ? "" : ": ", tmp,
             st__lua_ctx(L)->stop == ST_ERR_OUT_OF_MEMORY
                 ? " (the file's top level, in a worker's state: limits.lua_memory_bytes)"
                 : "");
    return rc == ST_ERR_OUT_OF_MEMORY ? ST_ERR_OUT_OF_MEMORY : ST_ERR_CONFIGURATION;
  }
  int n = st__lua_file_decls(L, 1);                  /* ret, list|msg */
  if (n < 0) {
    snprintf(err, errlen, "%s: %s", src->path, lua_tostring(L, -1));
    lua_settop(L, 0);
    return ST_ERR_CONFIGURATION;
  }
  lua_pushlightuserdata(L, &builds_key);
  lua_rawget(L, LUA_REGISTRYINDEX);                 /* ret, list, builds */
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, 2, i);                           /* ret, list, builds, decl */
    lua_pushliteral(L, "name");                     /* raw gets: no metamethods */
    lua_rawget(L, -2);                              /* ..., decl, name */
    lua_pushliteral(L, "build");
    lua_rawget(L, -3);                              /* ..., decl, name, build */
    if (lua_type(L, -2) == LUA_TSTRING && lua_type(L, -1) == LUA_TFUNCTION) lua_rawset(L, 3);
    else lua_pop(L, 2);
    lua_pop(L, 1);                                  /* ret, list, builds */
  }
  lua_settop(L, 0);
  return ST_OK;
}

typedef struct compile {
  const st__source_t *src;
  double limit_s;             /* the generation's load_limit_s */
  char *err;
  size_t errlen;
  int rc;
} compile_t;

static int l_compile(lua_State *L) {
  compile_t *c = lua_touserdata(L, 1);
  lua_settop(L, 0);
  c->rc = compile_source(L, c->src, c->limit_s, c->err, c->errlen);
  return 0;
}

/* Builds vm->L for vm->gen: a fresh sandbox that has compiled every
 * source, with each endpoint's build function. ST_OK, or an error with a
 * reason (vm->L is then NULL). */
static int open_state(st__vm_t *vm, char *err, size_t errlen) {
  const st__generation_t *gen = vm->gen;
  vm->ctx.mode = ST__LUA_VM;
  vm->ctx.who = "lua";
  vm->ctx.mem_limit = (size_t)vm->limits.lua_memory_bytes;
  vm->L = st__lua_state_new(&vm->ctx);
  if (!vm->L) {
    snprintf(err, errlen, "cannot create a Lua state (out of memory)");
    return ST_ERR_OUT_OF_MEMORY;
  }
  lua_State *L = vm->L;
  lua_pushlightuserdata(L, &builds_key);
  lua_newtable(L);
  lua_rawset(L, LUA_REGISTRYINDEX);

  int rc = ST_OK;
  for (size_t i = 0; i < gen->nsources && rc == ST_OK; i++) {
    compile_t c = {&gen->sources[i], gen->load_limit_s, err, errlen, ST_OK};
    if (lua_cpcall(L, l_compile, &c) != 0) {
      snprintf(err, errlen, "%s: %s", gen->sources[i].path, lua_tostring(L, -1));
      c.rc = ST_ERR_OUT_OF_MEMORY;
    }
    lua_settop(L, 0);
    rc = c.rc;
  }

  lua_pushlightuserdata(L, &builds_key);
  lua_rawget(L, LUA_REGISTRYINDEX);                 /* builds */
  for (size_t i = 0; i < gen->nendpoints && rc == ST_OK; i++) {
    lua_getfield(L, -1, gen->endpoints[i].name);    /* builds, fn */
    if (lua_type(L, -1) != LUA_TFUNCTION) {
      snprintf(err, errlen, "%s:%d: endpoint '%s' has no build function in worker %d's state",
               gen->endpoints[i].file, gen->endpoints[i].line, gen->endpoints[i].name,
               vm->worker_id);
      rc = ST_ERR_CONFIGURATION;
    }
    lua_pop(L, 1);
  }
  lua_settop(L, 0);
  if (rc != ST_OK) {
    st__lua_close(L);
    vm->L = NULL;
    return rc;
  }
  lua_gc(L, LUA_GCCOLLECT, 0);
  return ST_OK;
}

/* Worker thread. See st_lua.h. */
int st__vm_new(st__generation_t *gen, int worker_id, const st__vm_limits_t *limits,
               st__vm_t **out, char *err, size_t errlen) {
  char dummy[1];
  if (!err) { err = dummy; errlen = 1; }
  *out = NULL;
  st__vm_t *vm = calloc(1, sizeof *vm);
  if (!vm) {
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  vm->worker_id = worker_id;
  if (limits) vm->limits = *limits;
  vm->gen = gen;
  int rc = open_state(vm, err, errlen);
  if (rc != ST_OK) {
    free(vm);
    return rc;
  }
  st__generation_ref(gen);
  *out = vm;
  return ST_OK;
}

/* After a body ran out of memory: collect what it left; when the state
 * still holds more than half its cap (the body kept what it made in an
 * upvalue or a table of the file), replace it with a fresh one so that the
 * next call does not start out of memory. A rebuild that fails leaves
 * vm->L NULL; the next st__vm_build tries again. */
static void recover_memory(st__vm_t *vm) {
  lua_gc(vm->L, LUA_GCCOLLECT, 0);
  if (vm->ctx.mem_used <= vm->ctx.mem_limit / 2) return;
  st__log(ST_LOG_WARN, "lua", "worker %d: the Lua state still holds %zu of its %zu bytes "
          "after a collection: rebuilt", vm->worker_id, vm->ctx.mem_used, vm->ctx.mem_limit);
  st__lua_close(vm->L);
  vm->L = NULL;
  char err[1024];
  if (open_state(vm, err, sizeof err) != ST_OK)
    st__log(ST_LOG_ERROR, "lua", "worker %d: cannot rebuild its Lua state: %s", vm->worker_id, err);
}

void st__vm_free(st__vm_t *vm) {
  if (!vm) return;
  st__lua_close(vm->L);               /* finalizers drop every arena reference */
  st__generation_unref(vm->gen);
  free(vm);
}

st__generation_t *st__vm_generation(const st__vm_t *vm) { return vm->gen; }

/* Worker thread that owns vm. See st_lua.h. */
void st__vm_set_device(st__vm_t *vm, int device, int cuda_device) {
  vm->ctx.tensor.device = device < 0 ? ST__DEV_CPU : device;
  vm->ctx.tensor.cuda_device = cuda_device;
}

/* Worker thread that owns vm. See st_lua.h. */
void st__vm_prepare(st__vm_t *vm, const st__job_t *job) {
  st__vm_set_device(vm, job->device, job->cuda_device);
  vm->ctx.arg_arenas = job->targs.arenas;
  vm->ctx.narg_arenas = job->targs.arenas ? job->targs.n : 0;
}

typedef struct build_call {
  const st__endpoint_decl_t *ep;
  const msgpack_object *args;
  st__build_result_t *res;
  int rc;                     /* failure that did not raise: args, serialization */
  char *err;
  size_t errlen;
} build_call_t;

/* Protected body of a build: fn(args), then serialization. */
static int l_build_call(lua_State *L) {
  build_call_t *b = lua_touserdata(L, 1);
  lua_settop(L, 0);
  lua_pushlightuserdata(L, &builds_key);
  lua_rawget(L, LUA_REGISTRYINDEX);                 /* builds */
  lua_getfield(L, 1, b->ep->name);                  /* builds, fn */
  if (lua_type(L, -1) != LUA_TFUNCTION) {
    snprintf(b->err, b->errlen, "endpoint '%s' is not in this state's generation", b->ep->name);
    b->rc = ST_ERR_UNKNOWN_ENDPOINT;
    return 0;
  }
  if (b->args && b->args->type != MSGPACK_OBJECT_NIL) {
    if (b->args->type != MSGPACK_OBJECT_MAP) {
      snprintf(b->err, b->errlen, "arguments must be a map");
      b->rc = ST_ERR_INVALID_ARGUMENT;
      return 0;
    }
    b->rc = st__lua_push_msgpack(L, b->args, b->err, b->errlen);  /* builds, fn, args */
    if (b->rc != ST_OK) return 0;
  } else {
    lua_newtable(L);
  }
  lua_call(L, 1, 1);                                /* builds, ret */
  msgpack_packer pk;
  msgpack_packer_init(&pk, &b->res->value, msgpack_sbuffer_write);
  char msg[1024];
  b->rc = st__lua_pack(L, 2, &pk, b->res, "value", msg, sizeof msg);
  if (b->rc == ST_ERR_SERIALIZATION)
    snprintf(b->err, b->errlen, "%s:%d: endpoint '%s' returned a value that cannot be sent: %s",
             b->ep->file, b->ep->line, b->ep->name, msg);
  else if (b->rc != ST_OK)
    snprintf(b->err, b->errlen, "%s", msg);
  return 0;
}

/* An endpoint with ipc = "legacy" sends its CUDA memory as legacy IPC
 * arenas only: a VMM arena in its result (a file st.safetensors loaded)
 * could not be reopened by the consumer this mode is for. ST_OK or
 * ST_ERR_ENDPOINT with the way out. */
static int check_legacy(const st__endpoint_decl_t *ep, const st__build_result_t *res, char *err,
                        size_t errlen) {
  for (size_t i = 0; i < res->narenas; i++) {
    if (st__arena_device(res->arenas[i]) < 0 || !st__arena_has_fd(res->arenas[i])) continue;
    snprintf(err, errlen,
             "%s:%d: endpoint '%s' has ipc = \"legacy\" but its result holds CUDA memory that "
             "is not a legacy IPC allocation (loaded by st.safetensors?): copy it into one, "
             "e.g. with :clone() or st.module{...}",
             ep->file, ep->line, ep->name);
    return ST_ERR_ENDPOINT;
  }
  return ST_OK;
}

/* The error of a body that raised (status: what st__lua_run returned,
 * msg its message) into err; returns the call's error code. A message
 * without a position (a tail call; a stop the allocator raised, for which
 * LuaJIT calls no message handler) gets the endpoint's declaration's. */
static int fail_message(const st__vm_t *vm, const st__endpoint_decl_t *ep, int status,
                        const char *msg, double timeout_s, char *err, size_t errlen) {
  const st__lua_ctx_t *c = &vm->ctx;
  char pos[1100] = "";
  if (!st__lua_has_position(msg)) snprintf(pos, sizeof pos, "%s:%d: ", ep->file, ep->line);
  if (status == ST_ERR_TIMEOUT && ep->timeout_s > 0)
    snprintf(err, errlen, "%s%s (endpoint '%s', timeout %g s)", pos, msg, ep->name, timeout_s);
  else if (status == ST_ERR_TIMEOUT)
    snprintf(err, errlen, "%s%s (endpoint '%s' declares no timeout: limits.default_timeout_s "
             "= %g s applies)", pos, msg, ep->name, timeout_s);
  else if (status == ST_ERR_CANCELLED)
    snprintf(err, errlen, "%s%s (endpoint '%s')", pos, msg, ep->name);
  else if (c->stop == ST_ERR_OUT_OF_MEMORY)
    snprintf(err, errlen, "%s%s (endpoint '%s'; limits.lua_memory_bytes sets the limit of "
             "each worker's Lua state)", pos, msg, ep->name);
  else
    snprintf(err, errlen, "%s%s", pos, msg);
  if (status != ST_ERR_ENDPOINT) return status;
  /* A failure of the call's resources (an arena, a device, a kernel)
   * fails the call with its own code when its message is what raised. */
  const st__tensor_ctx_t *tc = &c->tensor;
  return tc->err_code && tc->err_msg[0] && strstr(msg, tc->err_msg) ? tc->err_code
                                                                     : ST_ERR_ENDPOINT;
}

/* Worker thread that owns vm. See st_lua.h. */
int st__vm_build(st__vm_t *vm, const st__endpoint_decl_t *ep, const char *args, size_t args_len,
                 const volatile int *cancel, st__progress_t *progress, st__build_result_t *res,
                 char *err, size_t errlen) {
  char dummy[1];
  if (!err) { err = dummy; errlen = 1; }
  err[0] = '\0';
  st__build_result_init(res);
  if (!vm->L) {
    /* A reset after running out of memory could not rebuild the state:
     * try again, keeping the devices st__vm_prepare set. */
    st__tensor_ctx_t t = vm->ctx.tensor;
    int rc = open_state(vm, err, errlen);
    vm->ctx.tensor.device = t.device;
    vm->ctx.tensor.cuda_device = t.cuda_device;
    if (rc != ST_OK) return rc;
  }
  lua_State *L = vm->L;
  if (cancel && __atomic_load_n(cancel, __ATOMIC_RELAXED)) {
    snprintf(err, errlen, "endpoint '%s' was cancelled before it started", ep->name);
    return ST_ERR_CANCELLED;
  }

  msgpack_unpacked up;
  msgpack_unpacked_init(&up);
  const msgpack_object *argobj = NULL;
  if (args && args_len) {
    size_t off = 0;
    if (msgpack_unpack_next(&up, args, args_len, &off) != MSGPACK_UNPACK_SUCCESS) {
      msgpack_unpacked_destroy(&up);
      snprintf(err, errlen, "arguments are not valid msgpack");
      return ST_ERR_INVALID_ARGUMENT;
    }
    argobj = &up.data;
  }

  build_call_t b = {.ep = ep, .args = argobj, .res = res, .rc = ST_OK, .err = err,
                    .errlen = errlen};
  uint64_t debt0 = vm->ctx.gc_debt;
  /* An endpoint without `timeout` runs under limits.default_timeout_s. */
  double timeout_s = ep->timeout_s > 0 ? ep->timeout_s : vm->limits.default_timeout_s;
  vm->ctx.progress = progress;
  vm->ctx.tensor.in_call = 1;
  vm->ctx.tensor.cuda_used = 0;
  vm->ctx.tensor.cuda_legacy = ep->ipc == ST_IPC_LEGACY;
  lua_pushcfunction(L, l_build_call);
  lua_pushlightuserdata(L, &b);
  char msg[2048];
  int status = st__lua_run(L, 1, 0, timeout_s, cancel, msg, sizeof msg);
  vm->ctx.progress = NULL;
  /* Whatever the body queued on CUDA streams completes before the result
   * leaves this thread (docs/design.md, section 3, decision 5), and
   * before the GC below can release arenas a kernel still writes. */
  char sync_err[512];
  int sync_rc = st__tensor_sync_used(&vm->ctx.tensor, sync_err, sizeof sync_err);
  /* The regions and tensor arguments the call's tensors hold go now
   * (lua/scope.h): the result keeps its own references, temporaries'
   * regions go back to the pool, and no tensor maps the client's memory
   * past its call (no full collection needed for that). */
  st__lua_scope_end(L, sync_rc == ST_OK);
  vm->ctx.arg_arenas = NULL;
  vm->ctx.narg_arenas = 0;
  vm->ctx.tensor.in_call = 0;
  vm->ctx.tensor.cuda_legacy = 0;
  msgpack_unpacked_destroy(&up);
  lua_settop(L, 0);

  int rc = status != ST_OK ? fail_message(vm, ep, status, msg, timeout_s, err, errlen) : b.rc;
  if (sync_rc != ST_OK && rc == ST_OK) {
    rc = sync_rc;
    snprintf(err, errlen, "%s:%d: endpoint '%s': %s", ep->file, ep->line, ep->name, sync_err);
  }
  if (rc == ST_OK && ep->ipc == ST_IPC_LEGACY) rc = check_legacy(ep, res, err, errlen);
  if (rc != ST_OK) st__build_result_destroy(res);
  /* Tensors the body dropped that hold arenas other than pool regions
   * keep them until Lua collects them: collect now when the call made any,
   * so that memory follows the result. */
  if (vm->ctx.stop == ST_ERR_OUT_OF_MEMORY) {
    recover_memory(vm);
    vm->ctx.gc_debt = 0;
  } else if (vm->ctx.gc_debt != debt0) {
    lua_gc(L, LUA_GCCOLLECT, 0);
    vm->ctx.gc_debt = 0;
  }
  return rc;
}
