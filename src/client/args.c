/* src/client: named call arguments (st_args_t): the map of name ->
 * msgpack bytes of one value that call and rpc pack as the argument map,
 * where each value goes (place / placed: the top level, or the innermost
 * open list or map of args_nest.c), and the scalar setters.
 *
 * Threads: an st_args_t belongs to one thread at a time.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_internal.h"

#define FAIL st__client_args_fail

/* See client_internal.h. */
int st__client_args_fail(st_args_t *a, int rc, const char *fmt, ...) {
  if (a->depth + a->lost > 0) {
    if (a->build_rc != ST_OK) return a->build_rc;
    a->build_rc = rc;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(a->err, sizeof a->err, fmt, ap);
  va_end(ap);
  return rc;
}

/* See client_internal.h. */
const char *st__client_args_name(const st_args_t *a) {
  return a->build_key ? a->build_key : "?";
}

/* See client_internal.h. */
size_t st__client_args_arenas(const st_args_t *a, st__mapping_t *const **out) {
  *out = a ? a->arenas : NULL;
  return a ? a->narenas : 0;
}

/* See client_internal.h. */
long st__client_args_arena_index(st_args_t *a, st__mapping_t *m) {
  for (size_t i = 0; i < a->narenas; i++) {
    if (a->arenas[i] == m) {
      st__client_mapping_release(m);
      return (long)i;
    }
  }
  if (a->narenas == a->arenas_cap) {
    size_t cap = a->arenas_cap ? a->arenas_cap * 2 : 4;
    st__mapping_t **p = realloc(a->arenas, cap * sizeof *p);
    if (!p) {
      st__client_mapping_release(m);
      return -1;
    }
    a->arenas = p;
    a->arenas_cap = cap;
  }
  a->arenas[a->narenas] = m;
  return (long)a->narenas++;
}

/* See client_internal.h. */
int st__client_args_open(const st_args_t *a) { return a && a->depth + a->lost > 0; }

/* New empty argument map, owned by the caller (st_args_free); NULL when out
 * of memory. Any thread. */
ST_API st_args_t *st_args_new(void) {
  st_args_t *a = calloc(1, sizeof(st_args_t));
  if (!a) return NULL;
  st__client_cbuf_init(&a->build);
  st__client_cbuf_init(&a->keys);
  /* Most values are small: msgpack_sbuffer would start at 8 KiB, which
   * a garbage-collected binding (LuaJIT) keeps per map until it collects. */
  if ((a->build.sb.data = malloc(256)) != NULL) a->build.sb.alloc = 256;
  return a;
}

/* Frees the map, its values and an unfinished value. NULL ok. */
ST_API void st_args_free(st_args_t *a) {
  if (!a) return;
  for (size_t i = 0; i < a->n; i++) {
    free(a->items[i].key);
    free(a->items[i].data);
  }
  for (size_t i = 0; i < a->narenas; i++) st__client_mapping_release(a->arenas[i]);
  st__client_cbuf_destroy(&a->build);
  st__client_cbuf_destroy(&a->keys);
  free(a->open);
  free(a->build_key);
  free(a->arenas);
  free(a->items);
  free(a);
}

/* See client.h. Borrowed. */
ST_API const char *st_args_error(const st_args_t *a) { return a ? a->err : ""; }

/* See client_internal.h: copies key and bytes; the last set wins. */
int st__client_args_set_raw(st_args_t *a, const char *key, size_t key_len, const void *data,
                            size_t len) {
  if (!a || !key || key_len == 0 || !data || len == 0) return ST_ERR_INVALID_ARGUMENT;
  char *copy = malloc(len);
  if (!copy) return ST_ERR_OUT_OF_MEMORY;
  memcpy(copy, data, len);
  for (size_t i = 0; i < a->n; i++) {
    if (a->items[i].key_len == key_len && memcmp(a->items[i].key, key, key_len) == 0) {
      free(a->items[i].data);
      a->items[i].data = copy;
      a->items[i].len = len;
      return ST_OK;
    }
  }
  if (a->n == a->cap) {
    size_t cap = a->cap ? a->cap * 2 : 8;
    st__arg_t *p = realloc(a->items, cap * sizeof *p);
    if (!p) {
      free(copy);
      return ST_ERR_OUT_OF_MEMORY;
    }
    a->items = p;
    a->cap = cap;
  }
  char *k = malloc(key_len + 1);
  if (!k) {
    free(copy);
    return ST_ERR_OUT_OF_MEMORY;
  }
  memcpy(k, key, key_len);
  k[key_len] = '\0';
  a->items[a->n++] = (st__arg_t){k, key_len, copy, len};
  return ST_OK;
}

/* Packs {key: value, ...}; NULL packs an empty map. An unfinished value is
 * not part of it (the calls refuse such arguments first). */
void st__client_args_pack(msgpack_packer *pk, const st_args_t *a) {
  size_t n = a ? a->n : 0;
  msgpack_pack_map(pk, n);
  for (size_t i = 0; i < n; i++) {
    msgpack_pack_str_with_body(pk, a->items[i].key, a->items[i].key_len);
    st__client_cbuf_raw(pk, a->items[i].data, a->items[i].len);
  }
}

/* ------------------------------------------------------------ placing */

/* Writes the next queued key of map frame f into build. */
static void pop_key(st_args_t *a, st__args_frame_t *f) {
  const unsigned char *k = (const unsigned char *)a->keys.sb.data + f->kq_pos;
  size_t n;
  if (k[0] >= 0xa0 && k[0] <= 0xbf) n = 1 + (k[0] & 0x1f);
  else if (k[0] == 0xd9) n = 2 + (size_t)k[1];
  else if (k[0] == 0xda) n = 3 + ((size_t)k[1] << 8 | k[2]);
  else n = 5 + ((size_t)k[1] << 24 | (size_t)k[2] << 16 | (size_t)k[3] << 8 | k[4]);
  st__client_cbuf_raw(&a->build.pk, k, n);
  f->kq_pos += n;
  f->kq_count--;
}

/* Checks that nvalues more values fit the innermost open container and,
 * in a map, that those with a NULL key have a queued key each. */
static int check_room(st_args_t *a, const char *key, size_t nvalues, int nest) {
  st__args_frame_t *f = &a->open[a->depth - 1];
  const char *name = st__client_args_name(a);
  if (nest && a->depth == ST__ARGS_MAX_OPEN)
    return FAIL(a, ST_ERR_INVALID_ARGUMENT,
                "argument '%s': lists and maps nested deeper than %d levels", name,
                ST__ARGS_MAX_OPEN);
  if (nvalues > UINT32_MAX - f->count)
    return FAIL(a, ST_ERR_INVALID_ARGUMENT, "argument '%s': more than %u values in a container",
                name, (unsigned)UINT32_MAX);
  if (!f->map) {
    if (key)
      return FAIL(a, ST_ERR_INVALID_ARGUMENT,
                  "argument '%s': a list element takes no key (pass NULL)", name);
  } else if (key && f->kq_count) {
    return FAIL(a, ST_ERR_INVALID_ARGUMENT,
                "argument '%s': %u queued keys (st_args_key) name the next members (pass NULL)",
                name, (unsigned)f->kq_count);
  } else if (!key && nvalues == 1 && f->kq_count == 0) {
    return FAIL(a, ST_ERR_INVALID_ARGUMENT,
                "argument '%s': a map member needs a key (pass one, or st_args_key first)", name);
  } else if (!key && f->kq_count < nvalues) {
    return FAIL(a, ST_ERR_INVALID_ARGUMENT,
                "argument '%s': %zu map members need a key each (st_args_keys first; %u "
                "queued)", name, nvalues, (unsigned)f->kq_count);
  }
  return ST_OK;
}

/* See client_internal.h. */
int st__client_args_place(st_args_t *a, const char *key, int nest) {
  if (a->depth + a->lost == 0) {
    if (!key || !*key)
      return FAIL(a, ST_ERR_INVALID_ARGUMENT, "an argument needs a non-empty name");
    a->build.sb.size = 0;
    a->build.oom = 0;
    return ST_OK;
  }
  if (a->build_rc != ST_OK) return a->build_rc;
  int rc = check_room(a, key, 1, nest);
  if (rc != ST_OK) return rc;
  st__args_frame_t *f = &a->open[a->depth - 1];
  if (f->map && key)
    msgpack_pack_str_with_body(&a->build.pk, key, strlen(key));
  else if (f->map)
    pop_key(a, f);
  return ST_OK;
}

/* See client_internal.h. */
int st__client_args_place_many(st_args_t *a, size_t n, const char *what) {
  if (a->depth + a->lost == 0)
    return FAIL(a, ST_ERR_INVALID_ARGUMENT, "%s places values in an open list or map", what);
  if (a->build_rc != ST_OK) return a->build_rc;
  return check_room(a, NULL, n, 0);
}

/* See client_internal.h. */
void st__client_args_next_key(st_args_t *a) {
  st__args_frame_t *f = &a->open[a->depth - 1];
  if (f->map) pop_key(a, f);
}

/* See client_internal.h. */
int st__client_args_placed(st_args_t *a, const char *key, size_t nvalues) {
  if (a->depth + a->lost > 0) {
    if (a->build.oom || a->keys.oom) return FAIL(a, ST_ERR_OUT_OF_MEMORY, "out of memory");
    a->open[a->depth - 1].count += (uint32_t)nvalues;
    return ST_OK;
  }
  int rc = a->build.oom ? ST_ERR_OUT_OF_MEMORY
                        : st__client_args_set_raw(a, key, strlen(key), a->build.sb.data,
                                                  a->build.sb.size);
  a->build.sb.size = 0;
  a->build.oom = 0;
  return rc == ST_OK ? ST_OK : FAIL(a, rc, "argument '%s': out of memory", key);
}

/* Typed setters: see client.h. Thread of the map. */
ST_API int st_args_nil(st_args_t *a, const char *key) {
  if (!a) return ST_ERR_INVALID_ARGUMENT;
  int rc = st__client_args_place(a, key, 0);
  if (rc != ST_OK) return rc;
  msgpack_pack_nil(&a->build.pk);
  return st__client_args_placed(a, key, 1);
}

/* key = boolean (v != 0). */
ST_API int st_args_bool(st_args_t *a, const char *key, int v) {
  if (!a) return ST_ERR_INVALID_ARGUMENT;
  int rc = st__client_args_place(a, key, 0);
  if (rc != ST_OK) return rc;
  st__pack_bool(&a->build.pk, v);
  return st__client_args_placed(a, key, 1);
}

/* key = integer (the shortest msgpack form). */
ST_API int st_args_int(st_args_t *a, const char *key, int64_t v) {
  if (!a) return ST_ERR_INVALID_ARGUMENT;
  int rc = st__client_args_place(a, key, 0);
  if (rc != ST_OK) return rc;
  msgpack_pack_int64(&a->build.pk, v);
  return st__client_args_placed(a, key, 1);
}

/* key = float (a msgpack float64). */
ST_API int st_args_float(st_args_t *a, const char *key, double v) {
  if (!a) return ST_ERR_INVALID_ARGUMENT;
  int rc = st__client_args_place(a, key, 0);
  if (rc != ST_OK) return rc;
  msgpack_pack_double(&a->build.pk, v);
  return st__client_args_placed(a, key, 1);
}

/* key = a copy of `len` bytes as a msgpack str (binary: bin). */
static int put_bytes(st_args_t *a, const char *key, const void *p, size_t len, int binary) {
  if (!a) return ST_ERR_INVALID_ARGUMENT;
  int rc = st__client_args_place(a, key, 0);
  if (rc != ST_OK) return rc;
  if (!p && len) return FAIL(a, ST_ERR_INVALID_ARGUMENT, "NULL data of %zu bytes", len);
  if (len > UINT32_MAX)
    return FAIL(a, ST_ERR_INVALID_ARGUMENT, "a string of %zu bytes is too long", len);
  if (!p) p = "";
  if (binary)
    msgpack_pack_bin_with_body(&a->build.pk, p, len);
  else
    msgpack_pack_str_with_body(&a->build.pk, p, len);
  return st__client_args_placed(a, key, 1);
}

/* key = a copy of the NUL-terminated string v. */
ST_API int st_args_string(st_args_t *a, const char *key, const char *v) {
  if (a && !v) return FAIL(a, ST_ERR_INVALID_ARGUMENT, "NULL string");
  return put_bytes(a, key, v, v ? strlen(v) : 0, 0);
}

/* key = a copy of `len` bytes as a string. */
ST_API int st_args_str(st_args_t *a, const char *key, const char *s, size_t len) {
  return put_bytes(a, key, s, len, 0);
}

/* key = a copy of `len` bytes as binary. */
ST_API int st_args_bytes(st_args_t *a, const char *key, const void *p, size_t len) {
  return put_bytes(a, key, p, len, 1);
}

