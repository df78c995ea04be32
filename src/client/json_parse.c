/* src/client: a small strict JSON parser (RFC 8259) that packs msgpack.
 *
 * Used for `stcli call --args-json` and "key:json=" words. Strict: no
 * comments, no trailing commas, no NaN, no duplicate object keys, strings
 * must be valid UTF-8 (escapes included: lone surrogates are refused).
 * Nesting is limited to ST_MAX_DEPTH. Errors say what was expected and
 * where: "expected ':' after an object key at line 1, column 7".
 *
 * msgpack needs the element count of a container before its elements, so
 * a container is scanned once without packing (which also validates it)
 * and then parsed again with the packer. That is O(size x depth), fine for
 * argument texts.
 *
 * Integers without fraction or exponent become msgpack integers (int64, or
 * uint64 above INT64_MAX); anything else a double.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_internal.h"

typedef struct jp {
  const char *s;
  size_t len, pos;
  char *err;
  size_t errlen;
  st__text_t str;             /* scratch: the string being decoded */
} jp_t;

static int jp_error(jp_t *p, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int jp_error(jp_t *p, size_t at, const char *fmt, ...) {
  if (p->err && p->errlen) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < p->len; i++) {
      if (p->s[i] == '\n') {
        line++;
        col = 1;
      } else {
        col++;
      }
    }
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(p->err, p->errlen, "%s at line %zu, column %zu", msg, line, col);
  }
  return ST_ERR_INVALID_ARGUMENT;
}

static int jp_oom(jp_t *p) {
  if (p->err && p->errlen) snprintf(p->err, p->errlen, "out of memory");
  return ST_ERR_OUT_OF_MEMORY;
}

static void skip_ws(jp_t *p) {
  while (p->pos < p->len) {
    char ch = p->s[p->pos];
    if (ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r') break;
    p->pos++;
  }
}

/* Describes the character at pos for messages. */
static const char *found(jp_t *p, char *buf, size_t n) {
  if (p->pos >= p->len) return "the end of the input";
  unsigned char ch = (unsigned char)p->s[p->pos];
  if (ch >= 0x20 && ch < 0x7f)
    snprintf(buf, n, "'%c'", ch);
  else
    snprintf(buf, n, "byte 0x%02x", ch);
  return buf;
}

static int expect_error(jp_t *p, const char *what) {
  char b[16];
  if (p->pos >= p->len) return jp_error(p, p->pos, "unexpected end of input (expected %s)", what);
  return jp_error(p, p->pos, "expected %s but found %s", what, found(p, b, sizeof b));
}

static int hex4(const char *s, unsigned *out) {
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char ch = s[i];
    v <<= 4;
    if (ch >= '0' && ch <= '9') v |= (unsigned)(ch - '0');
    else if (ch >= 'a' && ch <= 'f') v |= (unsigned)(ch - 'a' + 10);
    else if (ch >= 'A' && ch <= 'F') v |= (unsigned)(ch - 'A' + 10);
    else return -1;
  }
  *out = v;
  return 0;
}

static void put_utf8(st__text_t *t, unsigned cp) {
  char b[4];
  size_t n;
  if (cp < 0x80) {
    b[0] = (char)cp;
    n = 1;
  } else if (cp < 0x800) {
    b[0] = (char)(0xc0 | (cp >> 6));
    b[1] = (char)(0x80 | (cp & 0x3f));
    n = 2;
  } else if (cp < 0x10000) {
    b[0] = (char)(0xe0 | (cp >> 12));
    b[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
    b[2] = (char)(0x80 | (cp & 0x3f));
    n = 3;
  } else {
    b[0] = (char)(0xf0 | (cp >> 18));
    b[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    b[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    b[3] = (char)(0x80 | (cp & 0x3f));
    n = 4;
  }
  st__client_text_put(t, b, n);
}

/* Decodes the string at pos (which is '"') into p->str. */
static int parse_string(jp_t *p) {
  size_t start = p->pos;
  p->pos++;
  p->str.len = 0;
  if (p->str.ptr) p->str.ptr[0] = '\0';
  st__client_text_put(&p->str, "", 0);
  for (;;) {
    if (p->pos >= p->len) return jp_error(p, start, "unterminated string");
    unsigned char ch = (unsigned char)p->s[p->pos];
    if (ch == '"') {
      p->pos++;
      return p->str.oom ? jp_oom(p) : ST_OK;
    }
    if (ch < 0x20)
      return jp_error(p, p->pos, "control character 0x%02x in a string (escape it)", ch);
    if (ch == '\\') {
      if (p->pos + 1 >= p->len) return jp_error(p, start, "unterminated string");
      char e = p->s[p->pos + 1];
      const char *rep = NULL;
      switch (e) {
      case '"': rep = "\""; break;
      case '\\': rep = "\\"; break;
      case '/': rep = "/"; break;
      case 'b': rep = "\b"; break;
      case 'f': rep = "\f"; break;
      case 'n': rep = "\n"; break;
      case 'r': rep = "\r"; break;
      case 't': rep = "\t"; break;
      case 'u': break;
      default:
        return jp_error(p, p->pos, "invalid escape '\\%c' in a string",
                        e >= 0x20 && e < 0x7f ? e : '?');
      }
      if (rep) {
        st__client_text_put(&p->str, rep, 1);
        p->pos += 2;
        continue;
      }
      unsigned cp;
      if (p->pos + 6 > p->len || hex4(p->s + p->pos + 2, &cp) != 0)
        return jp_error(p, p->pos, "'\\u' needs four hex digits");
      size_t at = p->pos;
      p->pos += 6;
      if (cp >= 0xdc00 && cp <= 0xdfff) return jp_error(p, at, "lone low surrogate \\u%04x", cp);
      if (cp >= 0xd800 && cp <= 0xdbff) {
        unsigned lo;
        if (p->pos + 6 > p->len || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u' ||
            hex4(p->s + p->pos + 2, &lo) != 0 || lo < 0xdc00 || lo > 0xdfff)
          return jp_error(p, at, "high surrogate \\u%04x is not followed by a low one", cp);
        p->pos += 6;
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
      }
      put_utf8(&p->str, cp);
      continue;
    }
    size_t n = st__client_utf8_len((const unsigned char *)p->s + p->pos, p->len - p->pos);
    if (n == 0) return jp_error(p, p->pos, "invalid UTF-8 in a string");
    st__client_text_put(&p->str, p->s + p->pos, n);
    p->pos += n;
  }
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int parse_number(jp_t *p, msgpack_packer *pk) {
  size_t start = p->pos, i = p->pos;
  int integral = 1;
  if (i < p->len && p->s[i] == '-') i++;
  if (i >= p->len || !is_digit(p->s[i])) return jp_error(p, start, "invalid number");
  if (p->s[i] == '0') {
    i++;
    if (i < p->len && is_digit(p->s[i]))
      return jp_error(p, start, "numbers cannot have leading zeros");
  } else {
    while (i < p->len && is_digit(p->s[i])) i++;
  }
  if (i < p->len && p->s[i] == '.') {
    integral = 0;
    i++;
    if (i >= p->len || !is_digit(p->s[i]))
      return jp_error(p, i, "a digit must follow the decimal point");
    while (i < p->len && is_digit(p->s[i])) i++;
  }
  if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
    integral = 0;
    i++;
    if (i < p->len && (p->s[i] == '+' || p->s[i] == '-')) i++;
    if (i >= p->len || !is_digit(p->s[i]))
      return jp_error(p, i, "a digit must follow the exponent");
    while (i < p->len && is_digit(p->s[i])) i++;
  }
  p->pos = i;
  if (!pk) return ST_OK;
  size_t n = i - start;
  char small[64], *buf = small;
  if (n >= sizeof small && !(buf = malloc(n + 1))) return jp_oom(p);
  memcpy(buf, p->s + start, n);
  buf[n] = '\0';
  int rc = ST_OK;
  char *end;
  errno = 0;
  if (integral && buf[0] == '-') {
    long long v = strtoll(buf, &end, 10);
    if (errno == ERANGE)
      msgpack_pack_double(pk, strtod(buf, &end));
    else
      msgpack_pack_int64(pk, v);
  } else if (integral) {
    unsigned long long v = strtoull(buf, &end, 10);
    if (errno == ERANGE)
      msgpack_pack_double(pk, strtod(buf, &end));
    else
      msgpack_pack_uint64(pk, v);
  } else {
    double v = strtod(buf, &end);
    if (errno == ERANGE && (v > 1.0 || v < -1.0))
      rc = jp_error(p, start, "number out of range");
    else
      msgpack_pack_double(pk, v);
  }
  if (buf != small) free(buf);
  return rc;
}

static int parse_value(jp_t *p, msgpack_packer *pk, int depth);

/* Keys seen in one object, for the duplicate check. */
typedef struct keyset {
  char **keys;
  size_t *lens;
  size_t n, cap;
} keyset_t;

static void keyset_free(keyset_t *k) {
  for (size_t i = 0; i < k->n; i++) free(k->keys[i]);
  free(k->keys);
  free(k->lens);
}

/* 1 if new and added, 0 if a duplicate, -1 when out of memory. */
static int keyset_add(keyset_t *k, const char *s, size_t n) {
  for (size_t i = 0; i < k->n; i++)
    if (k->lens[i] == n && memcmp(k->keys[i], s, n) == 0) return 0;
  if (k->n == k->cap) {
    size_t cap = k->cap ? k->cap * 2 : 8;
    char **a = realloc(k->keys, cap * sizeof *a);
    if (!a) return -1;
    k->keys = a;
    size_t *b = realloc(k->lens, cap * sizeof *b);
    if (!b) return -1;
    k->lens = b;
    k->cap = cap;
  }
  char *c = malloc(n + 1);
  if (!c) return -1;
  memcpy(c, s, n);
  c[n] = '\0';
  k->keys[k->n] = c;
  k->lens[k->n++] = n;
  return 1;
}

/* Parses '{...}' or '[...]' at pos. With pk NULL only validates and
 * counts (*count). cb, when set (top-level members), receives each member
 * packed on its own instead of pk. */
static int parse_container(jp_t *p, msgpack_packer *pk, int depth, size_t *count,
                           st__json_member_cb cb, void *ud) {
  int object = p->s[p->pos] == '{';
  char close = object ? '}' : ']';
  if (depth > ST_MAX_DEPTH)
    return jp_error(p, p->pos, "nested deeper than %d levels", ST_MAX_DEPTH);
  p->pos++;
  keyset_t seen = {0};
  size_t n = 0;
  int rc = ST_OK;
  skip_ws(p);
  if (p->pos < p->len && p->s[p->pos] == close) {
    p->pos++;
    *count = 0;
    return ST_OK;
  }
  for (;;) {
    skip_ws(p);
    if (object) {
      if (p->pos >= p->len || p->s[p->pos] != '"') {
        rc = expect_error(p, n ? "a string key" : "a string key or '}'");
        break;
      }
      size_t at = p->pos;
      if ((rc = parse_string(p)) != ST_OK) break;
      int added = keyset_add(&seen, p->str.ptr, p->str.len);
      if (added < 0) {
        rc = jp_oom(p);
        break;
      }
      if (added == 0) {
        rc = jp_error(p, at, "duplicate key \"%.40s\"", p->str.ptr);
        break;
      }
      if (cb && p->str.len == 0) {
        rc = jp_error(p, at, "an argument name cannot be empty");
        break;
      }
      if (pk) msgpack_pack_str_with_body(pk, p->str.ptr, p->str.len);
      skip_ws(p);
      if (p->pos >= p->len || p->s[p->pos] != ':') {
        rc = expect_error(p, "':' after an object key");
        break;
      }
      p->pos++;
      skip_ws(p);
    }
    if (cb) {
      st__cbuf_t b;
      st__client_cbuf_init(&b);
      rc = parse_value(p, &b.pk, depth + 1);
      if (rc == ST_OK && b.oom) rc = jp_oom(p);
      if (rc == ST_OK) {
        const char *key = seen.keys[seen.n - 1];
        rc = cb(ud, key, seen.lens[seen.n - 1], b.sb.data, b.sb.size);
        if (rc == ST_ERR_OUT_OF_MEMORY) jp_oom(p);
        else if (rc != ST_OK) jp_error(p, p->pos, "argument \"%.40s\" was refused", key);
      }
      st__client_cbuf_destroy(&b);
    } else {
      rc = parse_value(p, pk, depth + 1);
    }
    if (rc != ST_OK) break;
    n++;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == ',') {
      p->pos++;
      skip_ws(p);
      if (p->pos < p->len && p->s[p->pos] == close) {
        rc = jp_error(p, p->pos, "trailing comma before '%c'", close);
        break;
      }
      continue;
    }
    if (p->pos < p->len && p->s[p->pos] == close) {
      p->pos++;
      break;
    }
    rc = expect_error(p, object ? "',' or '}'" : "',' or ']'");
    break;
  }
  keyset_free(&seen);
  *count = n;
  return rc;
}

static int literal(jp_t *p, const char *word) {
  size_t n = strlen(word);
  if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) {
    char b[16];
    return jp_error(p, p->pos, "unexpected %s (expected a value)", found(p, b, sizeof b));
  }
  p->pos += n;
  return ST_OK;
}

/* One value at pos. pk NULL: validate only. `depth` is the nesting level
 * a container found here would have (the outermost is 1). */
static int parse_value(jp_t *p, msgpack_packer *pk, int depth) {
  skip_ws(p);
  if (p->pos >= p->len) return jp_error(p, p->pos, "unexpected end of input (expected a value)");
  char ch = p->s[p->pos];
  int rc;
  switch (ch) {
  case '{':
  case '[': {
    size_t n, start = p->pos;
    if (!pk) return parse_container(p, NULL, depth, &n, NULL, NULL);
    if ((rc = parse_container(p, NULL, depth, &n, NULL, NULL)) != ST_OK) return rc;
    p->pos = start;
    if (ch == '{')
      msgpack_pack_map(pk, n);
    else
      msgpack_pack_array(pk, n);
    return parse_container(p, pk, depth, &n, NULL, NULL);
  }
  case '"':
    if ((rc = parse_string(p)) != ST_OK) return rc;
    if (pk) msgpack_pack_str_with_body(pk, p->str.ptr, p->str.len);
    return ST_OK;
  case 't':
    if ((rc = literal(p, "true")) == ST_OK && pk) msgpack_pack_true(pk);
    return rc;
  case 'f':
    if ((rc = literal(p, "false")) == ST_OK && pk) msgpack_pack_false(pk);
    return rc;
  case 'n':
    if ((rc = literal(p, "null")) == ST_OK && pk) msgpack_pack_nil(pk);
    return rc;
  default:
    if (ch == '-' || is_digit(ch)) return parse_number(p, pk);
    {
      char b[16];
      return jp_error(p, p->pos, "unexpected %s (expected a value)", found(p, b, sizeof b));
    }
  }
}

static int finish(jp_t *p, int rc) {
  if (rc == ST_OK) {
    skip_ws(p);
    if (p->pos < p->len) {
      char b[16];
      rc = jp_error(p, p->pos, "unexpected %s after the JSON value", found(p, b, sizeof b));
    }
  }
  if (rc == ST_OK && p->str.oom) rc = jp_oom(p);
  free(p->str.ptr);
  return rc;
}

/* See client_internal.h. Any thread. */
int st__client_json_pack(const char *text, size_t len, msgpack_packer *pk, char *err,
                         size_t errlen) {
  jp_t p = {.s = text, .len = len, .err = err, .errlen = errlen};
  if (err && errlen) err[0] = '\0';
  return finish(&p, parse_value(&p, pk, 1));
}

/* See client_internal.h. Any thread. */
int st__client_json_members(const char *text, size_t len, st__json_member_cb cb, void *ud,
                            char *err, size_t errlen) {
  jp_t p = {.s = text, .len = len, .err = err, .errlen = errlen};
  if (err && errlen) err[0] = '\0';
  skip_ws(&p);
  if (p.pos >= p.len || p.s[p.pos] != '{') {
    int rc = expect_error(&p, "a JSON object");
    free(p.str.ptr);
    return rc;
  }
  size_t n;
  return finish(&p, parse_container(&p, NULL, 1, &n, cb, ud));
}
