/* src/lua: tensors, constructors, RNG determinism, views, modules and the
 * serialization of results, checked on the bytes of the arenas. */
#include <math.h>

#include "common/philox.h"
#include "lua_kit.h"
#include "mem/arena.h"

/* One endpoint per test: `t` with the given body, built with no args. */
static int run_body(const char *body, st__build_result_t *res, char *err, size_t errlen) {
  return kit_run_body(body, res, err, errlen);
}

/* Parses the result value as one tensor. */
static int one_tensor(const st__build_result_t *res, st__tensor_desc_t *d) {
  msgpack_unpacked up;
  const msgpack_object *v = kit_value(res, &up);
  char err[256];
  int rc = v ? st__parse_tensor(v, d, err, sizeof err) : -1;
  if (rc) fprintf(stderr, "   not a tensor: %s\n", err);
  msgpack_unpacked_destroy(&up);
  return rc;
}

/* Endpoint bodies that must fail, and a part of each one's message. */
typedef struct {
  const char *body, *msg;
} body_error_t;

/* Runs each body: it fails with `want` and a message that holds the
 * case's part and `where` (NULL: not checked). A check: fails the test. */
static void check_body_errors(const body_error_t *cases, size_t n, int want, const char *where) {
  for (size_t i = 0; i < n; i++) {
    st__build_result_t res;
    char err[1024];
    CHECK_EQ_INT(run_body(cases[i].body, &res, err, sizeof err), want);
    CHECK_CONTAINS(err, cases[i].msg);
    if (where) CHECK_CONTAINS(err, where);
  }
}

TEST(every_dtype) {
  static const char *const names[] = {"bool", "uint8", "int8", "int16", "int32", "int64",
                                      "float16", "bfloat16", "float32", "float64",
                                      "float8_e4m3fn", "float8_e5m2", "uint16", "uint32",
                                      "uint64"};
  for (int i = 0; i < 15; i++) {
    char body[512];
    snprintf(body, sizeof body,
             "local t = st.zeros{2, 3, dtype = '%s'}\n"
             "assert(t:get(1, 2) == 0 or t:get(1, 2) == false)\n"
             "t:set(0, 1, 1)\n"
             "t:set(1, 2, 3)\n"
             "assert(t:dtype() == '%s' and t:numel() == 6 and t:dim() == 2)\n"
             "return t", names[i], names[i]);
    st__build_result_t res;
    char err[1024];
    CHECK_EQ_INT(run_body(body, &res, err, sizeof err), ST_OK);
    st__tensor_desc_t d;
    CHECK_EQ_INT(one_tensor(&res, &d), ST_OK);
    CHECK_STR_EQ(st_dtype_name(d.dtype), names[i]);
    CHECK_EQ_INT(d.ndim, 2);
    CHECK_EQ_INT(d.shape[0], 2);
    CHECK_EQ_INT(d.shape[1], 3);
    CHECK_EQ_INT(d.strides[0], 3);
    CHECK_EQ_INT(d.strides[1], 1);
    CHECK_EQ_INT(d.offset, 0);
    CHECK_EQ_INT(res.narenas, 1);
    CHECK_EQ_INT(res.bytes, 6 * st_dtype_size(d.dtype));
    CHECK(kit_elem(&res, &d, 0) == 0);
    CHECK(kit_elem(&res, &d, 1) == 1);
    CHECK(kit_elem(&res, &d, 5) == (d.dtype == ST_DTYPE_BOOL ? 1 : 3));
    st__build_result_destroy(&res);
  }
}

/* Unsigned element types in endpoint bodies: stores wrap to the width,
 * loads are never negative, conversions go through st_dtype_store. */
TEST(unsigned_types_wrap_and_convert) {
  st__build_result_t res;
  char err[1024];
  CHECK_ERR_MSG(run_body("local a = st.zeros{2, dtype = 'uint16'}:fill(-1)\n"
                         "assert(a:get(0) == 65535, a:get(0))\n"
                         "assert(st.zeros{1, dtype = 'uint32'}:fill(2^32 + 5):item() == 5)\n"
                         "local b = st.zeros{1, dtype = 'uint64'}:fill(2^63)\n"
                         "assert(b:item() == 2^63, b:item())\n"
                         "assert(b:to('float64'):item() == 2^63)\n"
                         "assert(a:to('int16'):get(1) == -1)\n"
                         "return a",
                         &res, err, sizeof err),
                ST_OK, err);
  st__build_result_destroy(&res);
}

TEST(constructors) {
  st__build_result_t res;
  char err[1024];
  CHECK_EQ_INT(run_body("return { st.ones{4}, st.full{shape = {2, 2}, value = 1.5, dtype = 'float64'},\n"
                        "  st.arange{5}, st.arange{start = 1, stop = 2, step = 0.25}, st.arange{10, 0, -3},\n"
                        "  st.empty{}, st.zeros{0, 3} }",
                        &res, err, sizeof err), ST_OK);
  msgpack_unpacked up;
  const msgpack_object *v = kit_value(&res, &up);
  CHECK(v && v->type == MSGPACK_OBJECT_ARRAY && v->via.array.size == 7);
  CHECK_EQ_INT(res.narenas, 7);
  st__tensor_desc_t d;
  CHECK_EQ_INT(st__parse_tensor(&v->via.array.ptr[0], &d, err, sizeof err), ST_OK);
  CHECK_EQ_INT(d.dtype, ST_DTYPE_FLOAT32);
  for (int i = 0; i < 4; i++) CHECK(kit_elem(&res, &d, i) == 1.0);
  CHECK_EQ_INT(st__parse_tensor(&v->via.array.ptr[1], &d, err, sizeof err), ST_OK);
  CHECK_EQ_INT(d.dtype, ST_DTYPE_FLOAT64);
  for (int i = 0; i < 4; i++) CHECK(kit_elem(&res, &d, i) == 1.5);
  CHECK_EQ_INT(st__parse_tensor(&v->via.array.ptr[2], &d, err, sizeof err), ST_OK);
  CHECK_EQ_INT(d.dtype, ST_DTYPE_INT64);
  CHECK_EQ_INT(d.shape[0], 5);
  for (int i = 0; i < 5; i++) CHECK(kit_elem(&res, &d, i) == i);
  CHECK_EQ_INT(st__parse_tensor(&v->via.array.ptr[3], &d, err, sizeof err), ST_OK);
  CHECK_EQ_INT(d.dtype, ST_DTYPE_FLOAT32);
  CHECK_EQ_INT(d.shape[0], 4);
  CHECK(kit_elem(&res, &d, 3) == 1.75);
  CHECK_EQ_INT(st__parse_tensor(&v->via.array.ptr[4], &d, err, sizeof err), ST_OK);
  CHECK_EQ_INT(d.shape[0], 4);      /* 10, 7, 4, 1 */
  CHECK(kit_elem(&res, &d, 3) == 1);
  CHECK_EQ_INT(st__parse_tensor(&v->via.array.ptr[5], &d, err, sizeof err), ST_OK);
  CHECK_EQ_INT(d.ndim, 0);
  CHECK_EQ_INT(st__parse_tensor(&v->via.array.ptr[6], &d, err, sizeof err), ST_OK);
  CHECK_EQ_INT(d.shape[0], 0);
  msgpack_unpacked_destroy(&up);
  st__build_result_destroy(&res);
}

TEST(constructor_errors) {
  static const body_error_t cases[] = {
    {"local t = st.zeros{2, dtyp = 'float32'} return t", "t.lua:2: zeros: unknown option 'dtyp'"},
    {"return st.zeros{2, dtyp = 'float32'}", "t.lua:1: zeros: unknown option 'dtyp'"},  /* tail call */
    {"return st.zeros{2, dtype = 'float33'}", "zeros: unknown dtype 'float33'"},
    {"return st.zeros{2.5}", "zeros: size must be an integer"},
    {"return st.zeros{-1}", "zeros: size -1 is negative"},
    {"return st.zeros{2, device = 'tpu'}", "zeros: unknown device 'tpu'"},
    {"return st.zeros(2)", "zeros: expected one table"},
    {"return st.full{2}", "full: value is required"},
    {"return st.rand{2, dtype = 'int32'}", "rand: dtype must be a floating type, got int32"},
    {"return st.randn{2, seed = -1}", "randn: seed must be >= 0"},
    {"return st.arange{1, 2, 0}", "arange: start, stop and step must be finite and step nonzero"},
    {"return st.zeros{1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1}", "zeros: at most 16 dimensions"},
    {"return st.zeros{shape = {2}, 3}", "give the sizes or shape = {...}, not both"},
  };
  check_body_errors(cases, sizeof cases / sizeof cases[0], ST_ERR_ENDPOINT, "t.lua:");
}

TEST(rand_is_deterministic) {
  st__build_result_t r1, r2, r3;
  char err[1024];
  const char *b7 = "return { st.rand{3, 5, seed = 7}, st.randn{3, 5, seed = 7, dtype = 'float64'},\n"
                   "  st.rand{4, seed = 7, dtype = 'float64'}, st.randn{4}, st.rand{2, dtype = 'bfloat16', seed = 7} }";
  CHECK_EQ_INT(run_body(b7, &r1, err, sizeof err), ST_OK);
  CHECK_EQ_INT(run_body(b7, &r2, err, sizeof err), ST_OK);
  CHECK_EQ_INT(run_body("return { st.rand{3, 5, seed = 8} }", &r3, err, sizeof err), ST_OK);
  CHECK_EQ_INT(r1.narenas, 5);
  for (size_t i = 0; i < 5; i++) {
    uint64_t n = st__arena_bytes(r1.arenas[i]);
    CHECK(n == st__arena_bytes(r2.arenas[i]));
    CHECK(memcmp(st__arena_base(r1.arenas[i]), st__arena_base(r2.arenas[i]), n) == 0);
  }
  CHECK(memcmp(st__arena_base(r1.arenas[0]), st__arena_base(r3.arenas[0]), 60) != 0);

  msgpack_unpacked up;
  const msgpack_object *v = kit_value(&r1, &up);
  st__tensor_desc_t d;
  CHECK_EQ_INT(st__parse_tensor(&v->via.array.ptr[0], &d, err, sizeof err), ST_OK);
  double sum = 0;
  for (int i = 0; i < 15; i++) {
    double u = kit_elem(&r1, &d, i);
    CHECK(u == (double)(float)st__rng_uniform(7, (uint64_t)i, 0));
    CHECK(u >= 0 && u < 1);
    sum += u;
  }
  CHECK(sum > 2 && sum < 13);
  CHECK_EQ_INT(st__parse_tensor(&v->via.array.ptr[1], &d, err, sizeof err), ST_OK);
  for (int i = 0; i < 15; i++) CHECK(kit_elem(&r1, &d, i) == st__rng_normal(7, (uint64_t)i));
  CHECK_EQ_INT(st__parse_tensor(&v->via.array.ptr[2], &d, err, sizeof err), ST_OK);
  for (int i = 0; i < 4; i++) CHECK(kit_elem(&r1, &d, i) == st__rng_uniform(7, (uint64_t)i, 1));
  CHECK_EQ_INT(st__parse_tensor(&v->via.array.ptr[3], &d, err, sizeof err), ST_OK);
  for (int i = 0; i < 4; i++)   /* default seed 0, float32 */
    CHECK(kit_elem(&r1, &d, i) == (double)(float)st__rng_normal(0, (uint64_t)i));
  CHECK_EQ_INT(st__parse_tensor(&v->via.array.ptr[4], &d, err, sizeof err), ST_OK);
  for (int i = 0; i < 2; i++)
    CHECK(kit_elem(&r1, &d, i) ==
          st_bfloat16_to_float(st_float_to_bfloat16((float)st__rng_uniform(7, (uint64_t)i, 0))));
  msgpack_unpacked_destroy(&up);
  st__build_result_destroy(&r1);
  st__build_result_destroy(&r2);
  st__build_result_destroy(&r3);
}

TEST(views_share_storage) {
  st__build_result_t res;
  char err[1024];
  CHECK_EQ_INT(run_body(
      "local t = st.arange{24, dtype = 'float32'}\n"
      "local m = t:view{2, 3, 4}\n"
      "assert(m:is_contiguous() and m:get(1, 2, 3) == 23 and m:get(-1, -1, -1) == 23)\n"
      "local n = m:narrow(1, 1, 2)\n"               /* shape {2,2,4}, offset 4 elements */
      "assert(not n:is_contiguous())\n"
      "local s = t:slice(0, 1, 10, 3)\n"            /* 1, 4, 7 */
      "assert(#s == 3 and s:get(2) == 7 and s:stride(0) == 3)\n"
      "local r = n:reshape{-1}\n"                  /* a copy: not contiguous */
      "assert(r:numel() == 16 and r:get(0) == 4 and r:get(4) == 8)\n"
      "local ok, e = pcall(n.view, n, {16})\n"
      "assert(not ok and e:find('not contiguous'))\n"
      "t:set(5, 100)\n"                            /* visible through the views */
      "assert(m:get(0, 1, 1) == 100 and n:get(0, 0, 1) == 100 and r:get(1) == 5)\n"
      "local c = n:contiguous() assert(c:is_contiguous() and c:get(0, 0, 1) == 100)\n"
      "local l = m:narrow(0, 1, 1):tolist()\n"
      "assert(#l == 1 and #l[1] == 3 and l[1][3][4] == 23)\n"
      "local h = t:to('float16') assert(h:dtype() == 'float16' and h:get(5) == 100)\n"
      "local z = st.zeros{2, 4} z:narrow(1, 0, 2):copy_(st.ones{2, 2, dtype = 'int8'})\n"
      "assert(z:get(1, 1) == 1 and z:get(1, 2) == 0)\n"
      "local f = st.zeros{3, 3}:slice(1, 0, 3, 2):fill(7)\n"
      "assert(f:shape()[2] == 2)\n"
      "local cl = t:clone() cl:set(0, -1) assert(t:get(0) == 0)\n"
      "assert(tostring(n) == 'tensor(float32, {2,2,4}, cpu)' and t:nbytes() == 96)\n"
      "return { n = n, s = s, t = t }",
      &res, err, sizeof err), ST_OK);
  CHECK_EQ_INT(res.narenas, 1);                    /* three views, one arena */
  msgpack_unpacked up;
  const msgpack_object *v = kit_value(&res, &up);
  st__tensor_desc_t d;
  CHECK_EQ_INT(st__parse_tensor(st__map_get(v, "n"), &d, err, sizeof err), ST_OK);
  CHECK_EQ_INT(d.arena, 0);
  CHECK_EQ_INT(d.offset, 4 * 4);
  CHECK_EQ_INT(d.shape[1], 2);
  CHECK_EQ_INT(d.strides[0], 12);
  CHECK_EQ_INT(d.strides[1], 4);
  CHECK_EQ_INT(d.strides[2], 1);
  CHECK(kit_elem(&res, &d, 1) == 100);             /* element (0,0,1) */
  CHECK_EQ_INT(st__parse_tensor(st__map_get(v, "s"), &d, err, sizeof err), ST_OK);
  CHECK_EQ_INT(d.offset, 4);
  CHECK_EQ_INT(d.strides[0], 3);
  CHECK(kit_elem(&res, &d, 3) == 4);               /* s[1] = t[4] */
  msgpack_unpacked_destroy(&up);
  st__build_result_destroy(&res);
}

/* transpose and permute are views: strides move, the arena is shared. */
TEST(transpose_and_permute) {
  st__build_result_t res;
  char err[1024];
  CHECK_EQ_INT(run_body(
      "local t = st.arange{24, dtype = 'int32'}:view{2, 3, 4}\n"
      "local p = t:permute(2, 0, 1)\n"
      "assert(p:shape(0) == 4 and p:shape(1) == 2 and p:shape(2) == 3)\n"
      "assert(p:get(1, 0, 2) == 9 and not p:is_contiguous())\n"
      "local q = t:permute{-1, 0, 1} assert(q:get(3, 1, 2) == p:get(3, 1, 2))\n"
      "local tt = t:transpose(0, -1) assert(tt:shape(0) == 4 and tt:get(3, 2, 1) == 23)\n"
      "local c = p:contiguous() assert(c:is_contiguous() and c:get(1, 0, 2) == 9)\n"
      "t:set(0, 2, 1, -5) assert(p:get(1, 0, 2) == -5)\n"
      "return p",
      &res, err, sizeof err), ST_OK);
  st__tensor_desc_t d;
  CHECK_EQ_INT(one_tensor(&res, &d), ST_OK);
  CHECK_EQ_INT(res.narenas, 1);
  CHECK_EQ_INT(d.offset, 0);
  CHECK(d.shape[0] == 4 && d.shape[1] == 2 && d.shape[2] == 3);
  CHECK(d.strides[0] == 1 && d.strides[1] == 12 && d.strides[2] == 4);
  st__build_result_destroy(&res);
}

TEST(view_errors) {
  static const body_error_t cases[] = {
    {"return st.zeros{6}:narrow(0, 5, 2)", "narrow: start 5 + length 2 exceeds size 6 of dim 0"},
    {"return st.zeros{6}:narrow(1, 0, 1)", "narrow: dim 1 is out of range for a tensor of 1 dims"},
    {"return st.zeros{6}:view{4, -1}", "view: cannot infer size -1 for 6 elements"},
    {"return st.zeros{6}:reshape{-1, -1}", "reshape: only one size may be -1"},
    {"return st.zeros{6}:reshape{7}", "does not fit a tensor of 6 elements"},
    {"return st.zeros{2, 3}:get(2, 0)", "get: index 2 is out of range for dim 0 of size 2"},
    {"return st.zeros{2, 3}:get(0)", "get: expected 2 indices, got 1"},
    {"return st.zeros{2}:set(0, 'x')", "set: value must be a number or a boolean"},
    {"return st.zeros{2}:slice(0, 0, 2, 0)", "slice: step must be positive"},
    {"return st.zeros{2}:copy_(st.zeros{3})", "copy_: source and destination shapes differ"},
    {"return st.zeros{2}:to('nope')", "to: unknown dtype 'nope'"},
    {"return st.zeros{2}.fill(3)", "fill: expected a tensor, got number"},
    {"return #st.empty{}", "len() of a 0-d tensor"},
    {"return st.zeros{2}:item()", "item: the tensor has 2 elements, not 1"},
    {"return st.zeros{0}:view{2^32, 2^32, 0}", "view: shape is too large"},
    {"return st.zeros{2, 3}:permute(0, 0)", "permute: dim 0 is repeated"},
    {"return st.zeros{2, 3}:permute{1}", "permute: expected 2 dims, got 1"},
    {"return st.zeros{2, 3}:transpose(0, 2)", "transpose: dim 2 is out of range for a tensor of 2 dims"},
  };
  check_body_errors(cases, sizeof cases / sizeof cases[0], ST_ERR_ENDPOINT, "t.lua:");
}

TEST(module_packs_one_aligned_arena) {
  st__build_result_t res;
  char err[1024];
  CHECK_EQ_INT(run_body(
      "local w = st.arange{12, dtype = 'float32'}:view{3, 4}\n"
      "local b = st.full{3, value = 2, dtype = 'float64'}\n"
      "local m = st.module({ weight = w:narrow(1, 1, 2), bias = b, ['layers.0.x'] = st.ones{1, dtype = 'int8'} },\n"
      "                    { arch = 'linear', n = 2 })\n"
      "w:set(0, 1, 99)\n"                                      /* the module holds a copy */
      "assert(m.weight:get(0, 0) == 1 and m['layers.0.x']:get(0) == 1 and #m == 3)\n"
      "assert(m:names()[1] == 'bias' and m:metadata().arch == 'linear')\n"
      "assert(m:tensor('bias'):dtype() == 'float64' and m.nothing == nil)\n"
      "local o = st.module{ {'z', st.zeros{1}}, {'a', st.ones{2}} }\n"
      "assert(o:names()[1] == 'z' and tostring(o):find('module%(2 tensors'))\n"
      "return { m = m, o = o, again = m.weight }",
      &res, err, sizeof err), ST_OK);
  CHECK_EQ_INT(res.narenas, 2);
  msgpack_unpacked up;
  const msgpack_object *v = kit_value(&res, &up);
  CHECK(v != NULL);
  msgpack_unpacked pl;
  msgpack_unpacked_init(&pl);
  const msgpack_object *tensors, *meta;
  CHECK_EQ_INT(st__parse_module(st__map_get(v, "m"), &pl, &tensors, &meta, err, sizeof err), ST_OK);
  CHECK_EQ_INT(tensors->via.array.size, 3);
  const char *names[] = {"bias", "layers.0.x", "weight"};
  for (uint32_t i = 0; i < 3; i++) {
    const msgpack_object *pair = &tensors->via.array.ptr[i];
    CHECK(st__str_eq(&pair->via.array.ptr[0], names[i]));
    st__tensor_desc_t d;
    CHECK_EQ_INT(st__parse_tensor(&pair->via.array.ptr[1], &d, err, sizeof err), ST_OK);
    CHECK_EQ_INT(d.arena, 0);
    CHECK_EQ_INT(d.offset % ST_ARENA_ALIGN, 0);
    CHECK_EQ_INT(d.offset, i * 256);
    if (i == 0) CHECK(kit_elem(&res, &d, 2) == 2.0);
    if (i == 2) {
      CHECK_EQ_INT(d.shape[0], 3);
      CHECK_EQ_INT(d.shape[1], 2);
      CHECK_EQ_INT(d.strides[0], 2);               /* a contiguous copy */
      double want[] = {1, 2, 5, 6, 9, 10};
      for (int j = 0; j < 6; j++) CHECK(kit_elem(&res, &d, j) == want[j]);
    }
  }
  CHECK(st__str_eq(st__map_get(meta, "arch"), "linear"));
  CHECK_EQ_INT(kit_int(st__map_get(meta, "n")), 2);
  CHECK_EQ_INT(st__arena_bytes(res.arenas[0]), 512 + 6 * 4);
  st__tensor_desc_t again;
  CHECK_EQ_INT(st__parse_tensor(st__map_get(v, "again"), &again, err, sizeof err), ST_OK);
  CHECK_EQ_INT(again.arena, 0);                    /* same arena, same entry */
  msgpack_unpacked_destroy(&pl);
  CHECK_EQ_INT(st__parse_module(st__map_get(v, "o"), &pl, &tensors, &meta, err, sizeof err), ST_OK);
  CHECK(st__str_eq(&tensors->via.array.ptr[0].via.array.ptr[0], "z"));
  CHECK_EQ_INT(meta->via.map.size, 0);
  msgpack_unpacked_destroy(&pl);
  msgpack_unpacked_destroy(&up);
  st__build_result_destroy(&res);
}

TEST(module_errors) {
  static const body_error_t cases[] = {
    {"return st.module{ w = 1 }", "module: 'w' is not a tensor"},
    {"return st.module({ {'a', st.zeros{1}}, {'a', st.zeros{1}} })", "module: duplicate name 'a'"},
    {"return st.module({ {'', st.zeros{1}} })", "needs a non-empty name"},
    {"return st.module({ w = st.zeros{1} }, { [1] = 2 })", "metadata keys must be strings"},
    {"return st.module(3)", "module: expected a table of tensors"},
  };
  check_body_errors(cases, sizeof cases / sizeof cases[0], ST_ERR_ENDPOINT, NULL);
}

TEST(result_values) {
  st__build_result_t res;
  char err[1024];
  CHECK_EQ_INT(run_body(
      "local a = st.zeros{2}\n"
      "local b = st.ones{3}\n"
      "return { list = { 1, -2, 3.5, 'x', true }, nested = { deep = { b, a } }, first = b,\n"
      "  big = 2^53, neg = -2^40, empty = {}, arr = st.array({}), none = nil }",
      &res, err, sizeof err), ST_OK);
  CHECK_EQ_INT(res.narenas, 2);
  msgpack_unpacked up;
  const msgpack_object *v = kit_value(&res, &up);
  CHECK(v && v->type == MSGPACK_OBJECT_MAP);
  CHECK_EQ_INT(v->via.map.size, 7);
  /* keys are sorted */
  CHECK(st__str_eq(&v->via.map.ptr[0].key, "arr"));
  CHECK(st__str_eq(&v->via.map.ptr[6].key, "nested"));
  const msgpack_object *l = st__map_get(v, "list");
  CHECK(l->type == MSGPACK_OBJECT_ARRAY && l->via.array.size == 5);
  CHECK_EQ_INT(kit_int(&l->via.array.ptr[0]), 1);
  CHECK_EQ_INT(kit_int(&l->via.array.ptr[1]), -2);
  CHECK(l->via.array.ptr[2].type == MSGPACK_OBJECT_FLOAT64 && l->via.array.ptr[2].via.f64 == 3.5);
  CHECK(st__str_eq(&l->via.array.ptr[3], "x"));
  CHECK(l->via.array.ptr[4].type == MSGPACK_OBJECT_BOOLEAN);
  CHECK_EQ_INT(kit_int(st__map_get(v, "big")), 9007199254740992LL);
  CHECK_EQ_INT(kit_int(st__map_get(v, "neg")), -1099511627776LL);
  CHECK(st__map_get(v, "empty")->type == MSGPACK_OBJECT_MAP);
  CHECK(st__map_get(v, "arr")->type == MSGPACK_OBJECT_ARRAY);
  /* arenas in first-use order: "first" (b) is packed after "arr", "big",
   * "empty" but before "nested" and "list" holds no tensor */
  st__tensor_desc_t d;
  CHECK_EQ_INT(st__parse_tensor(st__map_get(v, "first"), &d, err, sizeof err), ST_OK);
  CHECK_EQ_INT(d.arena, 0);
  CHECK_EQ_INT(d.shape[0], 3);
  const msgpack_object *deep = st__map_get(st__map_get(v, "nested"), "deep");
  CHECK_EQ_INT(st__parse_tensor(&deep->via.array.ptr[0], &d, err, sizeof err), ST_OK);
  CHECK_EQ_INT(d.arena, 0);
  CHECK_EQ_INT(st__parse_tensor(&deep->via.array.ptr[1], &d, err, sizeof err), ST_OK);
  CHECK_EQ_INT(d.arena, 1);
  CHECK_EQ_INT(d.shape[0], 2);
  msgpack_unpacked_destroy(&up);
  st__build_result_destroy(&res);
}

TEST(serialization_errors) {
  static const body_error_t cases[] = {
    {"return { f = function() end }", "value.f: cannot serialize a function"},
    {"local t = {} t.self = t return t", "value.self: the value contains a cycle"},
    {"local t = {} local c = t for i = 1, 40 do c.x = {} c = c.x end return t", "nesting deeper than 32"},
    {"return { [5] = 1, x = 2 }", "map keys must be strings"},
    {"return { 1, nil, 3 }", "map keys must be strings"},
    {"return { r = st.required }", "value.r: cannot serialize st.required"},
    {"return { list = { 1, { fn = print } } }", "value.list[2].fn: cannot serialize a function"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    st__build_result_t res;
    char err[1024];
    CHECK_EQ_INT(run_body(cases[i].body, &res, err, sizeof err), ST_ERR_SERIALIZATION);
    CHECK_CONTAINS(err, cases[i].msg);
    CHECK_CONTAINS(err, "t.lua:1: endpoint 't' returned a value that cannot be sent");
    CHECK_EQ_INT(res.narenas, 0);
  }
  /* a DAG (the same table twice, no cycle) is fine */
  st__build_result_t res;
  char err[1024];
  CHECK_EQ_INT(run_body("local s = { 1 } return { a = s, b = s }", &res, err, sizeof err), ST_OK);
  st__build_result_destroy(&res);
  /* 32 levels are allowed */
  CHECK_EQ_INT(run_body("local t = {} local c = t for i = 1, 31 do c.x = {} c = c.x end return t",
                        &res, err, sizeof err), ST_OK);
  st__build_result_destroy(&res);
}

TEST(arena_failures_map_to_error_codes) {
  st__build_result_t res;
  char err[1024];
  st__arena_set_limit(1000);
  CHECK_EQ_INT(run_body("return st.zeros{1000}", &res, err, sizeof err), ST_ERR_LIMIT);
  CHECK_CONTAINS(err, "object of 4000 bytes exceeds max_object_bytes (1000)");
  CHECK_CONTAINS(err, "t.lua:");
  /* caught and replaced by another error: that error is what counts */
  CHECK_EQ_INT(run_body("pcall(st.zeros, {1000}) error('other')", &res, err, sizeof err),
               ST_ERR_ENDPOINT);
  st__arena_set_limit(0);
}

TEST(memory_follows_the_result) {
  uint64_t n0, b0;
  st__arena_stats(&n0, &b0);
  st__build_result_t res;
  char err[1024];
  CHECK_EQ_INT(run_body("local junk = {} for i = 1, 20 do junk[i] = st.zeros{100} end\n"
                        "return st.ones{10}", &res, err, sizeof err), ST_OK);
  uint64_t n1;
  st__arena_stats(&n1, NULL);
  CHECK_EQ_INT(n1, n0 + 1);            /* the vm is closed: only the result's arena */
  st__build_result_destroy(&res);
  st__arena_stats(&n1, NULL);
  CHECK_EQ_INT(n1, n0);

  /* and within a living vm, after each build */
  kit_fresh();
  kit_write("g.lua", "return st.endpoint{ name = 'g', build = function()\n"
                     "  local junk = {} for i = 1, 20 do junk[i] = st.zeros{100} end\n"
                     "  return st.ones{10} end }\n");
  kit_vm_t k;
  CHECK_EQ_INT(kit_vm_open(&k), ST_OK);
  for (int i = 0; i < 3; i++) {
    CHECK_EQ_INT(kit_build(&k, "g", NULL, NULL, &res, err, sizeof err), ST_OK);
    st__build_result_destroy(&res);
    st__arena_stats(&n1, NULL);
    CHECK_EQ_INT(n1, n0);
  }
  kit_vm_close(&k);
}

int main(void) {
  RUN(every_dtype);
  RUN(unsigned_types_wrap_and_convert);
  RUN(constructors);
  RUN(constructor_errors);
  RUN(rand_is_deterministic);
  RUN(views_share_storage);
  RUN(transpose_and_permute);
  RUN(view_errors);
  RUN(module_packs_one_aligned_arena);
  RUN(module_errors);
  RUN(result_values);
  RUN(serialization_errors);
  RUN(arena_failures_map_to_error_codes);
  RUN(memory_follows_the_result);
  kit_rmdir();
  return stt_summary();
}
