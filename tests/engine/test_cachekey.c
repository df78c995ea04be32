/* Unit tests of cache keys (src/engine/cachekey.c): format keys with every
 * kind of value, the canonical JSON of all arguments (sorted keys,
 * escaping, shortest floats), and the small hash map (src/engine/smap.c). */
#include <math.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/cachekey.h"
#include "engine/smap.h"
#include "proto/proto.h"
#include "st/errors.h"

static st__endpoint_decl_t ep;

/* A bound map: a = 3, b = "x y", c = 0.1, d = true, e = {z = [1, 2.5], a = nil},
 * f = -7, g = 2.0 (keys in the binder's sorted order). */
static void pack_bound(msgpack_sbuffer *sb) {
  msgpack_packer pk;
  msgpack_sbuffer_init(sb);
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 7);
  st__pack_cstr(&pk, "a");
  msgpack_pack_int(&pk, 3);
  st__pack_cstr(&pk, "b");
  st__pack_cstr(&pk, "x y");
  st__pack_cstr(&pk, "c");
  msgpack_pack_double(&pk, 0.1);
  st__pack_cstr(&pk, "d");
  msgpack_pack_true(&pk);
  st__pack_cstr(&pk, "e");
  msgpack_pack_map(&pk, 2);
  st__pack_cstr(&pk, "z");
  msgpack_pack_array(&pk, 2);
  msgpack_pack_int(&pk, 1);
  msgpack_pack_double(&pk, 2.5);
  st__pack_cstr(&pk, "a");
  msgpack_pack_nil(&pk);
  st__pack_cstr(&pk, "f");
  msgpack_pack_int(&pk, -7);
  st__pack_cstr(&pk, "g");
  msgpack_pack_double(&pk, 2.0);
}

static char *key_of(const char *format, size_t *len) {
  msgpack_sbuffer sb;
  pack_bound(&sb);
  memset(&ep, 0, sizeof ep);
  ep.name = "demo";
  ep.cache_format_key = (char *)format;
  char *out = NULL, err[128];
  int rc = st__cache_key(&ep, sb.data, sb.size, &out, len, err, sizeof err);
  msgpack_sbuffer_destroy(&sb);
  if (rc != ST_OK) fprintf(stderr, "   %s\n", err);
  return out;
}

TEST(format_key_fields) {
  size_t len;
  char *k = key_of("m:{a}:{b}:{c}:{d}:{f}:{g}", &len);
  CHECK_STR_EQ(k, "m:3:x y:0.1:true:-7:2");
  CHECK_EQ_INT(len, strlen(k));
  free(k);
  k = key_of("t={e}", &len);
  CHECK_STR_EQ(k, "t={\"a\":null,\"z\":[1,2.5]}");
  free(k);
  k = key_of("const", &len);
  CHECK_STR_EQ(k, "const");
  free(k);
  k = key_of("{a}{a}", &len);
  CHECK_STR_EQ(k, "33");
  free(k);
}

TEST(canonical_json_of_all_arguments) {
  size_t len;
  char *k = key_of(NULL, &len);
  CHECK_STR_EQ(k, "{\"a\":3,\"b\":\"x y\",\"c\":0.1,\"d\":true,\"e\":{\"a\":null,\"z\":[1,2.5]},"
                  "\"f\":-7,\"g\":2}");
  free(k);
}

static char *json_of(void (*pack)(msgpack_packer *)) {
  msgpack_sbuffer in, out;
  msgpack_sbuffer_init(&in);
  msgpack_sbuffer_init(&out);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &in, msgpack_sbuffer_write);
  pack(&pk);
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  msgpack_unpack_next(&u, in.data, in.size, &off);
  st__canonical_json(&u.data, &out);
  msgpack_sbuffer_write(&out, "", 1);
  msgpack_unpacked_destroy(&u);
  msgpack_sbuffer_destroy(&in);
  return msgpack_sbuffer_release(&out);
}

static void pack_escapes(msgpack_packer *pk) {
  st__pack_cstr(pk, "q\"b\\n\nt\tc\x01\xc3\xa9");
}
static void pack_floats(msgpack_packer *pk) {
  msgpack_pack_array(pk, 7);
  msgpack_pack_double(pk, 1.0 / 3);
  msgpack_pack_double(pk, 1e21);
  msgpack_pack_double(pk, -0.0);
  msgpack_pack_double(pk, NAN);
  msgpack_pack_double(pk, -INFINITY);
  msgpack_pack_float(pk, 0.1f);
  msgpack_pack_uint64(pk, UINT64_MAX);
}
static void pack_sorted(msgpack_packer *pk) {
  msgpack_pack_map(pk, 3);
  st__pack_cstr(pk, "ab");
  msgpack_pack_int(pk, 2);
  st__pack_cstr(pk, "b");
  msgpack_pack_int(pk, 3);
  st__pack_cstr(pk, "a");
  msgpack_pack_int(pk, 1);
}

TEST(json_escaping_floats_and_order) {
  char *s = json_of(pack_escapes);
  CHECK_STR_EQ(s, "\"q\\\"b\\\\n\\nt\\tc\\u0001\xc3\xa9\"");
  free(s);
  s = json_of(pack_floats);
  CHECK_STR_EQ(s, "[0.3333333333333333,1e+21,-0,NaN,-Infinity,0.10000000149011612,"
                  "18446744073709551615]");
  free(s);
  s = json_of(pack_sorted);
  CHECK_STR_EQ(s, "{\"a\":1,\"ab\":2,\"b\":3}");
  free(s);
}

TEST(not_a_map) {
  char bound[1] = {(char)0xc0};   /* nil */
  memset(&ep, 0, sizeof ep);
  ep.name = "demo";
  char *out = NULL, err[128];
  size_t len;
  CHECK_ERR_MSG(st__cache_key(&ep, bound, 1, &out, &len, err, sizeof err),
                ST_ERR_INVALID_ARGUMENT, err);
  CHECK(out == NULL);
  CHECK_CONTAINS(err, "not a map");
}

static void count_entry(const char *key, size_t len, void *value, void *ud) {
  (void)key;
  (void)len;
  *(size_t *)ud += (size_t)(uintptr_t)value;
}

TEST(smap_put_get_del_grow) {
  st__smap_t m;
  st__smap_init(&m);
  CHECK(st__smap_get(&m, "x", 1) == NULL);
  CHECK(st__smap_del(&m, "x", 1) == NULL);
  char key[32];
  for (uintptr_t i = 1; i <= 1000; i++) {
    int n = snprintf(key, sizeof key, "k%u", (unsigned)i);
    CHECK_ERR(st__smap_put(&m, key, (size_t)n, (void *)i), ST_OK);
  }
  CHECK_EQ_INT(m.count, 1000);
  CHECK(m.nbuckets >= 1000);
  CHECK(st__smap_get(&m, "k777", 4) == (void *)777);
  CHECK(st__smap_get(&m, "k77", 3) == (void *)77);
  CHECK_ERR(st__smap_put(&m, "k5", 2, (void *)5000), ST_OK);   /* replaces */
  CHECK_EQ_INT(m.count, 1000);
  CHECK(st__smap_del(&m, "k5", 2) == (void *)5000);
  CHECK(st__smap_get(&m, "k5", 2) == NULL);
  /* Binary keys: ids, embedded NULs. */
  uint64_t id = 42;
  CHECK_ERR(st__smap_put(&m, ST__ID_KEY(&id), (void *)1), ST_OK);
  CHECK_ERR(st__smap_put(&m, "a\0b", 3, (void *)2), ST_OK);
  CHECK(st__smap_get(&m, "a\0c", 3) == NULL);
  CHECK(st__smap_get(&m, ST__ID_KEY(&id)) == (void *)1);
  size_t sum = 0;
  st__smap_each(&m, count_entry, &sum);
  CHECK_EQ_INT(sum, 1000 * 1001 / 2 - 5 + 1 + 2);
  st__smap_clear(&m);
  CHECK_EQ_INT(m.count, 0);
  CHECK(st__smap_get(&m, "k1", 2) == NULL);
}

/* str and bin of the same bytes: bin as b"...", non-UTF-8 and NUL escaped. */
static void pack_str_bin(msgpack_packer *pk) {
  msgpack_pack_array(pk, 6);
  st__pack_cstr(pk, "ab");
  msgpack_pack_bin(pk, 2);
  msgpack_pack_bin_body(pk, "ab", 2);
  msgpack_pack_bin(pk, 5);
  msgpack_pack_bin_body(pk, "\xff\x00\"\\z", 5);
  msgpack_pack_str(pk, 3);
  msgpack_pack_str_body(pk, "a\0b", 3);
  msgpack_pack_str(pk, 4);
  msgpack_pack_str_body(pk, "\xff\xc3\xa9\x7f", 4);
  msgpack_pack_bin(pk, 0);
}

TEST(strings_and_binaries_stay_apart_and_readable) {
  char *s = json_of(pack_str_bin);
  CHECK_STR_EQ(s, "[\"ab\",b\"ab\",b\"\\xff\\x00\\\"\\\\z\",\"a\\u0000b\",\"\\xff\xc3\xa9\\x7f\","
                  "b\"\"]");
  free(s);
  /* a format key: a string as text (escaped), a binary as b"..." */
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 3);
  st__pack_cstr(&pk, "b");
  msgpack_pack_bin(&pk, 3);
  msgpack_pack_bin_body(&pk, "a\0b", 3);
  st__pack_cstr(&pk, "q");
  st__pack_cstr(&pk, "b\"ab\"");
  st__pack_cstr(&pk, "s");
  msgpack_pack_str(&pk, 6);
  msgpack_pack_str_body(&pk, "a\0b\\\xff\n", 6);
  memset(&ep, 0, sizeof ep);
  ep.name = "demo";
  ep.cache_format_key = "k:{s}|{b}|{q}";
  char *out = NULL, err[128];
  size_t len = 0;
  CHECK_ERR_MSG(st__cache_key(&ep, sb.data, sb.size, &out, &len, err, sizeof err), ST_OK, err);
  CHECK_STR_EQ(out, "k:a\\x00b\\\\\\xff\\x0a|b\"a\\x00b\"|b\\\"ab\\\"");
  CHECK_EQ_INT(len, strlen(out));
  free(out);
  msgpack_sbuffer_destroy(&sb);
}

int main(void) {
  RUN(format_key_fields);
  RUN(canonical_json_of_all_arguments);
  RUN(json_escaping_floats_and_order);
  RUN(strings_and_binaries_stay_apart_and_readable);
  RUN(not_a_map);
  RUN(smap_put_get_del_grow);
  return stt_summary();
}
