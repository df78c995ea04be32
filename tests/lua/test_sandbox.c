/* src/lua: the endpoint sandbox. One endpoint per way out; each must fail
 * with an ENDPOINT error naming its file and line, and the vm must keep
 * working. Then what the allow-list does permit. */
#include "lua_kit.h"

/* X(name, body): one endpoint "<name>.lua" whose body (line 2) tries one
 * way out. */
#define ESCAPES(X)                                                         \
  X(io_open, "return io.open('/etc/passwd')")                              \
  X(io_via_require, "return require('io')")                                \
  X(os_execute, "return os.execute('true')")                               \
  X(os_exit, "os.exit(3)")                                                 \
  X(os_getenv, "return os.getenv('HOME')")                                 \
  X(os_remove, "return os.remove('/tmp/x')")                               \
  X(require_ffi, "return require('ffi')")                                  \
  X(require_os, "return require('os')")                                    \
  X(require_debug, "return require('debug')")                              \
  X(require_st_escape, "return require('st.../../etc')")                   \
  X(ffi_global, "return ffi.C")                                            \
  X(debug_getinfo, "return debug.getinfo(1)")                              \
  X(jit_global, "return jit.version")                                      \
  X(package_loadlib, "return package.loadlib('libc.so.6', 'system')")      \
  X(dofile, "return dofile('/etc/passwd')")                                \
  X(loadfile, "return loadfile('/etc/passwd')")                            \
  X(loadstring, "return loadstring('return 1')")                           \
  X(load_bytecode, "return load('\\27LJ\\2\\0')")                          \
  X(load_binary_mode, "return load('return 1', 'x', 'b')")                 \
  X(load_function_reader, "return load(function() return nil end)")        \
  X(string_dump, "return string.dump(function() end)")                     \
  X(string_dump_method, "return ('x').dump(function() end)")               \
  X(new_global, "leaked = 1 return 1")                                     \
  X(global_function, "function leaked_fn() end return 1")                  \
  X(undeclared_read, "return undeclared_thing + 1")                        \
  X(setfenv, "return setfenv(1, {})")                                      \
  X(getfenv, "return getfenv(0)")                                          \
  X(rawset_G, "rawset(_G, 'x', 1) return 1")                               \
  X(G_global, "return _G")                                                 \
  X(rawset_st, "rawset(st, 'zeros', nil) return 1")                        \
  X(st_mutation, "st.zeros = nil return 1")                                \
  X(st_metatable, "setmetatable(st, nil) return 1")                        \
  X(string_mutation, "string.upper = nil return 1")                        \
  X(math_mutation, "math.floor = print return 1")                          \
  X(string_meta, "getmetatable('').__index = nil return 1")                \
  X(tensor_meta, "getmetatable(st.zeros{1}).__gc = nil return 1")          \
  X(collectgarbage, "collectgarbage('stop') return 1")                     \
  X(newproxy, "return newproxy(true)")                                     \
  X(coroutine, "return coroutine.wrap(function() return io end)()")        \
  X(module_fn, "return module('x')")                                       \
  X(gcinfo, "return gcinfo()")                                             \
  X(cuda_device, "return st.zeros{2, device = 'cuda:4095'}")

static kit_vm_t V;   /* one vm over every escape file, shared by the tests */

static void write_escape(const char *name, const char *body) {
  char file[128];
  snprintf(file, sizeof file, "%s.lua", name);
  kit_write(file, "return st.endpoint{ name = '%s', build = function(a)\n%s\nend }\n", name, body);
}

static int open_escapes(void) {
  kit_fresh();
#define WRITE_ESCAPE(n, b) write_escape(#n, b);
  ESCAPES(WRITE_ESCAPE)
  kit_write("ok.lua", "return st.endpoint{ name = 'ok', build = function() return 'fine' end }\n");
  return kit_vm_open(&V);
}

/* The escape must fail (ENDPOINT, or CAPABILITY for CUDA) naming its file
 * and line, and the vm must serve the next call. */
static void check_escape(const char *name) {
  CHECK(V.vm != NULL);
  st__build_result_t res;
  char err[1024];
  int rc = kit_build(&V, name, NULL, NULL, &res, err, sizeof err);
  if (rc == ST_OK) {
    fprintf(stderr, "   ESCAPED: %s\n", name);
    st__build_result_destroy(&res);
  }
  CHECK(rc != ST_OK);
  if (strcmp(name, "cuda_device") == 0) CHECK_ERR(rc, ST_ERR_CAPABILITY);
  else CHECK_ERR(rc, ST_ERR_ENDPOINT);
  /* the body's line, or the declaration's when a tail call
   * (`return require('io')`) left no frame to ask */
  char body[160], decl[160];
  snprintf(body, sizeof body, "%s.lua:2:", name);
  snprintf(decl, sizeof decl, "%s.lua:1:", name);
  if (!strstr(err, body)) CHECK_CONTAINS(err, decl);
  CHECK_ERR_MSG(kit_build(&V, "ok", NULL, NULL, &res, err, sizeof err), ST_OK, err);
  st__build_result_destroy(&res);
}

#define DEFINE_ESCAPE(n, b) TEST(escape_##n) { check_escape(#n); }
ESCAPES(DEFINE_ESCAPE)

TEST(messages_say_what_is_wrong) {
  kit_fresh();
  kit_write("m.lua",
            "return {\n"
            "  st.endpoint{ name = 'g', build = function() x = 1 end },\n"
            "  st.endpoint{ name = 'r', build = function() return y end },\n"
            "  st.endpoint{ name = 'q', build = function() return require('os') end },\n"
            "  st.endpoint{ name = 'b', build = function() return load('\\27LJ') end },\n"
            "  st.endpoint{ name = 's', build = function() st.zeros = 1 end },\n"
            "  st.endpoint{ name = 'c', build = function() return st.zeros{1, device = 'cuda:4095'} end },\n"
            "  st.endpoint{ name = 'n', build = function() local m = require('st.nothing_here') return m end },\n"
            "}\n");
  kit_vm_t k;
  CHECK_ERR(kit_vm_open(&k), ST_OK);
  st__build_result_t res;
  char err[1024];
  kit_build(&k, "g", NULL, NULL, &res, err, sizeof err);
  CHECK_CONTAINS(err, "m.lua:2: assignment to undeclared global 'x'");
  kit_build(&k, "r", NULL, NULL, &res, err, sizeof err);
  CHECK_CONTAINS(err, "m.lua:3: undeclared global 'y'");
  kit_build(&k, "q", NULL, NULL, &res, err, sizeof err);
  CHECK_CONTAINS(err, "m.lua:4: require: module 'os' is not available in endpoints");
  /* (a tail call: the declaration's line, which is the same line here) */
  kit_build(&k, "b", NULL, NULL, &res, err, sizeof err);
  CHECK_CONTAINS(err, "m.lua:5: load: binary chunks are not allowed");
  kit_build(&k, "s", NULL, NULL, &res, err, sizeof err);
  CHECK_CONTAINS(err, "m.lua:6: attempt to modify read-only table (field 'zeros')");
  CHECK_ERR_MSG(kit_build(&k, "c", NULL, NULL, &res, err, sizeof err), ST_ERR_CAPABILITY, err);
  CHECK_CONTAINS(err, "m.lua:7: no CUDA device: cuda:4095 is unavailable");
  CHECK_ERR_MSG(kit_build(&k, "n", NULL, NULL, &res, err, sizeof err), ST_ERR_ENDPOINT, err);
  CHECK_CONTAINS(err, "m.lua:8: require: module 'st.nothing_here' is not available in "
                      "endpoints (only 'st' and 'st.zerobranch')");
  kit_vm_close(&k);
}

TEST(allowed_things_work) {
  kit_fresh();
  kit_write("ok.lua",
            "local M = {}\n"
            "local mt = { __index = function(t, k) return k .. '!' end }\n"
            "return st.endpoint{ name = 'ok', build = function()\n"
            "  local r = {}\n"
            "  r.upper = ('abc'):upper()\n"
            "  r.fmt = string.format('%%d-%%s', 3, 'x')\n"
            "  r.floor = math.floor(2.7)\n"
            "  r.band = bit.band(12, 10)\n"
            "  r.time = os.time() > 0 and type(os.clock()) == 'number' and type(os.date()) == 'string'\n"
            "  local t = {} table.insert(t, 5) r.len = #t + rawlen(t)\n"
            "  local ok, e = pcall(error, 'inner')\n"
            "  r.pcall = (not ok) and e == 'inner'\n"
            "  r.xpcall = select(2, xpcall(function(a) return a * 2 end, print, 21))\n"
            "  local f = load('return 40 + 2') r.load = f()\n"
            "  local g, msg = load('syntax error here') r.loaderr = g == nil and type(msg) == 'string'\n"
            "  local envd = load('return x', 'chunk', 't', { x = 7 }) r.env = envd()\n"
            "  local leak = load('y = 1') r.strict = not pcall(leak)\n"
            "  r.meta = setmetatable({}, mt).hey\n"
            "  rawset(M, 'k', 1) r.rawget = rawget(M, 'k')\n"
            "  r.tostr = tostring(st.required) .. ' ' .. tostring(st.zeros{2, 3})\n"
            "  r.unpack = select('#', unpack({1, 2, 3}))\n"
            "  r.num = tonumber('0x10') + next({5}) + (ipairs({}) and 0 or 1)\n"
            "  r.version = type(st.version)\n"
            "  return r\n"
            "end }\n");
  st__build_result_t res;
  char err[1024];
  CHECK_ERR_MSG(kit_build_once("ok", &res, err, sizeof err), ST_OK, err);
  msgpack_unpacked up;
  const msgpack_object *v = kit_value(&res, &up);
  CHECK(v && v->type == MSGPACK_OBJECT_MAP);
  CHECK(st__str_eq(st__map_get(v, "upper"), "ABC"));
  CHECK(st__str_eq(st__map_get(v, "fmt"), "3-x"));
  CHECK_EQ_INT(kit_int(st__map_get(v, "floor")), 2);
  CHECK_EQ_INT(kit_int(st__map_get(v, "band")), 8);
  CHECK(st__map_get(v, "time")->via.boolean);
  CHECK_EQ_INT(kit_int(st__map_get(v, "len")), 2);
  CHECK(st__map_get(v, "pcall")->via.boolean);
  CHECK_EQ_INT(kit_int(st__map_get(v, "xpcall")), 42);
  CHECK_EQ_INT(kit_int(st__map_get(v, "load")), 42);
  CHECK(st__map_get(v, "loaderr")->via.boolean);
  CHECK_EQ_INT(kit_int(st__map_get(v, "env")), 7);
  CHECK(st__map_get(v, "strict")->via.boolean);
  CHECK(st__str_eq(st__map_get(v, "meta"), "hey!"));
  CHECK_EQ_INT(kit_int(st__map_get(v, "rawget")), 1);
  CHECK(st__str_eq(st__map_get(v, "tostr"), "st.required tensor(float32, {2,3}, cpu)"));
  CHECK_EQ_INT(kit_int(st__map_get(v, "unpack")), 3);
  CHECK_EQ_INT(kit_int(st__map_get(v, "num")), 17);
  CHECK(st__str_eq(st__map_get(v, "version"), "string"));
  msgpack_unpacked_destroy(&up);
  st__build_result_destroy(&res);
}

TEST(endpoints_cannot_touch_each_other) {
  kit_fresh();
  kit_write("a.lua",
            "local shared = { n = 0 }\n"
            "return st.endpoint{ name = 'a', build = function()\n"
            "  pcall(function() string.rep = nil end)\n"
            "  shared.n = shared.n + 1\n"
            "  return shared.n\n"
            "end }\n");
  kit_write("b.lua",
            "return st.endpoint{ name = 'b', build = function() return string.rep('x', 3) end }\n");
  kit_vm_t k;
  CHECK_ERR(kit_vm_open(&k), ST_OK);
  st__build_result_t res;
  char err[1024];
  msgpack_unpacked up;
  for (int i = 1; i <= 3; i++) {
    CHECK_ERR_MSG(kit_build(&k, "a", NULL, NULL, &res, err, sizeof err), ST_OK, err);
    CHECK_EQ_INT(kit_int(kit_value(&res, &up)), i);   /* file-level locals persist */
    msgpack_unpacked_destroy(&up);
    st__build_result_destroy(&res);
  }
  CHECK_ERR_MSG(kit_build(&k, "b", NULL, NULL, &res, err, sizeof err), ST_OK, err);
  CHECK(st__str_eq(kit_value(&res, &up), "xxx"));
  msgpack_unpacked_destroy(&up);
  st__build_result_destroy(&res);
  kit_vm_close(&k);
}

TEST(validation_runs_no_build_body) {
  kit_fresh();
  kit_write("v.lua",
            "return st.endpoint{ name = 'v', build = function() while true do end end }\n");
  st__generation_t *g;
  char *errs;
  CHECK_ERR(kit_load(&g, &errs), ST_OK);   /* returns at once: the body never ran */
  st__generation_unref(g);
}

int main(void) {
  if (open_escapes() != ST_OK) fprintf(stderr, "escape files did not load\n");
#define RUN_ESCAPE(n, b) RUN(escape_##n);
  ESCAPES(RUN_ESCAPE)
  kit_vm_close(&V);
  RUN(messages_say_what_is_wrong);
  RUN(allowed_things_work);
  RUN(endpoints_cannot_touch_each_other);
  RUN(validation_runs_no_build_body);
  kit_rmdir();
  return stt_summary();
}
