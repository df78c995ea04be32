/* src/client: a result's value in CPython's marshal format
 * (st_result_marshal, include/st/client.h), which the Python package
 * reads with marshal.loads: the whole tree converted in C at once instead
 * of one ctypes access per node.
 *
 * Only codes that every Python 3 from 3.4 on reads are written: None
 * 'N', False 'F', True 'T', int32 'i', long 'l' (15-bit digits), binary
 * float 'g', bytes 's', str 'u' (UTF-8) or 'z' (ASCII under 256 bytes,
 * which loads copies without decoding), tuple '(', list '[', dict '{'
 * ... '0', and references: a map key string is written once with the
 * reference flag (0x80 on its code) and again as 'r' and its index, so
 * that marshal.loads makes one str (hashed once) for a key that maps
 * repeat. A tensor is the tuple (index,) and a module the tuple
 * ([indices], [full names], metadata), indices in st_result_tensor order:
 * tuples stand for nothing else. A value marshal cannot carry the same
 * way is refused (ST_ERR_NOT_FOUND): a string that is not strict UTF-8
 * (the package then converts it node by node, with replacement
 * characters), a tensor in a map key.
 *
 * st_client_rpc_marshal writes the same format straight from a plain
 * reply's msgpack (no st_value_t tree, no result: the bytes live in a
 * buffer the client keeps and reuses), and hands a reply it cannot write
 * that way to the ordinary decoder.
 */
#include <stdint.h>
#include <string.h>

#include "client/result.h"

/* Map keys written with the reference flag: an open-addressing table of
 * KEY_SLOTS slots by content, at most KEY_REFS of them (later keys are
 * written whole each time), each with its index among the flagged
 * objects (marshal numbers them in the order it reads them). */
enum { KEY_SLOTS = 512, KEY_REFS = 256, KEY_MAX_LEN = 64 };
typedef struct key_ref {
  const char *ptr;        /* NULL: a free slot */
  uint32_t len, index;
} key_ref_t;

typedef struct writer {
  st_result_t *r;         /* the bytes live in r's blocks; NULL: c's buffer */
  st_client_t *c;
  unsigned char *buf;
  size_t len, cap;
  int rc;
  uint32_t nkeys;
  key_ref_t keys[KEY_SLOTS];
} writer_t;

/* Makes room for n more bytes (the buffer doubles, from 4 KiB); 0, or
 * -1 with w->rc set when out of memory. */
static int grow(writer_t *w, size_t n) {
  size_t cap = w->cap ? w->cap * 2 : 4096;
  while (cap - w->len < n) cap *= 2;
  unsigned char *b;
  if (w->r) {
    b = st__client_result_alloc(w->r, cap);
    if (b && w->len) memcpy(b, w->buf, w->len);
    /* the old block stays with the result until it is freed */
  } else {
    b = realloc(w->c->marshal_buf, cap);
    if (b) {
      w->c->marshal_buf = b;
      w->c->marshal_cap = cap;
    }
  }
  if (!b) {
    w->rc = ST_ERR_OUT_OF_MEMORY;
    return -1;
  }
  w->buf = b;
  w->cap = cap;
  return 0;
}

/* Appends n bytes. After an error the bytes are dropped (the result is
 * refused anyway). */
static inline void put(writer_t *w, const void *p, size_t n) {
  if (w->cap - w->len < n && (w->rc != ST_OK || grow(w, n) < 0)) return;
  memcpy(w->buf + w->len, p, n);
  w->len += n;
}

static void put_code(writer_t *w, char c) { put(w, &c, 1); }

static void put_u32(writer_t *w, uint32_t v) {
  unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                        (unsigned char)(v >> 24)};
  put(w, b, 4);
}

static void put_sized(writer_t *w, char code, uint32_t n) {
  put_code(w, code);
  put_u32(w, n);
}

static void put_int(writer_t *w, int64_t v) {
  if (v >= INT32_MIN && v <= INT32_MAX) {
    put_code(w, 'i');
    put_u32(w, (uint32_t)(int32_t)v);
    return;
  }
  uint64_t mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
  uint16_t digits[5];
  int n = 0;
  while (mag) {
    digits[n++] = (uint16_t)(mag & 0x7fff);
    mag >>= 15;
  }
  put_code(w, 'l');
  put_u32(w, (uint32_t)(int32_t)(v < 0 ? -n : n));
  for (int i = 0; i < n; i++) {
    unsigned char b[2] = {(unsigned char)digits[i], (unsigned char)(digits[i] >> 8)};
    put(w, b, 2);
  }
}

static void put_float(writer_t *w, double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  unsigned char b[8];
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(u >> (8 * i));
  put_code(w, 'g');
  put(w, b, 8);
}

/* Strict UTF-8: no overlong forms, no surrogates, nothing past U+10FFFF.
 * 0 when not; 2 when every byte is ASCII, else 1. */
static int utf8_ok(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n && s[i] < 0x80) i++;
  if (i == n) return 2;
  while (i < n) {
    unsigned c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t k;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) k = 1;
    else if (c == 0xe0) k = 2, lo = 0xa0;
    else if (c == 0xed) k = 2, hi = 0x9f;
    else if (c >= 0xe1 && c <= 0xef) k = 2;
    else if (c == 0xf0) k = 3, lo = 0x90;
    else if (c >= 0xf1 && c <= 0xf3) k = 3;
    else if (c == 0xf4) k = 3, hi = 0x8f;
    else return 0;
    if (n - i - 1 < k) return 0;
    if (s[i + 1] < lo || s[i + 1] > hi) return 0;
    for (size_t j = 2; j <= k; j++)
      if (s[i + j] < 0x80 || s[i + j] > 0xbf) return 0;
    i += k + 1;
  }
  return 1;
}

/* Index of t among r's tensors, starting the search at *next (tensors
 * come in decode order, so the first guess is right). */
static int64_t tensor_index(writer_t *w, const st_tensor_t *t, size_t *next) {
  st_result_t *r = w->r;
  for (size_t k = 0; k < r->ntensors; k++) {
    size_t i = (*next + k) % r->ntensors;
    if (r->tensors[i] == t) {
      *next = i + 1;
      return (int64_t)i;
    }
  }
  w->rc = ST_ERR_NOT_FOUND;
  return 0;
}

/* A str of n bytes at p, UTF-8 (ASCII when `ascii`), its code or'ed with
 * `flag`. */
static void put_str(writer_t *w, unsigned flag, int ascii, const char *p, size_t n) {
  if (ascii && n < 256) {
    unsigned char h[2] = {(unsigned char)('z' | flag), (unsigned char)n};
    put(w, h, 2);
  } else {
    put_sized(w, (char)('u' | flag), (uint32_t)n);
  }
  put(w, p, n);
}

/* For map key string p (n bytes): writes 'r' and its index when the same
 * key was written before, or the string with the reference flag when
 * there is room for one more; 1 when done, 0 when the caller writes it as
 * any string. */
static int put_key_ref(writer_t *w, const char *p, size_t n) {
  if (!p || n > KEY_MAX_LEN) return 0;   /* NULL marks a free slot */
  uint32_t h = 2166136261u;   /* FNV-1a */
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 16777619u;
  size_t slot = h & (KEY_SLOTS - 1);
  for (;; slot = (slot + 1) & (KEY_SLOTS - 1)) {
    key_ref_t *k = &w->keys[slot];
    if (!k->ptr) break;
    if (k->len == n && memcmp(k->ptr, p, n) == 0) {
      put_sized(w, 'r', k->index);
      return 1;
    }
  }
  int utf8 = w->nkeys == KEY_REFS ? 0 : utf8_ok((const unsigned char *)p, n);
  if (!utf8) return 0;
  key_ref_t *k = &w->keys[slot];
  *k = (key_ref_t){.ptr = p, .len = (uint32_t)n, .index = w->nkeys++};
  put_str(w, 0x80, utf8 == 2, p, n);
  return 1;
}

/* A string (`text`: str, else bytes) of n bytes at p; a str that is not
 * strict UTF-8 is refused. in_key: a map key or inside one. */
static void put_string(writer_t *w, int text, const char *p, size_t n, int in_key) {
  if (in_key && text && put_key_ref(w, p, n)) return;
  int utf8 = text ? utf8_ok((const unsigned char *)p, n) : 0;
  if (n > INT32_MAX || (text && !utf8)) {
    w->rc = ST_ERR_NOT_FOUND;
    return;
  }
  if (text) {
    put_str(w, 0, utf8 == 2, p, n);
    return;
  }
  put_sized(w, 's', (uint32_t)n);
  put(w, p, n);
}

/* in_key: v is a map key or inside one. */
static void put_value(writer_t *w, const st_value_t *v, size_t *next, int in_key) {
  if (w->rc != ST_OK) return;
  switch (v->kind) {
  case ST_VALUE_NIL:
    put_code(w, 'N');
    return;
  case ST_VALUE_BOOL:
    put_code(w, v->as.boolean ? 'T' : 'F');
    return;
  case ST_VALUE_INT:
    put_int(w, v->as.integer);
    return;
  case ST_VALUE_FLOAT:
    put_float(w, v->as.number);
    return;
  case ST_VALUE_STRING:
  case ST_VALUE_BINARY:
    put_string(w, v->kind == ST_VALUE_STRING, v->as.str.ptr, v->as.str.len, in_key);
    return;
  case ST_VALUE_ARRAY:
    put_sized(w, '[', (uint32_t)v->as.array.len);
    for (size_t i = 0; i < v->as.array.len; i++)
      put_value(w, &v->as.array.items[i], next, in_key);
    return;
  case ST_VALUE_MAP:
    put_code(w, '{');
    for (size_t i = 0; i < v->as.map.len; i++) {
      put_value(w, &v->as.map.keys[i], next, 1);
      put_value(w, &v->as.map.values[i], next, in_key);
    }
    put_code(w, '0');
    return;
  case ST_VALUE_TENSOR:
    if (in_key) w->rc = ST_ERR_NOT_FOUND;
    put_sized(w, '(', 1);
    put_int(w, tensor_index(w, v->as.tensor, next));
    return;
  case ST_VALUE_MODULE: {
    size_t n = v->as.module.len;
    if (in_key) w->rc = ST_ERR_NOT_FOUND;
    put_sized(w, '(', 3);
    put_sized(w, '[', (uint32_t)n);
    for (size_t i = 0; i < n; i++) put_int(w, tensor_index(w, v->as.module.tensors[i], next));
    put_sized(w, '[', (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
      const char *name = v->as.module.tensors[i]->name;
      size_t len = strlen(name);
      if (!utf8_ok((const unsigned char *)name, len)) w->rc = ST_ERR_NOT_FOUND;
      put_sized(w, 'u', (uint32_t)len);
      put(w, name, len);
    }
    put_value(w, v->as.module.metadata, next, in_key);
    return;
  }
  }
  w->rc = ST_ERR_NOT_FOUND;
}

/* See client.h. Thread that owns r (the buffer is allocated in r). */
ST_API const void *st_result_marshal(st_result_t *r, size_t *len) {
  if (len) *len = 0;
  if (!r || !len || !r->value) return NULL;
  writer_t w = {.r = r, .rc = ST_OK};
  size_t next = 0;
  put_value(&w, r->value, &next, 0);
  if (w.rc != ST_OK) return NULL;
  *len = w.len;
  return w.buf;
}

/* ------------------------------------------------ straight from a reply */

/* A reply's buffer is kept for the next one up to this size. */
enum { MARSHAL_KEEP = 256 * 1024 };

/* Writes msgpack object o as st_result_marshal writes the value the
 * decoder (result.c) makes of it: an unsigned integer past INT64_MAX is a
 * float there too. Anything else -- an ext (tensor, module), nesting
 * deeper than ST_MAX_DEPTH, a str that is not UTF-8 -- is refused
 * (w->rc ST_ERR_NOT_FOUND), and the decoder reads the reply instead. */
static void put_object(writer_t *w, const msgpack_object *o, int in_key, int depth) {
  if (w->rc != ST_OK) return;
  if (depth > ST_MAX_DEPTH) {
    w->rc = ST_ERR_NOT_FOUND;
    return;
  }
  switch (o->type) {
  case MSGPACK_OBJECT_NIL:
    put_code(w, 'N');
    return;
  case MSGPACK_OBJECT_BOOLEAN:
    put_code(w, o->via.boolean ? 'T' : 'F');
    return;
  case MSGPACK_OBJECT_POSITIVE_INTEGER:
    if (o->via.u64 > INT64_MAX) put_float(w, (double)o->via.u64);
    else put_int(w, (int64_t)o->via.u64);
    return;
  case MSGPACK_OBJECT_NEGATIVE_INTEGER:
    put_int(w, o->via.i64);
    return;
  case MSGPACK_OBJECT_FLOAT32:
  case MSGPACK_OBJECT_FLOAT64:
    put_float(w, o->via.f64);
    return;
  case MSGPACK_OBJECT_STR:
    put_string(w, 1, o->via.str.ptr, o->via.str.size, in_key);
    return;
  case MSGPACK_OBJECT_BIN:
    put_string(w, 0, o->via.bin.ptr, o->via.bin.size, in_key);
    return;
  case MSGPACK_OBJECT_ARRAY:
    put_sized(w, '[', o->via.array.size);
    for (uint32_t i = 0; i < o->via.array.size; i++)
      put_object(w, &o->via.array.ptr[i], in_key, depth + 1);
    return;
  case MSGPACK_OBJECT_MAP:
    put_code(w, '{');
    for (uint32_t i = 0; i < o->via.map.size; i++) {
      put_object(w, &o->via.map.ptr[i].key, 1, depth + 1);
      put_object(w, &o->via.map.ptr[i].val, in_key, depth + 1);
    }
    put_code(w, '0');
    return;
  default:
    w->rc = ST_ERR_NOT_FOUND;
    return;
  }
}

/* Nonzero when a result names memory the decoder must take: an `arenas`
 * array, a `pool_page` or `kept` (result.c, pool.c, kept_arenas.c). */
static int names_memory(const msgpack_object *result) {
  if (result->type != MSGPACK_OBJECT_MAP) return 0;
  for (uint32_t i = 0; i < result->via.map.size; i++) {
    const msgpack_object_kv *kv = &result->via.map.ptr[i];
    if ((st__str_eq(&kv->key, "arenas") && kv->val.type == MSGPACK_OBJECT_ARRAY) ||
        st__str_eq(&kv->key, "pool_page") || st__str_eq(&kv->key, "kept"))
      return 1;
  }
  return 0;
}

/* See client.h. Thread of the client. */
ST_API int st_client_rpc_marshal(st_client_t *c, const char *method, const st_args_t *params,
                                 const void **data, size_t *len, st_result_t **fallback) {
  if (data) *data = NULL;
  if (len) *len = 0;
  if (fallback) *fallback = NULL;
  if (!c || !data || !len || !fallback) return ST_ERR_INVALID_ARGUMENT;
  if (c->marshal_cap > MARSHAL_KEEP) {   /* the last reply was a large one */
    free(c->marshal_buf);
    c->marshal_buf = NULL;
    c->marshal_cap = 0;
  }
  st__message_t m;
  int *fds;
  size_t nfds;
  int rc = st__client_rpc_exchange(c, method, params, &m, &fds, &nfds);
  if (rc != ST_OK) return rc;
  if (nfds == 0 && !names_memory(&m.result)) {
    /* No arena, nothing kept: what the decoder would do beyond the value
     * (st__client_kept_arenas_answered) was done when the reply came. */
    writer_t w = {.c = c, .buf = c->marshal_buf, .cap = c->marshal_cap, .rc = ST_OK};
    put_object(&w, &m.result, 0, 0);
    if (w.rc == ST_OK) {
      *data = w.buf;
      *len = w.len;
    }
  }
  if (!*data) rc = st__client_result_decode(c, &m.result, 0, fds, nfds, fallback);
  free(fds);
  st__message_destroy(&m);
  return rc;
}
