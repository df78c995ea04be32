/* CUDA tensors in a worker's Lua state, in process (src/lua/device.c,
 * tensor_ops.c): the call's default device, element access and tolist on
 * the device, the stream synchronized before st__vm_build returns, arenas
 * the GC releases while kernels are queued, and the errors: devices mixed
 * in a module, "cuda" without a socket device, CUDA at a file's top level
 * (checked on every host). Skipped (77) without a CUDA device. */
#include "lua_kit.h"

#include "common/philox.h"
#include "mem/arena.h"
#include "mem/cuda.h"

/* No device needed: a file's top level runs outside any call. */
TEST(top_level_cuda_is_refused) {
  kit_fresh();
  kit_write("top.lua", "local w = st.zeros{2, device = 'cuda:0'}\n"
                       "return st.endpoint{ name = 't', build = function() return 1 end }\n");
  st__generation_t *g = NULL;
  char *errs = NULL;
  CHECK(kit_load(&g, &errs) != ST_OK);
  CHECK_CONTAINS(errs, "top.lua:1: zeros: CUDA tensors can only be built inside a build body");
  free(errs);
  if (g) st__generation_unref(g);
}

#ifdef ST_HAVE_CUDA

static kit_vm_t V;

static int open_vm(void) {
  kit_fresh();
  kit_write("a.lua",
            "return {\n"
            "  st.endpoint{ name = 'where', build = function()\n"
            "    local m = st.arange{6, dtype = 'float32'}:view{2, 3}\n"
            "    m:narrow(1, 1, 1):fill(-1)\n"
            "    m:set(1, 2, 0.5)\n"
            "    assert(m:get(1, 2) == 0.5 and m:get(0, 1) == -1 and m:get(1, 0) == 3)\n"
            "    local l = m:tolist()\n"
            "    assert(l[1][1] == 0 and l[1][2] == -1 and l[2][3] == 0.5)\n"
            "    assert(st.full{1, value = 7, dtype = 'int8'}:item() == 7)\n"
            "    assert(st.full{2, value = true, dtype = 'bool'}:get(1) == true)\n"
            "    return { d = st.zeros{1}:device(), c = st.zeros{1, device = 'cpu'}:device(),\n"
            "             n = st.ones{1, device = 'cuda'}:device(),\n"
            "             s = tostring(st.zeros{2}), m = tostring(st.module{ x = m }) }\n"
            "  end },\n"
            "  st.endpoint{ name = 'big', params = { n = 1 },\n"
            "    build = function(a) return st.randn{a.n, seed = 3} end },\n"
            "  st.endpoint{ name = 'churn', build = function()\n"
            "    for i = 1, 40 do local t = st.randn{8 * 1024 * 1024, seed = i} end\n"
            "    return st.arange{4} end },\n"
            "  st.endpoint{ name = 'mixed', build = function()\n"
            "    return st.module({ { 'a', st.zeros{2} }, { 'b', st.zeros{2, device = 'cpu'} } }) end },\n"
            "  st.endpoint{ name = 'bare', build = function() return st.zeros{1, device = 'cuda'} end },\n"
            "}\n");
  return kit_vm_open(&V);
}

static const char *str_of(const msgpack_object *map, const char *key) {
  static char buf[4][128];
  static int k;
  char *b = buf[k++ & 3];
  b[0] = '\0';
  for (uint32_t i = 0; map && i < map->via.map.size; i++) {
    const msgpack_object *kk = &map->via.map.ptr[i].key, *v = &map->via.map.ptr[i].val;
    if (kk->via.str.size == strlen(key) && memcmp(kk->via.str.ptr, key, kk->via.str.size) == 0 &&
        v->type == MSGPACK_OBJECT_STR)
      snprintf(b, 128, "%.*s", (int)v->via.str.size, v->via.str.ptr);
  }
  return b;
}

TEST(default_device_and_element_access) {
  st__vm_set_device(V.vm, 0, 0);
  st__build_result_t res;
  char err[1024];
  CHECK_EQ_INT(kit_build(&V, "where", NULL, NULL, &res, err, sizeof err), ST_OK);
  msgpack_unpacked up;
  const msgpack_object *v = kit_value(&res, &up);
  CHECK(v && v->type == MSGPACK_OBJECT_MAP);
  CHECK_STR_EQ(str_of(v, "d"), "cuda:0");
  CHECK_STR_EQ(str_of(v, "c"), "cpu");
  CHECK_STR_EQ(str_of(v, "n"), "cuda:0");
  CHECK_STR_EQ(str_of(v, "s"), "tensor(float32, {2}, cuda:0)");
  CHECK_CONTAINS(str_of(v, "m"), ", cuda:0)");
  msgpack_unpacked_destroy(&up);
  st__build_result_destroy(&res);
}

/* In process, the result's arena base is the server's device address: the
 * tail of a 64 MiB randn is final when st__vm_build returns. */
TEST(stream_is_synchronized_before_return) {
  st__vm_set_device(V.vm, 0, 0);
  const int64_t n = 1 << 24;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 1);
  msgpack_pack_str(&pk, 1);
  msgpack_pack_str_body(&pk, "n", 1);
  msgpack_pack_int64(&pk, n);
  st__build_result_t res;
  char err[1024];
  CHECK_EQ_INT(kit_build(&V, "big", &sb, NULL, &res, err, sizeof err), ST_OK);
  msgpack_sbuffer_destroy(&sb);
  CHECK_EQ_INT(res.narenas, 1);
  CHECK_EQ_INT(st__arena_device(res.arenas[0]), 0);
  float tail[32];
  uint64_t base = (uint64_t)(uintptr_t)st__arena_base(res.arenas[0]);
  CHECK_EQ_INT(st__cuda_copy_to_host(tail, base + (uint64_t)(n - 32) * 4, sizeof tail, 0, err,
                                     sizeof err),
               ST_OK);
  for (int k = 0; k < 32; k++) {
    float want;
    st_dtype_store(ST_DTYPE_FLOAT32, &want, 0, st__rng_normal(3, (uint64_t)(n - 32 + k)));
    int32_t a, b;
    memcpy(&a, &tail[k], 4);
    memcpy(&b, &want, 4);
    CHECK(llabs((int64_t)a - b) <= 2);
  }
  st__build_result_destroy(&res);
}

/* 40 arenas of 32 MiB made and dropped in one body: the GC releases them
 * (after waiting for the stream) and nothing is left afterwards. */
TEST(dropped_tensors_are_released) {
  st__vm_set_device(V.vm, 0, 0);
  uint64_t n0, b0, n1, b1;
  st__arena_stats(&n0, &b0);
  st__build_result_t res;
  char err[1024];
  CHECK_EQ_INT(kit_build(&V, "churn", NULL, NULL, &res, err, sizeof err), ST_OK);
  st__build_result_destroy(&res);
  st__arena_stats(&n1, &b1);
  CHECK_EQ_INT(n1, n0);
  CHECK_EQ_INT(b1, b0);
}

TEST(errors) {
  st__vm_set_device(V.vm, 0, 0);
  st__build_result_t res;
  char err[1024];
  CHECK_EQ_INT(kit_build(&V, "mixed", NULL, NULL, &res, err, sizeof err), ST_ERR_ENDPOINT);
  CHECK_CONTAINS(err, "module: tensors on different devices ('b' is on cpu, the ones before it "
                      "on cuda:0)");
  st__vm_set_device(V.vm, -1, -1);
  CHECK_EQ_INT(kit_build(&V, "bare", NULL, NULL, &res, err, sizeof err), ST_ERR_CAPABILITY);
  CHECK_CONTAINS(err, "names the CUDA device of the call's socket");
  /* The state still builds afterwards. */
  st__vm_set_device(V.vm, 0, 0);
  CHECK_EQ_INT(kit_build(&V, "where", NULL, NULL, &res, err, sizeof err), ST_OK);
  st__build_result_destroy(&res);
}

#endif

int main(void) {
  RUN(top_level_cuda_is_refused);
  char why[512];
  if (st__cuda_available(why, sizeof why) != ST_OK) {
    kit_rmdir();
    if (stt_failed) return stt_summary();
    stt_skip(why);
  }
#ifdef ST_HAVE_CUDA
  if (open_vm() != ST_OK) return 1;
  RUN(default_device_and_element_access);
  RUN(stream_is_synchronized_before_return);
  RUN(dropped_tensors_are_released);
  RUN(errors);
  kit_vm_close(&V);
  kit_rmdir();
#endif
  return stt_summary();
}
