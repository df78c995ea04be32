/* src/client: named call arguments. An st_args_t is a small ordered map of
 * key -> msgpack bytes of one value; call and rpc pack it as the argument
 * map. Also the parsing of shell words ("n=5", "name:str=5") and of JSON
 * objects into arguments.
 *
 * Threads: an st_args_t belongs to one thread at a time.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_internal.h"
#include "common/fail.h"

typedef struct arg {
  char *key;
  char *data;       /* msgpack bytes of the value */
  size_t len;
} arg_t;

struct st_args {
  arg_t *items;
  size_t n, cap;
  /* Own allocations that tensor values name by index (st_args_tensor,
   * targs.c): one reference each, dropped by st_args_free. */
  st__mapping_t **arenas;
  size_t narenas, arenas_cap;
};

/* See client_internal.h. */
size_t st__client_args_arenas(const st_args_t *a, st__mapping_t *const **out) {
  *out = a ? a->arenas : NULL;
  return a ? a->narenas : 0;
}

/* Index of m among a's arenas, adding it (and keeping the caller's
 * reference) when new; an existing entry gives the extra reference back.
 * -1 when out of memory (the reference is released). */
long st__client_args_arena_index(st_args_t *a, st__mapping_t *m) {
  for (size_t i = 0; i < a->narenas; i++) {
    if (a->arenas[i] == m) {
      st__client_mapping_release(m);
      return (long)i;
    }
  }
  if (a->narenas == a->arenas_cap) {
    size_t cap = a->arenas_cap ? a->arenas_cap * 2 : 4;
    st__mapping_t **p = realloc(a->arenas, cap * sizeof *p);
    if (!p) {
      st__client_mapping_release(m);
      return -1;
    }
    a->arenas = p;
    a->arenas_cap = cap;
  }
  a->arenas[a->narenas] = m;
  return (long)a->narenas++;
}

/* New empty argument map, owned by the caller (st_args_free); NULL when out
 * of memory. Any thread. */
ST_API st_args_t *st_args_new(void) { return calloc(1, sizeof(st_args_t)); }

/* Frees the map and its values. NULL ok. */
ST_API void st_args_free(st_args_t *a) {
  if (!a) return;
  for (size_t i = 0; i < a->n; i++) {
    free(a->items[i].key);
    free(a->items[i].data);
  }
  for (size_t i = 0; i < a->narenas; i++) st__client_mapping_release(a->arenas[i]);
  free(a->arenas);
  free(a->items);
  free(a);
}

/* See client_internal.h: copies key and bytes; the last set wins. */
int st__client_args_set_raw(st_args_t *a, const char *key, size_t key_len, const void *data,
                            size_t len) {
  if (!a || !key || key_len == 0 || !data || len == 0) return ST_ERR_INVALID_ARGUMENT;
  char *copy = malloc(len);
  if (!copy) return ST_ERR_OUT_OF_MEMORY;
  memcpy(copy, data, len);
  for (size_t i = 0; i < a->n; i++) {
    if (strlen(a->items[i].key) == key_len && memcmp(a->items[i].key, key, key_len) == 0) {
      free(a->items[i].data);
      a->items[i].data = copy;
      a->items[i].len = len;
      return ST_OK;
    }
  }
  if (a->n == a->cap) {
    size_t cap = a->cap ? a->cap * 2 : 8;
    arg_t *p = realloc(a->items, cap * sizeof *p);
    if (!p) {
      free(copy);
      return ST_ERR_OUT_OF_MEMORY;
    }
    a->items = p;
    a->cap = cap;
  }
  char *k = malloc(key_len + 1);
  if (!k) {
    free(copy);
    return ST_ERR_OUT_OF_MEMORY;
  }
  memcpy(k, key, key_len);
  k[key_len] = '\0';
  a->items[a->n++] = (arg_t){k, copy, len};
  return ST_OK;
}

/* Packs {key: value, ...}; NULL packs an empty map. */
void st__client_args_pack(msgpack_packer *pk, const st_args_t *a) {
  size_t n = a ? a->n : 0;
  msgpack_pack_map(pk, n);
  for (size_t i = 0; i < n; i++) {
    st__pack_cstr(pk, a->items[i].key);
    st__client_cbuf_raw(pk, a->items[i].data, a->items[i].len);
  }
}

/* Sets key to whatever the packer in b holds. */
static int set_from(st_args_t *a, const char *key, size_t key_len, st__cbuf_t *b) {
  int rc = b->oom ? ST_ERR_OUT_OF_MEMORY
                  : st__client_args_set_raw(a, key, key_len, b->sb.data, b->sb.size);
  st__client_cbuf_destroy(b);
  return rc;
}

static int check_key(st_args_t *a, const char *key) {
  return a && key && *key ? ST_OK : ST_ERR_INVALID_ARGUMENT;
}

/* Typed setters: ST_OK, ST_ERR_INVALID_ARGUMENT (NULL map or empty key),
 * ST_ERR_OUT_OF_MEMORY. */
ST_API int st_args_nil(st_args_t *a, const char *key) {
  if (check_key(a, key)) return ST_ERR_INVALID_ARGUMENT;
  st__cbuf_t b;
  st__client_cbuf_init(&b);
  msgpack_pack_nil(&b.pk);
  return set_from(a, key, strlen(key), &b);
}

/* key = boolean (v != 0). */
ST_API int st_args_bool(st_args_t *a, const char *key, int v) {
  if (check_key(a, key)) return ST_ERR_INVALID_ARGUMENT;
  st__cbuf_t b;
  st__client_cbuf_init(&b);
  if (v)
    msgpack_pack_true(&b.pk);
  else
    msgpack_pack_false(&b.pk);
  return set_from(a, key, strlen(key), &b);
}

/* key = integer. */
ST_API int st_args_int(st_args_t *a, const char *key, int64_t v) {
  if (check_key(a, key)) return ST_ERR_INVALID_ARGUMENT;
  st__cbuf_t b;
  st__client_cbuf_init(&b);
  msgpack_pack_int64(&b.pk, v);
  return set_from(a, key, strlen(key), &b);
}

/* key = float (a msgpack float64). */
ST_API int st_args_float(st_args_t *a, const char *key, double v) {
  if (check_key(a, key)) return ST_ERR_INVALID_ARGUMENT;
  st__cbuf_t b;
  st__client_cbuf_init(&b);
  msgpack_pack_double(&b.pk, v);
  return set_from(a, key, strlen(key), &b);
}

/* key = a copy of the NUL-terminated string v. */
ST_API int st_args_string(st_args_t *a, const char *key, const char *v) {
  if (check_key(a, key) || !v) return ST_ERR_INVALID_ARGUMENT;
  st__cbuf_t b;
  st__client_cbuf_init(&b);
  msgpack_pack_str_with_body(&b.pk, v, strlen(v));
  return set_from(a, key, strlen(key), &b);
}

/* ------------------------------------------------------------ key=value */

/* Every failure of argument parsing is INVALID_ARGUMENT. */
#define bad(err, errlen, ...) st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, __VA_ARGS__)

static const char *digits(const char *p) {
  while (*p >= '0' && *p <= '9') p++;
  return p;
}

/* [+-]digits: 1. [+-](digits[.digits*]|.digits)([eE][+-]digits)? with a '.'
 * or exponent: 2. Anything else: 0. */
static int number_shape(const char *s) {
  const char *p = s;
  if (*p == '+' || *p == '-') p++;
  const char *q = digits(p);
  int lead = q > p, frac = 0, dot = 0, expo = 0;
  p = q;
  if (*p == '.') {
    dot = 1;
    q = digits(p + 1);
    frac = q > p + 1;
    p = q;
  }
  if (!lead && !frac) return 0;
  if (*p == 'e' || *p == 'E') {
    p++;
    if (*p == '+' || *p == '-') p++;
    q = digits(p);
    if (q == p) return 0;
    p = q;
    expo = 1;
  }
  if (*p) return 0;
  return dot || expo ? 2 : 1;
}

static int parse_int(const char *s, int64_t *out) {
  if (number_shape(s) != 1) return -1;
  errno = 0;
  char *end;
  long long v = strtoll(s, &end, 10);
  if (errno == ERANGE || *end) return -2;
  *out = v;
  return 0;
}

static int parse_float(const char *s, int strict_shape, double *out) {
  if (!*s || (strict_shape && !number_shape(s))) return -1;
  errno = 0;
  char *end;
  double v = strtod(s, &end);
  if (*end) return -1;
  if (errno == ERANGE && isinf(v)) return -2;
  *out = v;
  return 0;
}

/* One shell word "key[:type]=value"; see client.h. */
ST_API int st_args_parse_kv(st_args_t *a, const char *word, char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (!a || !word) return bad(err, errlen, "no argument given");
  const char *eq = strchr(word, '=');
  if (!eq) return bad(err, errlen, "'%s' is not key=value", word);
  const char *colon = memchr(word, ':', (size_t)(eq - word));
  const char *key_end = colon ? colon : eq;
  size_t key_len = (size_t)(key_end - word);
  if (key_len == 0) return bad(err, errlen, "'%s' has an empty key", word);
  char type[8] = "";
  if (colon) {
    size_t tl = (size_t)(eq - colon - 1);
    if (tl == 0 || tl >= sizeof type)
      return bad(err, errlen, "'%s': unknown type '%.*s' (use int, float, bool, str or json)",
                 word, (int)tl, colon + 1);
    memcpy(type, colon + 1, tl);
    type[tl] = '\0';
  }
  const char *val = eq + 1;
  st__cbuf_t b;
  st__client_cbuf_init(&b);
  int64_t iv;
  double dv;
  int rc = ST_OK;
  if (!colon) {
    int shape = number_shape(val);
    if (shape == 1) {
      if (parse_int(val, &iv) != 0)
        rc = bad(err, errlen, "'%s': integer out of range (use :float= or :str=)", word);
      else
        msgpack_pack_int64(&b.pk, iv);
    } else if (shape == 2) {
      if (parse_float(val, 1, &dv) != 0)
        rc = bad(err, errlen, "'%s': float out of range", word);
      else
        msgpack_pack_double(&b.pk, dv);
    } else if (strcmp(val, "true") == 0) {
      msgpack_pack_true(&b.pk);
    } else if (strcmp(val, "false") == 0) {
      msgpack_pack_false(&b.pk);
    } else if (strcmp(val, "null") == 0) {
      msgpack_pack_nil(&b.pk);
    } else {
      msgpack_pack_str_with_body(&b.pk, val, strlen(val));
    }
  } else if (strcmp(type, "int") == 0) {
    int r = parse_int(val, &iv);
    if (r == -1)
      rc = bad(err, errlen, "'%s': '%s' is not an integer", word, val);
    else if (r == -2)
      rc = bad(err, errlen, "'%s': integer out of range", word);
    else
      msgpack_pack_int64(&b.pk, iv);
  } else if (strcmp(type, "float") == 0) {
    int r = parse_float(val, 0, &dv);
    if (r == -1)
      rc = bad(err, errlen, "'%s': '%s' is not a number", word, val);
    else if (r == -2)
      rc = bad(err, errlen, "'%s': float out of range", word);
    else
      msgpack_pack_double(&b.pk, dv);
  } else if (strcmp(type, "bool") == 0) {
    if (strcmp(val, "true") == 0 || strcmp(val, "1") == 0)
      msgpack_pack_true(&b.pk);
    else if (strcmp(val, "false") == 0 || strcmp(val, "0") == 0)
      msgpack_pack_false(&b.pk);
    else
      rc = bad(err, errlen, "'%s': '%s' is not a boolean (true, false, 1 or 0)", word, val);
  } else if (strcmp(type, "str") == 0) {
    msgpack_pack_str_with_body(&b.pk, val, strlen(val));
  } else if (strcmp(type, "json") == 0) {
    char why[200];
    rc = st__client_json_pack(val, strlen(val), &b.pk, why, sizeof why);
    if (rc == ST_ERR_INVALID_ARGUMENT) bad(err, errlen, "'%.*s:json': %s", (int)key_len, word, why);
  } else {
    rc = bad(err, errlen, "'%s': unknown type '%s' (use int, float, bool, str or json)", word,
             type);
  }
  if (rc != ST_OK) {
    st__client_cbuf_destroy(&b);
    if (rc == ST_ERR_OUT_OF_MEMORY) bad(err, errlen, "out of memory");
    return rc;
  }
  rc = set_from(a, word, key_len, &b);
  if (rc == ST_ERR_OUT_OF_MEMORY) bad(err, errlen, "out of memory");
  return rc;
}

static int member_cb(void *ud, const char *key, size_t key_len, const void *value,
                     size_t value_len) {
  if (key_len == 0) return ST_ERR_INVALID_ARGUMENT;
  return st__client_args_set_raw(ud, key, key_len, value, value_len);
}

/* A JSON object whose members become arguments; see client.h. */
ST_API int st_args_parse_json(st_args_t *a, const char *json, char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (!a || !json) return bad(err, errlen, "no JSON given");
  int rc = st__client_json_members(json, strlen(json), member_cb, a, err, errlen);
  if (rc == ST_ERR_OUT_OF_MEMORY) bad(err, errlen, "out of memory");
  return rc;
}
