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

#include "common/settings.h"
#include "engine/options.h"

#define NAME_MAX_LEN 128

/* See lua_int.h. Any thread. */
uint64_t st__lua_fnv1a(uint64_t h, const void *data, size_t len) {
  const unsigned char *p = data;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

/* See lua_int.h. */
void st__lua_decl_free(st__endpoint_decl_t *d) {
  free(d->name);
  free(d->file);
  free(d->doc);
  st__options_free(d);
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

/* One of the option's words; returns its index, or -1 after reporting. */
static int want_choice(checker_t *c, const st__option_t *o) {
  const char *s = want_string(c, o->name);
  if (!s) return -1;
  int v = st__choices_index(o->choices, s);
  char words[256];
  if (v < 0)
    bad(c, "option '%s' must be %s, got \"%s\"", o->name,
        st__choices_text(o->choices, words, sizeof words), s);
  return v;
}

/* The option o's value at the top of the stack into d, read and checked
 * by o's type (engine/options.h). Returns 1 when it was stored, 0 after
 * reporting. */
static int parse_option(checker_t *c, const st__option_t *o, st__endpoint_decl_t *d) {
  lua_State *L = c->L;
  const char *s;
  int v;
  switch (o->type) {
  case ST_OPT_ENUM:
    if ((v = want_choice(c, o)) < 0) return 0;
    st__option_set_int(o, d, v);
    return 1;
  case ST_OPT_BOOL:
    if (!want_bool(c, o->name, &v)) return 0;
    st__option_set_int(o, d, v);
    return 1;
  case ST_OPT_SECONDS: {
    double t = lua_tonumber(L, -1);
    if (lua_type(L, -1) != LUA_TNUMBER || !(t > 0) || isinf(t)) {
      bad(c, "option '%s' must be a number of seconds > 0, got %s", o->name,
          lua_type(L, -1) == LUA_TNUMBER ? lua_tostring(L, -1) : luaL_typename(L, -1));
      return 0;
    }
    st__option_set_seconds(o, d, t);
    return 1;
  }
  case ST_OPT_DEVICE:
    if (!(s = want_string(c, o->name))) return 0;
    if (!st__device_name_ok(s, 1)) {
      bad(c, "option '%s' must be \"cpu\", \"cuda\" or \"cuda:N\", got \"%s\"", o->name, s);
      return 0;
    }
    st__option_set_text(o, d, strdup(s));
    return 1;
  case ST_OPT_STRING:
  case ST_OPT_KEY_FORMAT:
    if (!(s = want_string(c, o->name))) return 0;
    st__option_set_text(o, d, strdup(s));
    return 1;
  }
  return 0;
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

/* Every {name} of the key k must be a parameter; braces must pair up. */
static void check_format_key(checker_t *c, const st__endpoint_decl_t *d, const char *k) {
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

/* "unknown option" lists every key: the structural ones and the options. */
static const char *option_list(char *buf, size_t len) {
  size_t used = (size_t)snprintf(buf, len, "name, doc");
  for (size_t i = 0; i < ST__ENDPOINT_NOPTIONS && used < len; i++)
    used += (size_t)snprintf(buf + used, len - used, ", %s", st__endpoint_options[i].name);
  if (used < len) snprintf(buf + used, len - used, ", params, build");
  return buf;
}

/* After every key was read: an option with a value sets the option it
 * implies (cache_format_key: cache), which must not be declared false;
 * a key format must name parameters. `seen` marks the options declared
 * with a valid value. */
static void finish_options(checker_t *c, st__endpoint_decl_t *d, const unsigned char *seen) {
  for (size_t i = 0; i < ST__ENDPOINT_NOPTIONS; i++) {
    const st__option_t *o = &st__endpoint_options[i];
    if (st__option_is_default(o, d)) continue;
    const st__option_t *imp = o->implies ? st__option_find(o->implies) : NULL;
    if (imp) {
      if (seen[imp - st__endpoint_options] && !st__option_int(imp, d))
        bad(c, "%s implies %s = true, but %s = false", o->name, imp->name, imp->name);
    }
    if (o->type == ST_OPT_KEY_FORMAT) check_format_key(c, d, st__option_text(o, d));
    if (imp) st__option_set_int(imp, d, 1);
  }
}

/* Every key of the declaration at idx: the structural ones (name, doc,
 * params, build) here, the options by their rows (parse_option), then
 * what the options imply (finish_options). See lua_int.h. */
int st__lua_decl_parse(lua_State *L, int idx, const char *file, int line,
                       st__endpoint_decl_t *out, st__errlist_t *errs) {
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  checker_t c = {L, file, line, errs, 0};
  st__endpoint_decl_t *d = out;
  memset(d, 0, sizeof *d);
  d->file = strdup(file);
  d->line = line;
  st__options_defaults(d);
  unsigned char seen[ST__ENDPOINT_NOPTIONS] = {0};
  int has_build = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {                  /* decl, key, value */
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
    const st__option_t *o = k ? st__option_find(k) : NULL;
    const char *s;
    char list[512];
    if (!k) {
      bad(&c, "option names must be strings (found a %s key)", luaL_typename(L, -2));
    } else if (o) {
      if (parse_option(&c, o, d)) seen[o - st__endpoint_options] = 1;
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
    } else if (strcmp(k, "params") == 0) {
      parse_params(&c, d);
    } else if (strcmp(k, "build") == 0) {
      if (lua_type(L, -1) == LUA_TFUNCTION) has_build = 1;
      else bad(&c, "option 'build' must be a function, got %s", luaL_typename(L, -1));
    } else {
      bad(&c, "unknown option '%s' (options: %s)", k, option_list(list, sizeof list));
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
  finish_options(&c, d, seen);
  if (c.nerr) st__lua_decl_free(d);
  return c.nerr;
}
