/* src/mem/safetensors_json.c: a small strict JSON reader for safetensors
 * headers and shard indexes (safetensors.h).
 *
 * RFC 8259 and nothing more: one value, then only whitespace; no comments,
 * no trailing commas, no NaN or Infinity, no leading zeros, no control
 * characters in strings, valid UTF-8 (no overlong forms, no surrogates),
 * \u escapes with surrogate pairs combined and lone surrogates refused.
 * Nesting is limited to 64 levels and a document to 8 Mi values, so a
 * hostile header cannot exhaust the stack or memory.
 *
 * The reader does no I/O: it is fed bytes. Nodes live in one array and are
 * linked first-child / next-sibling; decoded strings live in one buffer no
 * larger than the input. Object keys may repeat here; callers decide what
 * a repeat means.
 *
 * Contracts of the non-static functions: their comments in safetensors.h.
 */
#include "mem/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64
#define MAX_NODES (8u << 20)

typedef struct reader {
  const unsigned char *s;
  size_t len, pos;
  st__json_t *doc;
  char *err;
  size_t errlen;
  int rc;
} reader_t;

static int fail_at(reader_t *r, size_t pos, const char *what) {
  if (r->rc == ST_OK) {
    r->rc = ST_ERR_INVALID_ARGUMENT;
    snprintf(r->err, r->errlen, "invalid JSON at byte %zu: %s", pos, what);
  }
  return -1;
}

static void skip_ws(reader_t *r) {
  while (r->pos < r->len) {
    unsigned char c = r->s[r->pos];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
    r->pos++;
  }
}

/* Appends a node; returns its index or 0 on failure (0 is the root, which
 * is always created first, so it never collides with a failure). */
static uint32_t new_node(reader_t *r, st__json_type_t type) {
  st__json_t *d = r->doc;
  if (d->n >= MAX_NODES) {
    fail_at(r, r->pos, "too many values (more than 8388608)");
    return 0;
  }
  if (d->n == d->cap) {
    size_t cap = d->cap ? d->cap * 2 : 64;
    st__json_node_t *nodes = realloc(d->nodes, cap * sizeof *nodes);
    if (!nodes) {
      r->rc = ST_ERR_OUT_OF_MEMORY;
      snprintf(r->err, r->errlen, "out of memory reading JSON");
      return 0;
    }
    d->nodes = nodes;
    d->cap = cap;
  }
  st__json_node_t *n = &d->nodes[d->n];
  memset(n, 0, sizeof *n);
  n->type = type;
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

/* Length of the valid UTF-8 sequence at p (at most `left` bytes), 0 when
 * invalid (overlong, surrogate, past U+10FFFF, truncated). */
static size_t utf8_len(const unsigned char *p, size_t left) {
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
    if (c < 0x20) return fail_at(r, r->pos, "control character in a string");
    if (c == '\\') {
      if (r->pos + 1 >= r->len) return fail_at(r, start, "unterminated string");
      unsigned char e = r->s[r->pos + 1];
      r->pos += 2;
      switch (e) {
      case '"': *o++ = '"'; break;
      case '\\': *o++ = '\\'; break;
      case '/': *o++ = '/'; break;
      case 'b': *o++ = '\b'; break;
      case 'f': *o++ = '\f'; break;
      case 'n': *o++ = '\n'; break;
      case 'r': *o++ = '\r'; break;
      case 't': *o++ = '\t'; break;
      case 'u': {
        unsigned cp = 0, lo = 0;
        if (r->pos + 4 > r->len || hex4(r->s + r->pos, &cp) != 0)
          return fail_at(r, r->pos - 2, "bad \\u escape");
        r->pos += 4;
        if (cp >= 0xdc00 && cp <= 0xdfff) return fail_at(r, r->pos - 6, "lone low surrogate");
        if (cp >= 0xd800 && cp <= 0xdbff) {
          if (r->pos + 6 > r->len || r->s[r->pos] != '\\' || r->s[r->pos + 1] != 'u' ||
              hex4(r->s + r->pos + 2, &lo) != 0 || lo < 0xdc00 || lo > 0xdfff)
            return fail_at(r, r->pos - 6, "high surrogate without its low surrogate");
          r->pos += 6;
          cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        o = put_utf8(o, cp);     /* never longer than the escape it replaces */
        break;
      }
      default:
        return fail_at(r, r->pos - 2, "bad escape");
      }
      continue;
    }
    size_t n = utf8_len(r->s + r->pos, r->len - r->pos);
    if (n == 0) return fail_at(r, r->pos, "invalid UTF-8");
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

static int read_number(reader_t *r, uint32_t node) {
  size_t start = r->pos;
  const unsigned char *s = r->s;
  size_t p = r->pos;
  if (p < r->len && s[p] == '-') p++;
  if (p >= r->len || !(s[p] >= '0' && s[p] <= '9')) return fail_at(r, start, "bad number");
  if (s[p] == '0') {
    p++;
    if (p < r->len && s[p] >= '0' && s[p] <= '9') return fail_at(r, start, "leading zero");
  } else {
    while (p < r->len && s[p] >= '0' && s[p] <= '9') p++;
  }
  if (p < r->len && s[p] == '.') {
    p++;
    if (p >= r->len || !(s[p] >= '0' && s[p] <= '9')) return fail_at(r, start, "bad fraction");
    while (p < r->len && s[p] >= '0' && s[p] <= '9') p++;
  }
  if (p < r->len && (s[p] == 'e' || s[p] == 'E')) {
    p++;
    if (p < r->len && (s[p] == '+' || s[p] == '-')) p++;
    if (p >= r->len || !(s[p] >= '0' && s[p] <= '9')) return fail_at(r, start, "bad exponent");
    while (p < r->len && s[p] >= '0' && s[p] <= '9') p++;
  }
  r->doc->nodes[node].str = (const char *)s + start;
  r->doc->nodes[node].len = p - start;
  r->pos = p;
  return 0;
}

static int read_value(reader_t *r, uint32_t *out, int depth);

/* Reads an array or object at r->pos into node `node`. */
static int read_container(reader_t *r, uint32_t node, int object, int depth) {
  size_t start = r->pos++;
  uint32_t last = 0, count = 0;
  skip_ws(r);
  if (r->pos < r->len && r->s[r->pos] == (object ? '}' : ']')) {
    r->pos++;
    return 0;
  }
  for (;;) {
    skip_ws(r);
    const char *key = NULL;
    size_t key_len = 0;
    if (object) {
      if (r->pos >= r->len) return fail_at(r, start, "unterminated object");
      if (r->s[r->pos] != '"') return fail_at(r, r->pos, "expected a string key");
      if (read_string(r, &key, &key_len) != 0) return -1;
      skip_ws(r);
      if (r->pos >= r->len || r->s[r->pos] != ':') return fail_at(r, r->pos, "expected ':'");
      r->pos++;
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
    if (r->pos >= r->len)
      return fail_at(r, start, object ? "unterminated object" : "unterminated array");
    unsigned char c2 = r->s[r->pos++];
    if (c2 == ',') continue;
    if (c2 == (object ? '}' : ']')) break;
    return fail_at(r, r->pos - 1, object ? "expected ',' or '}'" : "expected ',' or ']'");
  }
  r->doc->nodes[node].count = count;
  return 0;
}

static int match_word(reader_t *r, const char *w) {
  size_t n = strlen(w);
  if (r->len - r->pos < n || memcmp(r->s + r->pos, w, n) != 0) return 0;
  r->pos += n;
  return 1;
}

static int read_value(reader_t *r, uint32_t *out, int depth) {
  if (depth > MAX_DEPTH) return fail_at(r, r->pos, "nested deeper than 64 levels");
  skip_ws(r);
  if (r->pos >= r->len) return fail_at(r, r->pos, "expected a value");
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
    if (c == '-' || (c >= '0' && c <= '9')) t = ST__JSON_NUMBER;
    else return fail_at(r, r->pos, "expected a value");
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
  case ST__JSON_TRUE: return match_word(r, "true") ? 0 : fail_at(r, r->pos, "expected a value");
  case ST__JSON_FALSE: return match_word(r, "false") ? 0 : fail_at(r, r->pos, "expected a value");
  default: return match_word(r, "null") ? 0 : fail_at(r, r->pos, "expected a value");
  }
}

/* See safetensors.h. Any thread. */
int st__json_parse(const char *text, size_t len, st__json_t *doc, char *err, size_t errlen) {
  char dummy[1];
  if (!err) { err = dummy; errlen = sizeof dummy; }
  memset(doc, 0, sizeof *doc);
  /* Decoded strings (with their NULs) never outgrow the quoted input. */
  doc->strs = malloc(len + 1);
  if (!doc->strs) {
    snprintf(err, errlen, "out of memory reading JSON");
    return ST_ERR_OUT_OF_MEMORY;
  }
  reader_t r = {(const unsigned char *)text, len, 0, doc, err, errlen, ST_OK};
  uint32_t root = 0;
  if (read_value(&r, &root, 1) == 0) {
    skip_ws(&r);
    if (r.pos != r.len) fail_at(&r, r.pos, "unexpected data after the value");
  }
  if (r.rc != ST_OK) {
    st__json_free(doc);
    return r.rc;
  }
  return ST_OK;
}

/* See safetensors.h. NULL members are fine. Any thread. */
void st__json_free(st__json_t *doc) {
  free(doc->nodes);
  free(doc->strs);
  memset(doc, 0, sizeof *doc);
}

/* See safetensors.h. Any thread. */
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
