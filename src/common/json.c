/* src/common/json.c: the strict JSON reader (json.h).
 *
 * A recursive descent over the bytes: containers recurse (bounded by the
 * nesting limit), everything else is read in place. Nodes are appended to
 * one array and linked as they are read; strings are decoded into one
 * buffer sized from the input (a decoded string never outgrows its quoted
 * text). The first failure is kept, with its byte offset, line and column.
 *
 * Contracts of the non-static functions: their comments in json.h.
 */
#include "common/json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NODES (8u << 20)

typedef struct reader {
  const unsigned char *s;
  size_t len, pos;
  int max_depth;
  st__json_t *doc;
  int rc;
  size_t at;                   /* the first failure: where and what */
  char what[200];
} reader_t;

static int fail_at(reader_t *r, size_t pos, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail_at(reader_t *r, size_t pos, const char *fmt, ...) {
  if (r->rc == ST_OK) {
    r->rc = ST_ERR_INVALID_ARGUMENT;
    r->at = pos < r->len ? pos : r->len;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->what, sizeof r->what, fmt, ap);
    va_end(ap);
  }
  return -1;
}

/* Describes the byte at pos for messages: 'x', byte 0xNN or the end. */
static const char *found(const reader_t *r, char *buf, size_t n) {
  if (r->pos >= r->len) return "the end of the input";
  unsigned char c = r->s[r->pos];
  if (c >= 0x20 && c < 0x7f)
    snprintf(buf, n, "'%c'", c);
  else
    snprintf(buf, n, "byte 0x%02x", c);
  return buf;
}

/* "expected WHAT but found X", or the end of the input inside `where`. */
static int expected(reader_t *r, const char *what, const char *where) {
  char b[16];
  if (r->pos >= r->len)
    return fail_at(r, r->pos, "unexpected end of input%s%s (expected %s)", where ? " in an " : "",
                   where ? where : "", what);
  return fail_at(r, r->pos, "expected %s but found %s", what, found(r, b, sizeof b));
}

static void skip_ws(reader_t *r) {
  while (r->pos < r->len) {
    unsigned char c = r->s[r->pos];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
    r->pos++;
  }
}

/* Appends a node; returns its index, or 0 on failure (0 is the root, which
 * is always created first, so it never collides with a failure). */
static uint32_t new_node(reader_t *r, st__json_type_t type) {
  st__json_t *d = r->doc;
  if (d->n >= MAX_NODES) {
    fail_at(r, r->pos, "too many values (more than %u)", MAX_NODES);
    return 0;
  }
  if (d->n == d->cap) {
    size_t cap = d->cap ? d->cap * 2 : 64;
    st__json_node_t *nodes = realloc(d->nodes, cap * sizeof *nodes);
    if (!nodes) {
      r->rc = ST_ERR_OUT_OF_MEMORY;
      return 0;
    }
    d->nodes = nodes;
    d->cap = cap;
  }
  st__json_node_t *n = &d->nodes[d->n];
  memset(n, 0, sizeof *n);
  n->type = type;
  n->at = r->pos;
  return (uint32_t)d->n++;
}

static int hex4(const unsigned char *p, unsigned *out) {
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    unsigned char c = p[i];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
    else return -1;
  }
  *out = v;
  return 0;
}

static char *put_utf8(char *o, unsigned cp) {
  if (cp < 0x80) {
    *o++ = (char)cp;
  } else if (cp < 0x800) {
    *o++ = (char)(0xc0 | (cp >> 6));
    *o++ = (char)(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    *o++ = (char)(0xe0 | (cp >> 12));
    *o++ = (char)(0x80 | ((cp >> 6) & 0x3f));
    *o++ = (char)(0x80 | (cp & 0x3f));
  } else {
    *o++ = (char)(0xf0 | (cp >> 18));
    *o++ = (char)(0x80 | ((cp >> 12) & 0x3f));
    *o++ = (char)(0x80 | ((cp >> 6) & 0x3f));
    *o++ = (char)(0x80 | (cp & 0x3f));
  }
  return o;
}

/* See json.h. Any thread. */
size_t st__utf8_len(const unsigned char *p, size_t left) {
  unsigned char c = p[0];
  size_t n;
  unsigned cp;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) { n = 2; cp = c & 0x1f; }
  else if (c >= 0xe0 && c <= 0xef) { n = 3; cp = c & 0x0f; }
  else if (c >= 0xf0 && c <= 0xf4) { n = 4; cp = c & 0x07; }
  else return 0;
  if (left < n) return 0;
  for (size_t i = 1; i < n; i++) {
    if ((p[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (p[i] & 0x3f);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff))) return 0;
  if (cp >= 0xd800 && cp <= 0xdfff) return 0;
  return n;
}

/* See json.h. Any thread. */
const char *st__json_escape(unsigned char c, char buf[8]) {
  switch (c) {
  case '"': return "\\\"";
  case '\\': return "\\\\";
  case '\n': return "\\n";
  case '\r': return "\\r";
  case '\t': return "\\t";
  case '\b': return "\\b";
  case '\f': return "\\f";
  default:
    if (c >= 0x20) return NULL;
    snprintf(buf, 8, "\\u%04x", c);
    return buf;
  }
}

/* See json.h. Any thread. */
void st__json_double_text(double d, int min_digits, char *buf, size_t len) {
  for (int prec = min_digits; prec <= 17; prec++) {
    snprintf(buf, len, "%.*g", prec, d);
    if (strtod(buf, NULL) == d) return;
  }
}

/* One escape after a backslash at r->pos - 2 (r->pos is past the escape
 * letter) appended at o; returns the new end, NULL on failure. */
static char *read_escape(reader_t *r, unsigned char e, char *o) {
  switch (e) {
  case '"': *o++ = '"'; return o;
  case '\\': *o++ = '\\'; return o;
  case '/': *o++ = '/'; return o;
  case 'b': *o++ = '\b'; return o;
  case 'f': *o++ = '\f'; return o;
  case 'n': *o++ = '\n'; return o;
  case 'r': *o++ = '\r'; return o;
  case 't': *o++ = '\t'; return o;
  case 'u': break;
  default:
    fail_at(r, r->pos - 2,
            "invalid escape '\\%c' in a string (bad escape: JSON has \\\" \\\\ \\/ \\b \\f \\n "
            "\\r \\t \\uXXXX)",
            e >= 0x20 && e < 0x7f ? e : '?');
    return NULL;
  }
  unsigned cp = 0, lo = 0;
  size_t at = r->pos - 2;
  if (r->pos + 4 > r->len || hex4(r->s + r->pos, &cp) != 0) {
    fail_at(r, at, "'\\u' needs four hex digits");
    return NULL;
  }
  r->pos += 4;
  if (cp >= 0xdc00 && cp <= 0xdfff) {
    fail_at(r, at, "lone low surrogate \\u%04x", cp);
    return NULL;
  }
  if (cp >= 0xd800 && cp <= 0xdbff) {
    if (r->pos + 6 > r->len || r->s[r->pos] != '\\' || r->s[r->pos + 1] != 'u' ||
        hex4(r->s + r->pos + 2, &lo) != 0 || lo < 0xdc00 || lo > 0xdfff) {
      fail_at(r, at, "high surrogate \\u%04x is not followed by a low one", cp);
      return NULL;
    }
    r->pos += 6;
    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
  }
  return put_utf8(o, cp);     /* never longer than the escape it replaces */
}

/* Reads a string at r->pos (the opening quote); out and outlen receive the decoded text. */
static int read_string(reader_t *r, const char **out, size_t *outlen) {
  size_t start = r->pos++;
  char *o = r->doc->strs + r->doc->strs_used, *o0 = o;
  for (;;) {
    if (r->pos >= r->len) return fail_at(r, start, "unterminated string");
    unsigned char c = r->s[r->pos];
    if (c == '"') {
      r->pos++;
      break;
    }
    if (c < 0x20)
      return fail_at(r, r->pos, "control character 0x%02x in a string (escape it)", c);
    if (c == '\\') {
      if (r->pos + 1 >= r->len) return fail_at(r, start, "unterminated string");
      unsigned char e = r->s[r->pos + 1];
      r->pos += 2;
      if (!(o = read_escape(r, e, o))) return -1;
      continue;
    }
    size_t n = st__utf8_len(r->s + r->pos, r->len - r->pos);
    if (n == 0) return fail_at(r, r->pos, "invalid UTF-8 in a string");
    memcpy(o, r->s + r->pos, n);
    o += n;
    r->pos += n;
  }
  *o++ = '\0';
  *out = o0;
  *outlen = (size_t)(o - o0) - 1;
  r->doc->strs_used += (size_t)(o - o0);
  return 0;
}

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static int read_number(reader_t *r, uint32_t node) {
  size_t start = r->pos;
  const unsigned char *s = r->s;
  size_t p = r->pos;
  if (p < r->len && s[p] == '-') p++;
  if (p >= r->len || !is_digit(s[p])) return fail_at(r, start, "invalid number");
  if (s[p] == '0') {
    p++;
    if (p < r->len && is_digit(s[p])) return fail_at(r, start, "numbers cannot have leading zeros");
  } else {
    while (p < r->len && is_digit(s[p])) p++;
  }
  if (p < r->len && s[p] == '.') {
    p++;
    if (p >= r->len || !is_digit(s[p]))
      return fail_at(r, p, "bad fraction: a digit must follow the decimal point");
    while (p < r->len && is_digit(s[p])) p++;
  }
  if (p < r->len && (s[p] == 'e' || s[p] == 'E')) {
    p++;
    if (p < r->len && (s[p] == '+' || s[p] == '-')) p++;
    if (p >= r->len || !is_digit(s[p]))
      return fail_at(r, p, "bad exponent: a digit must follow the exponent");
    while (p < r->len && is_digit(s[p])) p++;
  }
  r->doc->nodes[node].str = (const char *)s + start;
  r->doc->nodes[node].len = p - start;
  r->pos = p;
  return 0;
}

static int read_value(reader_t *r, uint32_t *out, int depth);

/* Reads an array or object at r->pos into node `node` (at nesting level
 * `depth`). */
static int read_container(reader_t *r, uint32_t node, int object, int depth) {
  const char *where = object ? "unterminated object" : "unterminated array";
  char close = object ? '}' : ']';
  if (depth > r->max_depth)
    return fail_at(r, r->pos, "nested deeper than %d levels", r->max_depth);
  r->pos++;
  uint32_t last = 0, count = 0;
  skip_ws(r);
  if (r->pos < r->len && r->s[r->pos] == close) {
    r->pos++;
    return 0;
  }
  for (;;) {
    skip_ws(r);
    const char *key = NULL;
    size_t key_len = 0;
    if (object) {
      const char *want = count ? "a string key" : "a string key or '}'";
      if (count && r->pos < r->len && r->s[r->pos] == '}')
        return fail_at(r, r->pos, "expected a string key but found a trailing comma before '}'");
      if (r->pos >= r->len || r->s[r->pos] != '"') return expected(r, want, where);
      if (read_string(r, &key, &key_len) != 0) return -1;
      skip_ws(r);
      if (r->pos >= r->len || r->s[r->pos] != ':')
        return expected(r, "':' after an object key", where);
      r->pos++;
    } else if (count && r->pos < r->len && r->s[r->pos] == ']') {
      return fail_at(r, r->pos, "expected a value but found a trailing comma before ']'");
    }
    uint32_t child = 0;
    if (read_value(r, &child, depth + 1) != 0) return -1;
    st__json_node_t *c = &r->doc->nodes[child];
    c->key = key;
    c->key_len = key_len;
    if (last) r->doc->nodes[last].next = child;
    else r->doc->nodes[node].first = child;
    last = child;
    count++;
    skip_ws(r);
    if (r->pos < r->len && r->s[r->pos] == ',') {
      r->pos++;
      continue;
    }
    if (r->pos < r->len && r->s[r->pos] == close) {
      r->pos++;
      break;
    }
    return expected(r, object ? "',' or '}'" : "',' or ']'", where);
  }
  r->doc->nodes[node].count = count;
  return 0;
}

static int read_word(reader_t *r, const char *w) {
  size_t n = strlen(w);
  if (r->len - r->pos < n || memcmp(r->s + r->pos, w, n) != 0) {
    char b[16];
    return fail_at(r, r->pos, "unexpected %s (expected a value)", found(r, b, sizeof b));
  }
  r->pos += n;
  return 0;
}

/* One value at r->pos; `depth` is the nesting level a container found
 * here would have (the outermost is 1). */
static int read_value(reader_t *r, uint32_t *out, int depth) {
  skip_ws(r);
  if (r->pos >= r->len) return fail_at(r, r->pos, "unexpected end of input (expected a value)");
  unsigned char c = r->s[r->pos];
  st__json_type_t t;
  switch (c) {
  case '{': t = ST__JSON_OBJECT; break;
  case '[': t = ST__JSON_ARRAY; break;
  case '"': t = ST__JSON_STRING; break;
  case 't': t = ST__JSON_TRUE; break;
  case 'f': t = ST__JSON_FALSE; break;
  case 'n': t = ST__JSON_NULL; break;
  default:
    if (c == '-' || is_digit(c)) {
      t = ST__JSON_NUMBER;
    } else {
      char b[16];
      return fail_at(r, r->pos, "unexpected %s (expected a value)", found(r, b, sizeof b));
    }
  }
  uint32_t node = new_node(r, t);
  if (r->rc != ST_OK) return -1;
  *out = node;
  switch (t) {
  case ST__JSON_OBJECT: return read_container(r, node, 1, depth);
  case ST__JSON_ARRAY: return read_container(r, node, 0, depth);
  case ST__JSON_STRING: {
    const char *s = NULL;
    size_t len = 0;
    if (read_string(r, &s, &len) != 0) return -1;
    r->doc->nodes[node].str = s;
    r->doc->nodes[node].len = len;
    return 0;
  }
  case ST__JSON_NUMBER: return read_number(r, node);
  case ST__JSON_TRUE: return read_word(r, "true");
  case ST__JSON_FALSE: return read_word(r, "false");
  default: return read_word(r, "null");
  }
}

/* Reads the document; on failure *r says why (doc freed). */
static int read_doc(reader_t *r) {
  memset(r->doc, 0, sizeof *r->doc);
  /* Decoded strings (with their NULs) never outgrow the quoted input. */
  r->doc->strs = malloc(r->len + 1);
  if (!r->doc->strs) return r->rc = ST_ERR_OUT_OF_MEMORY;
  uint32_t root = 0;
  if (read_value(r, &root, 1) == 0) {
    skip_ws(r);
    if (r->pos != r->len) {
      char b[16];
      fail_at(r, r->pos,
              "unexpected %s after the JSON value (unexpected data after the value: a JSON "
              "text holds one)",
              found(r, b, sizeof b));
    }
  }
  if (r->rc != ST_OK) st__json_free(r->doc);
  return r->rc;
}

/* Reads the document and formats a failure into err (may be NULL):
 * "[invalid JSON at byte N: ]WHAT at line L, column C". */
static int parse(const char *text, size_t len, int max_depth, int with_byte, st__json_t *doc,
                 char *err, size_t errlen) {
  reader_t r = {.s = (const unsigned char *)text, .len = len, .max_depth = max_depth, .doc = doc};
  int rc = read_doc(&r);
  if (rc == ST_OK || !err || !errlen) return rc;
  if (rc == ST_ERR_OUT_OF_MEMORY) {
    snprintf(err, errlen, "out of memory reading JSON");
    return rc;
  }
  size_t line, col;
  st__json_line_col(text, r.at, &line, &col);
  if (with_byte)
    snprintf(err, errlen, "invalid JSON at byte %zu: %s at line %zu, column %zu", r.at, r.what,
             line, col);
  else
    snprintf(err, errlen, "%s at line %zu, column %zu", r.what, line, col);
  return rc;
}

/* See json.h. Any thread. */
int st__json_parse(const char *text, size_t len, st__json_t *doc, char *err, size_t errlen) {
  return parse(text, len, ST__JSON_MAX_DEPTH, 1, doc, err, errlen);
}

/* See json.h. Any thread. */
int st__json_read(const char *text, size_t len, int max_depth, st__json_t *doc, char *err,
                  size_t errlen) {
  return parse(text, len, max_depth, 0, doc, err, errlen);
}

/* See json.h. NULL members are fine. Any thread. */
void st__json_free(st__json_t *doc) {
  free(doc->nodes);
  free(doc->strs);
  memset(doc, 0, sizeof *doc);
}

/* See json.h. Any thread. */
int st__json_uint(const st__json_node_t *n, uint64_t *out) {
  if (n->type != ST__JSON_NUMBER || n->len == 0) return -1;
  uint64_t v = 0;
  for (size_t i = 0; i < n->len; i++) {
    char c = n->str[i];
    if (c < '0' || c > '9') return -1;
    unsigned d = (unsigned)(c - '0');
    if (v > (UINT64_MAX - d) / 10) return -1;
    v = v * 10 + d;
  }
  *out = v;
  return 0;
}

/* See json.h. Any thread. */
void st__json_line_col(const char *text, size_t at, size_t *line, size_t *col) {
  size_t l = 1, c = 1;
  for (size_t i = 0; i < at; i++) {
    if (text[i] == '\n') {
      l++;
      c = 1;
    } else {
      c++;
    }
  }
  *line = l;
  *col = c;
}
