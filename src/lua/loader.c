/* src/lua: loading a generation of endpoints (st_lua.h).
 *
 * Each endpoints/NAME.lua (sorted, not recursive, hidden files skipped),
 * or the one file the endpoints setting names, is read once; its text is
 * kept in the generation and run in its own sandboxed validation state,
 * where st.endpoint{...} (or a zero-branch script's app:endpoint{...})
 * only records the declaration and its line. What the file returns (or
 * what it recorded) is validated in C (decl.c). Build bodies never run
 * here. Every problem of every file is collected; any problem fails the
 * whole load and frees everything.
 */
#include "lua/lua_int.h"
#include "lua/zerobranch.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define SOURCE_MAX_BYTES (16u << 20)

static int str_cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int decl_cmp(const void *a, const void *b) {
  const st__endpoint_decl_t *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  if (c) return c;
  c = strcmp(x->file, y->file);
  return c ? c : x->line - y->line;
}

/* The files to load, as owned paths: `dir` itself when it names a regular
 * file (a single endpoint file, such as a zero-branch script), else the
 * sorted *.lua files of the directory. NULL with an error added. */
static char **list_files(const char *dir, size_t *count, st__errlist_t *errs) {
  *count = 0;
  struct stat self;
  if (stat(dir, &self) == 0 && S_ISREG(self.st_mode)) {
    char **one = calloc(1, sizeof *one);
    if (!one || !(one[0] = strdup(dir))) {
      free(one);
      st__errlist_add(errs, "%s: out of memory", dir);
      return NULL;
    }
    *count = 1;
    return one;
  }
  DIR *d = opendir(dir);
  if (!d) {
    st__errlist_add(errs, "%s: cannot open the endpoints directory or file: %s", dir,
                    strerror(errno));
    return NULL;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  size_t dl = strlen(dir);
  const char *sep = dl && dir[dl - 1] == '/' ? "" : "/";
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name);
    if (e->d_name[0] == '.' || len < 5 || strcmp(e->d_name + len - 4, ".lua") != 0) continue;
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s%s%s", dir, sep, e->d_name);
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      char **v = realloc(names, cap * sizeof *v);
      if (!v) break;
      names = v;
    }
    if (!(names[n] = strdup(path))) break;
    n++;
  }
  closedir(d);
  if (n) qsort(names, n, sizeof *names, str_cmp);
  *count = n;
  if (!names) names = calloc(1, sizeof *names);
  return names;
}

/* Reads a whole file into an owned NUL-terminated buffer. */
static char *read_text(const char *path, size_t *len, st__errlist_t *errs) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    st__errlist_add(errs, "%s: cannot read: %s", path, strerror(errno));
    return NULL;
  }
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    if (n + 1 >= cap) {
      if (cap >= SOURCE_MAX_BYTES) {
        st__errlist_add(errs, "%s: larger than %u bytes", path, SOURCE_MAX_BYTES);
        free(buf);
        buf = NULL;
        break;
      }
      char *b = realloc(buf, cap * 2);
      if (!b) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = b;
      cap *= 2;
    }
    size_t k = fread(buf + n, 1, cap - n - 1, f);
    n += k;
    if (k == 0) break;
  }
  if (buf && ferror(f)) {
    st__errlist_add(errs, "%s: cannot read: %s", path, strerror(errno));
    free(buf);
    buf = NULL;
  }
  fclose(f);
  if (!buf) return NULL;
  buf[n] = '\0';
  *len = n;
  return buf;
}

typedef struct decls {
  st__endpoint_decl_t *v;
  size_t n, cap;
} decls_t;

typedef struct filerun {
  const st__source_t *src;
  decls_t *out;
  st__errlist_t *errs;
  double limit_s;
  const volatile int *cancel;
} filerun_t;

/* Protected part of load_file: compile, run the top level, validate what
 * it returned. A failure of the Lua API itself (out of memory) raises to
 * load_file instead of panicking. */
static int l_run_file(lua_State *L) {
  filerun_t *f = lua_touserdata(L, 1);
  const st__source_t *src = f->src;
  st__errlist_t *errs = f->errs;
  lua_settop(L, 0);
  st__lua_ctx_t *ctx = st__lua_ctx(L);
  char chunkname[4200], err[2048];
  snprintf(chunkname, sizeof chunkname, "@%s", src->path);
  if (luaL_loadbufferx(L, src->text, src->len, chunkname, "t") != 0) {
    st__errlist_add(errs, "%s", lua_tostring(L, -1));  /* "file:line: message" */
    return 0;
  }
  ctx->src_text = src->text;
  ctx->src_len = src->len;
  st__lua_arm(L, f->limit_s, f->cancel);
  int rc = st__lua_pcall(L, 0, 1, err, sizeof err);   /* ret */
  st__lua_disarm(L);
  if (rc != 0 && rc != LUA_ERRMEM && st__lua_main_reached(L)) {
    lua_pushnil(L);                           /* app:main ended the file: ret = nil */
    rc = 0;
  }
  if (rc != 0) {
    if (ctx->stop == ST_ERR_TIMEOUT)
      st__errlist_add(errs, "%s%s%s (a file's top level may run at most %g s: "
                      "endpoint_load_timeout_s)", st__lua_has_position(err) ? "" : src->path,
                      st__lua_has_position(err) ? "" : ": ", err, f->limit_s);
    else if (ctx->stop == ST_ERR_OUT_OF_MEMORY)
      st__errlist_add(errs, "%s: the top level went past the %zu MiB a file may hold while it "
                      "is loaded", src->path, ST__LUA_LOAD_MEMORY_BYTES >> 20);
    else if (st__lua_has_position(err))
      st__errlist_add(errs, "%s", err);
    else
      st__errlist_add(errs, "%s: %s", src->path, err);
    return 0;
  }
  int n = st__lua_file_decls(L, 1);           /* ret, list|msg */
  if (n < 0) {
    st__errlist_add(errs, "%s: %s", src->path, lua_tostring(L, -1));
    return 0;
  }
  decls_t *out = f->out;
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, 2, i);                     /* ret, list, decl */
    if (out->n == out->cap) {
      size_t cap = out->cap ? out->cap * 2 : 16;
      st__endpoint_decl_t *v = realloc(out->v, cap * sizeof *v);
      if (!v) {
        st__errlist_add(errs, "%s: out of memory", src->path);
        break;
      }
      out->v = v;
      out->cap = cap;
    }
    st__endpoint_decl_t *d = &out->v[out->n];
    if (st__lua_decl_parse(L, 3, src->path, st__lua_decl_line(L, 3), d, errs) == 0) {
      uint64_t h = st__lua_fnv1a(ST__FNV_OFFSET, src->text, src->len);
      h = st__lua_fnv1a(h, "", 1);
      d->fingerprint = st__lua_fnv1a(h, d->name, strlen(d->name));
      out->n++;
    }
    lua_settop(L, 2);                         /* ret, list */
  }
  return 0;
}

/* Runs one file in its own validation state, under f's time limit and
 * cancel flag, and appends its declarations. */
static void load_file(filerun_t *f) {
  const st__source_t *src = f->src;
  st__errlist_t *errs = f->errs;
  st__lua_ctx_t ctx = {.mode = ST__LUA_LOAD, .who = "lua", .mem_limit = ST__LUA_LOAD_MEMORY_BYTES};
  lua_State *L = st__lua_state_new(&ctx);
  if (!L) {
    st__errlist_add(errs, "%s: cannot create a Lua state (out of memory)", src->path);
    return;
  }
  if (lua_cpcall(L, l_run_file, f) != 0)
    st__errlist_add(errs, "%s: %s", src->path, lua_tostring(L, -1));
  st__lua_close(L);
}

static double wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Any thread. See st_lua.h. */
int st__generation_load(const char *dir, uint64_t number, const st__load_opts_t *opts,
                        st__generation_t **out, st__errlist_t *errs) {
  *out = NULL;
  double limit_s = opts && opts->limit_s > 0 ? opts->limit_s : ST__LUA_LOAD_LIMIT_S;
  const volatile int *cancel = opts ? opts->cancel : NULL;
  size_t errs0 = errs->count;
  size_t nfiles;
  char **files = list_files(dir, &nfiles, errs);
  if (!files) return ST_ERR_CONFIGURATION;

  st__generation_t *g = calloc(1, sizeof *g);
  decls_t decls = {0};
  if (!g || !(g->dir = strdup(dir)) ||
      !(g->sources = calloc(nfiles ? nfiles : 1, sizeof *g->sources))) {
    st__errlist_add(errs, "%s: out of memory", dir);
    goto fail;
  }
  g->refs = 1;
  g->number = number;
  g->loaded_at = wall_now();
  g->load_limit_s = limit_s;

  for (size_t i = 0; i < nfiles; i++) {
    if (cancel && __atomic_load_n(cancel, __ATOMIC_RELAXED)) {
      st__errlist_add(errs, "%s: the load was cancelled", dir);
      break;
    }
    st__source_t *s = &g->sources[g->nsources];
    if (!(s->text = read_text(files[i], &s->len, errs))) continue;
    s->path = strdup(files[i]);
    g->nsources++;
    filerun_t f = {s, &decls, errs, limit_s, cancel};
    load_file(&f);
  }

  if (decls.n) qsort(decls.v, decls.n, sizeof *decls.v, decl_cmp);
  for (size_t i = 1; i < decls.n; i++) {
    const st__endpoint_decl_t *a = &decls.v[i - 1], *b = &decls.v[i];
    if (strcmp(a->name, b->name) == 0)
      st__errlist_add(errs, "%s:%d: duplicate endpoint name '%s' (also declared at %s:%d)",
                      b->file, b->line, b->name, a->file, a->line);
  }
  g->endpoints = decls.v;
  g->nendpoints = decls.n;
  decls.v = NULL;
  decls.n = 0;
  if (errs->count > errs0) goto fail;

  for (size_t i = 0; i < nfiles; i++) free(files[i]);
  free(files);
  *out = g;
  return ST_OK;

fail:
  for (size_t i = 0; i < decls.n; i++) st__lua_decl_free(&decls.v[i]);
  free(decls.v);
  for (size_t i = 0; i < nfiles; i++) free(files[i]);
  free(files);
  if (g) {
    g->refs = 1;
    st__generation_unref(g);
  }
  return ST_ERR_CONFIGURATION;
}
