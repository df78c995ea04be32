/* src/lua: validation of one st.endpoint{...} declaration into plain C
 * (engine/generation.h). Every problem is reported, each as
 * "file:line: message" with the line of the st.endpoint call.
 *
 * The contract of each non-static function (what it does, returns and owns)
 * is its comment in lua_int.h; all of them run on the thread that owns the
 * lua_State they are given.
 */
#include "lua/lua_int.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_MAX_LEN 128

static const char option_list[] =
    "name, doc, execution, concurrency, managed, cache, cache_format_key, singleflight, "
    "timeout, device, ipc, params, build";

uint64_t st__lua_fnv1a(uint64_t h, const void *data, size_t len) {
  const unsigned char *p = data;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

void st__lua_decl_free(st__endpoint_decl_t *d) {
  free(d->name);
  free(d->file);
  free(d->doc);
  free(d->cache_format_key);
  free(d->device);
  for (size_t i = 0; i < d->nparams; i++) {
    free(d->params[i].name);
    free(d->params[i].default_mp);
  }
  free(d->params);
  memset(d, 0, sizeof *d);
}

typedef struct checker {
  lua_State *L;
  const char *file;
  int line;
  st__errlist_t *errs;
  int nerr;
} checker_t;

static void bad(checker_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bad(checker_t *c, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  st__errlist_add(c->errs, "%s:%d: %s", c->file, c->line, msg);
  c->nerr++;
}

static int valid_name(const char *s, size_t len, int dots) {
  if (!len) return 0;
  if (!((s[0] >= 'A' && s[0] <= 'Z') || (s[0] >= 'a' && s[0] <= 'z') || s[0] == '_')) return 0;
  for (size_t i = 1; i < len; i++) {
    char ch = s[i];
    int ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
             ch == '_' || (dots && (ch == '.' || ch == '-'));
    if (!ok) return 0;
  }
  return 1;
}

/* The value at the top is a string; else reports and returns NULL. */
static const char *want_string(checker_t *c, const char *opt) {
  if (lua_type(c->L, -1) == LUA_TSTRING) return lua_tostring(c->L, -1);
  bad(c, "option '%s' must be a string, got %s", opt, luaL_typename(c->L, -1));
  return NULL;
}

static int want_bool(checker_t *c, const char *opt, int *out) {
  if (lua_type(c->L, -1) == LUA_TBOOLEAN) {
    *out = lua_toboolean(c->L, -1);
    return 1;
  }
  bad(c, "option '%s' must be a boolean (true or false), got %s", opt, luaL_typename(c->L, -1));
  return 0;
}

/* One of two words; returns 0/1, or -1 after reporting. */
static int want_enum(checker_t *c, const char *opt, const char *a, const char *b) {
  const char *s = want_string(c, opt);
  if (!s) return -1;
  if (strcmp(s, a) == 0) return 0;
  if (strcmp(s, b) == 0) return 1;
  bad(c, "option '%s' must be \"%s\" or \"%s\", got \"%s\"", opt, a, b, s);
  return -1;
}

static int param_cmp(const void *a, const void *b) {
  return strcmp(((const st__param_t *)a)->name, ((const st__param_t *)b)->name);
}

/* params = { name = default | st.required | st.tensor_param{...}, ... } at
 * the top of the stack. */
static void parse_params(checker_t *c, st__endpoint_decl_t *d) {
  lua_State *L = c->L;
  if (lua_type(L, -1) != LUA_TTABLE) {
    bad(c, "option 'params' must be a table of name = default, got %s", luaL_typename(L, -1));
    return;
  }
  int t = lua_gettop(L);
  size_t n = 0;
  lua_pushnil(L);
  while (lua_next(L, t)) {
    n++;
    lua_pop(L, 1);
  }
  d->params = calloc(n ? n : 1, sizeof *d->params);
  if (!d->params) {
    bad(c, "out of memory");
    return;
  }
  lua_pushnil(L);
  while (lua_next(L, t)) {                    /* params, key, value */
    size_t klen;
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &klen) : NULL;
    if (!k || !valid_name(k, klen, 0) || klen > NAME_MAX_LEN) {
      bad(c, "params: parameter names must be identifiers ([A-Za-z_][A-Za-z0-9_]*), got %s",
          k ? k : luaL_typename(L, -2));
      lua_pop(L, 1);
      continue;
    }
    st__param_t *p = &d->params[d->nparams];
    int tdtype, tdevice;
    p->tensor_dtype = -1;
    if (st__lua_is_required(L, -1)) {
      p->required = 1;
      p->type = ST_PARAM_ANY;
    } else if (st__lua_is_tensor_param(L, -1, &tdtype, &tdevice)) {
      p->required = 1;
      p->type = ST_PARAM_TENSOR;
      p->tensor_dtype = tdtype;
      p->tensor_device = (st__tensor_device_t)tdevice;
    } else {
      int64_t iv;
      switch (lua_type(L, -1)) {
      case LUA_TBOOLEAN: p->type = ST_PARAM_BOOL; break;
      case LUA_TNUMBER:
        p->type = st__lua_num_to_int(lua_tonumber(L, -1), &iv) ? ST_PARAM_INTEGER : ST_PARAM_NUMBER;
        break;
      case LUA_TSTRING: p->type = ST_PARAM_STRING; break;
      case LUA_TTABLE: p->type = ST_PARAM_TABLE; break;
      default:
        bad(c, "params.%s: a default must be a boolean, number, string, table or st.required, "
               "got %s", k, luaL_typename(L, -1));
        lua_pop(L, 1);
        continue;
      }
      msgpack_sbuffer sb;
      msgpack_sbuffer_init(&sb);
      msgpack_packer pk;
      msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
      char root[160], err[512];
      snprintf(root, sizeof root, "params.%s", k);
      if (st__lua_pack(L, -1, &pk, NULL, root, err, sizeof err) != ST_OK) {
        bad(c, "%s", err);
        msgpack_sbuffer_destroy(&sb);
        lua_pop(L, 1);
        continue;
      }
      p->default_mp = sb.data;                /* ownership moves to the param */
      p->default_len = sb.size;
      if (!p->default_mp) p->default_mp = malloc(1);
    }
    p->name = strdup(k);
    d->nparams++;
    lua_pop(L, 1);                            /* params, key */
  }
  qsort(d->params, d->nparams, sizeof *d->params, param_cmp);
}

static int has_param(const st__endpoint_decl_t *d, const char *name, size_t len) {
  for (size_t i = 0; i < d->nparams; i++)
    if (strlen(d->params[i].name) == len && memcmp(d->params[i].name, name, len) == 0) return 1;
  return 0;
}

/* Every {name} of the key must be a parameter; braces must pair up. */
static void check_format_key(checker_t *c, const st__endpoint_decl_t *d) {
  const char *k = d->cache_format_key;
  for (const char *p = k; *p; p++) {
    if (*p == '}') {
      bad(c, "cache_format_key \"%s\": '}' without '{'", k);
      return;
    }
    if (*p != '{') continue;
    const char *e = strchr(p + 1, '}');
    const char *o = strchr(p + 1, '{');
    if (!e || (o && o < e)) {
      bad(c, "cache_format_key \"%s\": '{' without '}'", k);
      return;
    }
    size_t len = (size_t)(e - p - 1);
    if (!has_param(d, p + 1, len))
      bad(c, "cache_format_key \"%s\" names {%.*s}, which is not a parameter", k, (int)len, p + 1);
    p = e;
  }
}

int st__lua_device_name_ok(const char *s, int bare_cuda) {
  if (strcmp(s, "cpu") == 0 || (bare_cuda && strcmp(s, "cuda") == 0)) return 1;
  if (strncmp(s, "cuda:", 5) != 0 || !s[5] || strlen(s + 5) > 4) return 0;
  return strspn(s + 5, "0123456789") == strlen(s + 5);
}

int st__lua_decl_parse(lua_State *L, int idx, const char *file, int line,
                       st__endpoint_decl_t *out, st__errlist_t *errs) {
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  checker_t c = {L, file, line, errs, 0};
  st__endpoint_decl_t *d = out;
  memset(d, 0, sizeof *d);
  d->file = strdup(file);
  d->line = line;
  int has_build = 0, cache_set = 0, cache_val = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {                  /* decl, key, value */
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
    int v;
    const char *s;
    if (!k) {
      bad(&c, "option names must be strings (found a %s key)", luaL_typename(L, -2));
    } else if (strcmp(k, "name") == 0) {
      if ((s = want_string(&c, k))) {
        size_t len = lua_objlen(L, -1);
        if (!valid_name(s, len, 1) || len > NAME_MAX_LEN)
          bad(&c, "invalid endpoint name \"%s\" ([A-Za-z_][A-Za-z0-9_.-]*, at most %d characters)",
              s, NAME_MAX_LEN);
        else d->name = strdup(s);
      }
    } else if (strcmp(k, "doc") == 0) {
      if ((s = want_string(&c, k))) d->doc = strdup(s);
    } else if (strcmp(k, "execution") == 0) {
      if ((v = want_enum(&c, k, "direct", "task")) >= 0) d->execution = (st__execution_t)v;
    } else if (strcmp(k, "concurrency") == 0) {
      if ((v = want_enum(&c, k, "parallel", "serialized")) >= 0) d->concurrency = (st__concurrency_t)v;
    } else if (strcmp(k, "ipc") == 0) {
      if ((v = want_enum(&c, k, "vmm", "legacy")) >= 0) d->ipc = (st__ipc_t)v;
    } else if (strcmp(k, "managed") == 0) {
      want_bool(&c, k, &d->managed);
    } else if (strcmp(k, "cache") == 0) {
      if (want_bool(&c, k, &cache_val)) cache_set = 1;
    } else if (strcmp(k, "singleflight") == 0) {
      want_bool(&c, k, &d->singleflight);
    } else if (strcmp(k, "cache_format_key") == 0) {
      if ((s = want_string(&c, k))) d->cache_format_key = strdup(s);
    } else if (strcmp(k, "timeout") == 0) {
      double t = lua_tonumber(L, -1);
      if (lua_type(L, -1) != LUA_TNUMBER || !(t > 0) || isinf(t))
        bad(&c, "option 'timeout' must be a number of seconds > 0, got %s",
            lua_type(L, -1) == LUA_TNUMBER ? lua_tostring(L, -1) : luaL_typename(L, -1));
      else d->timeout_s = t;
    } else if (strcmp(k, "device") == 0) {
      if ((s = want_string(&c, k))) {
        if (st__lua_device_name_ok(s, 1)) d->device = strdup(s);
        else bad(&c, "option 'device' must be \"cpu\", \"cuda\" or \"cuda:N\", got \"%s\"", s);
      }
    } else if (strcmp(k, "params") == 0) {
      parse_params(&c, d);
    } else if (strcmp(k, "build") == 0) {
      if (lua_type(L, -1) == LUA_TFUNCTION) has_build = 1;
      else bad(&c, "option 'build' must be a function, got %s", luaL_typename(L, -1));
    } else {
      bad(&c, "unknown option '%s' (options: %s)", k, option_list);
    }
    lua_pop(L, 1);                            /* decl, key */
  }
  if (!d->name) {
    lua_pushliteral(L, "name");
    lua_rawget(L, idx);                       /* raw: no metamethod runs here */
    if (lua_isnil(L, -1)) bad(&c, "missing option 'name'");
    lua_pop(L, 1);
  }
  if (!has_build) {
    lua_pushliteral(L, "build");
    lua_rawget(L, idx);
    if (lua_isnil(L, -1)) bad(&c, "missing option 'build' (the function that builds the result)");
    lua_pop(L, 1);
  }
  if (d->cache_format_key) {
    if (cache_set && !cache_val)
      bad(&c, "cache_format_key implies cache = true, but cache = false");
    check_format_key(&c, d);
    d->cache = 1;
  } else {
    d->cache = cache_val;
  }
  if (c.nerr) st__lua_decl_free(d);
  return c.nerr;
}
