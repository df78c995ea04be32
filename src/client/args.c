/* src/client: named call arguments (st_args_t) and the nested builder.
 *
 * An st_args_t is a small ordered map of name -> msgpack bytes of one
 * value; call and rpc pack it as the argument map. Values are packed as
 * they are set: a scalar at the top level is packed into `build` and
 * copied into its entry at once; a list or map opened at the top level is
 * packed into `build` element by element and becomes an entry when its
 * outermost st_args_end closes it.
 *
 * msgpack wants a container's count before its elements, and the builder
 * does not know it yet: each open container gets a 5-byte header (array32
 * or map32) that st_args_end rewrites with the count, in the shortest form
 * (fixarray / fixmap below 16, 16-bit below 65536), moving the body down.
 * So the bytes are those a one-shot packer would write.
 *
 * Threads: an st_args_t belongs to one thread at a time.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_internal.h"

/* Levels of lists and maps in one argument. The server reads a request
 * with at most ST_MAX_DEPTH levels of msgpack containers (the depth of
 * msgpack-c's unpacker; src/proto/reader.c), and a call's argument values
 * sit inside four of them: the request, its params array, the params map
 * and the argument map. Deeper values would cost the connection. */
#define MAX_OPEN (ST_MAX_DEPTH - 4)
#define HEAD_BYTES 5

typedef struct arg {
  char *key;        /* NUL-terminated; key_len bytes (may hold NUL) */
  size_t key_len;
  char *data;       /* msgpack bytes of the value */
  size_t len;
} arg_t;

typedef struct frame {
  size_t head;      /* offset of the container's header in build */
  uint32_t count;   /* elements or members placed so far */
  int map;
  int keyed;        /* map: st_args_key wrote a key; its value comes next */
} frame_t;

struct st_args {
  arg_t *items;
  size_t n, cap;
  /* Own allocations that tensor values name by index (st_args_tensor,
   * targs.c): one reference each, dropped by st_args_free. */
  st__mapping_t **arenas;
  size_t narenas, arenas_cap;
  /* The value being built (empty between top-level calls). */
  st__cbuf_t build;
  char *build_key;  /* name of the open top-level value */
  frame_t open[MAX_OPEN];
  int depth;        /* open containers with a frame */
  int lost;         /* open containers past MAX_OPEN (after a failure) */
  int build_rc;     /* first failure inside the open value, or ST_OK */
  char err[256];
};

/* Records a failure's message; inside an open value the first failure
 * sticks (build_rc). Returns rc. */
static int fail(st_args_t *a, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(st_args_t *a, int rc, const char *fmt, ...) {
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

/* The name used in messages about the open value. */
static const char *open_name(const st_args_t *a) {
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
  if (a) st__client_cbuf_init(&a->build);
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
    arg_t *p = realloc(a->items, cap * sizeof *p);
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
  a->items[a->n++] = (arg_t){k, key_len, copy, len};
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

/* Checks where a new value goes and, inside a map, writes its key. `nest`:
 * the value is a container (it needs a level of its own). ST_OK or a
 * recorded failure. */
static int place(st_args_t *a, const char *key, int nest) {
  if (a->depth + a->lost == 0) {
    if (!key || !*key) return fail(a, ST_ERR_INVALID_ARGUMENT, "an argument needs a non-empty name");
    a->build.sb.size = 0;
    a->build.oom = 0;
    return ST_OK;
  }
  if (a->build_rc != ST_OK) return a->build_rc;
  frame_t *f = &a->open[a->depth - 1];
  if (nest && a->depth == MAX_OPEN)
    return fail(a, ST_ERR_INVALID_ARGUMENT,
                "argument '%s': lists and maps nested deeper than %d levels", open_name(a),
                MAX_OPEN);
  if (f->count == UINT32_MAX)
    return fail(a, ST_ERR_INVALID_ARGUMENT, "argument '%s': more than %u values in a container",
                open_name(a), (unsigned)UINT32_MAX);
  if (!f->map) {
    if (key)
      return fail(a, ST_ERR_INVALID_ARGUMENT,
                  "argument '%s': a list element takes no key (pass NULL)", open_name(a));
  } else if (f->keyed) {
    if (key)
      return fail(a, ST_ERR_INVALID_ARGUMENT,
                  "argument '%s': st_args_key named this member already (pass NULL)",
                  open_name(a));
    f->keyed = 0;
  } else {
    if (!key)
      return fail(a, ST_ERR_INVALID_ARGUMENT,
                  "argument '%s': a map member needs a key (or st_args_key first)", open_name(a));
    msgpack_pack_str_with_body(&a->build.pk, key, strlen(key));
  }
  return ST_OK;
}

/* After a value was packed into build: a top-level value becomes the
 * entry `key`; inside a container it counts. */
static int placed(st_args_t *a, const char *key) {
  if (a->depth + a->lost > 0) {
    if (a->build.oom) return fail(a, ST_ERR_OUT_OF_MEMORY, "out of memory");
    a->open[a->depth - 1].count++;
    return ST_OK;
  }
  int rc = a->build.oom ? ST_ERR_OUT_OF_MEMORY
                        : st__client_args_set_raw(a, key, strlen(key), a->build.sb.data,
                                                  a->build.sb.size);
  a->build.sb.size = 0;
  a->build.oom = 0;
  return rc == ST_OK ? ST_OK : fail(a, rc, "argument '%s': out of memory", key);
}

/* Typed setters: see client.h. Thread of the map. */
ST_API int st_args_nil(st_args_t *a, const char *key) {
  if (!a) return ST_ERR_INVALID_ARGUMENT;
  int rc = place(a, key, 0);
  if (rc != ST_OK) return rc;
  msgpack_pack_nil(&a->build.pk);
  return placed(a, key);
}

/* key = boolean (v != 0). */
ST_API int st_args_bool(st_args_t *a, const char *key, int v) {
  if (!a) return ST_ERR_INVALID_ARGUMENT;
  int rc = place(a, key, 0);
  if (rc != ST_OK) return rc;
  if (v)
    msgpack_pack_true(&a->build.pk);
  else
    msgpack_pack_false(&a->build.pk);
  return placed(a, key);
}

/* key = integer (the shortest msgpack form). */
ST_API int st_args_int(st_args_t *a, const char *key, int64_t v) {
  if (!a) return ST_ERR_INVALID_ARGUMENT;
  int rc = place(a, key, 0);
  if (rc != ST_OK) return rc;
  msgpack_pack_int64(&a->build.pk, v);
  return placed(a, key);
}

/* key = float (a msgpack float64). */
ST_API int st_args_float(st_args_t *a, const char *key, double v) {
  if (!a) return ST_ERR_INVALID_ARGUMENT;
  int rc = place(a, key, 0);
  if (rc != ST_OK) return rc;
  msgpack_pack_double(&a->build.pk, v);
  return placed(a, key);
}

/* key = a copy of `len` bytes as a msgpack str (binary: bin). */
static int put_bytes(st_args_t *a, const char *key, const void *p, size_t len, int binary) {
  if (!a) return ST_ERR_INVALID_ARGUMENT;
  int rc = place(a, key, 0);
  if (rc != ST_OK) return rc;
  if (!p && len) return fail(a, ST_ERR_INVALID_ARGUMENT, "NULL data of %zu bytes", len);
  if (len > UINT32_MAX)
    return fail(a, ST_ERR_INVALID_ARGUMENT, "a string of %zu bytes is too long", len);
  if (!p) p = "";
  if (binary)
    msgpack_pack_bin_with_body(&a->build.pk, p, len);
  else
    msgpack_pack_str_with_body(&a->build.pk, p, len);
  return placed(a, key);
}

/* key = a copy of the NUL-terminated string v. */
ST_API int st_args_string(st_args_t *a, const char *key, const char *v) {
  if (a && !v) return fail(a, ST_ERR_INVALID_ARGUMENT, "NULL string");
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

/* ---------------------------------------------------------- containers */

/* Opens a list or map as the value of key. A failure still opens it (as
 * a lost level), so that the calls up to its st_args_end stay inside. */
static int begin(st_args_t *a, const char *key, int map) {
  if (!a) return ST_ERR_INVALID_ARGUMENT;
  int top = a->depth + a->lost == 0;
  int rc = place(a, key, 1);
  if (rc == ST_OK && top) {
    size_t n = strlen(key) + 1;
    free(a->build_key);
    if (!(a->build_key = malloc(n))) {
      rc = ST_ERR_OUT_OF_MEMORY;
    } else {
      memcpy(a->build_key, key, n);
    }
  }
  if (rc != ST_OK) {
    a->lost++;
    if (top) {
      a->build_rc = rc;
      if (rc == ST_ERR_OUT_OF_MEMORY) snprintf(a->err, sizeof a->err, "out of memory");
    }
    return rc;
  }
  frame_t *f = &a->open[a->depth++];
  f->head = a->build.sb.size;
  f->count = 0;
  f->map = map;
  f->keyed = 0;
  static const char head[2][HEAD_BYTES] = {{(char)0xdd, 0, 0, 0, 0}, {(char)0xdf, 0, 0, 0, 0}};
  st__client_cbuf_raw(&a->build.pk, head[map], HEAD_BYTES);
  if (a->build.oom) return fail(a, ST_ERR_OUT_OF_MEMORY, "out of memory");
  return ST_OK;
}

/* See client.h. */
ST_API int st_args_begin_list(st_args_t *a, const char *key) { return begin(a, key, 0); }
ST_API int st_args_begin_map(st_args_t *a, const char *key) { return begin(a, key, 1); }

/* Rewrites f's placeholder header with its count, in the shortest form. */
static void close_header(st_args_t *a, const frame_t *f) {
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

/* Closes the innermost open container; the outermost one sets its
 * argument (or drops it after a failure). See client.h. */
ST_API int st_args_end(st_args_t *a) {
  if (!a) return ST_ERR_INVALID_ARGUMENT;
  if (a->depth + a->lost == 0)
    return fail(a, ST_ERR_INVALID_ARGUMENT, "st_args_end with no list or map open");
  if (a->lost > 0) {
    a->lost--;
  } else {
    frame_t *f = &a->open[a->depth - 1];
    if (a->build_rc == ST_OK && f->keyed)
      fail(a, ST_ERR_INVALID_ARGUMENT, "argument '%s': a map key (st_args_key) has no value",
           open_name(a));
    if (a->build_rc == ST_OK && !a->build.oom) close_header(a, f);
    a->depth--;
    if (a->depth > 0 && a->build_rc == ST_OK) a->open[a->depth - 1].count++;
  }
  if (a->depth + a->lost > 0) return a->build_rc;
  int rc = a->build_rc;
  if (rc == ST_OK && a->build.oom) rc = ST_ERR_OUT_OF_MEMORY;
  if (rc == ST_OK)
    rc = st__client_args_set_raw(a, a->build_key, strlen(a->build_key), a->build.sb.data,
                                 a->build.sb.size);
  if (rc == ST_ERR_OUT_OF_MEMORY && a->build_rc == ST_OK)
    snprintf(a->err, sizeof a->err, "argument '%s': out of memory", open_name(a));
  free(a->build_key);
  a->build_key = NULL;
  a->build.sb.size = 0;
  a->build.oom = 0;
  a->build_rc = ST_OK;
  return rc;
}

/* Writes the key of the next member of the innermost open map. */
ST_API int st_args_key(st_args_t *a, const char *key, size_t len) {
  if (!a) return ST_ERR_INVALID_ARGUMENT;
  if (a->depth + a->lost == 0)
    return fail(a, ST_ERR_INVALID_ARGUMENT, "st_args_key outside a map (st_args_begin_map)");
  if (a->build_rc != ST_OK) return a->build_rc;
  frame_t *f = &a->open[a->depth - 1];
  if (!f->map)
    return fail(a, ST_ERR_INVALID_ARGUMENT, "argument '%s': st_args_key inside a list",
                open_name(a));
  if (f->keyed)
    return fail(a, ST_ERR_INVALID_ARGUMENT, "argument '%s': two keys without a value between",
                open_name(a));
  if (!key && len)
    return fail(a, ST_ERR_INVALID_ARGUMENT, "argument '%s': NULL key of %zu bytes",
                open_name(a), len);
  if (len > UINT32_MAX)
    return fail(a, ST_ERR_INVALID_ARGUMENT, "argument '%s': a key of %zu bytes is too long",
                open_name(a), len);
  msgpack_pack_str_with_body(&a->build.pk, key ? key : "", len);
  if (a->build.oom) return fail(a, ST_ERR_OUT_OF_MEMORY, "out of memory");
  f->keyed = 1;
  return ST_OK;
}

/* ---------------------------------------------------------- whole lists */

/* Places the header of a list of n known elements. */
static int list_head(st_args_t *a, const char *key, const void *v, size_t n) {
  if (!a) return ST_ERR_INVALID_ARGUMENT;
  int rc = place(a, key, 1);
  if (rc != ST_OK) return rc;
  if (!v && n) {
    rc = fail(a, ST_ERR_INVALID_ARGUMENT, "NULL list of %zu elements", n);
  } else if (n > UINT32_MAX) {
    rc = fail(a, ST_ERR_INVALID_ARGUMENT, "a list of %zu elements is too long", n);
  }
  if (rc != ST_OK) {
    if (a->depth + a->lost == 0) a->build.sb.size = 0;
    return rc;
  }
  msgpack_pack_array(&a->build.pk, (uint32_t)n);
  return ST_OK;
}

/* See client.h. */
ST_API int st_args_int_list(st_args_t *a, const char *key, const int64_t *v, size_t n) {
  int rc = list_head(a, key, v, n);
  if (rc != ST_OK) return rc;
  for (size_t i = 0; i < n; i++) msgpack_pack_int64(&a->build.pk, v[i]);
  return placed(a, key);
}

ST_API int st_args_float_list(st_args_t *a, const char *key, const double *v, size_t n) {
  int rc = list_head(a, key, v, n);
  if (rc != ST_OK) return rc;
  for (size_t i = 0; i < n; i++) msgpack_pack_double(&a->build.pk, v[i]);
  return placed(a, key);
}

ST_API int st_args_str_list(st_args_t *a, const char *key, const char *const *strs,
                            const size_t *lens, size_t n) {
  int rc = list_head(a, key, strs, n);
  if (rc != ST_OK) return rc;
  for (size_t i = 0; i < n; i++) {
    size_t len = lens ? lens[i] : strs[i] ? strlen(strs[i]) : 0;
    if ((!strs[i] && len) || len > UINT32_MAX || (!strs[i] && !lens)) {
      if (a->depth + a->lost == 0) a->build.sb.size = 0;
      return fail(a, ST_ERR_INVALID_ARGUMENT, "string %zu of the list is NULL or too long", i);
    }
    msgpack_pack_str_with_body(&a->build.pk, strs[i] ? strs[i] : "", len);
  }
  return placed(a, key);
}
