/* src/engine: cache keys (cachekey.h). Any thread. */
#include "engine/cachekey.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fail.h"
#include "common/json.h"
#include "st/errors.h"

typedef struct sink {
  msgpack_sbuffer *sb;
  int failed;
} sink_t;

static void put(sink_t *s, const void *p, size_t n) {
  if (!s->failed && n && msgpack_sbuffer_write(s->sb, p, n) != 0) s->failed = 1;
}

static void puts_(sink_t *s, const char *str) {
  put(s, str, strlen(str));
}

/* Shortest "%.*g" text that reads back to d. */
static void put_double(sink_t *s, double d) {
  if (isnan(d)) {
    puts_(s, "NaN");
    return;
  }
  if (isinf(d)) {
    puts_(s, d < 0 ? "-Infinity" : "Infinity");
    return;
  }
  char buf[40];
  st__json_double_text(d, 1, buf, sizeof buf);
  puts_(s, buf);
}

static void put_hex(sink_t *s, unsigned char c) {
  static const char digits[] = "0123456789abcdef";
  char e[4] = {'\\', 'x', digits[c >> 4], digits[c & 15]};
  put(s, e, sizeof e);
}

/* The text of a msgpack str (cachekey.h): valid UTF-8 as it is, a
 * backslash and a quote escaped (so no string renders as a binary's
 * b"..."), control characters and DEL as JSON escapes in JSON and as \xNN
 * in a format key, bytes that are not UTF-8 as \xNN. */
static void put_text(sink_t *s, const char *p, size_t n, int json) {
  const unsigned char *u = (const unsigned char *)p;
  size_t i = 0, run = 0;   /* bytes copied as they are, pending */
  while (i < n) {
    char ebuf[8];
    const char *esc = NULL;
    size_t len = 1;
    int hex = 0;
    if (u[i] >= 0x80) {
      len = st__utf8_len(u + i, n - i);
      hex = len == 0;
    } else if (json) {
      esc = st__json_escape(u[i], ebuf);
      hex = u[i] == 0x7f;
    } else if (u[i] == '\\' || u[i] == '"') {
      esc = u[i] == '\\' ? "\\\\" : "\\\"";
    } else {
      hex = u[i] < 0x20 || u[i] == 0x7f;
    }
    if (!esc && !hex) {
      run += len;
      i += len;
      continue;
    }
    put(s, p + i - run, run);
    run = 0;
    if (esc) puts_(s, esc);
    else put_hex(s, u[i]);
    i++;
  }
  put(s, p + n - run, run);
}

static void put_json_string(sink_t *s, const char *p, size_t n) {
  put(s, "\"", 1);
  put_text(s, p, n, 1);
  put(s, "\"", 1);
}

/* A msgpack bin: b"..." with printable ASCII as it is (a quote and a
 * backslash escaped) and every other byte as \xNN. */
static void put_binary(sink_t *s, const char *p, size_t n) {
  const unsigned char *u = (const unsigned char *)p;
  put(s, "b\"", 2);
  for (size_t i = 0; i < n; i++) {
    if (u[i] == '\\' || u[i] == '"') {
      put(s, "\\", 1);
      put(s, p + i, 1);
    } else if (u[i] < 0x20 || u[i] >= 0x7f) {
      put_hex(s, u[i]);
    } else {
      put(s, p + i, 1);
    }
  }
  put(s, "\"", 1);
}

static int key_cmp(const void *a, const void *b) {
  const msgpack_object_kv *x = *(const msgpack_object_kv *const *)a;
  const msgpack_object_kv *y = *(const msgpack_object_kv *const *)b;
  size_t xl = x->key.type == MSGPACK_OBJECT_STR ? x->key.via.str.size : 0;
  size_t yl = y->key.type == MSGPACK_OBJECT_STR ? y->key.via.str.size : 0;
  int c = memcmp(xl ? x->key.via.str.ptr : "", yl ? y->key.via.str.ptr : "", xl < yl ? xl : yl);
  if (c) return c;
  return (xl > yl) - (xl < yl);
}

static void put_json(sink_t *s, const msgpack_object *o, int depth);

static void put_json_map(sink_t *s, const msgpack_object *o, int depth) {
  uint32_t n = o->via.map.size;
  const msgpack_object_kv *stack[16];
  const msgpack_object_kv **kv = n <= 16 ? stack : malloc(n * sizeof *kv);
  if (!kv) {
    s->failed = 1;
    return;
  }
  for (uint32_t i = 0; i < n; i++) kv[i] = &o->via.map.ptr[i];
  qsort(kv, n, sizeof *kv, key_cmp);
  put(s, "{", 1);
  for (uint32_t i = 0; i < n; i++) {
    if (i) put(s, ",", 1);
    if (kv[i]->key.type == MSGPACK_OBJECT_STR)
      put_json_string(s, kv[i]->key.via.str.ptr, kv[i]->key.via.str.size);
    else
      put_json(s, &kv[i]->key, depth + 1);
    put(s, ":", 1);
    put_json(s, &kv[i]->val, depth + 1);
  }
  put(s, "}", 1);
  if (kv != stack) free(kv);
}

static void put_json(sink_t *s, const msgpack_object *o, int depth) {
  char buf[32];
  if (depth > 64) {          /* arguments are checked to 32 levels */
    puts_(s, "null");
    return;
  }
  switch (o->type) {
    case MSGPACK_OBJECT_NIL: puts_(s, "null"); break;
    case MSGPACK_OBJECT_BOOLEAN: puts_(s, o->via.boolean ? "true" : "false"); break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
      snprintf(buf, sizeof buf, "%llu", (unsigned long long)o->via.u64);
      puts_(s, buf);
      break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
      snprintf(buf, sizeof buf, "%lld", (long long)o->via.i64);
      puts_(s, buf);
      break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: put_double(s, o->via.f64); break;
    case MSGPACK_OBJECT_STR: put_json_string(s, o->via.str.ptr, o->via.str.size); break;
    case MSGPACK_OBJECT_BIN: put_binary(s, o->via.bin.ptr, o->via.bin.size); break;
    case MSGPACK_OBJECT_ARRAY:
      put(s, "[", 1);
      for (uint32_t i = 0; i < o->via.array.size; i++) {
        if (i) put(s, ",", 1);
        put_json(s, &o->via.array.ptr[i], depth + 1);
      }
      put(s, "]", 1);
      break;
    case MSGPACK_OBJECT_MAP: put_json_map(s, o, depth); break;
    case MSGPACK_OBJECT_EXT: puts_(s, "null"); break;
  }
}

/* Appends the canonical JSON of o. Any thread. */
int st__canonical_json(const msgpack_object *o, msgpack_sbuffer *out) {
  sink_t s = {out, 0};
  put_json(&s, o, 0);
  return s.failed ? ST_ERR_OUT_OF_MEMORY : ST_OK;
}

/* One {param} of a format key: strings as text (put_text), everything
 * else (binary too: b"...") as in JSON. */
static void put_field(sink_t *s, const msgpack_object *v) {
  if (v->type == MSGPACK_OBJECT_STR) put_text(s, v->via.str.ptr, v->via.str.size, 0);
  else put_json(s, v, 0);
}

static const msgpack_object *bound_get(const msgpack_object *map, const char *name, size_t len) {
  for (uint32_t i = 0; i < map->via.map.size; i++) {
    const msgpack_object *k = &map->via.map.ptr[i].key;
    if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == len &&
        memcmp(k->via.str.ptr, name, len) == 0)
      return &map->via.map.ptr[i].val;
  }
  return NULL;
}

/* The cache key of one call; see cachekey.h. Any thread. */
int st__cache_key(const st__endpoint_decl_t *ep, const char *bound, size_t bound_len,
                  char **out, size_t *outlen, char *err, size_t errlen) {
  *out = NULL;
  *outlen = 0;
  msgpack_unpacked up;
  msgpack_unpacked_init(&up);
  size_t off = 0;
  if (msgpack_unpack_next(&up, bound, bound_len, &off) != MSGPACK_UNPACK_SUCCESS ||
      up.data.type != MSGPACK_OBJECT_MAP) {
    msgpack_unpacked_destroy(&up);
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "bound arguments are not a map");
  }
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  sink_t s = {&sb, 0};
  const char *k = ep->cache_format_key;
  if (!k) {
    put_json(&s, &up.data, 0);
  } else {
    while (*k) {
      const char *open = strchr(k, '{');
      const char *close = open ? strchr(open + 1, '}') : NULL;
      if (!open || !close) {         /* the loader refuses unpaired braces */
        puts_(&s, k);
        break;
      }
      put(&s, k, (size_t)(open - k));
      const msgpack_object *v = bound_get(&up.data, open + 1, (size_t)(close - open - 1));
      if (v) put_field(&s, v);
      else put(&s, open, (size_t)(close - open + 1));
      k = close + 1;
    }
  }
  put(&s, "", 1);     /* the NUL */
  msgpack_unpacked_destroy(&up);
  if (s.failed) {
    msgpack_sbuffer_destroy(&sb);
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory formatting the cache key");
  }
  *outlen = sb.size - 1;
  *out = msgpack_sbuffer_release(&sb);
  return ST_OK;
}
