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

/* "cpu" or "cuda:N" into buf; returns buf. */
const char *cli_device_name(const st_tensor_t *t, char *buf, size_t len) {
  if (t->device == ST_DEVICE_CUDA)
    snprintf(buf, len, "cuda:%d", t->device_index);
  else
    snprintf(buf, len, "cpu");
  return buf;
}

/* Address of element `linear` (row-major, following strides). */
static const unsigned char *element(const st_tensor_t *t, int64_t linear) {
  int64_t off = 0;
  for (int i = t->ndim - 1; i >= 0; i--) {
    int64_t dim = t->shape[i];
    off += (linear % dim) * t->strides[i];
    linear /= dim;
  }
  return (const unsigned char *)t->data + (size_t)off * st_dtype_size(t->dtype);
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

/* Element i as text: integers exactly, floats in their shortest form. */
void cli_format_element(const st_tensor_t *t, int64_t i, char *buf, size_t len) {
  const unsigned char *p = element(t, i);
  switch (t->dtype) {
  case ST_DTYPE_BOOL:
    snprintf(buf, len, "%s", *p ? "true" : "false");
    return;
  case ST_DTYPE_UINT8:
    snprintf(buf, len, "%u", (unsigned)*p);
    return;
  case ST_DTYPE_INT8: {
    int8_t v;
    memcpy(&v, p, 1);
    snprintf(buf, len, "%d", v);
    return;
  }
  case ST_DTYPE_INT16: {
    int16_t v;
    memcpy(&v, p, 2);
    snprintf(buf, len, "%d", v);
    return;
  }
  case ST_DTYPE_INT32: {
    int32_t v;
    memcpy(&v, p, 4);
    snprintf(buf, len, "%" PRId32, v);
    return;
  }
  case ST_DTYPE_INT64: {
    int64_t v;
    memcpy(&v, p, 8);
    snprintf(buf, len, "%" PRId64, v);
    return;
  }
  default:
    shortest(st_tensor_get(t, i), t->dtype != ST_DTYPE_FLOAT64, buf, len);
  }
}

/* Sum as doubles and FNV-1a 64 over the element bytes, row-major. */
void cli_checksum(const st_tensor_t *t, double *sum, uint64_t *fnv) {
  uint64_t h = 0xcbf29ce484222325ull;
  double s = 0;
  size_t esize = st_dtype_size(t->dtype);
  for (int64_t i = 0; i < t->numel; i++) {
    const unsigned char *p = element(t, i);
    for (size_t k = 0; k < esize; k++) {
      h ^= p[k];
      h *= 0x100000001b3ull;
    }
    s += st_tensor_get(t, i);
  }
  *sum = s;
  *fnv = h;
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
