/* src/engine: generations and the loader's error list (generation.h).
 * Loading lives in src/lua (it needs Lua); this file only owns the data.
 */
#include "engine/generation.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

/* Appends one formatted entry. On allocation failure the entry is dropped
 * (the count of earlier entries stays right). Owner's thread. */
void st__errlist_add(st__errlist_t *l, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  int n = vasprintf(&s, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  char **items = realloc(l->items, (l->count + 1) * sizeof *items);
  if (!items) {
    free(s);
    return;
  }
  l->items = items;
  l->items[l->count++] = s;
}

/* Frees every entry; the list is empty and reusable afterwards. */
void st__errlist_clear(st__errlist_t *l) {
  for (size_t i = 0; i < l->count; i++) free(l->items[i]);
  free(l->items);
  l->items = NULL;
  l->count = 0;
}

/* Entries joined by newlines; owned by the caller (free), NULL if empty. */
char *st__errlist_join(const st__errlist_t *l) {
  if (!l->count) return NULL;
  size_t n = 0;
  for (size_t i = 0; i < l->count; i++) n += strlen(l->items[i]) + 1;
  char *s = malloc(n);
  if (!s) return NULL;
  char *p = s;
  for (size_t i = 0; i < l->count; i++) {
    size_t k = strlen(l->items[i]);
    memcpy(p, l->items[i], k);
    p += k;
    *p++ = '\n';
  }
  p[-1] = '\0';
  return s;
}

/* One log line per entry. Any thread. */
void st__errlist_log(const st__errlist_t *l, st__log_level_t level, const char *who) {
  for (size_t i = 0; i < l->count; i++) st__log_all(level, who, "%s", l->items[i]);
}

/* "a, b, c" (cut with "..." at cap). Any thread. */
void st__generation_names(const st__generation_t *g, char *out, size_t cap) {
  size_t used = 0;
  out[0] = '\0';
  for (size_t i = 0; g && i < g->nendpoints && used + 1 < cap; i++) {
    int n = snprintf(out + used, cap - used, "%s%s", i ? ", " : "", g->endpoints[i].name);
    if (n < 0) break;
    used += (size_t)n;
  }
  if (used >= cap && cap > 4) memcpy(out + cap - 4, "...", 4);
}

/* Any thread. */
void st__generation_ref(st__generation_t *g) {
  __atomic_add_fetch(&g->refs, 1, __ATOMIC_RELAXED);
}

static void free_decl(st__endpoint_decl_t *e) {
  free(e->name);
  free(e->file);
  free(e->doc);
  free(e->cache_format_key);
  free(e->device);
  for (size_t i = 0; i < e->nparams; i++) {
    free(e->params[i].name);
    free(e->params[i].default_mp);
  }
  free(e->params);
}

/* Any thread; frees the generation (declarations and sources) at zero. */
void st__generation_unref(st__generation_t *g) {
  if (!g) return;
  if (__atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  for (size_t i = 0; i < g->nendpoints; i++) free_decl(&g->endpoints[i]);
  free(g->endpoints);
  for (size_t i = 0; i < g->nsources; i++) {
    free(g->sources[i].path);
    free(g->sources[i].text);
  }
  free(g->sources);
  free(g->dir);
  free(g);
}

/* See generation.h. Any thread. */
int st__name_cmp(const char *a, const char *b, size_t blen) {
  size_t al = strlen(a);
  int c = memcmp(a, b, al < blen ? al : blen);
  return c ? c : (al > blen) - (al < blen);
}

/* Binary search over the endpoints (sorted by name with strcmp), with
 * st__name_cmp: a wire name with a NUL byte matches no endpoint.
 * Borrowed result, or NULL. Any thread. */
const st__endpoint_decl_t *st__generation_find(const st__generation_t *g, const char *name,
                                               size_t len) {
  size_t lo = 0, hi = g->nendpoints;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = st__name_cmp(g->endpoints[mid].name, name, len);
    if (c == 0) return &g->endpoints[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return NULL;
}
