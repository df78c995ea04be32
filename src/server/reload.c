/* src/server: reloading the endpoints (SIGHUP and the `reload` method):
 * compile and validate a new generation, then swap it in, or keep the
 * current one and record why (server.h). Loop thread only.
 */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "lua/st_lua.h"
#include "server/server.h"
#include "server/work.h"
#include "st/errors.h"

/* Frees the owned strings of a reload report. */
void st__reload_report_free(st__reload_report_t *r) {
  free(r->error);
  for (int k = 0; k < 3; k++) {
    for (size_t i = 0; i < r->counts[k]; i++) free(r->names[k][i]);
    free(r->names[k]);
  }
  memset(r, 0, sizeof *r);
}

static void report_add(st__reload_report_t *r, int list, const char *name) {
  char **v = realloc(r->names[list], (r->counts[list] + 1) * sizeof *v);
  if (!v) return;
  r->names[list] = v;
  char *copy = strdup(name);
  if (copy) v[r->counts[list]++] = copy;
}

/* Changed, added and removed endpoints between two generations (both
 * sorted by name), compared by fingerprint. Caches of changed and removed
 * endpoints are dropped, and their builds in flight are not cached. */
static void diff_generations(st__server_t *srv, const st__generation_t *old,
                             const st__generation_t *g, st__reload_report_t *r) {
  size_t i = 0, j = 0, nold = old ? old->nendpoints : 0;
  while (i < nold || j < g->nendpoints) {
    int c = i == nold ? 1 : j == g->nendpoints ? -1
                                               : strcmp(old->endpoints[i].name, g->endpoints[j].name);
    if (c < 0 || (c == 0 && old->endpoints[i].fingerprint != g->endpoints[j].fingerprint)) {
      const char *name = old->endpoints[i].name;
      report_add(r, c < 0 ? ST_RELOAD_REMOVED : ST_RELOAD_CHANGED, name);
      size_t dropped = st__objects_uncache_endpoint(&srv->objects, name);
      st__builds_forget(srv, name, NULL, 0);
      if (dropped)
        ST_LOG_I("server", "reload: %s %s: %zu cache entries dropped", name,
                 c < 0 ? "removed" : "changed", dropped);
      i++;
      if (c == 0) j++;
    } else if (c > 0) {
      report_add(r, ST_RELOAD_ADDED, g->endpoints[j].name);
      j++;
    } else {
      i++;
      j++;
    }
  }
}

/* SIGHUP and `reload`: compile, validate, then swap; on error keep the
 * current generation and record why. Loop thread. */
void st__server_reload(st__server_t *srv, st__reload_report_t *report) {
  st__reload_report_t local;
  st__reload_report_t *r = report ? report : &local;
  memset(r, 0, sizeof *r);
  r->generation = srv->gen ? srv->gen->number : 0;
  if (srv->shutting_down) {
    ST_LOG_W("server", "reload ignored: shutting down");
    r->error = strdup("the server is shutting down");
    if (!report) st__reload_report_free(r);
    return;
  }
  uint64_t number = (srv->gen ? srv->gen->number : 0) + 1;
  st__errlist_t errs = {0};
  st__generation_t *g = NULL;
  double t0 = st__now_mono();
  int rc = st__generation_load(srv->cfg->endpoints_dir, number, &g, &errs);
  srv->last_reload_done = 1;
  srv->last_reload_at = st__now_unix();
  free(srv->last_reload_error);
  srv->last_reload_error = NULL;
  if (rc != ST_OK) {
    srv->last_reload_ok = 0;
    srv->last_reload_error = st__errlist_join(&errs);
    if (!srv->last_reload_error) srv->last_reload_error = strdup(st_strerror(rc));
    srv->counters.reload_failures++;
    ST_LOG_E("server", "reload failed; generation %llu stays in service:",
             (unsigned long long)(srv->gen ? srv->gen->number : 0));
    st__errlist_log(&errs, ST_LOG_ERROR, "server");
    st__errlist_clear(&errs);
    r->error = srv->last_reload_error ? strdup(srv->last_reload_error) : NULL;
    if (!report) st__reload_report_free(r);
    return;
  }
  st__errlist_clear(&errs);
  st__generation_t *old = srv->gen;
  diff_generations(srv, old, g, r);
  srv->gen = g;
  if (srv->pool) st__pool_set_generation(srv->pool, g);
  /* Jobs and worker states hold their own references: the old generation
   * is freed when the last of them lets go. */
  if (old) st__generation_unref(old);
  srv->last_reload_ok = 1;
  srv->counters.reloads++;
  r->ok = 1;
  r->generation = g->number;
  char names[1024];
  st__generation_names(g, names, sizeof names);
  ST_LOG_I("server", "reloaded in %.1f ms: generation %llu, %zu endpoints (%zu changed, "
           "%zu added, %zu removed): %s",
           (st__now_mono() - t0) * 1e3, (unsigned long long)g->number, g->nendpoints,
           r->counts[ST_RELOAD_CHANGED], r->counts[ST_RELOAD_ADDED],
           r->counts[ST_RELOAD_REMOVED], names);
  if (!report) st__reload_report_free(r);
}
