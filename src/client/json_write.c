/* src/client: values as JSON text (st_value_json).
 *
 * Output is always valid JSON: strings are escaped and invalid UTF-8 is
 * replaced by U+FFFD; NaN and infinities, which JSON cannot express, are
 * written as null; floats use the shortest form that reads back exactly and
 * always carry a '.' or an exponent; non-string map keys become their JSON
 * text as a string (one level: a non-string key inside such a key is
 * written "(nested key)", since each level would double the escaping and
 * 32 levels of a few bytes would make gigabytes). Tensors and modules are described, never dumped:
 *   {"tensor": {"name", "dtype", "shape", "strides", "device", "nbytes"}}
 *   {"module": {"tensors": [<tensor description>...], "metadata": {...}}}
 * Binary values are {"binary": "<base64>"}.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_internal.h"
#include "common/json.h"

typedef struct jw {
  st__text_t t;
  int pretty;
  int in_key;                 /* writing the JSON text of a non-string key */
} jw_t;

static void put(jw_t *w, const char *s) { st__client_text_puts(&w->t, s); }

static void newline(jw_t *w, int indent) {
  if (!w->pretty) return;
  put(w, "\n");
  for (int i = 0; i < indent; i++) put(w, "  ");
}

static void put_string(jw_t *w, const char *s, size_t n) {
  put(w, "\"");
  const unsigned char *p = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    char buf[8];
    const char *esc = st__json_escape(p[i], buf);
    if (esc) {
      put(w, esc);
      i++;
      continue;
    }
    size_t k = st__utf8_len(p + i, n - i);
    if (k == 0) {
      put(w, "\\ufffd");
      i++;
      continue;
    }
    st__client_text_put(&w->t, s + i, k);
    i += k;
  }
  put(w, "\"");
}

static void put_double(jw_t *w, double d) {
  if (!isfinite(d)) {
    put(w, "null");
    return;
  }
  char buf[40];
  st__json_double_text(d, 15, buf, sizeof buf);
  put(w, buf);
  if (!strpbrk(buf, ".eE")) put(w, ".0");
}

static void put_base64(jw_t *w, const unsigned char *p, size_t n) {
  static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  put(w, "\"");
  for (size_t i = 0; i < n; i += 3) {
    unsigned v = (unsigned)p[i] << 16;
    if (i + 1 < n) v |= (unsigned)p[i + 1] << 8;
    if (i + 2 < n) v |= p[i + 2];
    char q[5] = {tbl[(v >> 18) & 63], tbl[(v >> 12) & 63], i + 1 < n ? tbl[(v >> 6) & 63] : '=',
                 i + 2 < n ? tbl[v & 63] : '=', 0};
    put(w, q);
  }
  put(w, "\"");
}

/* Before item i of an array or object: a comma after the previous item,
 * then (pretty) a new line at indent. */
static void item_start(jw_t *w, size_t i, int indent) {
  if (i) put(w, ",");
  newline(w, indent);
}

/* After the n items of an array or object: (pretty) the closing line at
 * indent when there were items, then the closing bracket. */
static void items_end(jw_t *w, size_t n, int indent, const char *close) {
  if (n) newline(w, indent);
  put(w, close);
}

static void key(jw_t *w, const char *k, int indent, int first) {
  item_start(w, !first, indent);
  put_string(w, k, strlen(k));
  put(w, w->pretty ? ": " : ":");
}

static void put_dims(jw_t *w, const int64_t *d, int n) {
  put(w, "[");
  for (int i = 0; i < n; i++)
    st__client_text_printf(&w->t, i ? (w->pretty ? ", %lld" : ",%lld") : "%lld", (long long)d[i]);
  put(w, "]");
}

/* The inner description of a tensor: {"name", "dtype", ...}. */
static void put_tensor_desc(jw_t *w, const st_tensor_t *t, int indent) {
  put(w, "{");
  key(w, "name", indent + 1, 1);
  put_string(w, t->name, strlen(t->name));
  key(w, "dtype", indent + 1, 0);
  const char *dt = st_dtype_name(t->dtype);
  put_string(w, dt ? dt : "invalid", strlen(dt ? dt : "invalid"));
  key(w, "shape", indent + 1, 0);
  put_dims(w, t->shape, t->ndim);
  key(w, "strides", indent + 1, 0);
  put_dims(w, t->strides, t->ndim);
  key(w, "device", indent + 1, 0);
  if (t->device == ST_DEVICE_CUDA)
    st__client_text_printf(&w->t, "\"cuda:%d\"", t->device_index);
  else
    put(w, "\"cpu\"");
  key(w, "nbytes", indent + 1, 0);
  st__client_text_printf(&w->t, "%zu", t->nbytes);
  newline(w, indent);
  put(w, "}");
}

static void put_value(jw_t *w, const st_value_t *v, int indent);

static void put_map_key(jw_t *w, const st_value_t *k) {
  if (k->kind == ST_VALUE_STRING) {
    put_string(w, k->as.str.ptr, k->as.str.len);
    return;
  }
  if (w->in_key) {
    put(w, "\"(nested key)\"");
    return;
  }
  jw_t sub = {.pretty = 0, .in_key = 1};
  put_value(&sub, k, 0);
  if (sub.t.oom) w->t.oom = 1;
  else put_string(w, sub.t.ptr ? sub.t.ptr : "", sub.t.len);
  free(sub.t.ptr);
}

static void put_value(jw_t *w, const st_value_t *v, int indent) {
  switch (v->kind) {
  case ST_VALUE_NIL:
    put(w, "null");
    break;
  case ST_VALUE_BOOL:
    put(w, v->as.boolean ? "true" : "false");
    break;
  case ST_VALUE_INT:
    st__client_text_printf(&w->t, "%lld", (long long)v->as.integer);
    break;
  case ST_VALUE_FLOAT:
    put_double(w, v->as.number);
    break;
  case ST_VALUE_STRING:
    put_string(w, v->as.str.ptr, v->as.str.len);
    break;
  case ST_VALUE_BINARY:
    put(w, "{");
    key(w, "binary", indent + 1, 1);
    put_base64(w, (const unsigned char *)v->as.str.ptr, v->as.str.len);
    newline(w, indent);
    put(w, "}");
    break;
  case ST_VALUE_ARRAY:
    put(w, "[");
    for (size_t i = 0; i < v->as.array.len; i++) {
      item_start(w, i, indent + 1);
      put_value(w, &v->as.array.items[i], indent + 1);
    }
    items_end(w, v->as.array.len, indent, "]");
    break;
  case ST_VALUE_MAP:
    put(w, "{");
    for (size_t i = 0; i < v->as.map.len; i++) {
      item_start(w, i, indent + 1);
      put_map_key(w, &v->as.map.keys[i]);
      put(w, w->pretty ? ": " : ":");
      put_value(w, &v->as.map.values[i], indent + 1);
    }
    items_end(w, v->as.map.len, indent, "}");
    break;
  case ST_VALUE_TENSOR:
    put(w, "{");
    key(w, "tensor", indent + 1, 1);
    put_tensor_desc(w, v->as.tensor, indent + 1);
    newline(w, indent);
    put(w, "}");
    break;
  case ST_VALUE_MODULE:
    put(w, "{");
    key(w, "module", indent + 1, 1);
    put(w, "{");
    key(w, "tensors", indent + 2, 1);
    put(w, "[");
    for (size_t i = 0; i < v->as.module.len; i++) {
      item_start(w, i, indent + 3);
      put_tensor_desc(w, v->as.module.tensors[i], indent + 3);
    }
    items_end(w, v->as.module.len, indent + 2, "]");
    key(w, "metadata", indent + 2, 0);
    if (v->as.module.metadata)
      put_value(w, v->as.module.metadata, indent + 2);
    else
      put(w, "{}");
    newline(w, indent + 1);
    put(w, "}");
    newline(w, indent);
    put(w, "}");
    break;
  default:
    put(w, "null");
  }
}

/* JSON text of v; owned by the caller (free()), NULL when out of memory or
 * v is NULL. Any thread. */
ST_API char *st_value_json(const st_value_t *v, int pretty) {
  if (!v) return NULL;
  jw_t w = {.pretty = pretty};
  put_value(&w, v, 0);
  if (w.t.oom || !w.t.ptr) {
    free(w.t.ptr);
    return NULL;
  }
  return w.t.ptr;
}
