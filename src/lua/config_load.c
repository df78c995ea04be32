/* src/lua: configuration files (config.lua, docs/operations.md) read by
 * the rows of a settings schema (common/settings.h): this file knows how
 * each kind of row reads a Lua value, never which keys exist or which
 * struct they fill.
 *
 * The file is a Lua chunk that returns one table. It runs sandboxed (the
 * endpoint allow-list without st and require; no io, no os.execute) under
 * the load time limit. Every key is checked; every problem is collected as
 * "path: key: message" (or "path:line: message" for Lua errors).
 */
#include "lua/lua_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/settings.h"

typedef struct cfgck {
  lua_State *L;
  const char *path;
  st__errlist_t *errs;
  void *obj;                 /* the struct the rows describe */
} cfgck_t;

static void bad(cfgck_t *c, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void bad(cfgck_t *c, const char *key, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (key) st__errlist_add(c->errs, "%s: %s: %s", c->path, key, msg);
  else st__errlist_add(c->errs, "%s: %s", c->path, msg);
}

/* What the value at idx is, for messages: a type name or the number. */
static const char *got(lua_State *L, int idx, char *buf, size_t len) {
  if (lua_type(L, idx) == LUA_TNUMBER) {
    snprintf(buf, len, "%.17g", lua_tonumber(L, idx));
    return buf;
  }
  return luaL_typename(L, idx);
}

static int get_int(cfgck_t *c, int idx, const char *key, int64_t lo, int64_t hi, int64_t *out) {
  int64_t v;
  char buf[64];
  if (lua_type(c->L, idx) == LUA_TNUMBER && st__lua_num_to_int(lua_tonumber(c->L, idx), &v) &&
      v >= lo && v <= hi) {
    *out = v;
    return 1;
  }
  bad(c, key, "expected an integer in %lld..%lld, got %s", (long long)lo, (long long)hi,
      got(c->L, idx, buf, sizeof buf));
  return 0;
}

/* A non-empty string at idx, copied (owned by the caller), or NULL after
 * reporting. */
static char *get_string(cfgck_t *c, int idx, const char *key) {
  if (lua_type(c->L, idx) != LUA_TSTRING || lua_objlen(c->L, idx) == 0) {
    bad(c, key, "expected a non-empty string, got %s", luaL_typename(c->L, idx));
    return NULL;
  }
  char *s = strdup(lua_tostring(c->L, idx));
  if (!s) bad(c, key, "out of memory");
  return s;
}

/* ST_SET_INTS: an array of integers (or, with ST_SET_ONE, one integer). */
static void read_ints(cfgck_t *c, const st__setting_t *r, int idx, const char *key) {
  lua_State *L = c->L;
  int64_t v;
  if ((r->flags & ST_SET_ONE) && lua_type(L, idx) == LUA_TNUMBER) {
    if (!get_int(c, idx, key, r->lo, r->hi, &v)) return;
    st__setting_set_int(r, c->obj, 0, v);
    *st__setting_count(r, c->obj) = 1;
    return;
  }
  if (lua_type(L, idx) != LUA_TTABLE) {
    bad(c, key, "expected %s, got %s", (r->flags & ST_SET_ONE)
                                           ? "an integer or an array of integers"
                                           : "an array of integers", luaL_typename(L, idx));
    return;
  }
  int n = (int)lua_objlen(L, idx), count = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    count++;
    lua_pop(L, 1);
  }
  if (count != n) {
    bad(c, key, "expected an array of integers");
    return;
  }
  if (n > r->max_entries) {
    bad(c, key, "at most %d entries, got %d", r->max_entries, n);
    return;
  }
  int64_t vals[256];
  int ok = n <= (int)(sizeof vals / sizeof vals[0]);
  for (int i = 0; ok && i < n; i++) {
    lua_rawgeti(L, idx, i + 1);
    char k[192];
    snprintf(k, sizeof k, "%s[%d]", key, i + 1);
    if (!get_int(c, lua_gettop(L), k, r->lo, r->hi, &vals[i])) ok = 0;
    lua_pop(L, 1);
  }
  if (!ok) return;
  if (n == 0 && (r->flags & ST_SET_NONEMPTY)) {
    bad(c, key, "at least one %s is needed", r->what);
    return;
  }
  for (int i = 0; (r->flags & ST_SET_UNIQUE) && i < n; i++)
    for (int j = 0; j < i; j++)
      if (vals[j] == vals[i]) {
        bad(c, key, "%s %lld is listed twice", r->what, (long long)vals[i]);
        return;
      }
  for (int i = 0; i < n; i++) st__setting_set_int(r, c->obj, (size_t)i, vals[i]);
  *st__setting_count(r, c->obj) = n;
}

/* ST_SET_PATHS: directory names, each taken from the config file's
 * directory when relative. Replaces the previous entries. */
static void read_paths(cfgck_t *c, const st__setting_t *r, int idx, const char *key) {
  lua_State *L = c->L;
  if (lua_type(L, idx) != LUA_TTABLE) {
    bad(c, key, "expected an array of directory names, got %s", luaL_typename(L, idx));
    return;
  }
  int n = (int)lua_objlen(L, idx);
  if (n > r->max_entries) {
    bad(c, key, "at most %d directories, got %d", r->max_entries, n);
    return;
  }
  char **v = st__setting_field(r, c->obj);
  int *count = st__setting_count(r, c->obj);
  for (int i = 0; i < *count; i++) free(v[i]);
  *count = 0;
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, idx, i);                        /* [dir] */
    if (lua_type(L, -1) != LUA_TSTRING || lua_objlen(L, -1) == 0) {
      bad(c, key, "entry %d: expected a directory name, got %s", i, luaL_typename(L, -1));
    } else {
      char *dir = st__settings_resolve(c->path, lua_tostring(L, -1));
      if (dir) v[(*count)++] = dir;
      else bad(c, key, "out of memory");
    }
    lua_pop(L, 1);                                 /* [] */
  }
}

/* ST_SET_STRINGS: non-empty strings. Replaces the previous entries. */
static void read_strings(cfgck_t *c, const st__setting_t *r, int idx, const char *key) {
  lua_State *L = c->L;
  if (lua_type(L, idx) != LUA_TTABLE) {
    bad(c, key, "expected an array of strings, got %s", luaL_typename(L, idx));
    return;
  }
  int n = (int)lua_objlen(L, idx);
  if (n > r->max_entries) {
    bad(c, key, "at most %d entries, got %d", r->max_entries, n);
    return;
  }
  char **v = st__setting_field(r, c->obj);
  int *count = st__setting_count(r, c->obj);
  for (int i = 0; i < *count; i++) free(v[i]);
  *count = 0;
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, idx, i);                        /* [s] */
    if (lua_type(L, -1) != LUA_TSTRING || lua_objlen(L, -1) == 0) {
      bad(c, key, "entry %d: expected a non-empty string, got %s", i, luaL_typename(L, -1));
    } else {
      char *s = strdup(lua_tostring(L, -1));
      if (s) v[(*count)++] = s;
      else bad(c, key, "out of memory");
    }
    lua_pop(L, 1);                                 /* [] */
  }
}

static void read_table(cfgck_t *c, const st__setting_t *rows, int idx, const char *prefix);
static void read_value(cfgck_t *c, const st__setting_t *r, int idx, const char *key);

/* ST_SET_RECORDS: name -> record (a table of the sub-rows, or with
 * ST_SET_ONE a string for the first sub-row). Replaces the previous
 * entries. */
static void read_records(cfgck_t *c, const st__setting_t *r, int idx, const char *key) {
  lua_State *L = c->L;
  if (lua_type(L, idx) != LUA_TTABLE) {
    bad(c, key, "expected a table of name = entry, got %s", luaL_typename(L, idx));
    return;
  }
  st__settings_free_records(r, c->obj);
  int *count = st__setting_count(r, c->obj);
  void *obj = c->obj;
  lua_pushnil(L);
  while (lua_next(L, idx)) {                     /* ..., name, value */
    int v = lua_gettop(L);
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
    char path[320];
    snprintf(path, sizeof path, "%s.%s", key, k ? k : "?");
    if (!k || (r->key_ok && !r->key_ok(k))) {
      bad(c, NULL, "%s: names are %s, got '%s'", key, r->keys, k ? k : "?");
    } else if (*count >= r->max_entries) {
      bad(c, key, "at most %d entries", r->max_entries);
    } else {
      char *e = st__setting_record(r, obj, *count);
      memset(e, 0, r->size);
      char *name = strdup(k);
      if (!name || st__settings_defaults(r->rows, e) != 0) {
        free(name);
        bad(c, path, "out of memory");
      } else {
        memcpy(e + r->key_offset, &name, sizeof name);
        (*count)++;
        c->obj = e;
        if ((r->flags & ST_SET_ONE) && lua_type(L, v) == LUA_TSTRING)
          read_value(c, &r->rows[0], v, path);
        else if (lua_type(L, v) == LUA_TTABLE)
          read_table(c, r->rows, v, path);
        else
          bad(c, path, "expected %s, got %s", (r->flags & ST_SET_ONE) ? "a string or a table"
                                                                      : "a table",
              luaL_typename(L, v));
        c->obj = obj;
      }
    }
    lua_pop(L, 1);                               /* ..., name */
  }
}

/* ST_SET_MODE: octal text ("0660") or an integer. */
static void read_mode(cfgck_t *c, const st__setting_t *r, int idx, const char *key) {
  lua_State *L = c->L;
  unsigned *mode = st__setting_field(r, c->obj);
  int64_t v;
  if (lua_type(L, idx) == LUA_TSTRING) {
    const char *s = lua_tostring(L, idx);
    char *end;
    errno = 0;
    long m = strtol(s, &end, 8);
    if (*s && !*end && !errno && m >= 0 && m <= 0777) {
      *mode = (unsigned)m;
      return;
    }
    bad(c, key, "expected octal permission bits like \"0660\", got \"%s\"", s);
  } else if (get_int(c, idx, key, 0, 0777, &v)) {
    *mode = (unsigned)v;
  }
}

/* ST_SET_MAP: key -> integer pairs, each stored by the row's put. */
static void read_map(cfgck_t *c, const st__setting_t *r, int idx, const char *key) {
  lua_State *L = c->L;
  if (lua_type(L, idx) != LUA_TTABLE) {
    bad(c, key, "expected a table such as %s, got %s", r->example, luaL_typename(L, idx));
    return;
  }
  lua_pushnil(L);
  while (lua_next(L, idx)) {                  /* ..., key, value */
    int v = lua_gettop(L);
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
    char path[320], err[256];
    snprintf(path, sizeof path, "%s.%s", key, k ? k : "?");
    int64_t n;
    if (!k || !r->key_ok(k)) {
      bad(c, NULL, "%s: keys are %s, got '%s'", key, r->keys, k ? k : "?");
    } else if (get_int(c, v, path, r->lo, r->hi, &n)) {
      if (r->put(c->obj, k, n, err, sizeof err) != 0) bad(c, path, "%s", err);
    }
    lua_pop(L, 1);
  }
}

/* One key: the value at idx for row r (named `key` in messages). */
static void read_value(cfgck_t *c, const st__setting_t *r, int idx, const char *key) {
  lua_State *L = c->L;
  int64_t n;
  char buf[160];
  switch (r->type) {
  case ST_SET_INT:
    if (get_int(c, idx, key, r->lo, r->hi, &n)) st__setting_set_int(r, c->obj, 0, n);
    break;
  case ST_SET_SECONDS: {
    double d = lua_tonumber(L, idx);
    int low = (r->flags & ST_SET_OPEN) ? !(d > r->min) : !(d >= r->min);
    if (lua_type(L, idx) != LUA_TNUMBER || low || d > r->max)
      bad(c, key, "expected a number of seconds %s %g, got %s",
          (r->flags & ST_SET_OPEN) ? ">" : ">=", r->min, got(L, idx, buf, sizeof buf));
    else *(double *)st__setting_field(r, c->obj) = d;
    break;
  }
  case ST_SET_STRING:
  case ST_SET_PATH: {
    char *s = get_string(c, idx, key);
    if (s && r->type == ST_SET_PATH) {
      char *dir = st__settings_resolve(c->path, s);
      free(s);
      s = dir;
      if (!s) bad(c, key, "out of memory");
    }
    if (s) st__setting_set_text(r, c->obj, s);
    break;
  }
  case ST_SET_WORD: {
    int w = lua_type(L, idx) == LUA_TSTRING ? st__setting_word(r, lua_tostring(L, idx)) : -1;
    if (w < 0) {
      bad(c, key, "expected %s", st__choices_text(r->choices, buf, sizeof buf));
    } else if (r->flags & ST_SET_AS_TEXT) {
      char *s = strdup(lua_tostring(L, idx));
      if (s) st__setting_set_text(r, c->obj, s);
      else bad(c, key, "out of memory");
    } else {
      *(int *)st__setting_field(r, c->obj) = w;
    }
    break;
  }
  case ST_SET_MODE: read_mode(c, r, idx, key); break;
  case ST_SET_NAME_OR_ID:
    if (lua_type(L, idx) == LUA_TNUMBER) {     /* an id: kept as its decimal text */
      char *s = NULL;
      if (get_int(c, idx, key, r->lo, r->hi, &n) && asprintf(&s, "%lld", (long long)n) >= 0)
        st__setting_set_text(r, c->obj, s);
    } else {
      char *s = get_string(c, idx, key);
      if (s) st__setting_set_text(r, c->obj, s);
    }
    break;
  case ST_SET_INTS: read_ints(c, r, idx, key); break;
  case ST_SET_PATHS: read_paths(c, r, idx, key); break;
  case ST_SET_MAP: read_map(c, r, idx, key); break;
  case ST_SET_STRINGS: read_strings(c, r, idx, key); break;
  case ST_SET_RECORDS: read_records(c, r, idx, key); break;
  case ST_SET_TABLE:
    if (lua_type(L, idx) != LUA_TTABLE) bad(c, key, "expected a table, got %s", luaL_typename(L, idx));
    else read_table(c, r->rows, idx, key);
    break;
  }
}

/* "a, b, c": the names of rows, for messages. */
static const char *row_names(const st__setting_t *rows, char *buf, size_t len) {
  size_t used = 0;
  buf[0] = '\0';
  for (const st__setting_t *r = rows; r->name && used < len; r++) {
    int n = snprintf(buf + used, len - used, "%s%s", r == rows ? "" : ", ", r->name);
    if (n < 0) break;
    used += (size_t)n;
  }
  return buf;
}

/* Every key of the table at idx by `rows`. `prefix` NULL: the file's
 * table ("unknown key 'x'"); else a sub-table named prefix, whose keys
 * are reported as "prefix.key" and whose unknown keys list the known
 * ones. */
static void read_table(cfgck_t *c, const st__setting_t *rows, int idx, const char *prefix) {
  lua_State *L = c->L;
  lua_pushnil(L);
  while (lua_next(L, idx)) {                    /* ..., key, value */
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
    const st__setting_t *r = k ? st__settings_find(rows, k) : NULL;
    char key[160], names[512];
    if (!k) {
      if (prefix) bad(c, prefix, "keys must be strings");
      else bad(c, NULL, "keys must be strings");
    } else if (!r && prefix) {
      bad(c, NULL, "%s: unknown key '%s' (%s)", prefix, k, row_names(rows, names, sizeof names));
    } else if (!r) {
      bad(c, NULL, "unknown key '%s'", k);
    } else {
      if (prefix) snprintf(key, sizeof key, "%s.%s", prefix, k);
      else snprintf(key, sizeof key, "%s", k);
      read_value(c, r, lua_gettop(L), key);
    }
    lua_pop(L, 1);                              /* ..., key */
  }
}

/* The whole file as text (owned), or NULL after reporting. */
static char *read_file(const char *path, size_t *len, st__errlist_t *errs) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    st__errlist_add(errs, "%s: cannot read: %s", path, strerror(errno));
    return NULL;
  }
  char *text = NULL;
  FILE *mem = open_memstream(&text, len);
  char buf[4096];
  size_t k;
  while (mem && (k = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, k, mem);
  fclose(f);
  if (!mem || fclose(mem) != 0 || !text) {
    free(text);
    st__errlist_add(errs, "%s: out of memory", path);
    return NULL;
  }
  return text;
}

/* The thread that calls it, at start. See st_lua.h. */
int st__settings_load(const char *path, const st__setting_t *rows, void *obj,
                      st__errlist_t *errs) {
  size_t errs0 = errs->count;
  size_t len = 0;
  char *text = read_file(path, &len, errs);
  if (!text) return ST_ERR_CONFIGURATION;
  st__lua_ctx_t ctx = {.mode = ST__LUA_CONFIG, .who = "config",
                       .mem_limit = ST__LUA_LOAD_MEMORY_BYTES};
  lua_State *L = st__lua_state_new(&ctx);
  if (!L) {
    free(text);
    st__errlist_add(errs, "%s: cannot create a Lua state", path);
    return ST_ERR_CONFIGURATION;
  }
  char chunkname[4200], err[2048];
  snprintf(chunkname, sizeof chunkname, "@%s", path);
  int rc = luaL_loadbufferx(L, text, len, chunkname, "t");
  free(text);
  if (rc != 0) {
    st__errlist_add(errs, "%s", lua_tostring(L, -1));
    st__lua_close(L);
    return ST_ERR_CONFIGURATION;
  }
  st__lua_arm(L, ST__LUA_LOAD_LIMIT_S, NULL);
  rc = st__lua_pcall(L, 0, 1, err, sizeof err);     /* ret */
  st__lua_disarm(L);
  if (rc != 0) {
    if (ctx.stop == ST_ERR_OUT_OF_MEMORY)
      st__errlist_add(errs, "%s: the file went past the %zu MiB of Lua memory it may hold while "
                      "it is loaded", path, ST__LUA_LOAD_MEMORY_BYTES >> 20);
    else if (st__lua_has_position(err)) st__errlist_add(errs, "%s", err);
    else st__errlist_add(errs, "%s: %s", path, err);
    st__lua_close(L);
    return ST_ERR_CONFIGURATION;
  }
  cfgck_t c = {L, path, errs, obj};
  if (lua_type(L, 1) != LUA_TTABLE)
    bad(&c, NULL, "the file must return a table (return { workers = 4, ... }), it returned %s",
        luaL_typename(L, 1));
  else read_table(&c, rows, 1, NULL);
  st__lua_close(L);
  return errs->count > errs0 ? ST_ERR_CONFIGURATION : ST_OK;
}
