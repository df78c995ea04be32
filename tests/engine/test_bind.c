/* Unit tests of argument binding (src/engine/bind.c): defaults, unknown
 * and missing names, type rules, and the exact output map. */
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/bind.h"
#include "proto/proto.h"
#include "st/errors.h"

/* Declaration built by hand: params sorted by name, as the loader makes
 * them. */
static st__param_t params[6];
static st__endpoint_decl_t ep;

static void set_default(st__param_t *p, void (*pack)(msgpack_packer *)) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  pack(&pk);
  p->default_len = sb.size;
  p->default_mp = msgpack_sbuffer_release(&sb);
}

static void pack_one(msgpack_packer *pk) { msgpack_pack_int(pk, 1); }
static void pack_half(msgpack_packer *pk) { msgpack_pack_double(pk, 2.5); }
static void pack_list(msgpack_packer *pk) {
  msgpack_pack_array(pk, 2);
  msgpack_pack_int(pk, 3);
  msgpack_pack_int(pk, 4);
}
static void pack_false(msgpack_packer *pk) { msgpack_pack_false(pk); }

static void setup(void) {
  memset(params, 0, sizeof params);
  /* a: integer = 1; b: string (required); c: number = 2.5; flag: boolean =
   * false; shape: table = {3, 4}; x: any (required) */
  params[0] = (st__param_t){.name = "a", .type = ST_PARAM_INTEGER};
  set_default(&params[0], pack_one);
  params[1] = (st__param_t){.name = "b", .type = ST_PARAM_STRING, .required = 1};
  params[2] = (st__param_t){.name = "c", .type = ST_PARAM_NUMBER};
  set_default(&params[2], pack_half);
  params[3] = (st__param_t){.name = "flag", .type = ST_PARAM_BOOL};
  set_default(&params[3], pack_false);
  params[4] = (st__param_t){.name = "shape", .type = ST_PARAM_TABLE};
  set_default(&params[4], pack_list);
  params[5] = (st__param_t){.name = "x", .type = ST_PARAM_ANY, .required = 1};
  memset(&ep, 0, sizeof ep);
  ep.name = "demo";
  ep.nparams = 6;
  ep.params = params;
}

/* Packs a map from (key, kind, value) triples: kind 'i' int, 'd' double,
 * 's' string, 'b' bool, 'n' nil, 'a' array of two ints, 'm' map {k=1}. */
typedef struct kv {
  const char *key;
  char kind;
  double num;
  const char *str;
} kv_t;

static void pack_args(msgpack_sbuffer *sb, const kv_t *kvs, int n) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, (size_t)n);
  for (int i = 0; i < n; i++) {
    st__pack_cstr(&pk, kvs[i].key);
    switch (kvs[i].kind) {
      case 'i': msgpack_pack_int64(&pk, (int64_t)kvs[i].num); break;
      case 'd': msgpack_pack_double(&pk, kvs[i].num); break;
      case 's': st__pack_cstr(&pk, kvs[i].str); break;
      case 'b': if (kvs[i].num) msgpack_pack_true(&pk); else msgpack_pack_false(&pk); break;
      case 'a': msgpack_pack_array(&pk, 2); msgpack_pack_int(&pk, 7); msgpack_pack_int(&pk, 8); break;
      case 'm': msgpack_pack_map(&pk, 1); st__pack_cstr(&pk, "k"); msgpack_pack_int(&pk, 1); break;
      default: msgpack_pack_nil(&pk); break;
    }
  }
}

/* Bytes of the last successful bind: unpacked objects point into them, so
 * they live until the next bind (msgpack unpacking does not copy). */
static char *last_bound;

/* Binds kvs; on success *out holds the unpacked bound map. */
static int bind_on(const st__endpoint_decl_t *e, const kv_t *kvs, int n, msgpack_unpacked *out,
                   char *err, size_t errlen) {
  msgpack_sbuffer in, bound;
  msgpack_sbuffer_init(&in);
  msgpack_sbuffer_init(&bound);
  pack_args(&in, kvs, n);
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  msgpack_unpack_next(&u, in.data, in.size, &off);
  err[0] = '\0';
  int rc = st__bind_args(e, &u.data, NULL, &bound, err, errlen);
  msgpack_unpacked_destroy(&u);
  msgpack_sbuffer_destroy(&in);
  msgpack_unpacked_init(out);
  if (rc == ST_OK) {
    off = 0;
    size_t size = bound.size;
    free(last_bound);
    last_bound = msgpack_sbuffer_release(&bound);
    if (msgpack_unpack_next(out, last_bound, size, &off) != MSGPACK_UNPACK_SUCCESS ||
        off != size)
      rc = -1000;
  } else if (bound.size != 0) {
    rc = -2000;   /* a failed bind must leave the buffer as it was */
  }
  msgpack_sbuffer_destroy(&bound);
  return rc;
}

static int bind_demo(const kv_t *kvs, int n, msgpack_unpacked *out, char *err, size_t errlen) {
  return bind_on(&ep, kvs, n, out, err, errlen);
}

static const msgpack_object *get(const msgpack_unpacked *u, const char *key) {
  return st__map_get(&u->data, key);
}

TEST(defaults_are_filled) {
  kv_t kvs[] = {{"b", 's', 0, "hi"}, {"x", 'n', 0, NULL}};
  msgpack_unpacked u;
  char err[256];
  CHECK_ERR_MSG(bind_demo(kvs, 2, &u, err, sizeof err), ST_OK, err);
  CHECK(u.data.type == MSGPACK_OBJECT_MAP);
  CHECK_EQ_INT(u.data.via.map.size, 6);
  /* In declaration order. */
  CHECK(st__str_eq(&u.data.via.map.ptr[0].key, "a"));
  CHECK(st__str_eq(&u.data.via.map.ptr[5].key, "x"));
  CHECK_EQ_INT(get(&u, "a")->via.i64, 1);
  CHECK(st__str_eq(get(&u, "b"), "hi"));
  CHECK(get(&u, "c")->type == MSGPACK_OBJECT_FLOAT64 && get(&u, "c")->via.f64 == 2.5);
  CHECK(get(&u, "flag")->type == MSGPACK_OBJECT_BOOLEAN && !get(&u, "flag")->via.boolean);
  CHECK(get(&u, "shape")->type == MSGPACK_OBJECT_ARRAY && get(&u, "shape")->via.array.size == 2);
  CHECK(get(&u, "x")->type == MSGPACK_OBJECT_NIL);
  msgpack_unpacked_destroy(&u);
}

TEST(given_values_win) {
  kv_t kvs[] = {{"a", 'i', -5, NULL}, {"b", 's', 0, "s"}, {"c", 'i', 3, NULL},
                {"flag", 'b', 1, NULL}, {"shape", 'm', 0, NULL}, {"x", 'a', 0, NULL}};
  msgpack_unpacked u;
  char err[256];
  CHECK_ERR_MSG(bind_demo(kvs, 6, &u, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(get(&u, "a")->via.i64, -5);
  /* An integer is accepted for a number parameter and kept as sent. */
  CHECK_EQ_INT(get(&u, "c")->via.u64, 3);
  CHECK(get(&u, "flag")->via.boolean);
  CHECK(get(&u, "shape")->type == MSGPACK_OBJECT_MAP);
  CHECK(get(&u, "x")->type == MSGPACK_OBJECT_ARRAY);
  msgpack_unpacked_destroy(&u);
}

TEST(unknown_argument) {
  kv_t kvs[] = {{"b", 's', 0, "s"}, {"x", 'i', 1, NULL}, {"bogus", 'i', 1, NULL}};
  msgpack_unpacked u;
  char err[256];
  CHECK_ERR_MSG(bind_demo(kvs, 3, &u, err, sizeof err), ST_ERR_INVALID_ARGUMENT, err);
  CHECK_STR_EQ(err, "unknown argument 'bogus' (endpoint demo takes: a, b, c, flag, shape, x)");
  msgpack_unpacked_destroy(&u);
}

TEST(missing_required) {
  kv_t kvs[] = {{"x", 'i', 1, NULL}};
  msgpack_unpacked u;
  char err[256];
  CHECK_ERR_MSG(bind_demo(kvs, 1, &u, err, sizeof err), ST_ERR_INVALID_ARGUMENT, err);
  CHECK_STR_EQ(err, "missing required argument 'b'");
  msgpack_unpacked_destroy(&u);
}

TEST(type_mismatch) {
  struct {
    kv_t kv;
    const char *msg;
  } cases[] = {
      {{"a", 's', 0, "1"}, "argument 'a' must be integer, got string"},
      {{"a", 'd', 1.5, NULL}, "argument 'a' must be integer, got number"},
      {{"c", 's', 0, "x"}, "argument 'c' must be number, got string"},
      {{"flag", 'i', 1, NULL}, "argument 'flag' must be boolean, got integer"},
      {{"shape", 's', 0, "x"}, "argument 'shape' must be table, got string"},
      {{"b", 'a', 0, NULL}, "argument 'b' must be string, got array"},
      {{"a", 'n', 0, NULL}, "argument 'a' must be integer, got nil"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    kv_t kvs[3] = {{"b", 's', 0, "s"}, {"x", 'i', 1, NULL}, cases[i].kv};
    msgpack_unpacked u;
    char err[256];
    CHECK_ERR_MSG(bind_demo(kvs, 3, &u, err, sizeof err), ST_ERR_INVALID_ARGUMENT, err);
    CHECK_STR_EQ(err, cases[i].msg);
    msgpack_unpacked_destroy(&u);
  }
}

TEST(nil_and_non_map_args) {
  char err[256];
  msgpack_sbuffer out;
  msgpack_sbuffer_init(&out);
  /* NULL args: required parameters are missing. */
  CHECK_ERR_MSG(st__bind_args(&ep, NULL, NULL, &out, err, sizeof err),
                ST_ERR_INVALID_ARGUMENT, err);
  CHECK_CONTAINS(err, "missing required argument 'b'");
  CHECK_EQ_INT(out.size, 0);
  msgpack_object arr = {.type = MSGPACK_OBJECT_ARRAY};
  CHECK_ERR_MSG(st__bind_args(&ep, &arr, NULL, &out, err, sizeof err),
                ST_ERR_INVALID_ARGUMENT, err);
  CHECK_CONTAINS(err, "args must be a map");
  msgpack_sbuffer_destroy(&out);

  /* An endpoint without parameters binds nil to an empty map and names
   * no parameters in its message. */
  st__endpoint_decl_t none = {.name = "none"};
  msgpack_sbuffer_init(&out);
  msgpack_object nil = {.type = MSGPACK_OBJECT_NIL};
  CHECK_ERR_MSG(st__bind_args(&none, &nil, NULL, &out, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(out.size, 1);
  CHECK_EQ_INT((unsigned char)out.data[0], 0x80);
  msgpack_sbuffer_destroy(&out);
  msgpack_unpacked u;
  kv_t kvs[] = {{"q", 'i', 1, NULL}};
  CHECK_ERR_MSG(bind_on(&none, kvs, 1, &u, err, sizeof err), ST_ERR_INVALID_ARGUMENT, err);
  CHECK_STR_EQ(err, "unknown argument 'q' (endpoint none takes no arguments)");
  msgpack_unpacked_destroy(&u);
}

TEST(nested_values_are_checked) {
  /* A map with a non-string key inside an argument is refused. */
  msgpack_sbuffer in, out;
  msgpack_sbuffer_init(&in);
  msgpack_sbuffer_init(&out);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &in, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 3);
  st__pack_cstr(&pk, "b");
  st__pack_cstr(&pk, "s");
  st__pack_cstr(&pk, "x");
  msgpack_pack_int(&pk, 0);
  st__pack_cstr(&pk, "shape");
  msgpack_pack_map(&pk, 1);
  msgpack_pack_int(&pk, 1);
  msgpack_pack_int(&pk, 2);
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  msgpack_unpack_next(&u, in.data, in.size, &off);
  char err[256];
  CHECK_ERR_MSG(st__bind_args(&ep, &u.data, NULL, &out, err, sizeof err),
                ST_ERR_INVALID_ARGUMENT, err);
  CHECK_EQ_INT(out.size, 0);
  msgpack_unpacked_destroy(&u);
  msgpack_sbuffer_destroy(&in);
  msgpack_sbuffer_destroy(&out);
}

TEST(many_parameters) {
  /* More parameters than the binder's stack table. */
  enum { N = 40 };
  static st__param_t many[N];
  static char names[N][8];
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "p%02d", i);
    many[i] = (st__param_t){.name = names[i], .type = ST_PARAM_INTEGER};
    set_default(&many[i], pack_one);
  }
  st__endpoint_decl_t big = {.name = "big", .nparams = N, .params = many};
  msgpack_sbuffer out;
  msgpack_sbuffer_init(&out);
  char err[256];
  CHECK_ERR_MSG(st__bind_args(&big, NULL, NULL, &out, err, sizeof err), ST_OK, err);
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  CHECK(msgpack_unpack_next(&u, out.data, out.size, &off) == MSGPACK_UNPACK_SUCCESS);
  CHECK_EQ_INT(u.data.via.map.size, N);
  CHECK(st__str_eq(&u.data.via.map.ptr[N - 1].key, "p39"));
  msgpack_unpacked_destroy(&u);
  msgpack_sbuffer_destroy(&out);
  for (int i = 0; i < N; i++) free(many[i].default_mp);
}

int main(void) {
  setup();
  RUN(defaults_are_filled);
  RUN(given_values_win);
  RUN(unknown_argument);
  RUN(missing_required);
  RUN(type_mismatch);
  RUN(nil_and_non_map_args);
  RUN(nested_values_are_checked);
  RUN(many_parameters);
  for (int i = 0; i < 6; i++) free(params[i].default_mp);
  free(last_bound);
  return stt_summary();
}
