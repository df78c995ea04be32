/* src/mem/safetensors_parse.c: the safetensors header schema
 * (docs/design.md, section 7).
 *
 * A file is: 8 bytes, the little-endian length N of the header; N bytes of
 * JSON (space-padded); the data buffer. The header is one object:
 *
 *   { "__metadata__": { "format": "pt" },                 optional, str -> str
 *     "w": { "dtype": "F16", "shape": [2, 3], "data_offsets": [0, 12] }, ... }
 *
 * data_offsets are [begin, end) relative to the start of the data buffer.
 * Everything is checked here, before any arena exists: fields (exactly
 * dtype, shape, data_offsets), dtype names, shapes (non-negative, at most
 * ST_MAX_NDIM dimensions, numel * size without overflow), offsets (inside
 * the buffer, the right size), unique and non-empty names, no overlaps.
 * Holes between tensors are allowed (nothing reads them).
 *
 * Contracts of the non-static functions: their comments in safetensors.h.
 */
#include "mem/safetensors.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const struct { const char *name; st_dtype_t dtype; } dtype_names[] = {
  {"F64", ST_DTYPE_FLOAT64}, {"F32", ST_DTYPE_FLOAT32}, {"F16", ST_DTYPE_FLOAT16},
  {"BF16", ST_DTYPE_BFLOAT16}, {"I64", ST_DTYPE_INT64}, {"I32", ST_DTYPE_INT32},
  {"I16", ST_DTYPE_INT16}, {"I8", ST_DTYPE_INT8}, {"U8", ST_DTYPE_UINT8},
  {"U16", ST_DTYPE_UINT16}, {"U32", ST_DTYPE_UINT32}, {"U64", ST_DTYPE_UINT64},
  {"BOOL", ST_DTYPE_BOOL}, {"F8_E4M3", ST_DTYPE_FLOAT8_E4M3FN},
  {"F8_E5M2", ST_DTYPE_FLOAT8_E5M2},
};

#define NDTYPES (sizeof dtype_names / sizeof dtype_names[0])

typedef struct ctx {
  const char *file;
  char *err;
  size_t errlen;
} ctx_t;

static int bad(ctx_t *c, const char *tensor, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* "<file>: tensor '<name>': <what>" (or "<file>: header: <what>"). */
static int bad(ctx_t *c, const char *tensor, const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  if (tensor) snprintf(c->err, c->errlen, "%s: tensor '%.200s': %s", c->file, tensor, what);
  else snprintf(c->err, c->errlen, "%s: header: %s", c->file, what);
  return ST_ERR_INVALID_ARGUMENT;
}

static int oom(ctx_t *c) {
  snprintf(c->err, c->errlen, "%s: out of memory reading the header", c->file);
  return ST_ERR_OUT_OF_MEMORY;
}

/* Room for `need` tensors in into->tensors. */
static int grow_tensors(st__safetensors_t *into, size_t need) {
  if (need <= into->cap_tensors) return 0;
  size_t n = into->cap_tensors ? into->cap_tensors : 16;
  while (n < need) n *= 2;
  st__safetensors_tensor_t *q = realloc(into->tensors, n * sizeof *q);
  if (!q) return -1;
  into->tensors = q;
  into->cap_tensors = n;
  return 0;
}

static int parse_metadata(ctx_t *c, const st__json_t *doc, const st__json_node_t *m,
                          st__safetensors_t *into) {
  if (m->type != ST__JSON_OBJECT) return bad(c, NULL, "__metadata__ must be an object");
  size_t need = into->nmeta + m->count;
  if (need > into->cap_meta) {
    char **k = realloc(into->meta_keys, need * sizeof *k);
    if (k) into->meta_keys = k;
    char **v = k ? realloc(into->meta_values, need * sizeof *v) : NULL;
    if (!v) return oom(c);
    into->meta_values = v;
    into->cap_meta = need;
  }
  for (uint32_t i = m->first; i; i = doc->nodes[i].next) {
    const st__json_node_t *e = &doc->nodes[i];
    if (e->type != ST__JSON_STRING)
      return bad(c, NULL, "__metadata__ value of '%.200s' must be a string", e->key);
    if (strlen(e->key) != e->key_len || strlen(e->str) != e->len)
      return bad(c, NULL, "__metadata__ entry '%.200s' contains a NUL character", e->key);
    int seen = 0;
    for (size_t k = 0; k < into->nmeta && !seen; k++) seen = strcmp(into->meta_keys[k], e->key) == 0;
    if (seen) continue;                         /* first value wins (shards repeat keys) */
    char *k = strdup(e->key), *v = strdup(e->str);
    if (!k || !v) {
      free(k);
      free(v);
      return oom(c);
    }
    into->meta_keys[into->nmeta] = k;
    into->meta_values[into->nmeta] = v;
    into->nmeta++;
  }
  return ST_OK;
}

static int parse_dtype(ctx_t *c, const char *name, const st__json_node_t *v, st_dtype_t *out) {
  if (v->type != ST__JSON_STRING) return bad(c, name, "dtype must be a string");
  for (size_t i = 0; i < NDTYPES; i++)
    if (strcmp(v->str, dtype_names[i].name) == 0 && strlen(v->str) == v->len) {
      *out = dtype_names[i].dtype;
      return ST_OK;
    }
  return bad(c, name,
             "dtype '%.40s' is not supported (supported: F64 F32 F16 BF16 I64 I32 I16 I8 U8 U16 "
             "U32 U64 BOOL F8_E4M3 F8_E5M2)",
             v->str);
}

static int parse_shape(ctx_t *c, const st__json_t *doc, const char *name,
                       const st__json_node_t *v, st__safetensors_tensor_t *t) {
  if (v->type != ST__JSON_ARRAY) return bad(c, name, "shape must be an array of integers");
  if (v->count > ST_MAX_NDIM)
    return bad(c, name, "shape has %u dimensions, more than %d", v->count, ST_MAX_NDIM);
  uint64_t numel = 1;
  int overflow = 0, d = 0;
  for (uint32_t i = v->first; i; i = doc->nodes[i].next, d++) {
    uint64_t n = 0;
    const st__json_node_t *e = &doc->nodes[i];
    if (st__json_uint(e, &n) != 0) {
      if (e->type == ST__JSON_NUMBER && e->len && e->str[0] == '-')
        return bad(c, name, "size %.*s of dimension %d is negative",
                   (int)(e->len > 30 ? 30 : e->len), e->str, d);
      return bad(c, name, "size of dimension %d is not a non-negative integer", d);
    }
    if (n > (uint64_t)INT64_MAX) return bad(c, name, "size of dimension %d is too large", d);
    t->shape[d] = (int64_t)n;
    if (n && numel > UINT64_MAX / n) overflow = 1;
    else numel *= n;
  }
  t->ndim = d;
  /* A zero anywhere makes the tensor empty, whatever the other sizes. */
  for (int k = 0; k < d; k++)
    if (t->shape[k] == 0) { numel = 0; overflow = 0; }
  if (overflow || numel > UINT64_MAX / st_dtype_size(t->dtype))
    return bad(c, name, "shape is too large (the element count overflows)");
  t->numel = numel;
  return ST_OK;
}

static int parse_offsets(ctx_t *c, const st__json_t *doc, const char *name,
                         const st__json_node_t *v, uint64_t data_bytes,
                         st__safetensors_tensor_t *t) {
  uint64_t b = 0, e = 0;
  if (v->type != ST__JSON_ARRAY || v->count != 2 || st__json_uint(&doc->nodes[v->first], &b) != 0 ||
      st__json_uint(&doc->nodes[doc->nodes[v->first].next], &e) != 0)
    return bad(c, name, "data_offsets must be two non-negative integers [begin, end]");
  if (b > e) return bad(c, name, "data_offsets [%llu, %llu]: begin is after end",
                        (unsigned long long)b, (unsigned long long)e);
  if (e > data_bytes)
    return bad(c, name,
               "data_offsets [%llu, %llu] run past the end of the data buffer (%llu bytes; the "
               "file is truncated or the offsets are wrong)",
               (unsigned long long)b, (unsigned long long)e, (unsigned long long)data_bytes);
  uint64_t want = t->numel * st_dtype_size(t->dtype);
  if (e - b != want)
    return bad(c, name, "data_offsets [%llu, %llu] hold %llu bytes, but %llu elements of %s take %llu",
               (unsigned long long)b, (unsigned long long)e, (unsigned long long)(e - b),
               (unsigned long long)t->numel, st_dtype_name(t->dtype), (unsigned long long)want);
  t->begin = b;
  t->end = e;
  return ST_OK;
}

static int parse_tensor(ctx_t *c, const st__json_t *doc, const st__json_node_t *m,
                        uint64_t data_bytes, st__safetensors_tensor_t *t) {
  const char *name = m->key;
  if (m->key_len == 0) return bad(c, NULL, "a tensor has an empty name");
  if (strlen(name) != m->key_len) return bad(c, name, "the name contains a NUL character");
  if (m->type != ST__JSON_OBJECT)
    return bad(c, name, "entry must be an object with dtype, shape and data_offsets");
  const st__json_node_t *f[3] = {NULL, NULL, NULL};
  static const char *const fields[3] = {"dtype", "shape", "data_offsets"};
  for (uint32_t i = m->first; i; i = doc->nodes[i].next) {
    const st__json_node_t *e = &doc->nodes[i];
    int k = 0;
    while (k < 3 && strcmp(e->key, fields[k]) != 0) k++;
    if (k == 3 || strlen(e->key) != e->key_len)
      return bad(c, name, "unknown field '%.60s' (expected dtype, shape and data_offsets)", e->key);
    if (f[k]) return bad(c, name, "field '%s' appears twice", fields[k]);
    f[k] = e;
  }
  for (int k = 0; k < 3; k++)
    if (!f[k]) return bad(c, name, "field '%s' is missing", fields[k]);
  int rc = parse_dtype(c, name, f[0], &t->dtype);
  if (rc == ST_OK) rc = parse_shape(c, doc, name, f[1], t);
  if (rc == ST_OK) rc = parse_offsets(c, doc, name, f[2], data_bytes, t);
  return rc;
}

/* qsort_r comparators over indexes into the tensor array `arg`. */
static int by_name(const void *a, const void *b, void *arg) {
  const st__safetensors_tensor_t *t = arg;
  return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

static int by_begin(const void *a, const void *b, void *arg) {
  const st__safetensors_tensor_t *x = (st__safetensors_tensor_t *)arg + *(const size_t *)a;
  const st__safetensors_tensor_t *y = (st__safetensors_tensor_t *)arg + *(const size_t *)b;
  return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

/* Unique names and no overlaps among tensors [first, into->ntensors). */
static int check_set(ctx_t *c, const st__safetensors_t *into, size_t first) {
  size_t n = into->ntensors - first;
  if (n < 2) return ST_OK;
  size_t *idx = malloc(n * sizeof *idx);
  if (!idx) return oom(c);
  int rc = ST_OK;
  for (size_t i = 0; i < n; i++) idx[i] = first + i;
  qsort_r(idx, n, sizeof *idx, by_name, into->tensors);
  for (size_t i = 1; i < n && rc == ST_OK; i++)
    if (strcmp(into->tensors[idx[i]].name, into->tensors[idx[i - 1]].name) == 0)
      rc = bad(c, into->tensors[idx[i]].name, "the name appears twice in the header");
  if (rc == ST_OK) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
      if (into->tensors[first + i].end > into->tensors[first + i].begin) idx[m++] = first + i;
    qsort_r(idx, m, sizeof *idx, by_begin, into->tensors);
    for (size_t i = 1; i < m && rc == ST_OK; i++) {
      const st__safetensors_tensor_t *p = &into->tensors[idx[i - 1]], *q = &into->tensors[idx[i]];
      if (p->end > q->begin)
        rc = bad(c, q->name, "data_offsets [%llu, %llu] overlap those of '%.200s' [%llu, %llu]",
                 (unsigned long long)q->begin, (unsigned long long)q->end, p->name,
                 (unsigned long long)p->begin, (unsigned long long)p->end);
    }
  }
  free(idx);
  return rc;
}

/* See safetensors.h. No I/O; any thread. */
int st__safetensors_parse(const char *hdr, size_t len, uint64_t data_bytes, const char *file,
                          int file_index, st__safetensors_t *into, char *err, size_t errlen) {
  char dummy[1];
  if (!err) { err = dummy; errlen = sizeof dummy; }
  ctx_t c = {file ? file : "safetensors", err, errlen};
  if (len == 0 || hdr[0] != '{') return bad(&c, NULL, "the header must be a JSON object starting with '{'");
  st__json_t doc;
  char jerr[256];
  int rc = st__json_parse(hdr, len, &doc, jerr, sizeof jerr);
  if (rc == ST_ERR_OUT_OF_MEMORY) return oom(&c);
  if (rc != ST_OK) return bad(&c, NULL, "%s", jerr);
  const st__json_node_t *root = &doc.nodes[0];
  size_t first = into->ntensors;
  int have_meta = 0;
  if (grow_tensors(into, into->ntensors + root->count) != 0)
    rc = oom(&c);
  for (uint32_t i = root->first; i && rc == ST_OK; i = doc.nodes[i].next) {
    const st__json_node_t *m = &doc.nodes[i];
    if (strcmp(m->key, "__metadata__") == 0 && m->key_len == 12) {
      if (have_meta++) rc = bad(&c, NULL, "__metadata__ appears twice");
      else rc = parse_metadata(&c, &doc, m, into);
      continue;
    }
    st__safetensors_tensor_t *t = &into->tensors[into->ntensors];
    memset(t, 0, sizeof *t);
    t->file = file_index;
    rc = parse_tensor(&c, &doc, m, data_bytes, t);
    if (rc != ST_OK) break;
    t->name = strdup(m->key);
    if (!t->name) {
      rc = oom(&c);
      break;
    }
    into->ntensors++;
  }
  st__json_free(&doc);
  if (rc == ST_OK) rc = check_set(&c, into, first);
  return rc;
}

/* See safetensors.h. Any thread. */
void st__safetensors_clear(st__safetensors_t *s) {
  if (!s) return;
  for (size_t i = 0; i < s->ntensors; i++) free(s->tensors[i].name);
  free(s->tensors);
  for (size_t i = 0; i < s->nmeta; i++) {
    free(s->meta_keys[i]);
    free(s->meta_values[i]);
  }
  free(s->meta_keys);
  free(s->meta_values);
  for (size_t i = 0; i < s->nfiles; i++) {
    free(s->files[i].path);
    if (s->files[i].fd >= 0) close(s->files[i].fd);
  }
  free(s->files);
  memset(s, 0, sizeof *s);
}

/* See safetensors.h. Any thread. */
void st__safetensors_free(st__safetensors_t *s) {
  st__safetensors_clear(s);
  free(s);
}
