/* src/client: lists and maps in arguments (include/st/client.h, "arguments"):
 * st_args_begin_list / _map and st_args_end, queued map keys (st_args_key,
 * st_args_keys) and the bulk setters (st_args_ints, _floats, _strs).
 *
 * msgpack wants a container's count before its elements, and the builder
 * does not know it yet: each open container gets a 5-byte header (array32
 * or map32) that st_args_end rewrites with the count, in the shortest form
 * (fixarray / fixmap below 16, 16-bit below 65536), moving the body down.
 * So the bytes are those a one-shot packer would write.
 *
 * A failure inside an open value sticks (st__client_args_fail); a
 * container opened after it is counted as a lost level, so that each
 * st_args_end still closes the container its caller meant.
 *
 * Threads: an st_args_t belongs to one thread at a time.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_internal.h"

#define FAIL st__client_args_fail
#define HEAD_BYTES 5

/* Opens a list or map as the value of key. A failure still opens it (as
 * a lost level), so that the calls up to its st_args_end stay inside. */
static int begin(st_args_t *a, const char *key, int map) {
  if (!a) return ST_ERR_INVALID_ARGUMENT;
  int top = a->depth + a->lost == 0;
  int rc = st__client_args_place(a, key, 1);
  if (rc == ST_OK && !a->open && !(a->open = malloc(ST__ARGS_MAX_OPEN * sizeof *a->open)))
    rc = FAIL(a, ST_ERR_OUT_OF_MEMORY, "out of memory");
  if (rc == ST_OK && top) {
    size_t n = strlen(key) + 1;
    free(a->build_key);
    if ((a->build_key = malloc(n)) != NULL)
      memcpy(a->build_key, key, n);
    else
      rc = FAIL(a, ST_ERR_OUT_OF_MEMORY, "out of memory");
  }
  if (rc != ST_OK) {
    if (top) a->build_rc = rc;
    a->lost++;
    return rc;
  }
  st__args_frame_t *f = &a->open[a->depth++];
  memset(f, 0, sizeof *f);
  f->head = a->build.sb.size;
  f->map = map;
  f->kq_base = f->kq_pos = a->keys.sb.size;
  static const char head[2][HEAD_BYTES] = {{(char)0xdd, 0, 0, 0, 0}, {(char)0xdf, 0, 0, 0, 0}};
  st__client_cbuf_raw(&a->build.pk, head[map], HEAD_BYTES);
  if (a->build.oom) return FAIL(a, ST_ERR_OUT_OF_MEMORY, "out of memory");
  return ST_OK;
}

/* See client.h. Thread of the map. */
ST_API int st_args_begin_list(st_args_t *a, const char *key) { return begin(a, key, 0); }
ST_API int st_args_begin_map(st_args_t *a, const char *key) { return begin(a, key, 1); }

/* Rewrites f's placeholder header with its count, in the shortest form. */
static void close_header(st_args_t *a, const st__args_frame_t *f) {
  unsigned char h[HEAD_BYTES];
  size_t hl;
  uint32_t n = f->count;
  if (n < 16) {
    h[0] = (unsigned char)((f->map ? 0x80 : 0x90) | n);
    hl = 1;
  } else if (n <= 0xffff) {
    h[0] = f->map ? 0xde : 0xdc;
    h[1] = (unsigned char)(n >> 8);
    h[2] = (unsigned char)n;
    hl = 3;
  } else {
    h[0] = f->map ? 0xdf : 0xdd;
    for (int i = 0; i < 4; i++) h[1 + i] = (unsigned char)(n >> (24 - 8 * i));
    hl = 5;
  }
  char *base = a->build.sb.data + f->head;
  size_t body = a->build.sb.size - f->head - HEAD_BYTES;
  if (hl < HEAD_BYTES) memmove(base + hl, base + HEAD_BYTES, body);
  memcpy(base, h, hl);
  a->build.sb.size -= HEAD_BYTES - hl;
}

/* Sets the finished top-level value (or drops it after a failure) and
 * leaves the builder empty. Returns the outcome. */
static int finish(st_args_t *a) {
  int rc = a->build_rc;
  if (rc == ST_OK && (a->build.oom || a->keys.oom)) rc = ST_ERR_OUT_OF_MEMORY;
  if (rc == ST_OK)
    rc = st__client_args_set_raw(a, a->build_key, strlen(a->build_key), a->build.sb.data,
                                 a->build.sb.size);
  if (rc == ST_ERR_OUT_OF_MEMORY && a->build_rc == ST_OK)
    snprintf(a->err, sizeof a->err, "argument '%s': out of memory", st__client_args_name(a));
  free(a->build_key);
  a->build_key = NULL;
  a->build.sb.size = a->keys.sb.size = 0;
  a->build.oom = a->keys.oom = 0;
  a->build_rc = ST_OK;
  return rc;
}

/* Closes the innermost open container; see client.h. */
ST_API int st_args_end(st_args_t *a) {
  if (!a) return ST_ERR_INVALID_ARGUMENT;
  if (a->depth + a->lost == 0)
    return FAIL(a, ST_ERR_INVALID_ARGUMENT, "st_args_end with no list or map open");
  if (a->lost > 0) {
    a->lost--;
  } else {
    st__args_frame_t *f = &a->open[a->depth - 1];
    if (a->build_rc == ST_OK && f->kq_count)
      FAIL(a, ST_ERR_INVALID_ARGUMENT, "argument '%s': %u queued map keys have no value",
           st__client_args_name(a), (unsigned)f->kq_count);
    if (a->build_rc == ST_OK && !a->build.oom) close_header(a, f);
    a->keys.sb.size = f->kq_base;
    a->depth--;
    if (a->depth > 0 && a->build_rc == ST_OK) a->open[a->depth - 1].count++;
  }
  return a->depth + a->lost > 0 ? a->build_rc : finish(a);
}

/* ---------------------------------------------------------------- keys */

/* Queues n keys (packed back to back in data, lens[i] bytes each) for the
 * next members of the innermost open map. */
ST_API int st_args_keys(st_args_t *a, const char *data, const size_t *lens, size_t n) {
  if (!a) return ST_ERR_INVALID_ARGUMENT;
  if (a->depth + a->lost == 0)
    return FAIL(a, ST_ERR_INVALID_ARGUMENT, "st_args_keys outside a map (st_args_begin_map)");
  if (a->build_rc != ST_OK) return a->build_rc;
  st__args_frame_t *f = &a->open[a->depth - 1];
  const char *name = st__client_args_name(a);
  if (!f->map) return FAIL(a, ST_ERR_INVALID_ARGUMENT, "argument '%s': keys inside a list", name);
  if (n && !lens) return FAIL(a, ST_ERR_INVALID_ARGUMENT, "argument '%s': NULL key lengths", name);
  if (n > UINT32_MAX - f->kq_count)
    return FAIL(a, ST_ERR_INVALID_ARGUMENT, "argument '%s': too many queued keys", name);
  for (size_t i = 0; i < n; i++)
    if ((!data && lens[i]) || lens[i] > UINT32_MAX)
      return FAIL(a, ST_ERR_INVALID_ARGUMENT, "argument '%s': key %zu is NULL or too long",
                  name, i);
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    msgpack_pack_str_with_body(&a->keys.pk, data ? data + off : "", lens[i]);
    off += lens[i];
  }
  if (a->keys.oom) return FAIL(a, ST_ERR_OUT_OF_MEMORY, "out of memory");
  f->kq_count += (uint32_t)n;
  return ST_OK;
}

/* One queued key of `len` bytes. */
ST_API int st_args_key(st_args_t *a, const char *key, size_t len) {
  return st_args_keys(a, key, &len, 1);
}

/* ------------------------------------------------------------ bulk values */

/* Packs element i of a bulk array. */
typedef void (*pack_one_fn)(msgpack_packer *pk, const void *v, size_t i);

static void pack_int(msgpack_packer *pk, const void *v, size_t i) {
  msgpack_pack_int64(pk, ((const int64_t *)v)[i]);
}

static void pack_float(msgpack_packer *pk, const void *v, size_t i) {
  msgpack_pack_double(pk, ((const double *)v)[i]);
}

/* Places n values of array v, each behind its queued key in a map. */
static int put_many(st_args_t *a, const void *v, size_t n, pack_one_fn pack, const char *what) {
  if (!a) return ST_ERR_INVALID_ARGUMENT;
  int rc = st__client_args_place_many(a, n, what);
  if (rc != ST_OK) return rc;
  if (!v && n) return FAIL(a, ST_ERR_INVALID_ARGUMENT, "%s: NULL values", what);
  for (size_t i = 0; i < n; i++) {
    st__client_args_next_key(a);
    pack(&a->build.pk, v, i);
  }
  return st__client_args_placed(a, NULL, n);
}

/* See client.h. */
ST_API int st_args_ints(st_args_t *a, const int64_t *v, size_t n) {
  return put_many(a, v, n, pack_int, "st_args_ints");
}

ST_API int st_args_floats(st_args_t *a, const double *v, size_t n) {
  return put_many(a, v, n, pack_float, "st_args_floats");
}

ST_API int st_args_strs(st_args_t *a, const char *data, const size_t *lens, size_t n) {
  if (!a) return ST_ERR_INVALID_ARGUMENT;
  int rc = st__client_args_place_many(a, n, "st_args_strs");
  if (rc != ST_OK) return rc;
  if (n && !lens) return FAIL(a, ST_ERR_INVALID_ARGUMENT, "st_args_strs: NULL lengths");
  for (size_t i = 0; i < n; i++)
    if ((!data && lens[i]) || lens[i] > UINT32_MAX)
      return FAIL(a, ST_ERR_INVALID_ARGUMENT, "st_args_strs: string %zu is NULL or too long", i);
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    st__client_args_next_key(a);
    msgpack_pack_str_with_body(&a->build.pk, data ? data + off : "", lens[i]);
    off += lens[i];
  }
  return st__client_args_placed(a, NULL, n);
}
