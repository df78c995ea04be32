/* src/lua: st.load_safetensors through st__vm_build. A body that returns a
 * loaded checkpoint serializes as one module over ONE arena, names and
 * __metadata__ preserved; conversion, views, and the errors a body gets
 * (outside data_dirs, bad files, bad options, CUDA without a device, use
 * outside a build body). */
#include <sys/stat.h>

#include "lua_kit.h"
#include "mem/arena.h"
#include "mem/cuda.h"
#include "mem/safetensors.h"

static char data_dir[256];
static char file_path[512];

/* One endpoint `t` with the given body, where each "%s" stands for the
 * checkpoint's path. */
static int run_body(const char *body, st__build_result_t *res, char *err, size_t errlen) {
  char text[4096];
  size_t n = 0;
  for (const char *p = body; *p && n + 600 < sizeof text; p++) {
    if (p[0] == '%' && p[1] == 's') {
      n += (size_t)snprintf(text + n, sizeof text - n, "%s", file_path);
      p++;
    } else {
      text[n++] = *p;
    }
  }
  text[n] = '\0';
  return kit_run_body(text, res, err, errlen);
}

/* A checkpoint: w (F32 2x3: 0..5), ids (I64 3: 10 20 30), h (BF16 4: 1.5 each),
 * metadata {format = "pt", arch = "tiny"}. */
static void write_checkpoint(const char *path) {
  unsigned char data[24 + 24 + 8];
  for (int i = 0; i < 6; i++) st_dtype_store(ST_DTYPE_FLOAT32, data, (size_t)i, i);
  for (int i = 0; i < 3; i++) st_dtype_store(ST_DTYPE_INT64, data + 24, (size_t)i, 10.0 * (i + 1));
  for (int i = 0; i < 4; i++) st_dtype_store(ST_DTYPE_BFLOAT16, data + 48, (size_t)i, 1.5);
  const char *h =
      "{\"__metadata__\":{\"format\":\"pt\",\"arch\":\"tiny\"},"
      "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
      "\"ids\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[24,48]},"
      "\"h\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[48,56]}}    ";
  FILE *f = fopen(path, "wb");
  if (!f) exit(2);
  uint64_t hl = strlen(h);
  unsigned char lb[8];
  for (int i = 0; i < 8; i++) lb[i] = (unsigned char)(hl >> (8 * i));
  fwrite(lb, 1, 8, f);
  fwrite(h, 1, hl, f);
  fwrite(data, 1, sizeof data, f);
  fclose(f);
}

/* Checks the module `o` (ext) of res: names, dtypes, values, one arena. */
static int check_module(const st__build_result_t *res, const msgpack_object *o, int f16) {
  char err[256];
  msgpack_unpacked pl;
  msgpack_unpacked_init(&pl);
  const msgpack_object *tensors = NULL, *meta = NULL;
  int ok = st__parse_module(o, &pl, &tensors, &meta, err, sizeof err) == ST_OK &&
           tensors->via.array.size == 3;
  static const char *names[] = {"w", "ids", "h"};
  st_dtype_t want_dt[] = {f16 ? ST_DTYPE_FLOAT16 : ST_DTYPE_FLOAT32, ST_DTYPE_INT64,
                          f16 ? ST_DTYPE_FLOAT16 : ST_DTYPE_BFLOAT16};
  for (uint32_t i = 0; ok && i < 3; i++) {
    const msgpack_object *pair = &tensors->via.array.ptr[i];
    st__tensor_desc_t d;
    memset(&d, 0, sizeof d);
    ok = st__str_eq(&pair->via.array.ptr[0], names[i]) &&
         st__parse_tensor(&pair->via.array.ptr[1], &d, err, sizeof err) == ST_OK &&
         d.arena == 0 && d.offset == i * ST_ARENA_ALIGN && d.dtype == want_dt[i];
    for (int j = 0; ok && j < (i == 0 ? 6 : i == 1 ? 3 : 4); j++)
      ok = kit_elem(res, &d, j) == (i == 0 ? j : i == 1 ? 10.0 * (j + 1) : 1.5);
    if (ok && i == 0) ok = d.ndim == 2 && d.shape[0] == 2 && d.shape[1] == 3 && d.strides[0] == 3;
  }
  ok = ok && st__str_eq(st__map_get(meta, "format"), "pt") &&
       st__str_eq(st__map_get(meta, "arch"), "tiny") && meta->via.map.size == 2;
  msgpack_unpacked_destroy(&pl);
  if (!ok) fprintf(stderr, "   module does not match (%s)\n", err);
  return ok;
}

TEST(a_loaded_checkpoint_is_one_module_arena) {
  st__build_result_t res;
  char err[1024];
  CHECK_ERR_MSG(run_body(
       "local m = st.load_safetensors('%s')\n"
       "assert(#m == 3 and m:names()[1] == 'w' and m:names()[3] == 'h')\n"
       "assert(m:metadata().arch == 'tiny' and m.w:dtype() == 'float32')\n"
       "assert(m.ids:shape()[1] == 3 and m:tensor('h'):dtype() == 'bfloat16')\n"
       "assert(tostring(m):find('module%(3 tensors'))\n"
       "return { m = m, again = m.w }",
       &res, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(res.narenas, 1);
  CHECK_EQ_INT(st__arena_bytes(res.arenas[0]), 2 * 256 + 8);
  msgpack_unpacked up;
  const msgpack_object *v = kit_value(&res, &up);
  CHECK(v != NULL);
  CHECK(check_module(&res, st__map_get(v, "m"), 0));
  st__tensor_desc_t again;
  memset(&again, 0, sizeof again);
  CHECK_ERR_MSG(st__parse_tensor(st__map_get(v, "again"), &again, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(again.arena, 0);
  msgpack_unpacked_destroy(&up);
  st__build_result_destroy(&res);
}

TEST(conversion_and_a_relative_path) {
  st__build_result_t res;
  char err[1024];
  CHECK_ERR_MSG(run_body("local _ = '%s'\n"
                         "return st.load_safetensors('model.safetensors', { dtype = 'half', "
                         "device = 'cpu' })",
                         &res, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(res.narenas, 1);
  msgpack_unpacked up;
  const msgpack_object *v = kit_value(&res, &up);
  CHECK(v != NULL);
  CHECK(check_module(&res, v, 1));
  msgpack_unpacked_destroy(&up);
  st__build_result_destroy(&res);
}

TEST(errors_raise_with_clear_messages) {
  char bad[600];
  snprintf(bad, sizeof bad, "%s/bad.safetensors", data_dir);
  const char *h = "{\"x\":{\"dtype\":\"F4\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  FILE *f = fopen(bad, "wb");
  uint64_t hl = strlen(h);
  unsigned char lb[8];
  for (int i = 0; i < 8; i++) lb[i] = (unsigned char)(hl >> (8 * i));
  fwrite(lb, 1, 8, f);
  fwrite(h, 1, hl, f);
  fwrite("\0", 1, 1, f);
  fclose(f);
  static const struct { const char *body; int rc; const char *msg, *msg2; } cases[] = {
    {"return st.load_safetensors('/etc/hostname')", ST_ERR_ENDPOINT,
     "load_safetensors: path '/etc/hostname' is outside the allowed data_dirs (", "t.lua:"},
    {"return st.load_safetensors('bad.safetensors')", ST_ERR_ENDPOINT,
     "bad.safetensors: tensor 'x': dtype 'F4' is not supported", "t.lua:"},
    {"return st.load_safetensors('nothing.safetensors')", ST_ERR_ENDPOINT,
     "load_safetensors: nothing.safetensors: not found in any data dir", NULL},
    {"return st.load_safetensors('%s', { dtyp = 'half' })", ST_ERR_ENDPOINT,
     "load_safetensors: unknown option 'dtyp'", NULL},
    {"return st.load_safetensors('%s', { dtype = 'int32' })", ST_ERR_ENDPOINT,
     "load_safetensors: dtype must be a floating dtype", "got 'int32'"},
    {"return st.load_safetensors('%s', { device = 'tpu' })", ST_ERR_ENDPOINT,
     "load_safetensors: unknown device 'tpu'", NULL},
    {"return st.load_safetensors(42)", ST_ERR_ENDPOINT, "path must be a string", NULL},
    {"return st.load_safetensors('%s', 'half')", ST_ERR_ENDPOINT, "options must be a table", NULL},
  };
  uint64_t count0 = 0, bytes0 = 0;
  st__arena_stats(&count0, &bytes0);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    st__build_result_t res;
    char err[1024];
    CHECK_EQ_INT(run_body(cases[i].body, &res, err, sizeof err), cases[i].rc);
    CHECK_CONTAINS(err, cases[i].msg);
    if (cases[i].msg2) CHECK_CONTAINS(err, cases[i].msg2);
  }
  uint64_t count1 = 0, bytes1 = 0;
  st__arena_stats(&count1, &bytes1);
  CHECK_EQ_INT(count1, count0);
  /* CUDA: without a usable device the call fails with CAPABILITY. */
  char why[256];
  if (st__cuda_available(why, sizeof why) != ST_OK) {
    st__build_result_t res;
    char err[1024];
    CHECK_ERR_MSG(run_body("return st.load_safetensors('%s', { device = 'cuda:0' })", &res, err,
                           sizeof err),
                  ST_ERR_CAPABILITY, err);
    CHECK_CONTAINS(err, "no CUDA device");
  }
}

/* On a GPU host: the same checkpoint into a CUDA arena through the
 * worker's stream, byte for byte what the CPU load gives. */
TEST(cuda_load_matches_the_cpu_load) {
  char why[256];
  if (st__cuda_available(why, sizeof why) != ST_OK) {
    fprintf(stderr, "   skipped: %s\n", why);
    return;
  }
  st__build_result_t cpu, gpu;
  char err[1024];
  CHECK_ERR_MSG(run_body("return st.load_safetensors('%s', { dtype = 'float16' })", &cpu, err,
                         sizeof err), ST_OK, err);
  CHECK_ERR_MSG(run_body("return st.load_safetensors('%s', { dtype = 'float16', device = 'cuda:0' })",
                         &gpu, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(gpu.narenas, 1);
  CHECK_EQ_INT(st__arena_device(gpu.arenas[0]), 0);
  st__arena_desc_t d;
  st__arena_describe(gpu.arenas[0], &d);
  CHECK_EQ_INT(d.cuda, 1);
  uint64_t n = st__arena_bytes(cpu.arenas[0]);
  CHECK_EQ_INT(st__arena_bytes(gpu.arenas[0]), n);
  char host[1024];
  CHECK(n <= sizeof host);
  CHECK_ERR_MSG(st__cuda_copy_to_host(host, (uint64_t)(uintptr_t)st__arena_base(gpu.arenas[0]), n,
                                      0, err, sizeof err), ST_OK, err);
  CHECK(memcmp(host, st__arena_base(cpu.arenas[0]), n) == 0);
  CHECK(cpu.value.size == gpu.value.size);        /* same names, dtypes, shapes, offsets */
  st__build_result_destroy(&cpu);
  st__build_result_destroy(&gpu);
}

TEST(not_at_a_files_top_level) {
  kit_fresh();
  kit_write("t.lua", "local m = st.load_safetensors('%s')\n"
                     "return st.endpoint{ name = 't', build = function(a) return 1 end }\n",
            file_path);
  st__generation_t *g = NULL;
  char *errs = NULL;
  CHECK(kit_load(&g, &errs) != ST_OK);
  CHECK_CONTAINS(errs, "load_safetensors: only inside a build function");
  free(errs);
}

int main(void) {
  snprintf(data_dir, sizeof data_dir, "/tmp/st-lua-sft-XXXXXX");
  if (!mkdtemp(data_dir)) return 2;
  snprintf(file_path, sizeof file_path, "%s/model.safetensors", data_dir);
  write_checkpoint(file_path);
  const char *dirs[] = {data_dir};
  st__safetensors_set_data_dirs(dirs, 1);
  RUN(a_loaded_checkpoint_is_one_module_arena);
  RUN(conversion_and_a_relative_path);
  RUN(errors_raise_with_clear_messages);
  RUN(cuda_load_matches_the_cpu_load);
  RUN(not_at_a_files_top_level);
  kit_rmdir();
  char p[600];
  snprintf(p, sizeof p, "%s/bad.safetensors", data_dir);
  unlink(p);
  unlink(file_path);
  rmdir(data_dir);
  return stt_summary();
}
