/* src/proto/viewvalue.c: a result's value seen through a view spec
 * (viewspec.h, "values"). No state; any thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fail.h"
#include "proto/viewspec.h"

typedef struct walk {
  const st__viewspec_t *v;
  st__view_tensor_fn fn;
  void *ud;
  char path[ST__VIEW_NAME_MAX + 1];
  size_t path_len;
  size_t ntensors;
  unsigned taken[ST__VIEW_RULES_MAX];     /* tensors each rule took */
  unsigned matched[ST__VIEW_RULES_MAX];   /* tensors each selector matches */
  char names[200];            /* the first names, for "selects no tensor" */
  size_t names_len;
  uint64_t steps, max_steps;  /* the walk's cost so far, its bound (0: none) */
  char *err;
  size_t errlen;
} walk_t;

/* Counts `n` steps; 1 when the walk passed its bound. */
static int spend(walk_t *w, uint64_t n) {
  w->steps += n;
  return w->max_steps && w->steps > w->max_steps;
}

/* Appends ".seg" (or "seg" at the root); the old length, or (size_t)-1
 * when the name would be too long (err set). */
static size_t path_push(walk_t *w, const char *seg, size_t n) {
  size_t old = w->path_len, need = old + (old ? 1 : 0) + n;
  if (need > ST__VIEW_NAME_MAX) {
    st__fail(ST_ERR_INVALID_ARGUMENT, w->err, w->errlen,
             "view: a tensor name is longer than %d bytes", ST__VIEW_NAME_MAX);
    return (size_t)-1;
  }
  if (old) w->path[w->path_len++] = '.';
  if (n) memcpy(w->path + w->path_len, seg, n);   /* an empty key's ptr may be NULL */
  w->path_len += n;
  w->path[w->path_len] = '\0';
  return old;
}

static void path_pop(walk_t *w, size_t old) {
  w->path_len = old;
  w->path[old] = '\0';
}

static void note_name(walk_t *w) {
  size_t room = sizeof w->names - w->names_len;
  if (room < 8) return;
  int k = snprintf(w->names + w->names_len, room, "%s%s", w->names_len ? ", " : "",
                   w->path_len ? w->path : "''");
  if (k > 0 && (size_t)k < room) w->names_len += (size_t)k;
  else if (room > 4) w->names_len += (size_t)snprintf(w->names + w->names_len, room, "...");
}

/* One tensor seen through its rule: *d its window, *rule the rule that
 * took it (-1: none), *materialize whether that rule asks for a copy. */
static int view_tensor(walk_t *w, const msgpack_object *o, st__tensor_desc_t *d, int *rule,
                       int *materialize) {
  char why[200];
  *materialize = 0;
  if (st__parse_tensor(o, d, why, sizeof why) != ST_OK)
    return st__fail(ST_ERR_PROTOCOL, w->err, w->errlen, "view: tensor '%s': %s", w->path, why);
  note_name(w);
  *rule = st__viewspec_match(w->v, w->path, w->path_len, &w->steps);
  /* Whether a later rule also selects it, for the message of a rule that
   * takes nothing: only rules that took nothing and matched nothing yet
   * need to know. */
  for (int i = *rule + 1; *rule >= 0 && i < w->v->nrules; i++)
    if (!w->taken[i] && !w->matched[i])
      w->matched[i] +=
          (unsigned)st__viewspec_glob_match(&w->v->rules[i].glob, w->path, w->path_len, &w->steps);
  if (spend(w, ST__VIEW_OBJECT_STEPS)) return ST__VIEW_OVER_BUDGET;
  if (*rule >= 0) {
    int rc = st__viewspec_apply(w->v, *rule, w->path, w->path_len, d, materialize, w->err,
                                w->errlen);
    if (rc != ST_OK) return rc;
    w->taken[*rule]++;
  }
  return ST_OK;
}

/* Hands a viewed tensor to fn and packs it. */
static int emit_tensor(walk_t *w, msgpack_packer *pk, st__tensor_desc_t *d, int rule,
                       int materialize) {
  if (w->fn) {
    int rc = w->fn(w->ud, w->ntensors, rule, materialize, d, w->err, w->errlen);
    if (rc != ST_OK) return rc;
  }
  w->ntensors++;
  st__pack_tensor(pk, d);
  return ST_OK;
}

static int put_tensor(walk_t *w, msgpack_packer *pk, const msgpack_object *o) {
  st__tensor_desc_t d;
  int rule, materialize;
  int rc = view_tensor(w, o, &d, &rule, &materialize);
  return rc == ST_OK ? emit_tensor(w, pk, &d, rule, materialize) : rc;
}

/* A viewed tensor of a module, held until all of them are viewed. */
typedef struct member {
  st__tensor_desc_t d;
  int rule;
  int materialize;
} member_t;

/* A module's tensors share one arena (docs/protocol.md, "Module"): when
 * its view copies one of them, every one is copied (each its window), so
 * all of them land in the copies' arena. The tensors are viewed first
 * (every bound checked), then handed to fn and packed. */
static int put_module(walk_t *w, msgpack_packer *pk, const msgpack_object *o) {
  msgpack_unpacked payload;
  const msgpack_object *tensors = NULL, *meta = NULL;
  char why[200] = "";
  int rc = st__parse_module(o, &payload, &tensors, &meta, why, sizeof why);
  if (rc != ST_OK || !tensors || tensors->type != MSGPACK_OBJECT_ARRAY) {
    if (rc == ST_OK) msgpack_unpacked_destroy(&payload);
    return st__fail(rc == ST_ERR_OUT_OF_MEMORY ? rc : ST_ERR_PROTOCOL, w->err, w->errlen,
                    "view: module '%s': %s", w->path, why[0] ? why : "no tensors array");
  }
  uint32_t n = tensors->via.array.size;
  member_t *m = malloc((n ? n : 1) * sizeof *m);
  if (!m) {
    msgpack_unpacked_destroy(&payload);
    return st__fail(ST_ERR_OUT_OF_MEMORY, w->err, w->errlen, "out of memory");
  }
  int copied = 0;
  for (uint32_t i = 0; i < n && rc == ST_OK; i++) {
    /* st__parse_module checked each pair: [str, tensor]. */
    const msgpack_object *pair = tensors->via.array.ptr[i].via.array.ptr;
    size_t old = path_push(w, pair[0].via.str.ptr, pair[0].via.str.size);
    if (old == (size_t)-1) {
      rc = ST_ERR_INVALID_ARGUMENT;
      break;
    }
    rc = view_tensor(w, &pair[1], &m[i].d, &m[i].rule, &m[i].materialize);
    copied |= m[i].materialize;
    path_pop(w, old);
  }
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer mp;
  msgpack_packer_init(&mp, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&mp, meta ? 2 : 1);
  st__pack_cstr(&mp, "tensors");
  msgpack_pack_array(&mp, n);
  for (uint32_t i = 0; i < n && rc == ST_OK; i++) {
    msgpack_pack_array(&mp, 2);
    msgpack_pack_object(&mp, tensors->via.array.ptr[i].via.array.ptr[0]);
    rc = emit_tensor(w, &mp, &m[i].d, m[i].rule, copied);
  }
  if (rc == ST_OK && meta) {
    st__pack_cstr(&mp, "metadata");
    msgpack_pack_object(&mp, *meta);
  }
  if (rc == ST_OK) st__pack_ext(pk, ST_EXT_MODULE, &sb);
  msgpack_sbuffer_destroy(&sb);
  msgpack_unpacked_destroy(&payload);
  free(m);
  return rc;
}

static int put_value(walk_t *w, msgpack_packer *pk, const msgpack_object *o, int depth) {
  if (spend(w, ST__VIEW_OBJECT_STEPS)) return ST__VIEW_OVER_BUDGET;
  if (depth > ST_MAX_DEPTH)
    return st__fail(ST_ERR_PROTOCOL, w->err, w->errlen, "view: the value nests deeper than %d",
                    ST_MAX_DEPTH);
  if (o->type == MSGPACK_OBJECT_EXT && o->via.ext.type == ST_EXT_TENSOR)
    return put_tensor(w, pk, o);
  if (o->type == MSGPACK_OBJECT_EXT && o->via.ext.type == ST_EXT_MODULE)
    return put_module(w, pk, o);
  if (o->type == MSGPACK_OBJECT_ARRAY) {
    msgpack_pack_array(pk, o->via.array.size);
    for (uint32_t i = 0; i < o->via.array.size; i++) {
      char seg[16];
      int k = snprintf(seg, sizeof seg, "%u", i);
      size_t old = path_push(w, seg, (size_t)k);
      if (old == (size_t)-1) return ST_ERR_INVALID_ARGUMENT;
      int rc = put_value(w, pk, &o->via.array.ptr[i], depth + 1);
      path_pop(w, old);
      if (rc != ST_OK) return rc;
    }
    return ST_OK;
  }
  if (o->type == MSGPACK_OBJECT_MAP) {
    msgpack_pack_map(pk, o->via.map.size);
    for (uint32_t i = 0; i < o->via.map.size; i++) {
      const msgpack_object *k = &o->via.map.ptr[i].key;
      msgpack_pack_object(pk, *k);
      size_t old = w->path_len;
      if (k->type == MSGPACK_OBJECT_STR) old = path_push(w, k->via.str.ptr, k->via.str.size);
      if (old == (size_t)-1) return ST_ERR_INVALID_ARGUMENT;
      int rc = put_value(w, pk, &o->via.map.ptr[i].val, depth + 1);
      path_pop(w, old);
      if (rc != ST_OK) return rc;
    }
    return ST_OK;
  }
  msgpack_pack_object(pk, *o);
  return ST_OK;
}

/* See viewspec.h. */
int st__viewspec_value(const st__viewspec_t *v, const char *value, size_t len,
                       msgpack_sbuffer *out, st__view_tensor_fn fn, void *ud, char *err,
                       size_t errlen) {
  return st__viewspec_value_bounded(v, value, len, out, fn, ud, 0, NULL, err, errlen);
}

/* See viewspec.h. */
int st__viewspec_value_bounded(const st__viewspec_t *v, const char *value, size_t len,
                               msgpack_sbuffer *out, st__view_tensor_fn fn, void *ud,
                               uint64_t max_steps, uint64_t *steps, char *err, size_t errlen) {
  walk_t *w = calloc(1, sizeof *w);
  if (!w) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  w->max_steps = max_steps;
  w->v = v;
  w->fn = fn;
  w->ud = ud;
  w->err = err;
  w->errlen = errlen;
  msgpack_unpacked up;
  msgpack_unpacked_init(&up);
  msgpack_packer pk;
  msgpack_packer_init(&pk, out, msgpack_sbuffer_write);
  int rc = ST_OK;
  if (!len) {
    msgpack_pack_nil(&pk);
  } else if (msgpack_unpack_next(&up, value, len, NULL) != MSGPACK_UNPACK_SUCCESS) {
    rc = st__fail(ST_ERR_PROTOCOL, err, errlen, "view: the value is not msgpack");
  } else {
    rc = put_value(w, &pk, &up.data, 0);
  }
  for (int i = 0; rc == ST_OK && i < v->nrules; i++)
    if (!w->taken[i] && w->matched[i])
      rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "view: rule %d ('%s') takes no tensor: earlier rules take every tensor it "
                    "selects (a tensor takes the first rule that selects it)",
                    i + 1, v->rules[i].selector);
    else if (!w->taken[i])
      rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "view: rule %d ('%s') selects no tensor (tensors: %s)", i + 1,
                    v->rules[i].selector, w->names_len ? w->names : "none");
  if (steps) *steps = w->steps;
  msgpack_unpacked_destroy(&up);
  free(w);
  return rc;
}
