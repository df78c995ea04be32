/* src/lua/guard.c through worker states: the Lua memory cap holds for a
 * file's top level and for bodies however they catch errors, the state
 * serves on, and limits.default_timeout_s stops a body that declares no
 * timeout. Small caps (8 MiB): nothing here needs much memory. */
#include "lua_kit.h"

/* The memory tests' timeout is long, so that a busy machine cannot turn
 * an OUT_OF_MEMORY into a TIMEOUT. */
static const st__vm_limits_t LIMITS = {.lua_memory_bytes = 8 << 20, .default_timeout_s = 60};
static const st__vm_limits_t QUICK = {.lua_memory_bytes = 8 << 20, .default_timeout_s = 0.2};

TEST(top_level_over_the_cap_fails_the_state) {
  kit_fresh();
  kit_write("big.lua", "local s = string.rep('x', 16 * 2^20)\n"
                       "return st.endpoint{ name = 'big', build = function() return #s end }\n");
  kit_vm_t k;
  char err[1024];
  CHECK_ERR_MSG(kit_vm_open_limited(&k, &LIMITS, err, sizeof err), ST_ERR_OUT_OF_MEMORY, err);
  CHECK_CONTAINS_ALL(err, "big.lua", "out of memory: the Lua state reached its limit of 8388608 "
                     "bytes (8 MiB)", "limits.lua_memory_bytes");
  kit_vm_close(&k);
  /* Without a cap the same file loads. */
  CHECK_ERR(kit_vm_open(&k), ST_OK);
  kit_vm_close(&k);
}

TEST(bodies_cannot_escape_the_cap) {
  kit_fresh();
  kit_write("m.lua",
            "local function bomb() local t = {} while true do t[#t + 1] = {} end end\n"
            "return {\n"
            "  st.endpoint{ name = 'plain', build = bomb },\n"
            "  st.endpoint{ name = 'caught', build = function()\n"
            "    for _ = 1, 5 do pcall(bomb) end return 'caught' end },\n"
            "  st.endpoint{ name = 'handler', build = function()\n"
            "    return xpcall(bomb, function(e) return string.rep('h', 4 * 2^20) .. e end) end },\n"
            "  st.endpoint{ name = 'small', build = function() return #string.rep('s', 2^20) end },\n"
            "}\n");
  kit_vm_t k;
  char err[1024];
  CHECK_ERR_MSG(kit_vm_open_limited(&k, &LIMITS, err, sizeof err), ST_OK, err);
  st__build_result_t res;
  const char *names[] = {"plain", "caught", "handler"};
  for (int i = 0; i < 3; i++) {
    CHECK_ERR(kit_build(&k, names[i], NULL, NULL, &res, err, sizeof err), ST_ERR_OUT_OF_MEMORY);
    CHECK_CONTAINS_ALL(err, "m.lua:", "limit of 8388608 bytes", names[i]);
    st__build_result_destroy(&res);
    /* the state serves on, with room for a 1 MiB string */
    CHECK_ERR_MSG(kit_build(&k, "small", NULL, NULL, &res, err, sizeof err), ST_OK, err);
    st__build_result_destroy(&res);
  }
  kit_vm_close(&k);
}

TEST(default_timeout_stops_a_body_without_one) {
  kit_fresh();
  kit_write("spin.lua",
            "return {\n"
            "  st.endpoint{ name = 'spin', build = function() while true do end end },\n"
            "  st.endpoint{ name = 'longer', timeout = 30, build = function()\n"
            "    st.sleep(0.3) return 1 end },\n"
            "}\n");
  kit_vm_t k;
  char err[1024];
  CHECK_ERR_MSG(kit_vm_open_limited(&k, &QUICK, err, sizeof err), ST_OK, err);
  st__build_result_t res;
  CHECK_ERR(kit_build(&k, "spin", NULL, NULL, &res, err, sizeof err), ST_ERR_TIMEOUT);
  CHECK_CONTAINS(err, "spin.lua:2: timed out after 0.2 s (endpoint 'spin' declares no timeout: "
                      "limits.default_timeout_s = 0.2 s applies)");
  st__build_result_destroy(&res);
  /* A declared timeout, longer than the default, is the one that counts. */
  CHECK_ERR_MSG(kit_build(&k, "longer", NULL, NULL, &res, err, sizeof err), ST_OK, err);
  st__build_result_destroy(&res);
  kit_vm_close(&k);
}

int main(void) {
  RUN(top_level_over_the_cap_fails_the_state);
  RUN(bodies_cannot_escape_the_cap);
  RUN(default_timeout_stops_a_body_without_one);
  kit_rmdir();
  return stt_summary();
}
