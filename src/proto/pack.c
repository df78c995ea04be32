/* src/proto/pack.c: packing the msgpack-RPC envelopes and small values.
 *
 * Each function appends to the packer's buffer; a buffer that runs out of
 * memory fails inside msgpack and the caller's sbuffer is then short, which
 * the sender detects by its size. No state; any thread on its own packer.
 */
#include "proto/proto.h"

#include <string.h>

/* See proto.h. `method` is borrowed. */
void st__pack_request_head(msgpack_packer *pk, uint32_t id, const char *method) {
  msgpack_pack_array(pk, 4);
  msgpack_pack_uint8(pk, ST_MSG_REQUEST);
  msgpack_pack_uint32(pk, id);
  st__pack_cstr(pk, method);
}

/* See proto.h. */
void st__pack_response_head(msgpack_packer *pk, uint32_t id) {
  msgpack_pack_array(pk, 4);
  msgpack_pack_uint8(pk, ST_MSG_RESPONSE);
  msgpack_pack_uint32(pk, id);
  msgpack_pack_nil(pk);
}

static void pack_error_map(msgpack_packer *pk, int err, const char *message, size_t extra);

/* See proto.h. `message` is borrowed; NULL uses st_strerror(err). */
void st__pack_error_response(msgpack_packer *pk, uint32_t id, int err, const char *message) {
  st__pack_error_response_head(pk, id, err, message, 0);
  msgpack_pack_nil(pk);
}

/* See proto.h. */
void st__pack_error_response_head(msgpack_packer *pk, uint32_t id, int err, const char *message,
                                  size_t extra) {
  msgpack_pack_array(pk, 4);
  msgpack_pack_uint8(pk, ST_MSG_RESPONSE);
  msgpack_pack_uint32(pk, id);
  pack_error_map(pk, err, message, extra);
}

/* See proto.h. `method` is borrowed. */
void st__pack_notification_head(msgpack_packer *pk, const char *method) {
  msgpack_pack_array(pk, 3);
  msgpack_pack_uint8(pk, ST_MSG_NOTIFICATION);
  st__pack_cstr(pk, method);
}

/* See proto.h. The code on the wire is positive (-err); a positive err is
 * taken as a wire code already. `message` NULL uses st_strerror(err). */
void st__pack_error(msgpack_packer *pk, int err, const char *message) {
  pack_error_map(pk, err, message, 0);
}

/* The error map's head with `extra` more pairs to come; see
 * st__pack_error. */
static void pack_error_map(msgpack_packer *pk, int err, const char *message, size_t extra) {
  int64_t code = err < 0 ? -(int64_t)err : (int64_t)err;
  msgpack_pack_map(pk, 3 + extra);
  st__pack_cstr(pk, "code");
  msgpack_pack_int64(pk, code);
  st__pack_cstr(pk, "name");
  st__pack_cstr(pk, st_err_name(err));
  st__pack_cstr(pk, "message");
  st__pack_cstr(pk, message ? message : st_strerror(err));
}

/* See proto.h. `s` is borrowed. A string shorter than 32 bytes (every
 * map key: replies repeat hundreds) is a fixstr, its header and body
 * written in one go; longer ones as msgpack-c packs them. */
void st__pack_cstr(msgpack_packer *pk, const char *s) {
  if (!s) {
    msgpack_pack_nil(pk);
    return;
  }
  size_t n = strlen(s);
  if (n < 32) {
    char b[32];
    b[0] = (char)(0xa0 | n);
    memcpy(b + 1, s, n);
    pk->callback(pk->data, b, n + 1);
    return;
  }
  msgpack_pack_str(pk, n);
  msgpack_pack_str_body(pk, s, n);
}

/* ------------------------------------------------------------ map entries
 *
 * A map entry whose key is shorter than 32 bytes (every key of every
 * reply) and whose value is a number, a bool or a short string is put
 * together here and written in one go: a reply such as info packs a few
 * hundred of them, and each write is a call through the packer. The bytes
 * are those msgpack-c writes (the smallest integer form, float64). */

/* Room for a fixstr key and a value of up to 31 bytes with its header. */
#define KV_MAX (32 + 32)

/* The key as a fixstr at b; its length, or 0 when it is 32 bytes or more
 * (the caller packs the entry as msgpack-c would). */
static size_t put_key(char *b, const char *k) {
  size_t n = strlen(k);
  if (n >= 32) return 0;
  b[0] = (char)(0xa0 | n);
  memcpy(b + 1, k, n);
  return n + 1;
}

static size_t put_be(char *b, unsigned char head, uint64_t v, int bytes) {
  b[0] = (char)head;
  for (int i = bytes; i > 0; i--, v >>= 8) b[i] = (char)(v & 0xff);
  return (size_t)bytes + 1;
}

static size_t put_uint(char *b, uint64_t v) {
  if (v < 128) {
    b[0] = (char)v;
    return 1;
  }
  if (v < 256) return put_be(b, 0xcc, v, 1);
  if (v < 65536) return put_be(b, 0xcd, v, 2);
  if (v <= UINT32_MAX) return put_be(b, 0xce, v, 4);
  return put_be(b, 0xcf, v, 8);
}

static size_t put_int(char *b, int64_t v) {
  if (v >= 0) return put_uint(b, (uint64_t)v);
  if (v >= -32) {
    b[0] = (char)(int8_t)v;
    return 1;
  }
  if (v >= INT8_MIN) return put_be(b, 0xd0, (uint64_t)v, 1);
  if (v >= INT16_MIN) return put_be(b, 0xd1, (uint64_t)v, 2);
  if (v >= INT32_MIN) return put_be(b, 0xd2, (uint64_t)v, 4);
  return put_be(b, 0xd3, (uint64_t)v, 8);
}

/* See proto.h. Strings are borrowed. */
void st__pack_kv_str(msgpack_packer *pk, const char *k, const char *v) {
  char b[KV_MAX];
  size_t n = put_key(b, k), vn = v ? strlen(v) : 0;
  if (!n || vn >= 32) {
    st__pack_cstr(pk, k);
    st__pack_cstr(pk, v);
    return;
  }
  if (!v) {
    b[n++] = (char)0xc0;
  } else {
    b[n++] = (char)(0xa0 | vn);
    memcpy(b + n, v, vn);
    n += vn;
  }
  pk->callback(pk->data, b, n);
}

/* See proto.h. */
void st__pack_kv_int(msgpack_packer *pk, const char *k, int64_t v) {
  char b[KV_MAX];
  size_t n = put_key(b, k);
  if (!n) {
    st__pack_cstr(pk, k);
    msgpack_pack_int64(pk, v);
    return;
  }
  n += put_int(b + n, v);
  pk->callback(pk->data, b, n);
}

/* See proto.h. */
void st__pack_kv_uint(msgpack_packer *pk, const char *k, uint64_t v) {
  char b[KV_MAX];
  size_t n = put_key(b, k);
  if (!n) {
    st__pack_cstr(pk, k);
    msgpack_pack_uint64(pk, v);
    return;
  }
  n += put_uint(b + n, v);
  pk->callback(pk->data, b, n);
}

/* See proto.h. */
void st__pack_kv_double(msgpack_packer *pk, const char *k, double v) {
  char b[KV_MAX];
  size_t n = put_key(b, k);
  if (!n) {
    st__pack_cstr(pk, k);
    msgpack_pack_double(pk, v);
    return;
  }
  uint64_t bits;
  memcpy(&bits, &v, sizeof bits);
  n += put_be(b + n, 0xcb, bits, 8);
  pk->callback(pk->data, b, n);
}

/* See proto.h. */
void st__pack_bool(msgpack_packer *pk, int v) {
  if (v) msgpack_pack_true(pk);
  else msgpack_pack_false(pk);
}

/* See proto.h. */
void st__pack_kv_bool(msgpack_packer *pk, const char *k, int v) {
  char b[KV_MAX];
  size_t n = put_key(b, k);
  if (!n) {
    st__pack_cstr(pk, k);
    st__pack_bool(pk, v);
    return;
  }
  b[n++] = (char)(v ? 0xc3 : 0xc2);
  pk->callback(pk->data, b, n);
}

/* See proto.h. `payload` is borrowed. */
void st__pack_ext(msgpack_packer *pk, int8_t type, const msgpack_sbuffer *payload) {
  msgpack_pack_ext(pk, payload->size, type);
  if (payload->size) msgpack_pack_ext_body(pk, payload->data, payload->size);
}
