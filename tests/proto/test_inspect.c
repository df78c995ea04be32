/* Looking into messages and checking client values (src/proto/inspect.c),
 * the error envelope and the map entries (src/proto/pack.c). */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "mpbuf.h"
#include "proto/proto.h"

static char why[256];


TEST(map_get_and_str_eq) {
  mpbuf_t b;
  mpbuf_init(&b);
  msgpack_pack_map(&b.pk, 3);
  st__pack_cstr(&b.pk, "a");
  msgpack_pack_int(&b.pk, 1);
  msgpack_pack_int(&b.pk, 7);          /* non-string key: skipped by lookups */
  msgpack_pack_int(&b.pk, 2);
  st__pack_cstr(&b.pk, "ab");
  st__pack_cstr(&b.pk, "x");
  const msgpack_object *o = mpbuf_obj(&b);
  const msgpack_object *v = st__map_get(o, "a");
  CHECK(v && v->via.u64 == 1);
  CHECK(st__str_eq(st__map_get(o, "ab"), "x"));
  CHECK(st__map_get(o, "") == NULL);
  CHECK(st__map_get(o, "abc") == NULL);
  CHECK(st__map_get(NULL, "a") == NULL);
  CHECK(st__map_get(&o->via.map.ptr[0].val, "a") == NULL);   /* not a map */
  CHECK(!st__str_eq(st__map_get(o, "ab"), "xy"));
  CHECK(!st__str_eq(st__map_get(o, "ab"), ""));
  CHECK(!st__str_eq(v, "1"));
  CHECK(!st__str_eq(NULL, "x"));
  mpbuf_free(&b);
}

/* A STR object of bytes p[0..n) (its ptr points into p). */
static msgpack_object str_of(const char *p, uint32_t n) {
  msgpack_object o;
  o.type = MSGPACK_OBJECT_STR;
  o.via.str.ptr = p;
  o.via.str.size = n;
  return o;
}

/* st__wire_cstr: the whole string or nothing, for every length around
 * the buffer's and a NUL at every place; st__wire_shown: every byte
 * visible. */
TEST(wire_cstr_and_shown) {
  char buf[8], big[16];
  msgpack_object o = str_of("float32", 7);
  CHECK_EQ_INT(st__wire_cstr(&o, buf, sizeof buf), 7);
  CHECK_STR_EQ(buf, "float32");
  o = str_of("float32x", 8);                 /* no room for it and its NUL */
  CHECK_EQ_INT(st__wire_cstr(&o, buf, sizeof buf), -1);
  CHECK_STR_EQ(buf, "");
  o = str_of(NULL, 0);
  CHECK_EQ_INT(st__wire_cstr(&o, buf, sizeof buf), 0);
  CHECK_STR_EQ(buf, "");
  const char text[] = "abcdefghijklmn";
  for (uint32_t n = 0; n < sizeof text; n++)
    for (uint32_t at = 0; at <= n; at++) {
      char with[16];
      memcpy(with, text, n);
      if (at < n) with[at] = '\0';
      o = str_of(with, n);
      long got = st__wire_cstr(&o, big, sizeof big);
      CHECK_EQ_INT(got, at < n || n >= sizeof big ? -1 : (long)n);
      if (got >= 0) CHECK(memcmp(big, with, n) == 0 && big[n] == '\0');
    }
  o.type = MSGPACK_OBJECT_BIN;
  CHECK_EQ_INT(st__wire_cstr(&o, big, sizeof big), -1);
  CHECK_EQ_INT(st__wire_cstr(NULL, big, sizeof big), -1);
  char shown[300];
  CHECK_STR_EQ(st__wire_shown("a\0b\\c\n\xff", 7, shown, sizeof shown), "a\\x00b\\x5cc\\x0a\\xff");
  char many[100];
  memset(many, 'x', sizeof many);
  CHECK_EQ_INT((long)strlen(st__wire_shown(many, sizeof many, shown, sizeof shown)), 64 + 3);
  CHECK_STR_EQ(shown + 64, "...");
  CHECK_STR_EQ(st__wire_shown("\0\0\0", 3, buf, sizeof buf), "\\x00...");
}

TEST(params_map_and_check) {
  static const char *const allowed[] = {"endpoint", "args", NULL};
  const msgpack_object *map = (void *)1;
  mpbuf_t b;

  mpbuf_init(&b);
  msgpack_pack_array(&b.pk, 0);
  CHECK_ERR_MSG(st__params_map(mpbuf_obj(&b), &map, why, sizeof why), ST_OK, why);
  CHECK(map == NULL);
  CHECK_ERR_MSG(st__params_check(map, allowed, why, sizeof why), ST_OK, why);
  mpbuf_free(&b);

  mpbuf_init(&b);
  msgpack_pack_array(&b.pk, 1);
  msgpack_pack_map(&b.pk, 2);
  st__pack_cstr(&b.pk, "endpoint");
  st__pack_cstr(&b.pk, "e");
  st__pack_cstr(&b.pk, "args");
  msgpack_pack_map(&b.pk, 0);
  CHECK_ERR_MSG(st__params_map(mpbuf_obj(&b), &map, why, sizeof why), ST_OK, why);
  CHECK(map && map->type == MSGPACK_OBJECT_MAP);
  CHECK_ERR_MSG(st__params_check(map, allowed, why, sizeof why), ST_OK, why);
  static const char *const fewer[] = {"endpoint", NULL};
  CHECK_ERR_MSG(st__params_check(map, fewer, why, sizeof why), ST_ERR_INVALID_ARGUMENT, why);
  CHECK_CONTAINS(why, "unknown parameter 'args'");
  mpbuf_free(&b);

  /* [1], [{}, {}], [[]], {} and a non-string parameter name. */
  const char *bad[] = {"\x91\x01", "\x92\x80\x80", "\x91\x90", "\x80", "\x91\x81\x01\x02"};
  const size_t len[] = {2, 3, 2, 1, 4};
  for (int i = 0; i < 5; i++) {
    mpbuf_init(&b);
    msgpack_sbuffer_write(&b.sb, bad[i], len[i]);
    CHECK_ERR_MSG(st__params_map(mpbuf_obj(&b), &map, why, sizeof why),
                  ST_ERR_INVALID_ARGUMENT, why);
    CHECK(map == NULL);
    mpbuf_free(&b);
  }
}

/* `depth` nested arrays (or maps) around an int, built by hand: msgpack's
 * own decoder stops at 32 levels, so deeper values cannot be unpacked. */
static int check_nest(int depth, int maps) {
  static msgpack_object node[ST_MAX_DEPTH + 2];
  static msgpack_object_kv kv[ST_MAX_DEPTH + 2];
  node[depth].type = MSGPACK_OBJECT_POSITIVE_INTEGER;
  node[depth].via.u64 = 1;
  for (int i = depth - 1; i >= 0; i--) {
    if (maps) {
      node[i].type = MSGPACK_OBJECT_MAP;
      node[i].via.map.size = 1;
      node[i].via.map.ptr = &kv[i];
      kv[i].key.type = MSGPACK_OBJECT_STR;
      kv[i].key.via.str.ptr = "k";
      kv[i].key.via.str.size = 1;
      kv[i].val = node[i + 1];
    } else {
      node[i].type = MSGPACK_OBJECT_ARRAY;
      node[i].via.array.size = 1;
      node[i].via.array.ptr = &node[i + 1];
    }
  }
  return st__check_value(&node[0], 0, why, sizeof why);
}

TEST(check_value_depth) {
  CHECK_ERR(check_nest(0, 0), ST_OK);
  CHECK_ERR(check_nest(ST_MAX_DEPTH, 0), ST_OK);
  CHECK_ERR(check_nest(ST_MAX_DEPTH + 1, 0), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(why, "deeper");
  CHECK_ERR(check_nest(ST_MAX_DEPTH, 1), ST_OK);
  CHECK_ERR(check_nest(ST_MAX_DEPTH + 1, 1), ST_ERR_INVALID_ARGUMENT);
  CHECK_ERR_MSG(st__check_value(NULL, 0, why, sizeof why), ST_ERR_INVALID_ARGUMENT, why);
}

TEST(check_value_types_and_keys) {
  mpbuf_t b;
  mpbuf_init(&b);
  /* Every plain type, nested. */
  msgpack_pack_map(&b.pk, 2);
  st__pack_cstr(&b.pk, "all");
  msgpack_pack_array(&b.pk, 9);
  msgpack_pack_nil(&b.pk);
  msgpack_pack_true(&b.pk);
  msgpack_pack_int(&b.pk, 5);
  msgpack_pack_int(&b.pk, -5);
  msgpack_pack_float(&b.pk, 1.5f);
  msgpack_pack_double(&b.pk, 2.5);
  st__pack_cstr(&b.pk, "s");
  msgpack_pack_bin(&b.pk, 1);
  msgpack_pack_bin_body(&b.pk, "b", 1);
  msgpack_pack_map(&b.pk, 0);
  st__pack_cstr(&b.pk, "inner");
  msgpack_pack_map(&b.pk, 1);
  st__pack_cstr(&b.pk, "x");
  msgpack_pack_array(&b.pk, 0);
  CHECK_ERR_MSG(st__check_value(mpbuf_obj(&b), 0, why, sizeof why), ST_OK, why);
  mpbuf_free(&b);

  /* A non-string key two levels down. */
  mpbuf_init(&b);
  msgpack_pack_map(&b.pk, 1);
  st__pack_cstr(&b.pk, "a");
  msgpack_pack_array(&b.pk, 1);
  msgpack_pack_map(&b.pk, 1);
  msgpack_pack_int(&b.pk, 3);
  msgpack_pack_nil(&b.pk);
  CHECK_ERR_MSG(st__check_value(mpbuf_obj(&b), 0, why, sizeof why), ST_ERR_INVALID_ARGUMENT, why);
  CHECK_CONTAINS(why, "keys");
  mpbuf_free(&b);
}

TEST(check_value_ext) {
  st__tensor_desc_t d;
  memset(&d, 0, sizeof d);
  d.dtype = ST_DTYPE_FLOAT32;
  d.ndim = 1;
  d.shape[0] = 4;
  d.strides[0] = 1;
  mpbuf_t b;

  mpbuf_init(&b);
  msgpack_pack_array(&b.pk, 1);
  st__pack_tensor(&b.pk, &d);
  CHECK_ERR_MSG(st__check_value(mpbuf_obj(&b), 0, why, sizeof why), ST_ERR_INVALID_ARGUMENT, why);
  CHECK_ERR_MSG(st__check_value(mpbuf_obj(&b), 1, why, sizeof why), ST_OK, why);
  mpbuf_free(&b);

  /* A module whose payload is well formed. */
  mpbuf_t mb;
  mpbuf_init(&mb);
  msgpack_pack_map(&mb.pk, 2);
  st__pack_cstr(&mb.pk, "tensors");
  msgpack_pack_array(&mb.pk, 1);
  msgpack_pack_array(&mb.pk, 2);
  st__pack_cstr(&mb.pk, "w");
  st__pack_tensor(&mb.pk, &d);
  st__pack_cstr(&mb.pk, "metadata");
  msgpack_pack_map(&mb.pk, 0);
  mpbuf_init(&b);
  st__pack_ext(&b.pk, ST_EXT_MODULE, &mb.sb);
  CHECK_ERR_MSG(st__check_value(mpbuf_obj(&b), 0, why, sizeof why), ST_ERR_INVALID_ARGUMENT, why);
  CHECK_ERR_MSG(st__check_value(mpbuf_obj(&b), 1, why, sizeof why), ST_OK, why);
  mpbuf_free(&b);

  /* Other ext types, and a tensor ext whose payload is bad. */
  mpbuf_init(&b);
  st__pack_ext(&b.pk, 5, &mb.sb);
  CHECK_ERR_MSG(st__check_value(mpbuf_obj(&b), 1, why, sizeof why), ST_ERR_INVALID_ARGUMENT, why);
  CHECK_CONTAINS(why, "ext type 5");
  mpbuf_free(&b);
  mpbuf_init(&b);
  st__pack_ext(&b.pk, -1, &mb.sb);   /* msgpack timestamp */
  CHECK_ERR_MSG(st__check_value(mpbuf_obj(&b), 1, why, sizeof why), ST_ERR_INVALID_ARGUMENT, why);
  mpbuf_free(&b);
  mpbuf_init(&b);
  st__pack_ext(&b.pk, ST_EXT_TENSOR, &mb.sb);   /* a module payload as a tensor */
  CHECK_ERR_MSG(st__check_value(mpbuf_obj(&b), 1, why, sizeof why), ST_ERR_INVALID_ARGUMENT, why);
  CHECK_CONTAINS(why, "tensor");
  mpbuf_free(&b);
  mpbuf_free(&mb);
}

TEST(error_envelope) {
  mpbuf_t b;
  mpbuf_init(&b);
  st__pack_error(&b.pk, ST_ERR_UNKNOWN_ENDPOINT, NULL);
  const msgpack_object *o = mpbuf_obj(&b);
  CHECK_EQ_INT(o->via.map.size, 3);
  CHECK_EQ_INT(st__map_get(o, "code")->via.u64, 2);
  CHECK(st__str_eq(st__map_get(o, "name"), "UNKNOWN_ENDPOINT"));
  CHECK(st__str_eq(st__map_get(o, "message"), "unknown endpoint"));
  mpbuf_free(&b);

  mpbuf_init(&b);
  st__pack_error_response(&b.pk, 42, ST_ERR_BUSY, "64 requests in flight");
  o = mpbuf_obj(&b);
  CHECK_EQ_INT(o->via.array.size, 4);
  CHECK_EQ_INT(o->via.array.ptr[0].via.u64, 1);
  CHECK_EQ_INT(o->via.array.ptr[1].via.u64, 42);
  CHECK_EQ_INT(st__map_get(&o->via.array.ptr[2], "code")->via.u64, 11);
  CHECK(st__str_eq(st__map_get(&o->via.array.ptr[2], "message"), "64 requests in flight"));
  CHECK_EQ_INT(o->via.array.ptr[3].type, MSGPACK_OBJECT_NIL);
  mpbuf_free(&b);

  mpbuf_init(&b);
  st__pack_cstr(&b.pk, NULL);
  CHECK_EQ_INT(mpbuf_obj(&b)->type, MSGPACK_OBJECT_NIL);
  mpbuf_free(&b);
}

/* Whether the bytes st__pack_kv_* wrote (into a) are those msgpack-c
 * writes for the key and the value (into b). */
static int same_bytes(const mpbuf_t *a, const mpbuf_t *b) {
  return a->sb.size == b->sb.size && memcmp(a->sb.data, b->sb.data, a->sb.size) == 0;
}

/* st__pack_kv_*: one map entry in the bytes msgpack-c packs for it (the
 * smallest integer form at every boundary, float64, nil for a NULL
 * string), with a short key written in one go and a key of 32 bytes or
 * more as msgpack-c writes it. */
TEST(kv_pairs_as_msgpack_c) {
  static const char *const keys[] = {"", "k", "requests_inflight",
                                     "a key of exactly thirty-one byte",
                                     "a key of thirty-two bytes or more"};
  static const uint64_t uints[] = {0, 1, 127, 128, 255, 256, 65535, 65536, 4294967295u,
                                   4294967296u, UINT64_MAX};
  static const int64_t ints[] = {0, 1, 127, 128, -1, -32, -33, -128, -129, -32768, -32769,
                                 INT32_MIN, (int64_t)INT32_MIN - 1, INT64_MIN, INT64_MAX};
  static const char *const strs[] = {NULL, "", "x", "thirty-one bytes of string text.",
                                     "thirty-two bytes of string text.."};
  for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
    for (int kind = 0; kind < 5; kind++) {
      size_t nv = kind == 0 ? sizeof uints / sizeof *uints
                  : kind == 1 ? sizeof ints / sizeof *ints
                  : kind == 4 ? sizeof strs / sizeof *strs
                              : 2;
      for (size_t i = 0; i < nv; i++) {
        mpbuf_t a, b;
        mpbuf_init(&a);
        mpbuf_init(&b);
        msgpack_pack_str(&b.pk, strlen(keys[k]));
        msgpack_pack_str_body(&b.pk, keys[k], strlen(keys[k]));
        switch (kind) {
        case 0:
          st__pack_kv_uint(&a.pk, keys[k], uints[i]);
          msgpack_pack_uint64(&b.pk, uints[i]);
          break;
        case 1:
          st__pack_kv_int(&a.pk, keys[k], ints[i]);
          msgpack_pack_int64(&b.pk, ints[i]);
          break;
        case 2:
          st__pack_kv_double(&a.pk, keys[k], i ? -1.5e300 : 0.25);
          msgpack_pack_double(&b.pk, i ? -1.5e300 : 0.25);
          break;
        case 3:
          st__pack_kv_bool(&a.pk, keys[k], (int)i);
          if (i) msgpack_pack_true(&b.pk);
          else msgpack_pack_false(&b.pk);
          break;
        default:
          st__pack_kv_str(&a.pk, keys[k], strs[i]);
          if (!strs[i]) {
            msgpack_pack_nil(&b.pk);
          } else {
            msgpack_pack_str(&b.pk, strlen(strs[i]));
            msgpack_pack_str_body(&b.pk, strs[i], strlen(strs[i]));
          }
        }
        if (!same_bytes(&a, &b))
          fprintf(stderr, "  key %zu, kind %d, value %zu differs\n", k, kind, i);
        CHECK(same_bytes(&a, &b));
        mpbuf_free(&a);
        mpbuf_free(&b);
      }
    }
  }
}

int main(void) {
  RUN(map_get_and_str_eq);
  RUN(wire_cstr_and_shown);
  RUN(params_map_and_check);
  RUN(check_value_depth);
  RUN(check_value_types_and_keys);
  RUN(check_value_ext);
  RUN(error_envelope);
  RUN(kv_pairs_as_msgpack_c);
  return stt_summary();
}
