/* src/lua: config.lua (docs/operations.md).
 *
 * The file is a Lua chunk that returns one table. It runs sandboxed (the
 * endpoint allow-list without st and require; no io, no os.execute) under
 * the load time limit. Every key is checked; every problem is collected as
 * "path: key: message" (or "path:line: message" for Lua errors).
 */
#include "lua/lua_int.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/config.h"

typedef struct cfgck {
  lua_State *L;
  const char *path;
  st__errlist_t *errs;
  int nerr;
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
  c->nerr++;
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

static int set_string(cfgck_t *c, int idx, const char *key, char **dst) {
  if (lua_type(c->L, idx) != LUA_TSTRING || lua_objlen(c->L, idx) == 0) {
    bad(c, key, "expected a non-empty string, got %s", luaL_typename(c->L, idx));
    return 0;
  }
  char *s = strdup(lua_tostring(c->L, idx));
  if (!s) {
    bad(c, key, "out of memory");
    return 0;
  }
  free(*dst);
  *dst = s;
  return 1;
}

/* An array of integers >= 0 (or, if `single`, one integer). */
static int get_id_list(cfgck_t *c, int idx, const char *key, int single, int max, int64_t hi,
                       int64_t *out) {
  lua_State *L = c->L;
  if (single && lua_type(L, idx) == LUA_TNUMBER) return get_int(c, idx, key, 0, hi, out) ? 1 : -1;
  if (lua_type(L, idx) != LUA_TTABLE) {
    bad(c, key, "expected %s, got %s", single ? "an integer or an array of integers"
                                              : "an array of integers", luaL_typename(L, idx));
    return -1;
  }
  int n = (int)lua_objlen(L, idx), count = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    count++;
    lua_pop(L, 1);
  }
  if (count != n) {
    bad(c, key, "expected an array of integers");
    return -1;
  }
  if (n > max) {
    bad(c, key, "at most %d entries, got %d", max, n);
    return -1;
  }
  int ok = 1;
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, idx, i + 1);
    char k[64];
    snprintf(k, sizeof k, "%s[%d]", key, i + 1);
    if (!get_int(c, lua_gettop(L), k, 0, hi, &out[i])) ok = 0;
    lua_pop(L, 1);
  }
  return ok ? n : -1;
}

static int parse_level(const char *s) {
  static const char *const names[] = {"error", "warn", "info", "debug"};
  if (strcmp(s, "warning") == 0) return ST_LOG_WARN;
  for (int i = 0; i < 4; i++)
    if (strcmp(s, names[i]) == 0) return i;
  return -1;
}

static void parse_limits(cfgck_t *c, int idx, st__config_t *cfg) {
  lua_State *L = c->L;
  if (lua_type(L, idx) != LUA_TTABLE) {
    bad(c, "limits", "expected a table, got %s", luaL_typename(L, idx));
    return;
  }
  lua_pushnil(L);
  while (lua_next(L, idx)) {                  /* ..., key, value */
    int v = lua_gettop(L);
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
    char key[128];
    snprintf(key, sizeof key, "limits.%s", k ? k : "?");
    int64_t n;
    if (!k) {
      bad(c, "limits", "keys must be strings");
    } else if (strcmp(k, "max_message_bytes") == 0) {
      if (get_int(c, v, key, 64, (int64_t)1 << 40, &n)) cfg->max_message_bytes = (size_t)n;
    } else if (strcmp(k, "max_connections") == 0) {
      if (get_int(c, v, key, 1, 1 << 20, &n)) cfg->max_connections = (int)n;
    } else if (strcmp(k, "max_inflight") == 0) {
      if (get_int(c, v, key, 1, 1 << 20, &n)) cfg->max_inflight = (int)n;
    } else if (strcmp(k, "frame_timeout_ms") == 0) {
      if (get_int(c, v, key, 1, INT_MAX, &n)) cfg->frame_timeout_ms = (int)n;
    } else if (strcmp(k, "max_object_bytes") == 0) {
      if (get_int(c, v, key, 0, (int64_t)1 << 53, &n)) cfg->max_object_bytes = (uint64_t)n;
    } else {
      bad(c, NULL, "limits: unknown key '%s' (max_message_bytes, max_connections, "
                   "max_inflight, frame_timeout_ms, max_object_bytes)", k);
    }
    lua_pop(L, 1);
  }
}

/* tasks = { ttl_s = 600, capacity = 10000 } */
static void parse_tasks(cfgck_t *c, int idx, st__config_t *cfg) {
  lua_State *L = c->L;
  if (lua_type(L, idx) != LUA_TTABLE) {
    bad(c, "tasks", "expected a table, got %s", luaL_typename(L, idx));
    return;
  }
  lua_pushnil(L);
  while (lua_next(L, idx)) {                  /* ..., key, value */
    int v = lua_gettop(L);
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
    int64_t n;
    char buf[64];
    if (!k) {
      bad(c, "tasks", "keys must be strings");
    } else if (strcmp(k, "ttl_s") == 0) {
      double d = lua_tonumber(L, v);
      if (lua_type(L, v) != LUA_TNUMBER || !(d > 0) || d > 1e9)
        bad(c, "tasks.ttl_s", "expected a number of seconds > 0, got %s",
            got(L, v, buf, sizeof buf));
      else cfg->task_ttl_s = d;
    } else if (strcmp(k, "capacity") == 0) {
      if (get_int(c, v, "tasks.capacity", 1, 10000000, &n)) cfg->task_capacity = (int)n;
    } else {
      bad(c, NULL, "tasks: unknown key '%s' (ttl_s, capacity)", k);
    }
    lua_pop(L, 1);
  }
}

/* memory_budget = { cpu = bytes, ["cuda:0"] = bytes }; 0 = no budget. */
static void parse_budget(cfgck_t *c, int idx, st__config_t *cfg) {
  lua_State *L = c->L;
  if (lua_type(L, idx) != LUA_TTABLE) {
    bad(c, "memory_budget", "expected a table such as { cpu = 8 * 2^30 }, got %s",
        luaL_typename(L, idx));
    return;
  }
  lua_pushnil(L);
  while (lua_next(L, idx)) {                  /* ..., key, value */
    int v = lua_gettop(L);
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
    char key[64];
    snprintf(key, sizeof key, "memory_budget.%s", k ? k : "?");
    int64_t n;
    if (!k || !st__lua_device_name_ok(k, 0)) {
      bad(c, NULL, "memory_budget: keys are \"cpu\" or \"cuda:N\", got '%s'", k ? k : "?");
    } else if (get_int(c, v, key, 0, (int64_t)1 << 60, &n)) {
      if (st__config_set_budget(cfg, k, (uint64_t)n) != 0)
        bad(c, key, "at most %d devices", ST_MAX_BUDGETS);
    }
    lua_pop(L, 1);
  }
}

static void parse_socket_mode(cfgck_t *c, int idx, st__config_t *cfg) {
  lua_State *L = c->L;
  int64_t v;
  if (lua_type(L, idx) == LUA_TSTRING) {
    const char *s = lua_tostring(L, idx);
    char *end;
    errno = 0;
    long m = strtol(s, &end, 8);
    if (*s && !*end && !errno && m >= 0 && m <= 0777) {
      cfg->socket_mode = (unsigned)m;
      return;
    }
    bad(c, "socket_mode", "expected octal permission bits like \"0660\", got \"%s\"", s);
  } else if (get_int(c, idx, "socket_mode", 0, 0777, &v)) {
    cfg->socket_mode = (unsigned)v;
  }
}

/* Joins a relative endpoints dir to the config file's directory. */
static char *resolve_dir(const char *config_path, const char *dir) {
  if (dir[0] == '/') return strdup(dir);
  const char *slash = strrchr(config_path, '/');
  if (!slash) return strdup(dir);
  char *out = NULL;
  if (asprintf(&out, "%.*s/%s", (int)(slash - config_path), config_path, dir) < 0) return NULL;
  return out;
}

/* data_dirs = { "models", "/srv/weights" }: relative entries are resolved
 * against the config file's directory. Replaces the default. */
static void parse_data_dirs(cfgck_t *c, int idx, st__config_t *cfg) {
  lua_State *L = c->L;
  if (lua_type(L, idx) != LUA_TTABLE) {
    bad(c, "data_dirs", "expected an array of directory names, got %s", luaL_typename(L, idx));
    return;
  }
  int n = (int)lua_objlen(L, idx);
  if (n > ST_MAX_DATA_DIRS) {
    bad(c, "data_dirs", "at most %d directories, got %d", ST_MAX_DATA_DIRS, n);
    return;
  }
  for (int i = 0; i < cfg->ndata_dirs; i++) free(cfg->data_dirs[i]);
  cfg->ndata_dirs = 0;
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, idx, i);                        /* [dir] */
    if (lua_type(L, -1) != LUA_TSTRING || lua_objlen(L, -1) == 0) {
      bad(c, "data_dirs", "entry %d: expected a directory name, got %s", i,
          luaL_typename(L, -1));
    } else {
      char *dir = resolve_dir(c->path, lua_tostring(L, -1));
      if (dir) cfg->data_dirs[cfg->ndata_dirs++] = dir;
      else bad(c, "data_dirs", "out of memory");
    }
    lua_pop(L, 1);                                 /* [] */
  }
}

static void parse_key(cfgck_t *c, const char *k, int v, st__config_t *cfg) {
  lua_State *L = c->L;
  int64_t ids[ST_MAX_ALLOW], n;
  int count;
  if (strcmp(k, "base_path") == 0) {
    set_string(c, v, k, &cfg->base_path);
  } else if (strcmp(k, "devices") == 0) {
    if ((count = get_id_list(c, v, k, 1, ST_MAX_DEVICES, 4095, ids)) > 0) {
      cfg->ndevices = count;
      for (int i = 0; i < count; i++) cfg->devices[i] = (int)ids[i];
    } else if (count == 0) {
      bad(c, k, "at least one device is needed");
    }
  } else if (strcmp(k, "workers") == 0) {
    if (get_int(c, v, k, 1, 256, &n)) cfg->workers = (int)n;
  } else if (strcmp(k, "endpoints") == 0) {
    char *s = NULL;
    if (set_string(c, v, k, &s)) {
      char *dir = resolve_dir(c->path, s);
      free(s);
      if (dir) {
        free(cfg->endpoints_dir);
        cfg->endpoints_dir = dir;
      } else {
        bad(c, k, "out of memory");
      }
    }
  } else if (strcmp(k, "log_level") == 0) {
    int lv = lua_type(L, v) == LUA_TSTRING ? parse_level(lua_tostring(L, v)) : -1;
    if (lv < 0) bad(c, k, "expected \"error\", \"warn\", \"info\" or \"debug\"");
    else cfg->log_level = (st__log_level_t)lv;
  } else if (strcmp(k, "socket_mode") == 0) {
    parse_socket_mode(c, v, cfg);
  } else if (strcmp(k, "socket_group") == 0) {
    if (lua_type(L, v) == LUA_TNUMBER) {        /* a gid: kept as its decimal text */
      char *s = NULL;
      if (get_int(c, v, k, 0, UINT32_MAX - 1, &n) && asprintf(&s, "%lld", (long long)n) >= 0) {
        free(cfg->socket_group);
        cfg->socket_group = s;
      }
    } else {
      set_string(c, v, k, &cfg->socket_group);
    }
  } else if (strcmp(k, "allow_uids") == 0) {
    if ((count = get_id_list(c, v, k, 0, ST_MAX_ALLOW, UINT32_MAX - 1, ids)) >= 0) {
      cfg->nallow_uids = count;
      for (int i = 0; i < count; i++) cfg->allow_uids[i] = (uid_t)ids[i];
    }
  } else if (strcmp(k, "allow_gids") == 0) {
    if ((count = get_id_list(c, v, k, 0, ST_MAX_ALLOW, UINT32_MAX - 1, ids)) >= 0) {
      cfg->nallow_gids = count;
      for (int i = 0; i < count; i++) cfg->allow_gids[i] = (gid_t)ids[i];
    }
  } else if (strcmp(k, "limits") == 0) {
    parse_limits(c, v, cfg);
  } else if (strcmp(k, "tasks") == 0) {
    parse_tasks(c, v, cfg);
  } else if (strcmp(k, "memory_budget") == 0) {
    parse_budget(c, v, cfg);
  } else if (strcmp(k, "default_device") == 0) {
    const char *d = lua_type(L, v) == LUA_TSTRING ? lua_tostring(L, v) : NULL;
    if (!d || (strcmp(d, "socket") != 0 && strcmp(d, "cpu") != 0)) {
      bad(c, k, "expected \"socket\" or \"cpu\"");
    } else {
      free(cfg->default_device);
      cfg->default_device = strdup(d);
    }
  } else if (strcmp(k, "data_dirs") == 0) {
    parse_data_dirs(c, v, cfg);
  } else if (strcmp(k, "loader_threads") == 0) {
    if (get_int(c, v, k, 1, 64, &n)) cfg->loader_threads = (int)n;
  } else if (strcmp(k, "staging_bytes") == 0) {
    if (get_int(c, v, k, 4 << 20, INT64_C(1) << 40, &n)) cfg->staging_bytes = (uint64_t)n;
  } else if (strcmp(k, "shutdown_grace_s") == 0) {
    double d = lua_tonumber(L, v);
    char buf[64];
    if (lua_type(L, v) != LUA_TNUMBER || !(d >= 0) || d > 86400.0)
      bad(c, k, "expected a number of seconds >= 0, got %s", got(L, v, buf, sizeof buf));
    else cfg->shutdown_grace_s = d;
  } else {
    bad(c, NULL, "unknown key '%s'", k);
  }
}

/* Loop thread, at start. See st_lua.h. */
int st__config_load(const char *path, st__config_t *cfg, st__errlist_t *errs) {
  size_t errs0 = errs->count;
  FILE *f = fopen(path, "rb");
  if (!f) {
    st__errlist_add(errs, "%s: cannot read: %s", path, strerror(errno));
    return ST_ERR_CONFIGURATION;
  }
  char *text = NULL;
  size_t len = 0;
  FILE *mem = open_memstream(&text, &len);
  char buf[4096];
  size_t k;
  while (mem && (k = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, k, mem);
  fclose(f);
  if (!mem || fclose(mem) != 0 || !text) {
    free(text);
    st__errlist_add(errs, "%s: out of memory", path);
    return ST_ERR_CONFIGURATION;
  }

  st__lua_ctx_t ctx = {.mode = ST__LUA_CONFIG, .who = "config"};
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
    lua_close(L);
    return ST_ERR_CONFIGURATION;
  }
  st__lua_arm(L, ST__LUA_LOAD_LIMIT_S, NULL);
  rc = st__lua_pcall(L, 0, 1, err, sizeof err);     /* ret */
  st__lua_disarm(L);
  if (rc != 0) {
    if (st__lua_has_position(err)) st__errlist_add(errs, "%s", err);
    else st__errlist_add(errs, "%s: %s", path, err);
    lua_close(L);
    return ST_ERR_CONFIGURATION;
  }
  cfgck_t c = {L, path, errs, 0};
  if (lua_type(L, 1) != LUA_TTABLE) {
    bad(&c, NULL, "the file must return a table (return { workers = 4, ... }), it returned %s",
        luaL_typename(L, 1));
  } else {
    lua_pushnil(L);
    while (lua_next(L, 1)) {                        /* ret, key, value */
      if (lua_type(L, -2) != LUA_TSTRING) bad(&c, NULL, "keys must be strings");
      else parse_key(&c, lua_tostring(L, -2), lua_gettop(L), cfg);
      lua_pop(L, 1);                                /* ret, key */
    }
  }
  lua_close(L);
  if (errs->count > errs0) return ST_ERR_CONFIGURATION;
  /* The default data directory is the config file's own directory. */
  if (cfg->ndata_dirs == 1 && strcmp(cfg->data_dirs[0], ".") == 0) {
    char *dir = resolve_dir(path, ".");
    if (dir) {
      free(cfg->data_dirs[0]);
      cfg->data_dirs[0] = dir;
    }
  }
  char *p = strdup(path);
  if (p) {
    free(cfg->path);
    cfg->path = p;
  }
  return ST_OK;
}
