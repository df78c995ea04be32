/* src/common: the default socket bases (sockdir.h). */
#include "common/sockdir.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st/wire.h"

/* Fills e from a parent directory: dir "<parent>/sharedtensor", base
 * "<parent>/" ST_XDG_BASE_PATH. 0, or -1 when it does not fit. */
static int from_parent(st__sockdir_t *e, st__sockdir_kind_t kind, const char *parent) {
  size_t n = strlen(parent);
  while (n > 0 && parent[n - 1] == '/') n--; /* "/run/" and "/run" alike */
  if (n == 0) return -1;                        /* "/" is nobody's runtime dir */
  e->kind = kind;
  int a = snprintf(e->parent, sizeof e->parent, "%.*s", (int)n, parent);
  int b = snprintf(e->base, sizeof e->base, "%s/" ST_XDG_BASE_PATH, e->parent);
  if (a < 0 || b < 0 || (size_t)a >= sizeof e->parent || (size_t)b >= sizeof e->base) return -1;
  snprintf(e->dir, sizeof e->dir, "%s", e->base);
  *strrchr(e->dir, '/') = '\0';
  return 0;
}

/* See sockdir.h. */
int st__sockdir_list(st__sockdir_t out[ST__SOCKDIR_MAX]) {
  int n = 0;
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  if (xdg && xdg[0] == '/' && from_parent(&out[n], ST__SOCKDIR_XDG, xdg) == 0) n++;
  const char *run = getenv(ST__ENV_TEST_RUN_DIR);
  if (!run || run[0] != '/') run = "/run";
  /* The test directory fits (tests make it short); /run always does. */
  if (from_parent(&out[n], ST__SOCKDIR_RUN, run) == 0) n++;
  st__sockdir_t *t = &out[n++];
  t->kind = ST__SOCKDIR_TMP;
  snprintf(t->base, sizeof t->base, "%s", ST_DEFAULT_BASE_PATH);
  snprintf(t->dir, sizeof t->dir, "%s", ST_DEFAULT_BASE_PATH);
  *strrchr(t->dir, '/') = '\0';
  snprintf(t->parent, sizeof t->parent, "%s", t->dir);
  return n;
}

/* See sockdir.h. */
const char *st__sockdir_kind_name(st__sockdir_kind_t kind) {
  switch (kind) {
  case ST__SOCKDIR_XDG: return "$XDG_RUNTIME_DIR";
  case ST__SOCKDIR_RUN: return "/run";
  default: return "the fallback";
  }
}

/* See sockdir.h. */
int st__sockdir_is_private(const char *dir) {
  st__sockdir_t list[ST__SOCKDIR_MAX];
  int n = st__sockdir_list(list);
  for (int i = 0; i < n; i++)
    if (list[i].kind != ST__SOCKDIR_TMP && strcmp(list[i].dir, dir) == 0) return 1;
  return 0;
}
