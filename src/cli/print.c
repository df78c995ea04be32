/* stcli: output helpers shared by the commands: value text, tensor shapes
 * and elements, checksums, JSON scalars. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Prints an owned JSON text and a newline; frees it. */
int cli_print_json_owned(char *s) {
  if (!s) {
    fprintf(stderr, "stcli: OUT_OF_MEMORY: cannot render the value as JSON\n");
    return CLI_SERVER_ERROR;
  }
  printf("%s\n", s);
  free(s);
  return CLI_OK;
}

/* A value as one line: strings bare, everything else compact JSON. */
char *cli_value_text(const st_value_t *v) {
  if (v && v->kind == ST_VALUE_STRING) {
    char *s = malloc(v->as.str.len + 1);
    if (s) {
      memcpy(s, v->as.str.ptr, v->as.str.len);
      s[v->as.str.len] = '\0';
    }
    return s;
  }
  if (!v) return strdup("-");
  return st_value_json(v, 0);
}

/* "[2, 3]" (scalars "[]"). */
void cli_format_shape(const st_tensor_t *t, char *buf, size_t len) {
  size_t used = 0;
  int n = snprintf(buf, len, "[");
  used = n > 0 ? (size_t)n : 0;
  for (int i = 0; i < t->ndim && used < len; i++) {
    n = snprintf(buf + used, len - used, i ? ", %" PRId64 : "%" PRId64, t->shape[i]);
    if (n < 0) break;
    used += (size_t)n;
  }
  if (used < len) snprintf(buf + used, len - used, "]");
}

/* "cpu", or "cuda:N (GPU-uuid)" into buf; returns buf. */
const char *cli_device_name(const st_tensor_t *t, char *buf, size_t len) {
  if (t->device == ST_DEVICE_CUDA)
    snprintf(buf, len, "cuda:%d (%s)", t->device_index, t->device_uuid);
  else
    snprintf(buf, len, "cpu");
  return buf;
}

/* Address of element `linear` of a CPU tensor (row-major, following
 * strides). */
static const unsigned char *element(const st_tensor_t *t, int64_t linear) {
  int64_t off = 0;
  for (int i = t->ndim - 1; i >= 0; i--) {
    int64_t dim = t->shape[i];
    off += (linear % dim) * t->strides[i];
    linear /= dim;
  }
  return (const unsigned char *)t->data + (size_t)off * st_dtype_size(t->dtype);
}

/* Elements handed to a callback at once: 8 MiB of float64. */
#define CHUNK ((int64_t)1 << 20)
/* Up to this many leading values of a strided device tensor are read one
 * by one; more, and the whole tensor is copied once. */
#define FEW 4096

/* Copies `count` contiguous elements of a device tensor starting at
 * element `first` (t contiguous) to dst through a 1-D view. */
static int copy_run(const st_tensor_t *t, int64_t first, int64_t count, unsigned char *dst) {
  size_t esize = st_dtype_size(t->dtype);
  int64_t one = 1;
  st_tensor_t v = *t;
  v.data = (unsigned char *)t->data + (size_t)first * esize;
  v.ndim = 1;
  v.shape = &count;
  v.strides = &one;
  v.numel = count;
  v.nbytes = (size_t)count * esize;
  return st_tensor_copy_to_host(&v, dst, v.nbytes);
}

/* See cli.h. */
int cli_each_chunk(const st_tensor_t *t, int64_t n, cli_chunk_fn fn, void *ud) {
  if (n > t->numel) n = t->numel;
  if (n <= 0) return ST_OK;
  size_t esize = st_dtype_size(t->dtype);
  int contiguous = st_tensor_is_contiguous(t);
  if (t->device == ST_DEVICE_CPU && contiguous) {
    fn(ud, t->data, 0, n);
    return ST_OK;
  }
  if (t->device != ST_DEVICE_CPU && !contiguous && (n == t->numel || n > FEW)) {
    /* A strided device tensor is gathered by the library in one copy. */
    unsigned char *all = malloc(t->nbytes ? t->nbytes : 1);
    if (!all) return ST_ERR_OUT_OF_MEMORY;
    int rc = st_tensor_copy_to_host(t, all, t->nbytes);
    if (rc == ST_OK) fn(ud, all, 0, n);
    free(all);
    return rc;
  }
  int64_t per = n < CHUNK ? n : CHUNK;
  unsigned char *buf = malloc((size_t)per * esize);
  if (!buf) return ST_ERR_OUT_OF_MEMORY;
  int rc = ST_OK;
  for (int64_t first = 0; first < n && rc == ST_OK; first += per) {
    int64_t count = n - first < per ? n - first : per;
    if (t->device == ST_DEVICE_CPU) {
      for (int64_t k = 0; k < count; k++)
        memcpy(buf + (size_t)k * esize, element(t, first + k), esize);
    } else if (contiguous) {
      rc = copy_run(t, first, count, buf);
    } else {
      /* The first few values of a strided device tensor: one element at a
       * time (each a small copy through a 0-d view). */
      for (int64_t k = 0; k < count && rc == ST_OK; k++) {
        int64_t off = 0, linear = first + k;
        for (int i = t->ndim - 1; i >= 0; i--) {
          off += (linear % t->shape[i]) * t->strides[i];
          linear /= t->shape[i];
        }
        st_tensor_t v = *t;
        v.data = (unsigned char *)t->data + (size_t)off * esize;
        v.ndim = 0;
        v.numel = 1;
        v.nbytes = esize;
        rc = st_tensor_copy_to_host(&v, buf + (size_t)k * esize, esize);
      }
    }
    if (rc == ST_OK) fn(ud, buf, first, count);
  }
  free(buf);
  return rc;
}

/* Shortest text that reads back as the same float (or double). */
static void shortest(double d, int single, char *buf, size_t len) {
  if (isnan(d)) {
    snprintf(buf, len, "nan");
    return;
  }
  if (isinf(d)) {
    snprintf(buf, len, d > 0 ? "inf" : "-inf");
    return;
  }
  int lo = single ? 6 : 15, hi = single ? 9 : 17;
  for (int p = lo; p <= hi; p++) {
    snprintf(buf, len, "%.*g", p, d);
    double back = strtod(buf, NULL);
    if (single ? (float)back == (float)d : back == d) return;
  }
}

/* See cli.h: integers exactly, floats in their shortest form. */
void cli_format_element(st_dtype_t dtype, const void *base, int64_t k, char *buf, size_t len) {
  const unsigned char *p = (const unsigned char *)base + (size_t)k * st_dtype_size(dtype);
  switch (dtype) {
  case ST_DTYPE_BOOL:
    snprintf(buf, len, "%s", *p ? "true" : "false");
    return;
  case ST_DTYPE_UINT8:
    snprintf(buf, len, "%u", (unsigned)*p);
    return;
/* An integer element of C type T, printed exactly with printf format FMT
 * (its value widened to W). */
#define INT_ELEMENT(DTYPE, T, W, FMT) \
  case DTYPE: {                       \
    T v;                              \
    memcpy(&v, p, sizeof v);          \
    snprintf(buf, len, FMT, (W)v);    \
    return;                           \
  }
    INT_ELEMENT(ST_DTYPE_INT8, int8_t, int, "%d")
    INT_ELEMENT(ST_DTYPE_INT16, int16_t, int, "%d")
    INT_ELEMENT(ST_DTYPE_INT32, int32_t, int32_t, "%" PRId32)
    INT_ELEMENT(ST_DTYPE_INT64, int64_t, int64_t, "%" PRId64)
    INT_ELEMENT(ST_DTYPE_UINT16, uint16_t, unsigned, "%u")
    INT_ELEMENT(ST_DTYPE_UINT32, uint32_t, uint32_t, "%" PRIu32)
    INT_ELEMENT(ST_DTYPE_UINT64, uint64_t, uint64_t, "%" PRIu64)
#undef INT_ELEMENT
  default:
    shortest(st_dtype_load(dtype, base, (size_t)k), dtype != ST_DTYPE_FLOAT64, buf, len);
  }
}

typedef struct checksum {
  st_dtype_t dtype;
  double sum;
  uint64_t h;
} checksum_t;

static void checksum_chunk(void *ud, const void *base, int64_t first, int64_t count) {
  checksum_t *c = ud;
  size_t esize = st_dtype_size(c->dtype);
  const unsigned char *p = base;
  uint64_t h = c->h;
  for (size_t k = 0; k < (size_t)count * esize; k++) {
    h ^= p[k];
    h *= 0x100000001b3ull;
  }
  c->h = h;
  for (int64_t k = 0; k < count; k++) c->sum += st_dtype_load(c->dtype, base, (size_t)k);
}

/* See cli.h: one pass in row-major order, device tensors in chunks. */
int cli_checksum(const st_tensor_t *t, double *sum, uint64_t *fnv) {
  checksum_t c = {t->dtype, 0, 0xcbf29ce484222325ull};
  int rc = cli_each_chunk(t, t->numel, checksum_chunk, &c);
  *sum = c.sum;
  *fnv = c.h;
  return rc;
}

/* A double as a JSON number, null when it is not finite. */
void cli_format_json_number(double d, char *buf, size_t len) {
  if (!isfinite(d)) {
    snprintf(buf, len, "null");
    return;
  }
  shortest(d, 0, buf, len);
}

/* A C string as a JSON string literal. */
void cli_print_json_string(FILE *out, const char *s) {
  fputc('"', out);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
    case '"': fputs("\\\"", out); break;
    case '\\': fputs("\\\\", out); break;
    case '\n': fputs("\\n", out); break;
    case '\r': fputs("\\r", out); break;
    case '\t': fputs("\\t", out); break;
    default:
      if (*p < 0x20)
        fprintf(out, "\\u%04x", *p);
      else
        fputc(*p, out);
    }
  }
  fputc('"', out);
}

/* See cli.h. Pretty JSON has newlines only between tokens (a string's own
 * are escaped), so each one starts a line to indent. */
void cli_print_json_nested(const char *json) {
  for (const char *c = json ? json : "null"; *c; c++) {
    putchar(*c);
    if (*c == '\n') fputs("  ", stdout);
  }
}
