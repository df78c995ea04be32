/* src/proto/inspect.c: looking into decoded messages and checking values
 * received from clients. No state; any thread.
 */
#include "proto/proto.h"

#include "common/fail.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Every failure here is INVALID_ARGUMENT. */
#define fail(err, errlen, ...) st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, __VA_ARGS__)


/* See proto.h. Returns a pointer into `map` (borrowed); the first match
 * wins. */
const msgpack_object *st__map_get(const msgpack_object *map, const char *key) {
  if (!map || map->type != MSGPACK_OBJECT_MAP || !key) return NULL;
  for (uint32_t i = 0; i < map->via.map.size; i++) {
    const msgpack_object_kv *kv = &map->via.map.ptr[i];
    if (st__str_eq(&kv->key, key)) return &kv->val;
  }
  return NULL;
}

/* See proto.h. */
int st__map_get_ids(const msgpack_object *params, const char *key, const char *noun,
                    const msgpack_object **ids, char *err, size_t errlen) {
  *ids = NULL;
  const msgpack_object *a = params ? st__map_get(params, key) : NULL;
  if (!a || a->type == MSGPACK_OBJECT_NIL) return ST_OK;
  int ok = a->type == MSGPACK_OBJECT_ARRAY;
  for (uint32_t i = 0; ok && i < a->via.array.size; i++)
    ok = a->via.array.ptr[i].type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
         a->via.array.ptr[i].via.u64 >= 1;
  if (!ok)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "'%s' must be an array of %s (integers >= 1)", key, noun);
  *ids = a;
  return ST_OK;
}

/* See proto.h. */
int st__str_eq(const msgpack_object *o, const char *s) {
  if (!o || !s || o->type != MSGPACK_OBJECT_STR) return 0;
  size_t n = strlen(s);
  return o->via.str.size == n && memcmp(o->via.str.ptr, s, n) == 0;
}

/* See proto.h. */
long st__wire_cstr(const msgpack_object *o, char *buf, size_t cap) {
  if (cap) buf[0] = '\0';
  if (!o || o->type != MSGPACK_OBJECT_STR || o->via.str.size >= cap ||
      (o->via.str.size && memchr(o->via.str.ptr, '\0', o->via.str.size)))
    return -1;
  if (o->via.str.size) memcpy(buf, o->via.str.ptr, o->via.str.size);
  buf[o->via.str.size] = '\0';
  return (long)o->via.str.size;
}

/* See proto.h. */
const char *st__wire_shown(const char *p, size_t n, char *buf, size_t cap) {
  static const char hex[] = "0123456789abcdef";
  size_t out = 0, i = 0;
  for (; i < n && i < 64; i++) {
    unsigned char ch = (unsigned char)p[i];
    int plain = ch >= 0x20 && ch < 0x7f && ch != '\\';
    if (out + (plain ? 1 : 4) + 4 > cap) break;
    if (plain) {
      buf[out++] = (char)ch;
    } else {
      buf[out++] = '\\';
      buf[out++] = 'x';
      buf[out++] = hex[ch >> 4];
      buf[out++] = hex[ch & 15];
    }
  }
  if (i < n) {
    memcpy(buf + out, "...", 3);
    out += 3;
  }
  buf[out] = '\0';
  return buf;
}

/* See proto.h. */
int st__features_has(const msgpack_object *features, const char *name) {
  if (!features || features->type != MSGPACK_OBJECT_ARRAY) return 0;
  for (uint32_t i = 0; i < features->via.array.size; i++)
    if (st__str_eq(&features->via.array.ptr[i], name)) return 1;
  return 0;
}

/* See proto.h. *map is borrowed from params. */
int st__params_map(const msgpack_object *params, const msgpack_object **map,
                   char *err, size_t errlen) {
  *map = NULL;
  if (!params || params->type != MSGPACK_OBJECT_ARRAY)
    return fail(err, errlen, "params must be an array");
  if (params->via.array.size == 0) return ST_OK;
  if (params->via.array.size > 1)
    return fail(err, errlen, "params must be [] or [{named parameters}]");
  const msgpack_object *m = &params->via.array.ptr[0];
  if (m->type != MSGPACK_OBJECT_MAP)
    return fail(err, errlen, "params must be [] or [{named parameters}]");
  for (uint32_t i = 0; i < m->via.map.size; i++)
    if (m->via.map.ptr[i].key.type != MSGPACK_OBJECT_STR)
      return fail(err, errlen, "parameter names must be strings");
  *map = m;
  return ST_OK;
}

/* See proto.h. `map` NULL (no parameters) passes. */
int st__params_check(const msgpack_object *map, const char *const *allowed,
                     char *err, size_t errlen) {
  if (!map) return ST_OK;
  if (map->type != MSGPACK_OBJECT_MAP) return fail(err, errlen, "params must be a map");
  for (uint32_t i = 0; i < map->via.map.size; i++) {
    const msgpack_object *k = &map->via.map.ptr[i].key;
    if (k->type != MSGPACK_OBJECT_STR) return fail(err, errlen, "parameter names must be strings");
    int known = 0;
    for (const char *const *a = allowed; a && *a && !known; a++) known = st__str_eq(k, *a);
    if (!known) {
      char shown[300];
      return fail(err, errlen, "unknown parameter '%s'",
                  st__wire_shown(k->via.str.ptr, k->via.str.size, shown, sizeof shown));
    }
  }
  return ST_OK;
}

/* Checks an ext value: a tensor or module whose descriptor parses. */
static int check_ext(const msgpack_object *o, char *err, size_t errlen) {
  char why[160];
  why[0] = '\0';
  if (o->via.ext.type == ST_EXT_TENSOR) {
    st__tensor_desc_t d;
    if (st__parse_tensor(o, &d, why, sizeof why) != ST_OK)
      return fail(err, errlen, "bad tensor value: %s", why);
    return ST_OK;
  }
  if (o->via.ext.type == ST_EXT_MODULE) {
    msgpack_unpacked payload;
    const msgpack_object *tensors, *metadata;
    if (st__parse_module(o, &payload, &tensors, &metadata, why, sizeof why) != ST_OK)
      return fail(err, errlen, "bad module value: %s", why);
    msgpack_unpacked_destroy(&payload);
    return ST_OK;
  }
  return fail(err, errlen, "ext type %d is not a value", (int)o->via.ext.type);
}

static int check_value(const msgpack_object *o, int allow_ext, int depth, char *err,
                       size_t errlen) {
  switch (o->type) {
  case MSGPACK_OBJECT_NIL: case MSGPACK_OBJECT_BOOLEAN:
  case MSGPACK_OBJECT_POSITIVE_INTEGER: case MSGPACK_OBJECT_NEGATIVE_INTEGER:
  case MSGPACK_OBJECT_FLOAT32: case MSGPACK_OBJECT_FLOAT64:
  case MSGPACK_OBJECT_STR: case MSGPACK_OBJECT_BIN:
    return ST_OK;
  case MSGPACK_OBJECT_EXT:
    if (!allow_ext) return fail(err, errlen, "ext values are not accepted here");
    return check_ext(o, err, errlen);
  case MSGPACK_OBJECT_ARRAY:
  case MSGPACK_OBJECT_MAP:
    break;
  default:
    return fail(err, errlen, "unsupported value type");
  }
  if (depth >= ST_MAX_DEPTH)
    return fail(err, errlen, "value nested deeper than %d", ST_MAX_DEPTH);
  if (o->type == MSGPACK_OBJECT_ARRAY) {
    for (uint32_t i = 0; i < o->via.array.size; i++) {
      int rc = check_value(&o->via.array.ptr[i], allow_ext, depth + 1, err, errlen);
      if (rc != ST_OK) return rc;
    }
    return ST_OK;
  }
  for (uint32_t i = 0; i < o->via.map.size; i++) {
    const msgpack_object_kv *kv = &o->via.map.ptr[i];
    if (kv->key.type != MSGPACK_OBJECT_STR) return fail(err, errlen, "map keys must be strings");
    int rc = check_value(&kv->val, allow_ext, depth + 1, err, errlen);
    if (rc != ST_OK) return rc;
  }
  return ST_OK;
}

/* See proto.h. Arrays and maps count one level each: a value with
 * ST_MAX_DEPTH levels of containers passes, one more fails. With allow_ext,
 * tensor and module values must carry a well-formed descriptor. */
int st__check_value(const msgpack_object *o, int allow_ext, char *err, size_t errlen) {
  if (!o) return fail(err, errlen, "no value");
  return check_value(o, allow_ext, 0, err, errlen);
}
