/* The repository's endpoints/ (what the default config serves): they load,
 * and each builds with its defaults, the way the server binds them. */
#include "lua_kit.h"
#include "mpbuf.h"

static st__generation_t *gen;
static st__vm_t *vm;

/* Builds `name` with every default filled in, plus `extra` (a packed
 * key/value pair) when given. */
static int build_defaults(const char *name, const char *extra_key, int64_t extra_val,
                          st__build_result_t *res, char *err, size_t errlen) {
  const st__endpoint_decl_t *ep = st__generation_find(gen, name, strlen(name));
  if (!ep) return -1000;
  mpbuf_t mb;
  mpbuf_init(&mb);
  msgpack_pack_map(&mb.pk, ep->nparams);
  for (size_t i = 0; i < ep->nparams; i++) {
    const st__param_t *p = &ep->params[i];
    st__pack_cstr(&mb.pk, p->name);
    if (extra_key && strcmp(p->name, extra_key) == 0) msgpack_pack_int64(&mb.pk, extra_val);
    else msgpack_sbuffer_write(&mb.sb, p->default_mp, p->default_len);
  }
  int rc = st__vm_build(vm, ep, mb.sb.data, mb.sb.size, NULL, NULL, res, err, errlen);
  if (rc) fprintf(stderr, "   %s: %s\n", name, err);
  mpbuf_free(&mb);
  return rc;
}

TEST(they_load) {
  const char *src = getenv("ST_SOURCE_DIR");
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/endpoints", src ? src : ".");
  st__errlist_t l = {0};
  int rc = st__generation_load(dir, 1, NULL, &gen, &l);
  char *errs = st__errlist_join(&l);
  if (errs) fprintf(stderr, "%s\n", errs);
  free(errs);
  st__errlist_clear(&l);
  CHECK_ERR(rc, ST_OK);
  CHECK(gen->nendpoints >= 4);
  for (size_t i = 0; i < gen->nendpoints; i++) CHECK(gen->endpoints[i].doc != NULL);
  char err[1024];
  CHECK_ERR_MSG(st__vm_new(gen, 0, NULL, &vm, err, sizeof err), ST_OK, err);
}

TEST(make_tensor) {
  CHECK(vm != NULL);
  st__build_result_t res;
  char err[1024];
  CHECK_ERR_MSG(build_defaults("make_tensor", NULL, 0, &res, err, sizeof err), ST_OK, err);
  msgpack_unpacked up;
  st__tensor_desc_t d;
  CHECK_ERR_MSG(st__parse_tensor(kit_value(&res, &up), &d, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(d.ndim, 2);
  CHECK_EQ_INT(d.shape[0] * d.shape[1], 32);
  CHECK(kit_elem(&res, &d, 31) == 31);
  msgpack_unpacked_destroy(&up);
  st__build_result_destroy(&res);
}

TEST(load_linear) {
  CHECK(vm != NULL);
  st__build_result_t res;
  char err[1024];
  CHECK_ERR_MSG(build_defaults("load_linear", "output_dim", 2, &res, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(res.narenas, 1);
  msgpack_unpacked up, pl;
  msgpack_unpacked_init(&pl);
  const msgpack_object *tensors, *meta;
  CHECK_ERR_MSG(st__parse_module(kit_value(&res, &up), &pl, &tensors, &meta, err, sizeof err),
                ST_OK, err);
  CHECK_EQ_INT(tensors->via.array.size, 2);
  st__tensor_desc_t w;
  CHECK(st__str_eq(&tensors->via.array.ptr[1].via.array.ptr[0], "weight"));
  CHECK_ERR_MSG(st__parse_tensor(&tensors->via.array.ptr[1].via.array.ptr[1], &w, err, sizeof err),
                ST_OK, err);
  CHECK_EQ_INT(w.shape[0], 2);
  CHECK_EQ_INT(w.shape[1], 16);
  msgpack_unpacked_destroy(&pl);
  msgpack_unpacked_destroy(&up);
  st__build_result_destroy(&res);
}

TEST(echo_and_hello) {
  CHECK(vm != NULL);
  st__build_result_t res;
  char err[1024];
  CHECK_ERR_MSG(build_defaults("echo", "value", 42, &res, err, sizeof err), ST_OK, err);
  msgpack_unpacked up;
  CHECK_EQ_INT(kit_int(kit_value(&res, &up)), 42);
  msgpack_unpacked_destroy(&up);
  st__build_result_destroy(&res);
  CHECK_ERR_MSG(build_defaults("hello", NULL, 0, &res, err, sizeof err), ST_OK, err);
  const msgpack_object *v = kit_value(&res, &up);
  CHECK(st__str_eq(st__map_get(v, "message"), "hello, world"));
  st__tensor_desc_t d;
  CHECK_ERR_MSG(st__parse_tensor(st__map_get(v, "numbers"), &d, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(d.dtype, ST_DTYPE_INT64);
  CHECK(kit_elem(&res, &d, 9) == 9);
  msgpack_unpacked_destroy(&up);
  st__build_result_destroy(&res);
}

int main(void) {
  RUN(they_load);
  RUN(make_tensor);
  RUN(load_linear);
  RUN(echo_and_hello);
  st__vm_free(vm);
  st__generation_unref(gen);
  return stt_summary();
}
