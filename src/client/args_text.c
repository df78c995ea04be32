/* src/client: arguments from text: shell words "key[:type]=value"
 * (st_args_parse_kv) and JSON objects (st_args_parse_json), for stcli and
 * anyone who holds arguments as text.
 *
 * JSON is read by the tree's one JSON reader (src/common/json.c) into a
 * document, checked whole (duplicate keys, numbers msgpack cannot hold,
 * empty argument names), then packed: integers without fraction or
 * exponent become msgpack integers (int64, or uint64 above INT64_MAX; a
 * larger magnitude a double), anything else a double; null stays nil at
 * every level.
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
#include "common/json.h"

/* Every failure of argument parsing is INVALID_ARGUMENT. */
#define bad(err, errlen, ...) st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, __VA_ARGS__)

/* ----------------------------------------------------------------- JSON */

typedef struct conv {
  const char *text;            /* the JSON text, for positions */
  const st__json_t *doc;
  char *err;
  size_t errlen;
} conv_t;

static int conv_fail(conv_t *c, const st__json_node_t *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int conv_fail(conv_t *c, const st__json_node_t *n, const char *fmt, ...) {
  char what[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  size_t line, col;
  st__json_line_col(c->text, n->at, &line, &col);
  return bad(c->err, c->errlen, "%s at line %zu, column %zu", what, line, col);
}

/* A number node as msgpack (pk NULL: only checks that it fits). */
static int pack_number(conv_t *c, const st__json_node_t *n, msgpack_packer *pk) {
  char small[64], *buf = small;
  if (n->len >= sizeof small && !(buf = malloc(n->len + 1)))
    return st__fail(ST_ERR_OUT_OF_MEMORY, c->err, c->errlen, "out of memory");
  memcpy(buf, n->str, n->len);
  buf[n->len] = '\0';
  int integral = strpbrk(buf, ".eE") == NULL, rc = ST_OK;
  char *end;
  errno = 0;
  if (integral && buf[0] == '-') {
    long long v = strtoll(buf, &end, 10);
    if (errno != ERANGE) {
      if (pk) msgpack_pack_int64(pk, v);
      goto done;
    }
  } else if (integral) {
    unsigned long long v = strtoull(buf, &end, 10);
    if (errno != ERANGE) {
      if (pk) msgpack_pack_uint64(pk, v);
      goto done;
    }
  }
  errno = 0;
  double d = strtod(buf, &end);
  if (errno == ERANGE && fabs(d) > 1.0)
    rc = conv_fail(c, n, "number out of range: %.40s", buf);
  else if (pk)
    msgpack_pack_double(pk, d);
done:
  if (buf != small) free(buf);
  return rc;
}

/* Checks the value at n (pk NULL) or packs it. */
static int pack_node(conv_t *c, const st__json_node_t *n, msgpack_packer *pk) {
  const st__json_node_t *nodes = c->doc->nodes;
  switch (n->type) {
  case ST__JSON_NULL: if (pk) msgpack_pack_nil(pk); return ST_OK;
  case ST__JSON_FALSE: if (pk) msgpack_pack_false(pk); return ST_OK;
  case ST__JSON_TRUE: if (pk) msgpack_pack_true(pk); return ST_OK;
  case ST__JSON_NUMBER: return pack_number(c, n, pk);
  case ST__JSON_STRING: if (pk) msgpack_pack_str_with_body(pk, n->str, n->len); return ST_OK;
  case ST__JSON_ARRAY:
  case ST__JSON_OBJECT: break;
  }
  int object = n->type == ST__JSON_OBJECT;
  if (pk && object) msgpack_pack_map(pk, n->count);
  else if (pk) msgpack_pack_array(pk, n->count);
  for (uint32_t i = n->first, k = 0; k < n->count; i = nodes[i].next, k++) {
    const st__json_node_t *e = &nodes[i];
    if (object && !pk) {
      for (uint32_t j = n->first; j != i; j = nodes[j].next)
        if (nodes[j].key_len == e->key_len && memcmp(nodes[j].key, e->key, e->key_len) == 0)
          return conv_fail(c, e, "duplicate key \"%.40s\"", e->key);
    }
    if (object && pk) msgpack_pack_str_with_body(pk, e->key, e->key_len);
    int rc = pack_node(c, e, pk);
    if (rc != ST_OK) return rc;
  }
  return ST_OK;
}

/* Parses `len` bytes of JSON into *doc (caller frees) and checks it. */
static int read_json(conv_t *c, const char *text, size_t len, st__json_t *doc) {
  int rc = st__json_read(text, len, ST_MAX_DEPTH, doc, c->err, c->errlen);
  if (rc != ST_OK) return rc;
  c->text = text;
  c->doc = doc;
  rc = pack_node(c, &doc->nodes[0], NULL);
  if (rc != ST_OK) st__json_free(doc);
  return rc;
}

/* One JSON value packed with pk (a "key:json=" word). */
static int json_value(const char *text, msgpack_packer *pk, char *err, size_t errlen) {
  conv_t c = {.err = err, .errlen = errlen};
  st__json_t doc;
  int rc = read_json(&c, text, strlen(text), &doc);
  if (rc != ST_OK) return rc;
  pack_node(&c, &doc.nodes[0], pk);
  st__json_free(&doc);
  return ST_OK;
}

/* Refuses text arguments while a list or map is being built. */
static int check_closed(st_args_t *a, char *err, size_t errlen) {
  if (!st__client_args_open(a)) return ST_OK;
  return bad(err, errlen, "a list or map is open (st_args_end it first)");
}

/* A JSON object whose members become arguments; see client.h. */
ST_API int st_args_parse_json(st_args_t *a, const char *json, char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (!a || !json) return bad(err, errlen, "no JSON given");
  if (check_closed(a, err, errlen) != ST_OK) return ST_ERR_INVALID_ARGUMENT;
  size_t len = strlen(json), at = strspn(json, " \t\r\n");
  if (json[at] != '{') {
    char what[16];
    if (at == len)
      snprintf(what, sizeof what, "the end");
    else if ((unsigned char)json[at] >= 0x20 && (unsigned char)json[at] < 0x7f)
      snprintf(what, sizeof what, "'%c'", json[at]);
    else
      snprintf(what, sizeof what, "byte 0x%02x", (unsigned char)json[at]);
    size_t line, col;
    st__json_line_col(json, at, &line, &col);
    return bad(err, errlen, "expected a JSON object but found %s at line %zu, column %zu", what,
               line, col);
  }
  conv_t c = {.err = err, .errlen = errlen};
  st__json_t doc;
  int rc = read_json(&c, json, len, &doc);
  if (rc != ST_OK) return rc;
  const st__json_node_t *nodes = doc.nodes;
  for (uint32_t i = nodes[0].first, k = 0; k < nodes[0].count; i = nodes[i].next, k++)
    if (nodes[i].key_len == 0) {
      rc = conv_fail(&c, &nodes[i], "an argument name cannot be empty");
      goto out;
    }
  for (uint32_t i = nodes[0].first, k = 0; k < nodes[0].count && rc == ST_OK;
       i = nodes[i].next, k++) {
    st__cbuf_t b;
    st__client_cbuf_init(&b);
    pack_node(&c, &nodes[i], &b.pk);
    rc = b.oom ? ST_ERR_OUT_OF_MEMORY
               : st__client_args_set_raw(a, nodes[i].key, nodes[i].key_len, b.sb.data,
                                         b.sb.size);
    st__client_cbuf_destroy(&b);
  }
  if (rc == ST_ERR_OUT_OF_MEMORY) st__fail(rc, err, errlen, "out of memory");
out:
  st__json_free(&doc);
  return rc;
}

/* ------------------------------------------------------------ key=value */

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

/* The value of an untyped word, by its text. */
static int pack_inferred(const char *word, const char *val, msgpack_packer *pk, char *err,
                         size_t errlen) {
  int64_t iv;
  double dv;
  int shape = number_shape(val);
  if (shape == 1) {
    if (parse_int(val, &iv) != 0)
      return bad(err, errlen, "'%s': integer out of range (use :float= or :str=)", word);
    msgpack_pack_int64(pk, iv);
  } else if (shape == 2) {
    if (parse_float(val, 1, &dv) != 0) return bad(err, errlen, "'%s': float out of range", word);
    msgpack_pack_double(pk, dv);
  } else if (strcmp(val, "true") == 0) {
    msgpack_pack_true(pk);
  } else if (strcmp(val, "false") == 0) {
    msgpack_pack_false(pk);
  } else if (strcmp(val, "null") == 0) {
    msgpack_pack_nil(pk);
  } else {
    msgpack_pack_str_with_body(pk, val, strlen(val));
  }
  return ST_OK;
}

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* The value of a word with a forced type. */
static int pack_typed(const char *word, size_t key_len, const char *type, const char *val,
                      msgpack_packer *pk, char *err, size_t errlen) {
  int64_t iv;
  double dv;
  if (strcmp(type, "int") == 0) {
    int r = parse_int(val, &iv);
    if (r == -1) return bad(err, errlen, "'%s': '%s' is not an integer", word, val);
    if (r == -2) return bad(err, errlen, "'%s': integer out of range", word);
    msgpack_pack_int64(pk, iv);
  } else if (strcmp(type, "float") == 0) {
    int r = parse_float(val, 0, &dv);
    if (r == -1) return bad(err, errlen, "'%s': '%s' is not a number", word, val);
    if (r == -2) return bad(err, errlen, "'%s': float out of range", word);
    msgpack_pack_double(pk, dv);
  } else if (strcmp(type, "bool") == 0) {
    if (strcmp(val, "true") == 0 || strcmp(val, "1") == 0)
      msgpack_pack_true(pk);
    else if (strcmp(val, "false") == 0 || strcmp(val, "0") == 0)
      msgpack_pack_false(pk);
    else
      return bad(err, errlen, "'%s': '%s' is not a boolean (true, false, 1 or 0)", word, val);
  } else if (strcmp(type, "str") == 0) {
    msgpack_pack_str_with_body(pk, val, strlen(val));
  } else if (strcmp(type, "hex") == 0) {
    size_t n = strlen(val);
    if (n % 2) return bad(err, errlen, "'%s': hex needs two digits a byte", word);
    msgpack_pack_bin(pk, n / 2);
    for (size_t i = 0; i < n; i += 2) {
      int hi = hex_digit(val[i]), lo = hex_digit(val[i + 1]);
      if (hi < 0 || lo < 0)
        return bad(err, errlen, "'%s': '%c%c' is not a hex byte", word, val[i], val[i + 1]);
      char byte = (char)(hi << 4 | lo);
      msgpack_pack_bin_body(pk, &byte, 1);
    }
  } else if (strcmp(type, "json") == 0) {
    char why[300];
    int rc = json_value(val, pk, why, sizeof why);
    if (rc == ST_ERR_INVALID_ARGUMENT) bad(err, errlen, "'%.*s:json': %s", (int)key_len, word, why);
    return rc;
  } else {
    return bad(err, errlen, "'%s': unknown type '%s' (use int, float, bool, str, hex or json)",
               word, type);
  }
  return ST_OK;
}

/* One shell word "key[:type]=value"; see client.h. */
ST_API int st_args_parse_kv(st_args_t *a, const char *word, char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (!a || !word) return bad(err, errlen, "no argument given");
  if (check_closed(a, err, errlen) != ST_OK) return ST_ERR_INVALID_ARGUMENT;
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
      return bad(err, errlen, "'%s': unknown type '%.*s' (use int, float, bool, str, hex or json)",
                 word, (int)tl, colon + 1);
    memcpy(type, colon + 1, tl);
    type[tl] = '\0';
  }
  st__cbuf_t b;
  st__client_cbuf_init(&b);
  int rc = colon ? pack_typed(word, key_len, type, eq + 1, &b.pk, err, errlen)
                 : pack_inferred(word, eq + 1, &b.pk, err, errlen);
  if (rc == ST_OK)
    rc = b.oom ? ST_ERR_OUT_OF_MEMORY
               : st__client_args_set_raw(a, word, key_len, b.sb.data, b.sb.size);
  st__client_cbuf_destroy(&b);
  if (rc == ST_ERR_OUT_OF_MEMORY) bad(err, errlen, "out of memory");
  return rc;
}
