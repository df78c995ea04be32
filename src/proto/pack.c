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

/* See proto.h. Strings are borrowed. */
void st__pack_kv_str(msgpack_packer *pk, const char *k, const char *v) {
  st__pack_cstr(pk, k);
  st__pack_cstr(pk, v);
}

/* See proto.h. */
void st__pack_kv_int(msgpack_packer *pk, const char *k, int64_t v) {
  st__pack_cstr(pk, k);
  msgpack_pack_int64(pk, v);
}

/* See proto.h. */
void st__pack_kv_uint(msgpack_packer *pk, const char *k, uint64_t v) {
  st__pack_cstr(pk, k);
  msgpack_pack_uint64(pk, v);
}

/* See proto.h. */
void st__pack_kv_double(msgpack_packer *pk, const char *k, double v) {
  st__pack_cstr(pk, k);
  msgpack_pack_double(pk, v);
}

/* See proto.h. */
void st__pack_bool(msgpack_packer *pk, int v) {
  if (v) msgpack_pack_true(pk);
  else msgpack_pack_false(pk);
}

/* See proto.h. */
void st__pack_kv_bool(msgpack_packer *pk, const char *k, int v) {
  st__pack_cstr(pk, k);
  st__pack_bool(pk, v);
}

/* See proto.h. `payload` is borrowed. */
void st__pack_ext(msgpack_packer *pk, int8_t type, const msgpack_sbuffer *payload) {
  msgpack_pack_ext(pk, payload->size, type);
  if (payload->size) msgpack_pack_ext_body(pk, payload->data, payload->size);
}
