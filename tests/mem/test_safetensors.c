/* safetensors on the CPU (src/mem/safetensors*.c): the strict JSON reader,
 * files of every dtype written here and read back into one arena, sharded
 * checkpoints with an index, every kind of bad file and the error it gets,
 * data_dirs confinement, dtype conversion, multi-piece reads from several
 * threads, pieces copied in the kernel and the fallback when that is
 * refused or fails (under the fault shim, $ST_FAULT_LIB), cancellation,
 * and no arena or descriptor left behind. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "fixture.h"
#include "proc.h"
#include "mem/arena.h"
#include "mem/safetensors.h"

static char dir[256];          /* a temp dir for files (the data dir) */
static char other[256];        /* a second temp dir, outside the data dirs */

/* ------------------------------------------------------------ writers */

/* Writes 8-byte length + header + data to path. */
static void write_raw(const char *path, const char *header, size_t hlen, const void *data,
                      size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f) {
    perror(path);
    exit(2);
  }
  unsigned char lb[8];
  for (int i = 0; i < 8; i++) lb[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
  fwrite(lb, 1, 8, f);
  fwrite(header, 1, hlen, f);
  if (len) fwrite(data, 1, len, f);
  fclose(f);
}

static void write_bytes(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f) exit(2);
  fwrite(data, 1, len, f);
  fclose(f);
}

static void path_in(char *out, size_t len, const char *d, const char *name) {
  if (snprintf(out, len, "%s/%s", d, name) >= (int)len) exit(2);
}

/* One tensor for write_st: name, safetensors dtype, shape, and values
 * (stored with st_dtype_store as dtype `dt`). */
typedef struct wt {
  const char *name;
  const char *sdt;
  st_dtype_t dt;
  int ndim;
  int64_t shape[4];
} wt_t;

static uint64_t numel_of(const wt_t *t) {
  uint64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
  return n;
}

/* Value j of tensor k (each dtype can hold it exactly, or rounds it). */
static double value_of(int k, uint64_t j, st_dtype_t dt) {
  if (dt == ST_DTYPE_BOOL) return (double)((j + (uint64_t)k) % 2);
  if (dt == ST_DTYPE_UINT8 || dt == ST_DTYPE_INT8) return (double)((j * 7 + (uint64_t)k) % 100);
  return (double)(j % 1000) * 0.25 - 17 + k;
}

/* Writes tensors back to back (in the given order) with a header that
 * lists them in the same order; meta is JSON text or NULL; `pad` spaces
 * after the header. */
static void write_st(const char *path, const wt_t *ts, int n, const char *meta, int pad) {
  size_t cap = 1 << 16, hl = 0, dl = 0;
  char *hdr = malloc(cap);
  uint64_t total = 0;
  for (int k = 0; k < n; k++) total += numel_of(&ts[k]) * st_dtype_size(ts[k].dt);
  unsigned char *data = malloc(total ? total : 1);
  hl += (size_t)snprintf(hdr + hl, cap - hl, "{");
  if (meta) hl += (size_t)snprintf(hdr + hl, cap - hl, "\"__metadata__\":%s", meta);
  for (int k = 0; k < n; k++) {
    uint64_t ne = numel_of(&ts[k]), b = dl;
    for (uint64_t j = 0; j < ne; j++)
      st_dtype_store(ts[k].dt, data + dl, (size_t)j, value_of(k, j, ts[k].dt));
    dl += ne * st_dtype_size(ts[k].dt);
    hl += (size_t)snprintf(hdr + hl, cap - hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                           (k || meta) ? "," : "", ts[k].name, ts[k].sdt);
    for (int i = 0; i < ts[k].ndim; i++)
      hl += (size_t)snprintf(hdr + hl, cap - hl, "%s%lld", i ? "," : "", (long long)ts[k].shape[i]);
    hl += (size_t)snprintf(hdr + hl, cap - hl, "],\"data_offsets\":[%llu,%zu]}",
                           (unsigned long long)b, dl);
  }
  hl += (size_t)snprintf(hdr + hl, cap - hl, "}");
  for (int i = 0; i < pad; i++) hdr[hl++] = ' ';
  write_raw(path, hdr, hl, data, dl);
  free(hdr);
  free(data);
}

static int count_fds(void) {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  while (d && (e = readdir(d))) n += e->d_name[0] != '.';
  if (d) closedir(d);
  return n;
}

/* Opens unconfined and loads to the CPU; *offs and *dts are malloc'ed. */
static int load_cpu(const char *path, st_dtype_t dtype, int threads, st__safetensors_t **s,
                    st__arena_t **a, uint64_t **offs, st_dtype_t **dts, char *err,
                    size_t errlen) {
  int rc = st__safetensors_open(path, 0, s, err, errlen);
  if (rc != ST_OK) return rc;
  size_t n = (*s)->ntensors ? (*s)->ntensors : 1;
  *offs = malloc(n * sizeof **offs);
  *dts = malloc(n * sizeof **dts);
  st__safetensors_opts_t o = {.dtype = dtype, .device = -1, .threads = threads};
  return st__safetensors_load(*s, &o, a, *offs, *dts, err, errlen);
}

/* Frees what load_cpu gave. */
static void unload_cpu(st__safetensors_t *s, st__arena_t *a, uint64_t *offs, st_dtype_t *dts) {
  st__arena_unref(a);
  st__safetensors_free(s);
  free(offs);
  free(dts);
}

/* ------------------------------------------------------------ JSON */

/* Arenas alive in this process (a load that fails must free its own). */
static uint64_t arena_count(void) {
  uint64_t count = 0, bytes = 0;
  st__arena_stats(&count, &bytes);
  return count;
}

TEST(json_reader_is_strict) {
  static const char *good[] = {
    "{}", " [ ] ", "{\"a\":[1,-2,3.5e10,0,true,false,null,\"x\"]}", "\"\\u00e9\\ud83d\\ude00\"",
    "{\"k\":{\"k\":{}}}  \n\t", "0", "-0.0E+1", "\"caf\xc3\xa9\"",
  };
  static const struct { const char *text, *msg; } bad[] = {
    {"", "expected a value"}, {"{", "unterminated object"}, {"[1,]", "expected a value"},
    {"{\"a\":1,}", "expected a string key"}, {"{'a':1}", "expected a string key"},
    {"[01]", "leading zero"}, {"[1.]", "bad fraction"}, {"[1e]", "bad exponent"},
    {"[NaN]", "expected a value"}, {"\"a\nb\"", "control character"},
    {"\"\\x\"", "bad escape"}, {"\"\\ud800\"", "high surrogate"}, {"\"\\udc00\"", "lone low"},
    {"\"\xc0\xaf\"", "invalid UTF-8"}, {"\"\xed\xa0\x80\"", "invalid UTF-8"},
    {"{} {}", "unexpected data"}, {"// c\n{}", "expected a value"}, {"[tru]", "expected a value"},
    {"{\"a\" 1}", "expected ':'"}, {"[1 2]", "expected ',' or ']'"},
  };
  char err[256];
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    st__json_t d;
    memset(&d, 0, sizeof d);
    int rc = st__json_parse(good[i], strlen(good[i]), &d, err, sizeof err);
    if (rc != ST_OK) fprintf(stderr, "   good[%zu]: %s\n", i, err);
    CHECK_ERR(rc, ST_OK);
    st__json_free(&d);
  }
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    st__json_t d;
    memset(&d, 0, sizeof d);
    err[0] = '\0';
    CHECK_ERR_MSG(st__json_parse(bad[i].text, strlen(bad[i].text), &d, err, sizeof err),
                  ST_ERR_INVALID_ARGUMENT, err);
    CHECK_CONTAINS(err, "invalid JSON at byte");
    CHECK_CONTAINS(err, bad[i].msg);
  }
  /* Nesting is capped, so a hostile header cannot overflow the stack. */
  char deep[200];
  memset(deep, '[', 100);
  memset(deep + 100, ']', 100);
  st__json_t d;
  memset(&d, 0, sizeof d);
  CHECK_ERR_MSG(st__json_parse(deep, sizeof deep, &d, err, sizeof err),
                ST_ERR_INVALID_ARGUMENT, err);
  CHECK_CONTAINS(err, "nested deeper than 64");
  /* Decoding, order and integers. */
  const char *t = "{\"n\\u00e9\":[18446744073709551615,18446744073709551616,1.0,-1]}";
  CHECK_ERR_MSG(st__json_parse(t, strlen(t), &d, err, sizeof err), ST_OK, err);
  const st__json_node_t *arr = &d.nodes[d.nodes[0].first];
  CHECK_STR_EQ(arr->key, "n\xc3\xa9");
  CHECK_EQ_INT(arr->count, 4);
  uint64_t v = 0;
  const st__json_node_t *e = &d.nodes[arr->first];
  CHECK_EQ_INT(st__json_uint(e, &v), 0);
  CHECK(v == UINT64_MAX);
  e = &d.nodes[e->next];
  CHECK_EQ_INT(st__json_uint(e, &v), -1);          /* overflow */
  e = &d.nodes[e->next];
  CHECK_EQ_INT(st__json_uint(e, &v), -1);          /* not an integer literal */
  e = &d.nodes[e->next];
  CHECK_EQ_INT(st__json_uint(e, &v), -1);          /* negative */
  st__json_free(&d);
}

/* ------------------------------------------------------------ round trips */

static const wt_t every_dtype[] = {
  {"f64", "F64", ST_DTYPE_FLOAT64, 2, {3, 5}},
  {"f32", "F32", ST_DTYPE_FLOAT32, 1, {7}},
  {"f16", "F16", ST_DTYPE_FLOAT16, 3, {2, 2, 3}},
  {"bf16", "BF16", ST_DTYPE_BFLOAT16, 1, {9}},
  {"i64", "I64", ST_DTYPE_INT64, 1, {4}},
  {"i32", "I32", ST_DTYPE_INT32, 2, {1, 3}},
  {"i16", "I16", ST_DTYPE_INT16, 1, {5}},
  {"i8", "I8", ST_DTYPE_INT8, 1, {6}},
  {"u8", "U8", ST_DTYPE_UINT8, 1, {300}},
  {"u16", "U16", ST_DTYPE_UINT16, 1, {5}},
  {"u32", "U32", ST_DTYPE_UINT32, 2, {2, 3}},
  {"u64", "U64", ST_DTYPE_UINT64, 1, {4}},
  {"b", "BOOL", ST_DTYPE_BOOL, 1, {11}},
  {"e4m3", "F8_E4M3", ST_DTYPE_FLOAT8_E4M3FN, 1, {8}},
  {"e5m2", "F8_E5M2", ST_DTYPE_FLOAT8_E5M2, 1, {8}},
  {"scalar", "F32", ST_DTYPE_FLOAT32, 0, {0}},
  {"empty", "F16", ST_DTYPE_FLOAT16, 2, {0, 3}},
  {"z.last", "F32", ST_DTYPE_FLOAT32, 1, {1}},
};
#define NEVERY ((int)(sizeof every_dtype / sizeof every_dtype[0]))

/* Checks tensor k of `ts` against what load put in the arena. */
static int tensor_matches(const st__arena_t *a, uint64_t off, st_dtype_t dt, const wt_t *t, int k) {
  const char *base = (const char *)st__arena_base(a) + off;
  uint64_t n = numel_of(t);
  for (uint64_t j = 0; j < n; j++) {
    unsigned char want[8];
    st_dtype_store(dt, want, 0, value_of(k, j, t->dt));
    if (memcmp(base + j * st_dtype_size(dt), want, st_dtype_size(dt)) != 0) {
      fprintf(stderr, "   %s[%llu]: %g, want %g\n", t->name, (unsigned long long)j,
              st_dtype_load(dt, base, (size_t)j), st_dtype_load(dt, want, 0));
      return 0;
    }
  }
  return 1;
}

TEST(every_dtype_round_trips) {
  char p[512], err[1024];
  path_in(p, sizeof p, dir, "every.safetensors");
  write_st(p, every_dtype, NEVERY, "{\"format\":\"pt\",\"note\":\"a \\\"quoted\\\" word\"}", 7);
  uint64_t count0 = arena_count();
  st__safetensors_t *s = NULL;
  st__arena_t *a = NULL;
  uint64_t *offs = NULL;
  st_dtype_t *dts = NULL;
  CHECK_ERR_MSG(load_cpu(p, ST_DTYPE_INVALID, 0, &s, &a, &offs, &dts, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(s->ntensors, NEVERY);
  CHECK_EQ_INT(s->nmeta, 2);
  CHECK_STR_EQ(s->meta_keys[0], "format");
  CHECK_STR_EQ(s->meta_values[0], "pt");
  CHECK_STR_EQ(s->meta_values[1], "a \"quoted\" word");
  uint64_t end = 0;
  for (int k = 0; k < NEVERY; k++) {
    const st__safetensors_tensor_t *t = &s->tensors[k];
    CHECK_STR_EQ(t->name, every_dtype[k].name);            /* header order */
    CHECK_EQ_INT(t->dtype, every_dtype[k].dt);
    CHECK_EQ_INT(dts[k], every_dtype[k].dt);
    CHECK_EQ_INT(t->ndim, every_dtype[k].ndim);
    for (int i = 0; i < t->ndim; i++) CHECK_EQ_INT(t->shape[i], every_dtype[k].shape[i]);
    CHECK_EQ_INT(t->numel, numel_of(&every_dtype[k]));
    CHECK_EQ_INT(offs[k] % ST_ARENA_ALIGN, 0);
    CHECK(offs[k] >= end);
    end = offs[k] + t->numel * st_dtype_size(dts[k]);
    CHECK(tensor_matches(a, offs[k], dts[k], &every_dtype[k], k));
  }
  CHECK_EQ_INT(st__arena_bytes(a), end);                    /* one arena, no slack */
  CHECK_EQ_INT(st__arena_device(a), -1);
  unload_cpu(s, a, offs, dts);
  CHECK_EQ_INT(arena_count(), count0);
}

TEST(names_with_escapes_and_an_empty_file) {
  char p[512], err[1024];
  path_in(p, sizeof p, dir, "esc.safetensors");
  float v[2] = {1.5f, -2};
  const char *h = "{\"layers.0.\\u00e9\\/x\":{\"data_offsets\":[0,8],\"shape\":[2],\"dtype\":\"F32\"}}  ";
  write_raw(p, h, strlen(h), v, sizeof v);
  st__safetensors_t *s = NULL;
  st__arena_t *a = NULL;
  uint64_t *offs = NULL;
  st_dtype_t *dts = NULL;
  CHECK_ERR_MSG(load_cpu(p, ST_DTYPE_INVALID, 2, &s, &a, &offs, &dts, err, sizeof err), ST_OK, err);
  CHECK_STR_EQ(s->tensors[0].name, "layers.0.\xc3\xa9/x");
  CHECK(memcmp(st__arena_base(a), v, sizeof v) == 0);
  unload_cpu(s, a, offs, dts);
  /* A header with no tensors is a valid, empty checkpoint. */
  path_in(p, sizeof p, dir, "none.safetensors");
  write_raw(p, "{}", 2, NULL, 0);
  CHECK_ERR_MSG(load_cpu(p, ST_DTYPE_INVALID, 0, &s, &a, &offs, &dts, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(s->ntensors, 0);
  CHECK_EQ_INT(st__arena_bytes(a), 0);
  unload_cpu(s, a, offs, dts);
}

/* ------------------------------------------------------------ bad files */

typedef struct bad_case {
  const char *header;          /* NULL: raw bytes below */
  size_t data_len;
  int rc;
  const char *msg, *msg2;
} bad_case_t;

TEST(bad_headers_get_clear_errors) {
  static const bad_case_t cases[] = {
    {"[1]", 0, ST_ERR_INVALID_ARGUMENT, "header: the header must be a JSON object", NULL},
    {"{\"w\":{\"dtype\":\"F32\",}}", 0, ST_ERR_INVALID_ARGUMENT, "header: invalid JSON at byte 20",
     "expected a string key"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,400]}}", 16,
     ST_ERR_INVALID_ARGUMENT, "tensor 'w': data_offsets [0, 400] run past the end of the data "
     "buffer (16 bytes", "truncated"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 16,
     ST_ERR_INVALID_ARGUMENT, "tensor 'b': data_offsets [4, 12] overlap those of 'a' [0, 8]", NULL},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 16, ST_ERR_INVALID_ARGUMENT,
     "tensor 'w': data_offsets [0, 8] hold 8 bytes, but 3 elements of float32 take 12", NULL},
    {"{\"w\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,8]}}", 16, ST_ERR_INVALID_ARGUMENT,
     "tensor 'w': dtype 'F4' is not supported", NULL},
    {"{\"w\":{\"dtype\":\"C64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 16, ST_ERR_INVALID_ARGUMENT,
     "tensor 'w': dtype 'C64' is not supported", NULL},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 16, ST_ERR_INVALID_ARGUMENT,
     "tensor 'w': the name appears twice", NULL},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 16, ST_ERR_INVALID_ARGUMENT,
     "tensor 'w': size -1 of dimension 0 is negative", NULL},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 16, ST_ERR_INVALID_ARGUMENT,
     "size of dimension 0 is not a non-negative integer", NULL},
    {"{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,4]}}", 16,
     ST_ERR_INVALID_ARGUMENT, "tensor 'w': shape is too large (the element count overflows)", NULL},
    {"{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
     16, ST_ERR_INVALID_ARGUMENT, "shape has 17 dimensions, more than 16", NULL},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 16, ST_ERR_INVALID_ARGUMENT,
     "data_offsets [8, 4]: begin is after end", NULL},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 16, ST_ERR_INVALID_ARGUMENT,
     "data_offsets must be two non-negative integers", NULL},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 16, ST_ERR_INVALID_ARGUMENT,
     "tensor 'w': field 'data_offsets' is missing", NULL},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"extra\":1}}", 16,
     ST_ERR_INVALID_ARGUMENT, "tensor 'w': unknown field 'extra'", NULL},
    {"{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 16,
     ST_ERR_INVALID_ARGUMENT, "field 'dtype' appears twice", NULL},
    {"{\"w\":[1]}", 16, ST_ERR_INVALID_ARGUMENT, "tensor 'w': entry must be an object", NULL},
    {"{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 16, ST_ERR_INVALID_ARGUMENT,
     "a tensor has an empty name", NULL},
    {"{\"__metadata__\":{\"n\":1}}", 0, ST_ERR_INVALID_ARGUMENT,
     "__metadata__ value of 'n' must be a string", NULL},
    {"{\"__metadata__\":[]}", 0, ST_ERR_INVALID_ARGUMENT, "__metadata__ must be an object", NULL},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} x", 16,
     ST_ERR_INVALID_ARGUMENT, "unexpected data after the value", NULL},
    {"{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 16,
     ST_ERR_INVALID_ARGUMENT, "contains a NUL character", NULL},
  };
  char p[512], err[1024];
  path_in(p, sizeof p, dir, "bad.safetensors");
  char zeros[64] = {0};
  uint64_t count0 = arena_count();
  int fds0 = count_fds();
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    write_raw(p, cases[i].header, strlen(cases[i].header), zeros, cases[i].data_len);
    st__safetensors_t *s = (st__safetensors_t *)1;
    err[0] = '\0';
    int rc = st__safetensors_open(p, 0, &s, err, sizeof err);
    if (rc != cases[i].rc || !strstr(err, cases[i].msg))
      fprintf(stderr, "   case %zu: rc %d: %s\n", i, rc, err);
    CHECK_EQ_INT(rc, cases[i].rc);
    CHECK(s == NULL);
    CHECK_CONTAINS(err, p);                                   /* names the file */
    CHECK_CONTAINS(err, cases[i].msg);
    if (cases[i].msg2) CHECK_CONTAINS(err, cases[i].msg2);
  }
  CHECK_EQ_INT(count_fds(), fds0);                            /* every file closed */
  CHECK_EQ_INT(arena_count(), count0);
}

TEST(truncated_and_foreign_files) {
  char p[512], err[1024];
  path_in(p, sizeof p, dir, "trunc.safetensors");
  st__safetensors_t *s = NULL;
  /* 5 bytes: not even the header length. */
  write_bytes(p, "\x10\0\0\0\0", 5);
  CHECK_ERR_MSG(st__safetensors_open(p, 0, &s, err, sizeof err), ST_ERR_INVALID_ARGUMENT, err);
  CHECK_CONTAINS(err, "too short for the 8-byte header length");
  /* A header length longer than the file. */
  unsigned char b[24] = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
  write_bytes(p, b, sizeof b);
  CHECK_ERR_MSG(st__safetensors_open(p, 0, &s, err, sizeof err), ST_ERR_INVALID_ARGUMENT, err);
  CHECK_CONTAINS(err, "header length 100 runs past the end of the file (24 bytes");
  /* A header length past the 100 MB limit (say, a text file). */
  write_bytes(p, "hello, world, this is text", 26);
  CHECK_ERR_MSG(st__safetensors_open(p, 0, &s, err, sizeof err), ST_ERR_INVALID_ARGUMENT, err);
  CHECK_CONTAINS(err, "larger than the 100 MB limit");
  /* A file cut inside its data: the offsets run past the buffer. */
  wt_t t = {"w", "F32", ST_DTYPE_FLOAT32, 1, {1000}};
  write_st(p, &t, 1, NULL, 0);
  CHECK_EQ_INT(truncate(p, 8 + 80 + 100), 0);
  CHECK_ERR_MSG(st__safetensors_open(p, 0, &s, err, sizeof err), ST_ERR_INVALID_ARGUMENT, err);
  CHECK_CONTAINS(err, "tensor 'w': data_offsets [0, 4000] run past the end of the data buffer");
  /* Missing file, and a directory without an index. */
  path_in(p, sizeof p, dir, "nope.safetensors");
  CHECK_ERR_MSG(st__safetensors_open(p, 0, &s, err, sizeof err), ST_ERR_NOT_FOUND, err);
  CHECK_CONTAINS(err, "No such file");
  CHECK_ERR_MSG(st__safetensors_open(other, 0, &s, err, sizeof err), ST_ERR_NOT_FOUND, err);
  CHECK_CONTAINS(err, "a directory without model.safetensors.index.json");
}

/* The file shrinks between open (validated) and load: the read fails
 * cleanly and nothing stays allocated. */
TEST(file_shrinking_after_open_fails_the_load) {
  char p[512], err[1024];
  path_in(p, sizeof p, dir, "shrink.safetensors");
  wt_t t = {"w", "F32", ST_DTYPE_FLOAT32, 1, {100000}};
  write_st(p, &t, 1, NULL, 0);
  st__safetensors_t *s = NULL;
  CHECK_ERR_MSG(st__safetensors_open(p, 0, &s, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(truncate(p, 1000), 0);
  uint64_t count0 = arena_count();
  uint64_t off = 0;
  st_dtype_t dt = ST_DTYPE_INVALID;
  st__arena_t *a = (st__arena_t *)1;
  st__safetensors_opts_t o = {.device = -1};
  CHECK_ERR_MSG(st__safetensors_load(s, &o, &a, &off, &dt, err, sizeof err), ST_ERR_IO, err);
  CHECK(a == NULL);
  CHECK_CONTAINS(err, "truncated");
  CHECK_EQ_INT(arena_count(), count0);
  st__safetensors_free(s);
}

/* ------------------------------------------------------------ shards */

static void write_index(const char *d, const char *weight_map) {
  char p[512], text[4096];
  path_in(p, sizeof p, d, ST_SAFETENSORS_INDEX);
  snprintf(text, sizeof text, "{\"metadata\":{\"total_size\":123},\"weight_map\":%s}", weight_map);
  write_bytes(p, text, strlen(text));
}

TEST(sharded_checkpoint_loads_in_index_order) {
  char sd[512], p[512], err[1024];
  path_in(sd, sizeof sd, dir, "sharded");
  mkdir(sd, 0700);
  wt_t s1[] = {{"a.w", "F32", ST_DTYPE_FLOAT32, 2, {2, 3}}, {"b.w", "BF16", ST_DTYPE_BFLOAT16, 1, {5}}};
  wt_t s2[] = {{"c.w", "I64", ST_DTYPE_INT64, 1, {3}}, {"0.first", "F16", ST_DTYPE_FLOAT16, 1, {4}}};
  path_in(p, sizeof p, sd, "model-00001-of-00002.safetensors");
  write_st(p, s1, 2, "{\"format\":\"pt\",\"shard\":\"1\"}", 0);
  path_in(p, sizeof p, sd, "model-00002-of-00002.safetensors");
  write_st(p, s2, 2, "{\"format\":\"pt\",\"shard\":\"2\",\"extra\":\"x\"}", 0);
  write_index(sd, "{\"0.first\":\"model-00002-of-00002.safetensors\","
                  "\"a.w\":\"model-00001-of-00002.safetensors\","
                  "\"c.w\":\"model-00002-of-00002.safetensors\","
                  "\"b.w\":\"model-00001-of-00002.safetensors\"}");
  static const char *order[] = {"0.first", "a.w", "c.w", "b.w"};
  const wt_t *src[] = {&s2[1], &s1[0], &s2[0], &s1[1]};
  int kidx[] = {1, 0, 0, 1};
  for (int via = 0; via < 2; via++) {               /* the directory, then the index file */
    if (via) path_in(p, sizeof p, sd, ST_SAFETENSORS_INDEX);
    st__safetensors_t *s = NULL;
    st__arena_t *a = NULL;
    uint64_t *offs = NULL;
    st_dtype_t *dts = NULL;
    CHECK_ERR_MSG(load_cpu(via ? p : sd, ST_DTYPE_INVALID, 3, &s, &a, &offs, &dts, err, sizeof err),
                  ST_OK, err);
    CHECK_EQ_INT(s->nfiles, 2);
    CHECK_EQ_INT(s->ntensors, 4);
    for (int k = 0; k < 4; k++) {
      CHECK_STR_EQ(s->tensors[k].name, order[k]);
      CHECK(tensor_matches(a, offs[k], dts[k], src[k], kidx[k]));
    }
    CHECK_EQ_INT(s->nmeta, 3);                      /* union; the first shard's value wins */
    CHECK_STR_EQ(s->meta_keys[1], "shard");
    CHECK_STR_EQ(s->meta_values[1], "2");           /* shard 2 is named first in the index */
    unload_cpu(s, a, offs, dts);
  }
}

TEST(bad_shard_sets) {
  char sd[512], p[512], err[1024];
  path_in(sd, sizeof sd, dir, "badshards");
  mkdir(sd, 0700);
  wt_t s1[] = {{"a", "F32", ST_DTYPE_FLOAT32, 1, {2}}, {"b", "F32", ST_DTYPE_FLOAT32, 1, {2}}};
  path_in(p, sizeof p, sd, "s1.safetensors");
  write_st(p, s1, 2, NULL, 0);
  path_in(p, sizeof p, sd, "s2.safetensors");
  write_st(p, s1, 1, NULL, 0);                       /* "a" again */
  path_in(p, sizeof p, other, "outside.safetensors");
  write_st(p, s1, 2, NULL, 0);
  static const struct { const char *wm; int rc; const char *msg; } cases[] = {
    {"{\"a\":\"../outside.safetensors\",\"b\":\"s1.safetensors\"}", ST_ERR_INVALID_ARGUMENT,
     "weight_map entry 'a' must name a shard file inside the index's directory"},
    {"{\"a\":\"/tmp/s1.safetensors\"}", ST_ERR_INVALID_ARGUMENT, "a plain file name"},
    {"{\"a\":\"s1.safetensors\",\"b\":\"missing.safetensors\"}", ST_ERR_NOT_FOUND,
     "shard 'missing.safetensors' named by the index cannot be opened"},
    {"{\"a\":\"s1.safetensors\"}", ST_ERR_INVALID_ARGUMENT,
     "tensor 'b' of shard"},
    {"{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\",\"c\":\"s1.safetensors\"}",
     ST_ERR_INVALID_ARGUMENT, "tensor 'c' is not in shard 's1.safetensors'"},
    {"{\"a\":\"s2.safetensors\",\"b\":\"s1.safetensors\"}", ST_ERR_INVALID_ARGUMENT,
     "tensor 'a' is in two shards"},
    {"{\"a\":1}", ST_ERR_INVALID_ARGUMENT, "weight_map entry 'a' must name a shard"},
    {"[]", ST_ERR_INVALID_ARGUMENT, "the index has no \"weight_map\" object"},
  };
  int fds0 = count_fds();
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    write_index(sd, cases[i].wm);
    st__safetensors_t *s = (st__safetensors_t *)1;
    int rc = st__safetensors_open(sd, 0, &s, err, sizeof err);
    if (rc != cases[i].rc || !strstr(err, cases[i].msg))
      fprintf(stderr, "   case %zu: rc %d: %s\n", i, rc, err);
    CHECK_EQ_INT(rc, cases[i].rc);
    CHECK(s == NULL);
    CHECK_CONTAINS(err, cases[i].msg);
  }
  /* A shard with a broken header names the shard. */
  path_in(p, sizeof p, sd, "s2.safetensors");
  const char *qh = "{\"x\":{\"dtype\":\"Q\",\"shape\":[],\"data_offsets\":[0,0]}}";
  write_raw(p, qh, strlen(qh), NULL, 0);
  write_index(sd, "{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\",\"x\":\"s2.safetensors\"}");
  st__safetensors_t *s = NULL;
  CHECK_ERR_MSG(st__safetensors_open(sd, 0, &s, err, sizeof err), ST_ERR_INVALID_ARGUMENT, err);
  CHECK_CONTAINS(err, "s2.safetensors: tensor 'x': dtype 'Q' is not supported");
  /* The index itself must be valid JSON. */
  path_in(p, sizeof p, sd, ST_SAFETENSORS_INDEX);
  write_bytes(p, "{\"weight_map\":{", 15);
  CHECK_ERR_MSG(st__safetensors_open(sd, 0, &s, err, sizeof err), ST_ERR_INVALID_ARGUMENT, err);
  CHECK_CONTAINS(err, "model.safetensors.index.json: invalid JSON at byte");
  CHECK_EQ_INT(count_fds(), fds0);
}

/* ------------------------------------------------------------ data_dirs */

TEST(paths_are_confined_to_data_dirs) {
  char p[512], q[512], err[1024];
  wt_t t = {"w", "F32", ST_DTYPE_FLOAT32, 1, {4}};
  path_in(p, sizeof p, dir, "in.safetensors");
  write_st(p, &t, 1, NULL, 0);
  path_in(q, sizeof q, other, "out.safetensors");
  write_st(q, &t, 1, NULL, 0);
  st__safetensors_t *s = NULL;
  /* No data dirs: everything is refused. */
  st__safetensors_set_data_dirs(NULL, 0);
  CHECK_ERR_MSG(st__safetensors_open(p, 1, &s, err, sizeof err), ST_ERR_AUTH, err);
  CHECK_CONTAINS(err, "outside the allowed data_dirs (none configured)");
  const char *dirs[] = {"/nonexistent-st-dir", dir};
  st__safetensors_set_data_dirs(dirs, 2);
  CHECK_ERR_MSG(st__safetensors_open(p, 1, &s, err, sizeof err), ST_OK, err);
  st__safetensors_free(s);
  CHECK_ERR_MSG(st__safetensors_open("in.safetensors", 1, &s, err, sizeof err),
                ST_OK, err);  /* relative */
  CHECK_STR_EQ(s->files[0].path, p);
  st__safetensors_free(s);
  CHECK_ERR_MSG(st__safetensors_open(q, 1, &s, err, sizeof err), ST_ERR_AUTH, err);
  CHECK_CONTAINS(err, "out.safetensors' is outside the allowed data_dirs (/nonexistent-st-dir, ");
  CHECK_CONTAINS(err, dir);
  /* ".." and symlinks are resolved before the check. */
  char rel[600];
  snprintf(rel, sizeof rel, "%s/../%s/out.safetensors", dir, strrchr(other, '/') + 1);
  CHECK_ERR_MSG(st__safetensors_open(rel, 1, &s, err, sizeof err), ST_ERR_AUTH, err);
  char link[512];
  path_in(link, sizeof link, dir, "link.safetensors");
  CHECK_EQ_INT(symlink(q, link), 0);
  CHECK_ERR_MSG(st__safetensors_open(link, 1, &s, err, sizeof err), ST_ERR_AUTH, err);
  CHECK_ERR_MSG(st__safetensors_open("link.safetensors", 1, &s, err, sizeof err), ST_ERR_AUTH, err);
  CHECK_ERR_MSG(st__safetensors_open("missing.safetensors", 1, &s, err, sizeof err),
                ST_ERR_NOT_FOUND, err);
  CHECK_CONTAINS(err, "not found in any data dir");
  /* A shard that links outside is refused too; one that links inside is fine. */
  char sd[512];
  path_in(sd, sizeof sd, dir, "linked");
  mkdir(sd, 0700);
  path_in(link, sizeof link, sd, "s.safetensors");
  CHECK_EQ_INT(symlink(q, link), 0);
  write_index(sd, "{\"w\":\"s.safetensors\"}");
  CHECK_ERR_MSG(st__safetensors_open(sd, 1, &s, err, sizeof err), ST_ERR_AUTH, err);
  CHECK_CONTAINS(err, "shard '");
  CHECK_ERR_MSG(st__safetensors_open(sd, 0, &s, err, sizeof err), ST_OK, err);   /* unconfined */
  st__safetensors_free(s);
  unlink(link);
  CHECK_EQ_INT(symlink(p, link), 0);
  CHECK_ERR_MSG(st__safetensors_open(sd, 1, &s, err, sizeof err), ST_OK, err);
  st__safetensors_free(s);
  st__safetensors_set_data_dirs(NULL, 0);
}

/* ------------------------------------------------------------ conversion */

TEST(dtype_conversion_converts_floating_tensors_only) {
  char p[512], err[1024];
  path_in(p, sizeof p, dir, "conv.safetensors");
  wt_t ts[] = {{"f32", "F32", ST_DTYPE_FLOAT32, 1, {1001}},
               {"f64", "F64", ST_DTYPE_FLOAT64, 2, {3, 3}},
               {"ids", "I64", ST_DTYPE_INT64, 1, {5}},
               {"e4", "F8_E4M3", ST_DTYPE_FLOAT8_E4M3FN, 1, {6}},
               {"mask", "BOOL", ST_DTYPE_BOOL, 1, {3}}};
  write_st(p, ts, 5, NULL, 0);
  static const st_dtype_t targets[] = {ST_DTYPE_FLOAT16, ST_DTYPE_BFLOAT16, ST_DTYPE_FLOAT32,
                                       ST_DTYPE_FLOAT64, ST_DTYPE_FLOAT8_E5M2};
  for (size_t g = 0; g < sizeof targets / sizeof targets[0]; g++) {
    st__safetensors_t *s = NULL;
    st__arena_t *a = NULL;
    uint64_t *offs = NULL;
    st_dtype_t *dts = NULL;
    CHECK_ERR_MSG(load_cpu(p, targets[g], 2, &s, &a, &offs, &dts, err, sizeof err), ST_OK, err);
    for (int k = 0; k < 5; k++) {
      int floating = st_dtype_is_float(ts[k].dt);
      CHECK_EQ_INT(dts[k], floating ? targets[g] : ts[k].dt);
      const char *base = (const char *)st__arena_base(a) + offs[k];
      for (uint64_t j = 0; j < numel_of(&ts[k]); j++) {
        unsigned char file[8], want[8];
        st_dtype_store(ts[k].dt, file, 0, value_of(k, j, ts[k].dt));   /* as in the file */
        st_dtype_store(dts[k], want, 0, st_dtype_load(ts[k].dt, file, 0));
        CHECK(memcmp(base + j * st_dtype_size(dts[k]), want, st_dtype_size(dts[k])) == 0);
      }
    }
    unload_cpu(s, a, offs, dts);
  }
  /* A non-floating target is refused. */
  st__safetensors_t *s = NULL;
  CHECK_ERR_MSG(st__safetensors_open(p, 0, &s, err, sizeof err), ST_OK, err);
  uint64_t offs[5];
  st_dtype_t dts[5];
  st__arena_t *a = NULL;
  st__safetensors_opts_t o = {.dtype = ST_DTYPE_INT32, .device = -1};
  CHECK_ERR_MSG(st__safetensors_load(s, &o, &a, offs, dts, err, sizeof err),
                ST_ERR_INVALID_ARGUMENT, err);
  CHECK_CONTAINS(err, "not a floating dtype");
  st__safetensors_free(s);
  /* The converter agrees with st_dtype_store for tricky values. */
  const float src[] = {0.0f, -0.0f, 1e-8f, 65504.0f, 65520.0f, 1e30f, -1e30f, 3.14159f,
                       448.0f, 464.0f, 1.0f / 3};
  const size_t n = sizeof src / sizeof src[0];
  for (int d = ST_DTYPE_INVALID + 1; d < ST_DTYPE_COUNT; d++) {
    unsigned char got[8 * 16], want[8 * 16];
    st__safetensors_convert(got, (st_dtype_t)d, src, ST_DTYPE_FLOAT32, n);
    for (size_t i = 0; i < n; i++) st_dtype_store((st_dtype_t)d, want, i, (double)src[i]);
    CHECK(memcmp(got, want, n * st_dtype_size((st_dtype_t)d)) == 0);
  }
}

/* Every code of every 16- and 8-bit float format, to every float format:
 * the lookup tables give exactly what st_dtype_store gives. */
TEST(converter_matches_st_dtype_store_for_every_code) {
  static const st_dtype_t from[] = {ST_DTYPE_FLOAT16, ST_DTYPE_BFLOAT16, ST_DTYPE_FLOAT8_E4M3FN,
                                    ST_DTYPE_FLOAT8_E5M2};
  static const st_dtype_t to[] = {ST_DTYPE_FLOAT16, ST_DTYPE_BFLOAT16, ST_DTYPE_FLOAT8_E4M3FN,
                                  ST_DTYPE_FLOAT8_E5M2, ST_DTYPE_FLOAT32, ST_DTYPE_FLOAT64};
  unsigned char *src = malloc(65536 * 2), *got = malloc(65536 * 8), *want = malloc(65536 * 8);
  for (size_t f = 0; f < sizeof from / sizeof from[0]; f++) {
    size_t ss = st_dtype_size(from[f]), count = (size_t)1 << (8 * ss);
    for (size_t c = 0; c < count; c++) {
      src[c * ss] = (unsigned char)c;
      if (ss == 2) src[c * ss + 1] = (unsigned char)(c >> 8);
    }
    for (size_t t = 0; t < sizeof to / sizeof to[0]; t++) {
      if (from[f] == to[t]) continue;
      size_t ds = st_dtype_size(to[t]);
      st__safetensors_convert(got, to[t], src, from[f], count);
      for (size_t c = 0; c < count; c++)
        st_dtype_store(to[t], want, c, st_dtype_load(from[f], src, c));
      for (size_t c = 0; c < count; c++)
        if (memcmp(got + c * ds, want + c * ds, ds) != 0) {
          fprintf(stderr, "   %s -> %s, code 0x%zx differs\n", st_dtype_name(from[f]),
                  st_dtype_name(to[t]), c);
          CHECK(0);
        }
    }
  }
  free(src);
  free(got);
  free(want);
}

/* ------------------------------------------------------------ big reads */

static int stop_now(void *ud) { return *(int *)ud; }

TEST(big_tensors_split_across_threads) {
  char p[512], err[1024];
  path_in(p, sizeof p, dir, "big.safetensors");
  /* 40 MiB + 3 tensors: pieces of 16 MiB, read by 4 threads. */
  wt_t ts[] = {{"big", "F32", ST_DTYPE_FLOAT32, 2, {2621440, 4}},
               {"tail", "F16", ST_DTYPE_FLOAT16, 1, {4099}},
               {"mid", "BF16", ST_DTYPE_BFLOAT16, 1, {9000001}}};
  write_st(p, ts, 3, NULL, 0);
  for (int conv = 0; conv < 2; conv++) {
    st__safetensors_t *s = NULL;
    st__arena_t *a = NULL;
    uint64_t *offs = NULL;
    st_dtype_t *dts = NULL;
    st_dtype_t to = conv ? ST_DTYPE_FLOAT32 : ST_DTYPE_INVALID;
    CHECK_ERR_MSG(load_cpu(p, to, 4, &s, &a, &offs, &dts, err, sizeof err), ST_OK, err);
    for (int k = 0; k < 3; k++) {
      const char *base = (const char *)st__arena_base(a) + offs[k];
      uint64_t n = numel_of(&ts[k]);
      for (uint64_t j = 0; j < n; j += (j % 4093 == 0 ? 1 : 997)) {
        unsigned char file[8], want[8];
        st_dtype_store(ts[k].dt, file, 0, value_of(k, j, ts[k].dt));
        st_dtype_store(dts[k], want, 0, st_dtype_load(ts[k].dt, file, 0));
        if (memcmp(base + j * st_dtype_size(dts[k]), want, st_dtype_size(dts[k])) != 0) {
          fprintf(stderr, "   %s[%llu] differs (conv %d)\n", ts[k].name, (unsigned long long)j,
                  conv);
          CHECK(0);
        }
      }
      /* the last element of each tensor too */
      unsigned char file[8], want[8];
      st_dtype_store(ts[k].dt, file, 0, value_of(k, n - 1, ts[k].dt));
      st_dtype_store(dts[k], want, 0, st_dtype_load(ts[k].dt, file, 0));
      CHECK(memcmp(base + (n - 1) * st_dtype_size(dts[k]), want, st_dtype_size(dts[k])) == 0);
    }
    /* The readers committed every page of the memfd (no page is left
     * for a first touch to fault in, or to fail with SIGBUS). */
    int fd = st__arena_dup_fd(a, NULL, 0);
    struct stat st;
    CHECK(fd >= 0 && fstat(fd, &st) == 0);
    CHECK((uint64_t)st.st_blocks * 512 >= (uint64_t)st.st_size);
    close(fd);
    unload_cpu(s, a, offs, dts);
  }
  /* A stop request ends the load with its error and frees the arena. */
  st__safetensors_t *s = NULL;
  CHECK_ERR_MSG(st__safetensors_open(p, 0, &s, err, sizeof err), ST_OK, err);
  uint64_t count0 = arena_count();
  int flag = ST_ERR_CANCELLED;
  uint64_t offs[3];
  st_dtype_t dts[3];
  st__arena_t *a = (st__arena_t *)1;
  st__safetensors_opts_t o = {.device = -1, .threads = 3, .stop = stop_now, .stop_ud = &flag};
  CHECK_ERR_MSG(st__safetensors_load(s, &o, &a, offs, dts, err, sizeof err), ST_ERR_CANCELLED, err);
  CHECK(a == NULL);
  CHECK_CONTAINS(err, "cancelled");
  CHECK_EQ_INT(arena_count(), count0);
  /* The arena cap applies (config max_object_bytes). */
  st__arena_set_limit(1 << 20);
  o.stop = NULL;
  CHECK_ERR_MSG(st__safetensors_load(s, &o, &a, offs, dts, err, sizeof err), ST_ERR_LIMIT, err);
  st__arena_set_limit(0);
  st__safetensors_free(s);
}

/* ------------------------------------------------------------ how pieces are written */

/* Tensors whose pages touch (odd sizes, 256-byte alignment between them):
 * a float32 of 40 MiB (three pieces), an odd float16, a bfloat16 of
 * 18 MB (two pieces) and a uint8 of 1000003 bytes. */
static const wt_t lane_ts[] = {{"big", "F32", ST_DTYPE_FLOAT32, 2, {2621440, 4}},
                               {"odd", "F16", ST_DTYPE_FLOAT16, 1, {4099}},
                               {"mid", "BF16", ST_DTYPE_BFLOAT16, 1, {9000001}},
                               {"u8", "U8", ST_DTYPE_UINT8, 1, {1000003}}};
#define NLANE ((int)(sizeof lane_ts / sizeof lane_ts[0]))

static uint64_t lane_bytes(void) {
  uint64_t n = 0;
  for (int k = 0; k < NLANE; k++) n += numel_of(&lane_ts[k]) * st_dtype_size(lane_ts[k].dt);
  return n;
}

/* Every tensor of the arena holds its bytes of the file, every other
 * byte of the memfd reads as zero, and every page is allocated in the
 * memfd (committed: no first touch left to fault or to fail). */
static void check_same_as_file(const st__safetensors_t *s, st__arena_t *a, const uint64_t *offs) {
  int fd = st__arena_dup_fd(a, NULL, 0);
  struct stat st;
  CHECK(fd >= 0 && fstat(fd, &st) == 0);
  uint64_t size = (uint64_t)st.st_size;
  CHECK((uint64_t)st.st_blocks * 512 >= size);
  unsigned char *mem = malloc(size), *file = malloc(size);
  /* Through the memfd, not the server's mapping. */
  uint64_t got = 0;
  for (ssize_t n; got < size && (n = pread(fd, mem + got, size - got, (off_t)got)) > 0;)
    got += (uint64_t)n;
  close(fd);
  CHECK_EQ_INT(got, size);
  memset(file, 0, size);
  for (size_t i = 0; i < s->ntensors; i++) {
    const st__safetensors_tensor_t *t = &s->tensors[i];
    const st__safetensors_file_t *f = &s->files[t->file];
    uint64_t b = t->numel * st_dtype_size(t->dtype);
    CHECK(offs[i] + b <= size);
    CHECK(pread(f->fd, file + offs[i], b, (off_t)(f->data_start + t->begin)) == (ssize_t)b);
  }
  for (uint64_t i = 0; i < size; i++)
    if (mem[i] != file[i]) {
      fprintf(stderr, "   byte %llu of %llu differs\n", (unsigned long long)i,
              (unsigned long long)size);
      CHECK(0);
      break;
    }
  CHECK(memcmp(mem, st__arena_base(a), size) == 0);   /* and the mapping agrees */
  free(mem);
  free(file);
}

/* Loads p with `threads` readers and checks it (check_same_as_file); the
 * bytes of each path in *spliced and *read. */
static void load_and_check(const char *p, int threads, uint64_t *spliced, uint64_t *read) {
  char err[1024];
  st__safetensors_t *s = NULL;
  st__arena_t *a = NULL;
  uint64_t *offs = NULL;
  st_dtype_t *dts = NULL;
  st__safetensors_cpu_counts_t c0, c1;
  st__safetensors_cpu_counts(&c0);
  CHECK_ERR_MSG(load_cpu(p, ST_DTYPE_INVALID, threads, &s, &a, &offs, &dts, err, sizeof err),
                ST_OK, err);
  st__safetensors_cpu_counts(&c1);
  *spliced = c1.spliced - c0.spliced;
  *read = c1.read - c0.read;
  CHECK_EQ_INT(c1.converted, c0.converted);
  check_same_as_file(s, a, offs);
  unload_cpu(s, a, offs, dts);
}

/* Tensors kept as they are go file -> memfd in the kernel (splice), one
 * reader at a time, the other readers reading into pages they commit;
 * where the host gives shared memory huge pages, all go through pages the
 * readers commit (those get the huge pages). Either way the arena holds
 * the file's bytes and zeros, and is committed. */
TEST(cpu_pieces_copied_in_the_kernel_or_read) {
  char p[512];
  path_in(p, sizeof p, dir, "lanes.safetensors");
  write_st(p, lane_ts, NLANE, NULL, 3);
  char huge[256];
  int offered = st__arena_shmem_huge(huge, sizeof huge);
  fprintf(stderr, "   %s: huge pages %s\n", huge, offered ? "offered" : "not offered");
  uint64_t total = lane_bytes(), spliced = 0, read = 0;
  load_and_check(p, 1, &spliced, &read);
  CHECK_EQ_INT(spliced, offered ? 0 : total);
  CHECK_EQ_INT(read, offered ? total : 0);
  for (int threads = 2; threads <= 5; threads += 3) {
    load_and_check(p, threads, &spliced, &read);
    CHECK_EQ_INT(spliced + read, total);
    CHECK(offered ? spliced == 0 : spliced > 0);
  }
}

/* `mem_safetensors fault MODE`: run by splice_refused_or_failing under
 * the fault shim (ST_FAULT rules on splice). Loads lanes.safetensors of
 * `where` and checks what MODE says: "refused" (every piece read into
 * committed pages, nothing spliced), "enospc" (the memfd's side fails:
 * OUT_OF_MEMORY), "eio" (the file's side fails: IO). After a failure the
 * rule is spent, and the next load succeeds. */
static void fault_child(const char *mode) {
  char p[512], err[1024];
  path_in(p, sizeof p, dir, "lanes.safetensors");
  write_st(p, lane_ts, NLANE, NULL, 3);
  uint64_t total = lane_bytes(), spliced = 0, read = 0;
  if (!strcmp(mode, "refused")) {
    for (int threads = 1; threads <= 3; threads += 2) {
      load_and_check(p, threads, &spliced, &read);
      CHECK_EQ_INT(spliced, 0);
      CHECK_EQ_INT(read, total);
    }
    return;
  }
  st__safetensors_t *s = NULL;
  CHECK_ERR_MSG(st__safetensors_open(p, 0, &s, err, sizeof err), ST_OK, err);
  uint64_t offs[NLANE], count0 = arena_count();
  st_dtype_t dts[NLANE];
  st__arena_t *a = (st__arena_t *)1;
  st__safetensors_opts_t o = {.device = -1, .threads = 1};
  int enospc = !strcmp(mode, "enospc");
  CHECK_ERR_MSG(st__safetensors_load(s, &o, &a, offs, dts, err, sizeof err),
                enospc ? ST_ERR_OUT_OF_MEMORY : ST_ERR_IO, err);
  CHECK(a == NULL);
  CHECK_EQ_INT(arena_count(), count0);
  if (enospc)
    CHECK_CONTAINS_ALL(err, "committing ", "-byte CPU arena: No space left on device",
                       "ran out");
  else
    CHECK_CONTAINS_ALL(err, p, "read of ", "failed: Input/output error");
  st__safetensors_free(s);
  load_and_check(p, 2, &spliced, &read);
  CHECK(spliced > 0);
}

/* The kernel copy refused (a filesystem that cannot splice, a seccomp
 * filter) on the file's side or on the memfd's, after the pipe was
 * filled: the pieces are read into committed pages instead, with the same
 * result. A failure on either side is the load's error, as a pread's or
 * a commit's would be. Run in a child under the fault shim. */
TEST(splice_refused_or_failing) {
  const char *lib = getenv("ST_FAULT_LIB");
  if (!lib || access(lib, R_OK) != 0) {
    fprintf(stderr, "   ST_FAULT_LIB not set: not tested\n");
    return;
  }
  if (st__arena_shmem_huge(NULL, 0)) {
    fprintf(stderr, "   huge pages for shared memory: loads do not splice here\n");
    return;
  }
  static const struct { const char *rule, *mode; } cases[] = {
      {"splice:0:0:EINVAL", "refused"},   /* the file's side, every call */
      {"splice:1:0:EINVAL", "refused"},   /* the memfd's side, after a full pipe */
      {"splice:0:0:ENOSYS", "refused"},
      {"splice:1:1:ENOSPC", "enospc"},
      {"splice:0:1:EIO", "eio"}};
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  CHECK(n > 0);
  if (n <= 0) return;
  self[n] = '\0';
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char env[PATH_MAX + 128];
    snprintf(env, sizeof env, "LD_PRELOAD=%s\nST_FAULT=%s", lib, cases[i].rule);
    stt_proc_t pr;
    int code = stt_run(&pr, self, (const char *const[]){"fault", cases[i].mode, NULL}, env, 0);
    fprintf(stderr, "   ST_FAULT=%s: exit %d\n", cases[i].rule, code);
    if (code != 0) fprintf(stderr, "%s", pr.err);
    CHECK_EQ_INT(code, 0);
    CHECK_CONTAINS(pr.err, "st_fault: injected splice");
  }
}

TEST(cuda_without_a_device_is_a_clear_error) {
  char p[512], err[1024];
  path_in(p, sizeof p, dir, "every.safetensors");
  st__safetensors_t *s = NULL;
  CHECK_ERR_MSG(st__safetensors_open(p, 0, &s, err, sizeof err), ST_OK, err);
  uint64_t offs[NEVERY];
  st_dtype_t dts[NEVERY];
  st__arena_t *a = (st__arena_t *)1;
  st__safetensors_opts_t o = {.device = 0};
  int rc = st__safetensors_load(s, &o, &a, offs, dts, err, sizeof err);
  st__safetensors_free(s);
  if (rc == ST_OK) {                     /* a GPU host: covered by mem_gpu_safetensors */
    st__arena_unref(a);
    return;
  }
  CHECK_ERR(rc, ST_ERR_CAPABILITY);
  CHECK(a == NULL);
  CHECK_CONTAINS(err, "no CUDA device: ");
}

/* ------------------------------------------------------------ setup */

int main(int argc, char **argv) {
  snprintf(dir, sizeof dir, "/tmp/st-sft-XXXXXX");
  snprintf(other, sizeof other, "/tmp/st-sft-other-XXXXXX");
  if (!mkdtemp(dir) || !mkdtemp(other)) {
    perror("mkdtemp");
    return 2;
  }
  if (chdir(other) != 0) return 2;      /* relative paths must not resolve against the cwd */
  if (argc == 3 && !strcmp(argv[1], "fault")) {   /* splice_refused_or_failing's child */
    stt_failed_now = 0;
    fault_child(argv[2]);
    if (stt_failed_now) stt_failed++;
    else stt_passed++;
    stt_remove_tree(dir);
    stt_remove_tree(other);
    return stt_summary();
  }
  RUN(json_reader_is_strict);
  RUN(every_dtype_round_trips);
  RUN(names_with_escapes_and_an_empty_file);
  RUN(bad_headers_get_clear_errors);
  RUN(truncated_and_foreign_files);
  RUN(file_shrinking_after_open_fails_the_load);
  RUN(sharded_checkpoint_loads_in_index_order);
  RUN(bad_shard_sets);
  RUN(paths_are_confined_to_data_dirs);
  RUN(dtype_conversion_converts_floating_tensors_only);
  RUN(converter_matches_st_dtype_store_for_every_code);
  RUN(big_tensors_split_across_threads);
  RUN(cpu_pieces_copied_in_the_kernel_or_read);
  RUN(splice_refused_or_failing);
  RUN(cuda_without_a_device_is_a_clear_error);
  stt_remove_tree(dir);
  stt_remove_tree(other);
  return stt_summary();
}
