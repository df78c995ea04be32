/* src/lua: values between msgpack and Lua (docs/endpoints.md, "Results").
 *
 * Lua -> msgpack (results and declaration defaults):
 *   nil, booleans, strings; numbers with an integral value in int64 range
 *   become msgpack integers, others floats; a table whose keys are exactly
 *   1..n is an array, any other table a map whose keys must be strings
 *   (sorted, so equal values give equal bytes); an empty table is a map
 *   unless marked with st.array; tensors and modules are ext values whose
 *   arenas are listed in the build result, each arena once, in first-use
 *   order. Functions, other userdata, cycles and nesting deeper than
 *   ST_MAX_DEPTH are SERIALIZATION errors.
 *
 * msgpack -> Lua (call arguments): the reverse; integers become Lua numbers
 * (exact up to 2^53); an empty array gets the array marker so it comes back
 * as an array if returned. A nil inside an array or map becomes st.null
 * (the light userdata NULL, as cjson.null and ngx.null), so it keeps its
 * place: Lua tables cannot hold nil. An argument that is itself nil stays
 * nil (a.x == nil). st.null packs back as nil, anywhere.
 *
 * Binary (msgpack bin) and strings (str) stay apart: Lua has one string
 * type, so a bin value arrives as an st.bytes value (a full userdata of
 * its bytes: #b, tostring(b), b .. s, b == st.bytes(s), and the string
 * methods, b:sub(1, 2), on its bytes) and packs back as bin; a Lua string
 * packs as str. st.bytes(s) makes one from a string.
 *
 * The contract of each non-static function (what it does, returns and owns)
 * is its comment in value.h; all of them run on the thread that owns the
 * lua_State they are given.
 */
#include "lua/value.h"
#include "lua/module.h"
#include "lua/scope.h"
#include "lua/stlib.h"
#include "lua/tensor.h"
#include "proto/proto.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ st.bytes */

static char bytes_mt_key;     /* registry: metatable of binary values       */

typedef struct bytes {
  size_t n;
  char p[];
} bytes_t;

static bytes_t *tobytes(lua_State *L, int idx) {
  bytes_t *b = lua_type(L, idx) == LUA_TUSERDATA ? lua_touserdata(L, idx) : NULL;
  if (!b || !lua_getmetatable(L, idx)) return NULL;
  lua_pushlightuserdata(L, &bytes_mt_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  int is = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  return is ? b : NULL;
}

const char *st__lua_tobytes(lua_State *L, int idx, size_t *n) {
  bytes_t *b = tobytes(L, idx);
  if (b) *n = b->n;
  return b ? b->p : NULL;
}

/* [-0, +1] The value at idx as a Lua string when it is a binary value,
 * else the value itself. */
static void push_as_string(lua_State *L, int idx) {
  bytes_t *b = tobytes(L, idx);
  if (b) lua_pushlstring(L, b->p, b->n);
  else lua_pushvalue(L, idx);
}

static int bytes_tostring(lua_State *L) {
  push_as_string(L, 1);
  return 1;
}

static int bytes_len(lua_State *L) {
  bytes_t *b = tobytes(L, 1);
  lua_pushnumber(L, b ? (lua_Number)b->n : 0);
  return 1;
}

static int bytes_concat(lua_State *L) {
  push_as_string(L, 1);
  push_as_string(L, 2);
  lua_concat(L, 2);
  return 1;
}

static int bytes_eq(lua_State *L) {
  bytes_t *a = tobytes(L, 1), *b = tobytes(L, 2);
  lua_pushboolean(L, a && b && a->n == b->n && memcmp(a->p, b->p, a->n) == 0);
  return 1;
}

/* A string method called on a binary value: the method on its bytes. */
static int bytes_method(lua_State *L) {
  if (lua_gettop(L) >= 1) {
    push_as_string(L, 1);
    lua_replace(L, 1);
  }
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

/* b:name(...): string.name on the bytes; nil for other keys. */
static int bytes_index(lua_State *L) {
  lua_getfield(L, LUA_REGISTRYINDEX, "_LOADED");
  lua_getfield(L, -1, "string");
  if (lua_type(L, -1) != LUA_TTABLE || lua_type(L, 2) != LUA_TSTRING) {
    lua_pushnil(L);
    return 1;
  }
  lua_pushvalue(L, 2);
  lua_rawget(L, -2);
  if (lua_type(L, -1) != LUA_TFUNCTION) {
    lua_pushnil(L);
    return 1;
  }
  lua_pushcclosure(L, bytes_method, 1);
  return 1;
}

static void build_bytes_mt(lua_State *L) {
  static const luaL_Reg meta[] = {
    {"__tostring", bytes_tostring}, {"__len", bytes_len}, {"__concat", bytes_concat},
    {"__eq", bytes_eq}, {"__index", bytes_index}, {NULL, NULL}};
  lua_pushlightuserdata(L, &bytes_mt_key);
  st__lua_push_metatable(L, meta);
  lua_rawset(L, LUA_REGISTRYINDEX);
}

void st__lua_push_bytes(lua_State *L, const void *p, size_t n) {
  bytes_t *b = lua_newuserdata(L, sizeof *b + (n ? n : 1));
  b->n = n;
  if (n) memcpy(b->p, p, n);
  st__lua_push_built(L, &bytes_mt_key, build_bytes_mt);
  lua_setmetatable(L, -2);
}

int st__lua_bytes(lua_State *L) {
  if (tobytes(L, 1)) {
    lua_settop(L, 1);
    return 1;
  }
  if (lua_type(L, 1) != LUA_TSTRING)
    return luaL_error(L, "st.bytes: expected a string, got %s", luaL_typename(L, 1));
  size_t n;
  const char *s = lua_tolstring(L, 1, &n);
  st__lua_push_bytes(L, s, n);
  return 1;
}

/* ------------------------------------------------------------ Lua -> msgpack */

typedef struct packer {
  lua_State *L;
  st__build_result_t *res;     /* NULL: tensors and modules are refused */
  int visiting;                /* stack index of the set of tables on the path */
  char *err;
  size_t errlen;
  char path[512];
  size_t pathlen;
} packer_t;

static int fail(packer_t *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(packer_t *p, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(p->err, p->errlen, "%s: %s", p->path, msg);
  return ST_ERR_SERIALIZATION;
}

static size_t path_push_key(packer_t *p, const char *key) {
  size_t old = p->pathlen;
  int n = snprintf(p->path + old, sizeof p->path - old, ".%s", key);
  if (n > 0) p->pathlen = old + (size_t)n < sizeof p->path ? old + (size_t)n : sizeof p->path - 1;
  return old;
}

static size_t path_push_index(packer_t *p, size_t i) {
  size_t old = p->pathlen;
  int n = snprintf(p->path + old, sizeof p->path - old, "[%zu]", i);
  if (n > 0) p->pathlen = old + (size_t)n < sizeof p->path ? old + (size_t)n : sizeof p->path - 1;
  return old;
}

static void path_pop(packer_t *p, size_t old) {
  p->pathlen = old;
  p->path[old] = '\0';
}

/* Index of arena a in the result, adding it (with a reference) if new. */
static int arena_index(packer_t *p, st__arena_t *a, uint32_t *out) {
  st__build_result_t *r = p->res;
  for (size_t i = 0; i < r->narenas; i++)
    if (r->arenas[i] == a) {
      *out = (uint32_t)i;
      return ST_OK;
    }
  if (r->narenas >= ST_MAX_FDS_PER_MESSAGE) {
    snprintf(p->err, p->errlen, "%s: the result references more than %d arenas", p->path,
             ST_MAX_FDS_PER_MESSAGE);
    return ST_ERR_LIMIT;
  }
  st__arena_t **v = realloc(r->arenas, (r->narenas + 1) * sizeof *v);
  if (!v) {
    snprintf(p->err, p->errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  r->arenas = v;
  st__arena_ref(a);
  r->arenas[r->narenas] = a;
  r->bytes += st__arena_bytes(a);
  *out = (uint32_t)r->narenas++;
  return ST_OK;
}

static int pack_tensor(packer_t *p, msgpack_packer *pk, const st__tensor_t *t) {
  st__tensor_desc_t d;
  uint32_t arena;
  int rc = arena_index(p, t->arena, &arena);
  if (rc != ST_OK) return rc;
  st__tensor_describe(t, arena, &d);
  st__pack_tensor(pk, &d);
  return ST_OK;
}

static int pack_value(packer_t *p, msgpack_packer *pk, int idx, int depth);

typedef struct mapkey {
  const char *s;
  size_t len;
} mapkey_t;

static int key_cmp(const void *a, const void *b) {
  const mapkey_t *x = a, *y = b;
  int c = memcmp(x->s, y->s, x->len < y->len ? x->len : y->len);
  if (c) return c;
  return x->len < y->len ? -1 : x->len > y->len;
}

/* Packs the table at idx as a map with string keys (sorted). */
static int pack_map(packer_t *p, msgpack_packer *pk, int idx, size_t count, int depth) {
  lua_State *L = p->L;
  /* a userdata: nothing leaks if the Lua memory runs out below */
  mapkey_t *keys = lua_newuserdata(L, (count ? count : 1) * sizeof *keys);   /* ..., keys */
  size_t n = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {                  /* ..., key, value */
    lua_pop(L, 1);
    if (lua_type(L, -1) != LUA_TSTRING) {
      int t = lua_type(L, -1);
      lua_pop(L, 2);                          /* the key, the keys */
      return fail(p, "map keys must be strings (found a %s key)", lua_typename(L, t));
    }
    if (n < count) {                          /* anchored: the table holds the key */
      keys[n].s = lua_tolstring(L, -1, &keys[n].len);
      n++;
    }
  }
  qsort(keys, n, sizeof *keys, key_cmp);
  msgpack_pack_map(pk, n);
  int rc = ST_OK;
  for (size_t i = 0; i < n && rc == ST_OK; i++) {
    msgpack_pack_str(pk, keys[i].len);
    msgpack_pack_str_body(pk, keys[i].s, keys[i].len);
    lua_pushlstring(L, keys[i].s, keys[i].len);
    lua_rawget(L, idx);                       /* ..., value */
    size_t old = path_push_key(p, keys[i].s);
    rc = pack_value(p, pk, lua_gettop(L), depth + 1);
    path_pop(p, old);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);                              /* keys */
  return rc;
}

static int pack_table(packer_t *p, msgpack_packer *pk, int idx, int depth) {
  lua_State *L = p->L;
  lua_pushvalue(L, idx);
  lua_rawget(L, p->visiting);
  int seen = lua_toboolean(L, -1);
  lua_pop(L, 1);
  if (seen) return fail(p, "%s", "the value contains a cycle");
  lua_pushvalue(L, idx);
  lua_pushboolean(L, 1);
  lua_rawset(L, p->visiting);                 /* visiting[t] = true */

  size_t count = 0;
  int64_t max = 0;
  int all_int = 1;
  lua_pushnil(L);
  while (lua_next(L, idx)) {                  /* ..., key, value */
    lua_pop(L, 1);
    count++;
    int64_t k;
    if (lua_type(L, -1) == LUA_TNUMBER && st__lua_num_to_int(lua_tonumber(L, -1), &k) && k >= 1) {
      if (k > max) max = k;
    } else {
      all_int = 0;
    }
  }
  int is_array = all_int && (int64_t)count == max;
  if (count == 0) {
    is_array = 0;
    if (lua_getmetatable(L, idx)) {           /* ..., mt */
      st__lua_push_array_mt(L);
      is_array = lua_rawequal(L, -1, -2);
      lua_pop(L, 2);
    }
  }
  int rc = ST_OK;
  if (is_array) {
    msgpack_pack_array(pk, count);
    for (size_t i = 1; i <= count && rc == ST_OK; i++) {
      lua_rawgeti(L, idx, (int)i);
      size_t old = path_push_index(p, i);
      rc = pack_value(p, pk, lua_gettop(L), depth + 1);
      path_pop(p, old);
      lua_pop(L, 1);
    }
  } else {
    rc = pack_map(p, pk, idx, count, depth);
  }
  lua_pushvalue(L, idx);
  lua_pushnil(L);
  lua_rawset(L, p->visiting);                 /* visiting[t] = nil */
  return rc;
}

static int pack_module(packer_t *p, msgpack_packer *pk, int idx, const st__lmodule_t *m,
                       int depth) {
  lua_State *L = p->L;
  msgpack_sbuffer payload;
  msgpack_sbuffer_init(&payload);
  msgpack_packer mp;
  msgpack_packer_init(&mp, &payload, msgpack_sbuffer_write);
  int top = lua_gettop(L);
  lua_getfenv(L, idx);                        /* env */
  int env = lua_gettop(L);
  lua_rawgeti(L, env, ST__MODULE_NAMES);      /* env, names */
  lua_rawgeti(L, env, ST__MODULE_TENSORS);    /* env, names, views */
  int rc = ST_OK;
  msgpack_pack_map(&mp, 2);
  st__pack_cstr(&mp, "tensors");
  msgpack_pack_array(&mp, m->ntensors);
  for (size_t i = 1; i <= m->ntensors && rc == ST_OK; i++) {
    lua_rawgeti(L, env + 1, (int)i);          /* ..., name */
    size_t len;
    const char *name = lua_tolstring(L, -1, &len);
    lua_rawget(L, env + 2);                   /* ..., view */
    msgpack_pack_array(&mp, 2);
    msgpack_pack_str(&mp, len);
    msgpack_pack_str_body(&mp, name, len);
    rc = pack_tensor(p, &mp, lua_touserdata(L, -1));
    lua_pop(L, 1);
  }
  if (rc == ST_OK) {
    st__pack_cstr(&mp, "metadata");
    lua_rawgeti(L, env, ST__MODULE_METADATA); /* env, names, views, meta? */
    size_t old = path_push_key(p, "metadata");
    if (lua_isnil(L, -1)) {
      msgpack_pack_map(&mp, 0);
    } else if (depth + 1 > ST_MAX_DEPTH) {
      rc = fail(p, "nesting deeper than %s", "32");
    } else {
      size_t count = 0;
      lua_pushnil(L);
      while (lua_next(L, -2)) {
        count++;
        lua_pop(L, 1);
      }
      rc = pack_map(p, &mp, lua_gettop(L), count, depth + 1);
    }
    path_pop(p, old);
  }
  if (rc == ST_OK) st__pack_ext(pk, ST_EXT_MODULE, &payload);
  msgpack_sbuffer_destroy(&payload);
  lua_settop(L, top);
  return rc;
}

static int pack_value(packer_t *p, msgpack_packer *pk, int idx, int depth) {
  lua_State *L = p->L;
  if (!lua_checkstack(L, 8)) return fail(p, "%s", "Lua stack overflow");
  switch (lua_type(L, idx)) {
  case LUA_TNIL:
    msgpack_pack_nil(pk);
    return ST_OK;
  case LUA_TLIGHTUSERDATA:
    if (lua_touserdata(L, idx) != NULL) return fail(p, "cannot serialize a %s", "light userdata");
    msgpack_pack_nil(pk);                     /* st.null */
    return ST_OK;
  case LUA_TBOOLEAN:
    st__pack_bool(pk, lua_toboolean(L, idx));
    return ST_OK;
  case LUA_TNUMBER: {
    double d = lua_tonumber(L, idx);
    int64_t i;
    if (st__lua_num_to_int(d, &i)) msgpack_pack_int64(pk, i);
    else msgpack_pack_double(pk, d);
    return ST_OK;
  }
  case LUA_TSTRING: {
    size_t len;
    const char *s = lua_tolstring(L, idx, &len);
    msgpack_pack_str(pk, len);
    msgpack_pack_str_body(pk, s, len);
    return ST_OK;
  }
  case LUA_TTABLE:
    if (depth > ST_MAX_DEPTH) return fail(p, "nesting deeper than %s levels", "32");
    return pack_table(p, pk, idx, depth);
  case LUA_TUSERDATA: {
    bytes_t *b = tobytes(L, idx);
    if (b) {
      msgpack_pack_bin(pk, b->n);
      msgpack_pack_bin_body(pk, b->p, b->n);
      return ST_OK;
    }
    st__tensor_t *t = st__lua_totensor(L, idx);
    st__lmodule_t *m = t ? NULL : st__lua_tomodule(L, idx);
    if ((t || m) && !p->res) return fail(p, "%s cannot be a default value", t ? "a tensor" : "a module");
    if ((t && !t->arena) || (m && !m->arena)) return fail(p, "%s", ST__LUA_ENDED_MSG);
    if (t) return pack_tensor(p, pk, t);
    if (m) {
      if (depth > ST_MAX_DEPTH) return fail(p, "nesting deeper than %s levels", "32");
      return pack_module(p, pk, idx, m, depth);
    }
    if (st__lua_is_required(L, idx)) return fail(p, "cannot serialize %s", "st.required");
    return fail(p, "cannot serialize a %s", "userdata");
  }
  default:
    return fail(p, "cannot serialize a %s", lua_typename(L, lua_type(L, idx)));
  }
}

int st__lua_pack(lua_State *L, int idx, msgpack_packer *pk, st__build_result_t *res,
                 const char *root, char *err, size_t errlen) {
  char dummy[1];
  packer_t p = {.L = L, .res = res, .err = err ? err : dummy, .errlen = err ? errlen : 1};
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  int top = lua_gettop(L);
  if (!lua_checkstack(L, 16)) {
    snprintf(p.err, p.errlen, "Lua stack overflow");
    return ST_ERR_SERIALIZATION;
  }
  snprintf(p.path, sizeof p.path, "%s", root ? root : "value");
  p.pathlen = strlen(p.path);
  lua_newtable(L);
  p.visiting = lua_gettop(L);
  int rc = pack_value(&p, pk, idx, 1);
  lua_settop(L, top);
  return rc;
}

/* ------------------------------------------------------------ msgpack -> Lua */

/* A tensor argument (or a value of st.key): a view of the arena the client
 * sent (bind checked its bounds against the request's arena list; this
 * checks them again against the arena, and maps a CUDA one on its first
 * use: that can fail, and the reason goes to err). */
static int push_arg_tensor(lua_State *L, const msgpack_object *o, char *err, size_t errlen) {
  st__lua_ctx_t *c = st__lua_ctx(L);
  st__tensor_desc_t d;
  char why[256];
  if (o->via.ext.type != ST_EXT_TENSOR || st__parse_tensor(o, &d, why, sizeof why) != ST_OK) {
    snprintf(err, errlen, "only tensors may be passed as ext values");
    return ST_ERR_INVALID_ARGUMENT;
  }
  if (d.arena >= c->narg_arenas) {
    snprintf(err, errlen, "tensor on arena %u: there are %zu", (unsigned)d.arena,
             c->narg_arenas);
    return ST_ERR_INVALID_ARGUMENT;
  }
  st__tensor_t *t = st__lua_push_tensor(L);
  int rc = st__tensor_from_desc(t, c->arg_arenas[d.arena], &d, err, errlen);
  if (rc != ST_OK) lua_pop(L, 1);
  return rc;
}

/* Pushes o, at nesting `depth` (1: the argument map, 2: an argument, 3
 * and up: inside an argument's arrays and maps, where nil is st.null). */
static int push_obj(lua_State *L, const msgpack_object *o, int depth, char *err, size_t errlen) {
  if (depth > ST_MAX_DEPTH + 1 || !lua_checkstack(L, 4)) {
    snprintf(err, errlen, "argument nested deeper than %d levels", ST_MAX_DEPTH);
    return ST_ERR_INVALID_ARGUMENT;
  }
  switch (o->type) {
  case MSGPACK_OBJECT_NIL:
    if (depth > 2)
      lua_pushlightuserdata(L, NULL);         /* st.null */
    else
      lua_pushnil(L);
    return ST_OK;
  case MSGPACK_OBJECT_BOOLEAN: lua_pushboolean(L, o->via.boolean); return ST_OK;
  case MSGPACK_OBJECT_POSITIVE_INTEGER: lua_pushnumber(L, (lua_Number)o->via.u64); return ST_OK;
  case MSGPACK_OBJECT_NEGATIVE_INTEGER: lua_pushnumber(L, (lua_Number)o->via.i64); return ST_OK;
  case MSGPACK_OBJECT_FLOAT32:
  case MSGPACK_OBJECT_FLOAT64: lua_pushnumber(L, o->via.f64); return ST_OK;
  case MSGPACK_OBJECT_STR: lua_pushlstring(L, o->via.str.ptr, o->via.str.size); return ST_OK;
  case MSGPACK_OBJECT_BIN: st__lua_push_bytes(L, o->via.bin.ptr, o->via.bin.size); return ST_OK;
  case MSGPACK_OBJECT_ARRAY: {
    uint32_t n = o->via.array.size;
    lua_createtable(L, (int)n, 0);
    for (uint32_t i = 0; i < n; i++) {
      int rc = push_obj(L, &o->via.array.ptr[i], depth + 1, err, errlen);
      if (rc != ST_OK) {
        lua_pop(L, 1);
        return rc;
      }
      lua_rawseti(L, -2, (int)i + 1);
    }
    if (n == 0) {
      st__lua_push_array_mt(L);
      lua_setmetatable(L, -2);
    }
    return ST_OK;
  }
  case MSGPACK_OBJECT_MAP: {
    uint32_t n = o->via.map.size;
    lua_createtable(L, 0, (int)n);
    for (uint32_t i = 0; i < n; i++) {
      const msgpack_object_kv *kv = &o->via.map.ptr[i];
      int rc = ST_OK;
      if (kv->key.type != MSGPACK_OBJECT_STR) {
        snprintf(err, errlen, "argument map keys must be strings");
        rc = ST_ERR_INVALID_ARGUMENT;
      }
      if (rc == ST_OK) rc = push_obj(L, &kv->key, depth + 1, err, errlen);
      if (rc == ST_OK) {
        rc = push_obj(L, &kv->val, depth + 1, err, errlen);
        if (rc != ST_OK) lua_pop(L, 1);
      }
      if (rc != ST_OK) {
        lua_pop(L, 1);
        return rc;
      }
      lua_rawset(L, -3);
    }
    return ST_OK;
  }
  case MSGPACK_OBJECT_EXT:
    return push_arg_tensor(L, o, err, errlen);
  default:
    snprintf(err, errlen, "unsupported argument value");
    return ST_ERR_INVALID_ARGUMENT;
  }
}

int st__lua_push_msgpack(lua_State *L, const msgpack_object *o, char *err, size_t errlen) {
  char dummy[1];
  return push_obj(L, o, 1, err ? err : dummy, err ? errlen : 1);
}
