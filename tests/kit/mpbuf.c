/* See mpbuf.h: the msgpack buffer and the text reader of stt_pack.
 *
 * The reader is recursive descent over the expanded text. Arrays and maps
 * need their length before their items, so each is read twice: once with
 * no packer to count, once to pack (the texts are a few hundred bytes). */
#include "mpbuf.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st/wire.h"

void mpbuf_init(mpbuf_t *b) {
  msgpack_sbuffer_init(&b->sb);
  msgpack_packer_init(&b->pk, &b->sb, msgpack_sbuffer_write);
  msgpack_unpacked_init(&b->up);
}

const msgpack_object *mpbuf_obj(mpbuf_t *b) {
  size_t off = 0;
  msgpack_unpacked_destroy(&b->up);
  msgpack_unpacked_init(&b->up);
  if (msgpack_unpack_next(&b->up, b->sb.data, b->sb.size, &off) != MSGPACK_UNPACK_SUCCESS)
    return NULL;
  return &b->up.data;
}

void mpbuf_free(mpbuf_t *b) {
  msgpack_unpacked_destroy(&b->up);
  msgpack_sbuffer_destroy(&b->sb);
}

/* ------------------------------------------------------------ the reader */

typedef struct reader {
  const char *text, *p;
} reader_t;

static void bad(const reader_t *r, const char *what) __attribute__((noreturn));
static void bad(const reader_t *r, const char *what) {
  fprintf(stderr, "stt_pack: %s at offset %d of:\n%s\n", what, (int)(r->p - r->text), r->text);
  abort();
}

static void skip_ws(reader_t *r) {
  while (isspace((unsigned char)*r->p)) r->p++;
}

static int eat(reader_t *r, char c) {
  skip_ws(r);
  if (*r->p != c) return 0;
  r->p++;
  return 1;
}

static void expect(reader_t *r, char c) {
  if (!eat(r, c)) {
    char why[32];
    snprintf(why, sizeof why, "expected '%c'", c);
    bad(r, why);
  }
}

/* The word at p (letters, digits, '_'), as its length; 0 when none. */
static size_t word_len(const char *p) {
  size_t n = 0;
  if (!isalpha((unsigned char)*p) && *p != '_') return 0;
  while (isalnum((unsigned char)p[n]) || p[n] == '_') n++;
  return n;
}

static int word_is(reader_t *r, const char *w) {
  size_t n = strlen(w);
  if (word_len(r->p) != n || strncmp(r->p, w, n) != 0) return 0;
  r->p += n;
  return 1;
}

/* A quoted string into a malloc'ed buffer; its length in *len. */
static char *read_string(reader_t *r, size_t *len) {
  char q = *r->p++;
  char *out = malloc(strlen(r->p) + 1);
  size_t n = 0;
  while (*r->p && *r->p != q) {
    char c = *r->p++;
    if (c == '\\') {
      c = *r->p++;
      switch (c) {
      case 'n': c = '\n'; break;
      case 't': c = '\t'; break;
      case '0': c = '\0'; break;
      case 'x': {
        char hex[3] = {r->p[0], r->p[0] ? r->p[1] : '\0', '\0'};
        char *end;
        c = (char)strtol(hex, &end, 16);
        if (end != hex + 2) bad(r, "bad \\x escape");
        r->p += 2;
        break;
      }
      case '\\': case '\'': case '"': break;
      default: bad(r, "unknown escape");
      }
    }
    out[n++] = c;
  }
  if (*r->p != q) bad(r, "unterminated string");
  r->p++;
  *len = n;
  return out;
}

static void value(reader_t *r, msgpack_packer *pk);

/* Items up to `close`, comma-separated; map items are key: value. Returns
 * their count (pairs for a map). */
static uint32_t items(reader_t *r, msgpack_packer *pk, char close, int map) {
  uint32_t n = 0;
  if (eat(r, close)) return 0;
  do {
    skip_ws(r);
    size_t w = word_len(r->p);
    const char *after = r->p + w;
    while (isspace((unsigned char)*after)) after++;
    if (map && w && *after == ':') { /* a bare word key */
      if (pk) msgpack_pack_str_with_body(pk, r->p, w);
      r->p += w;
    } else {
      value(r, pk);
    }
    if (map) {
      expect(r, ':');
      value(r, pk);
    }
    n++;
  } while (eat(r, ','));
  expect(r, close);
  return n;
}

static void container(reader_t *r, msgpack_packer *pk, char close, int map) {
  const char *start = r->p;
  uint32_t n = items(r, NULL, close, map);
  if (!pk) return;
  if (map) msgpack_pack_map(pk, n);
  else msgpack_pack_array(pk, n);
  r->p = start;
  items(r, pk, close, map);
}

static long long read_int(reader_t *r) {
  skip_ws(r);
  char *end;
  long long v = strtoll(r->p, &end, 0);
  if (end == r->p) bad(r, "expected an integer");
  r->p = end;
  return v;
}

static void number(reader_t *r, msgpack_packer *pk, int f32) {
  const char *s = r->p;
  const char *q = s + (*s == '-' || *s == '+');
  size_t digits = strspn(q, "0123456789");
  int real = f32 || q[digits] == '.' || q[digits] == 'e' || q[digits] == 'E' ||
             strncmp(q, "inf", 3) == 0 || strncmp(q, "nan", 3) == 0;
  char *end;
  if (real) {
    double d = strtod(s, &end);
    if (end == s) bad(r, "expected a number");
    if (pk && f32) msgpack_pack_float(pk, (float)d);
    else if (pk) msgpack_pack_double(pk, d);
  } else if (*s == '-') {
    long long v = strtoll(s, &end, 10);
    if (end == s) bad(r, "expected a number");
    if (pk) msgpack_pack_int64(pk, v);
  } else {
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s) bad(r, "expected a number");
    if (pk) msgpack_pack_uint64(pk, v);
  }
  r->p = end;
}

static void binary(reader_t *r, msgpack_packer *pk) {
  expect(r, '(');
  skip_ws(r);
  char *bytes;
  size_t n;
  if (*r->p == '\'' || *r->p == '"') {
    bytes = read_string(r, &n);
  } else {
    n = (size_t)read_int(r);
    bytes = calloc(n ? n : 1, 1);
    for (size_t i = 0; eat(r, ','); i++) {
      long long b = read_int(r);
      if (i < n) bytes[i] = (char)b;
    }
  }
  expect(r, ')');
  if (pk) {
    msgpack_pack_bin(pk, n);
    msgpack_pack_bin_body(pk, bytes, n);
  }
  free(bytes);
}

/* ext(type, value), or the tensor form with its five fields. */
static void extension(reader_t *r, msgpack_packer *pk, int tensor) {
  static const char *const fields[] = {"arena", "offset", "dtype", "shape", "strides"};
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer in;
  msgpack_packer_init(&in, &sb, msgpack_sbuffer_write);
  long long type = ST_EXT_TENSOR;
  expect(r, '(');
  if (tensor) {
    msgpack_pack_map(&in, 5);
    for (int i = 0; i < 5; i++) {
      if (i) expect(r, ',');
      msgpack_pack_str_with_body(&in, fields[i], strlen(fields[i]));
      value(r, &in);
    }
  } else {
    type = read_int(r);
    expect(r, ',');
    value(r, &in);
  }
  expect(r, ')');
  if (pk) msgpack_pack_ext_with_body(pk, sb.data, sb.size, (int8_t)type);
  msgpack_sbuffer_destroy(&sb);
}

static void value(reader_t *r, msgpack_packer *pk) {
  skip_ws(r);
  char c = *r->p;
  if (c == '[' || c == '{') {
    r->p++;
    container(r, pk, c == '[' ? ']' : '}', c == '{');
  } else if (c == '\'' || c == '"') {
    size_t n;
    char *s = read_string(r, &n);
    if (pk) msgpack_pack_str_with_body(pk, s, n);
    free(s);
  } else if (isdigit((unsigned char)c) || c == '-' || c == '+') {
    number(r, pk, 0);
  } else if (word_is(r, "nil")) {
    if (pk) msgpack_pack_nil(pk);
  } else if (word_is(r, "true")) {
    if (pk) msgpack_pack_true(pk);
  } else if (word_is(r, "false")) {
    if (pk) msgpack_pack_false(pk);
  } else if (word_is(r, "f32")) {
    expect(r, '(');
    skip_ws(r);
    number(r, pk, 1);
    expect(r, ')');
  } else if (word_is(r, "bin")) {
    binary(r, pk);
  } else if (word_is(r, "ext")) {
    extension(r, pk, 0);
  } else if (word_is(r, "tensor")) {
    extension(r, pk, 1);
  } else {
    bad(r, "expected a value");
  }
}

void stt_vpack(msgpack_packer *pk, const char *fmt, va_list ap) {
  va_list copy;
  va_copy(copy, ap);
  int n = vsnprintf(NULL, 0, fmt, copy);
  va_end(copy);
  char *text = malloc((size_t)n + 1);
  vsnprintf(text, (size_t)n + 1, fmt, ap);
  reader_t r = {text, text};
  do value(&r, pk);
  while (eat(&r, ','));
  skip_ws(&r);
  if (*r.p) bad(&r, "unexpected text");
  free(text);
}

void mpbuf_vtext(mpbuf_t *b, const char *fmt, va_list ap) {
  mpbuf_init(b);
  stt_vpack(&b->pk, fmt, ap);
}

void mpbuf_text(mpbuf_t *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  mpbuf_vtext(b, fmt, ap);
  va_end(ap);
}

void stt_pack(msgpack_packer *pk, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  stt_vpack(pk, fmt, ap);
  va_end(ap);
}
