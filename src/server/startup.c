/* src/server: from parsed flags to a running (or checked) server.
 * Precedence of every setting: flag > config.lua > environment (only
 * SHARED_TENSOR_BASE_PATH) > built-in default (for the socket base: the
 * first usable default directory, sockdir.c). Main thread.
 */
#include <errno.h>
#include <msgpack.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "engine/options.h"
#include "lua/st_lua.h"
#include "mem/ledger.h"
#include "peer/peer.h"
#include "peer/ssl_api.h"
#include "server/server.h"
#include "server/reclaim.h"
#include "server/takeover.h"
#include "st/errors.h"
#include "st/wire.h"

#define DEFAULT_CONFIG "config.lua"

static char *dir_of(const char *path) {
  char *d = strdup(path);
  if (!d) return NULL;
  char *slash = strrchr(d, '/');
  if (!slash) {
    free(d);
    return strdup(".");
  }
  if (slash == d) slash[1] = '\0';
  else *slash = '\0';
  return d;
}

/* The default endpoints directory ("endpoints") is relative to the config
 * file's directory when there is one (st__config_load already resolves a
 * value set in config.lua); --endpoints, and everything when no config
 * file is used, is relative to the working directory. */
static void resolve_endpoints(st__config_t *cfg, int keep) {
  if (keep || !cfg->endpoints_dir || cfg->endpoints_dir[0] == '/') return;
  if (!cfg->path || !cfg->path[0]) return;
  char *dir = dir_of(cfg->path);
  if (!dir) return;
  if (strcmp(dir, ".") != 0) {
    size_t n = strlen(dir) + strlen(cfg->endpoints_dir) + 2;
    char *joined = malloc(n);
    if (joined) {
      snprintf(joined, n, "%s/%s", dir, cfg->endpoints_dir);
      free(cfg->endpoints_dir);
      cfg->endpoints_dir = joined;
    }
  }
  free(dir);
}

static void print_errors(const st__errlist_t *errs) {
  for (size_t i = 0; i < errs->count; i++) fprintf(stderr, "%s\n", errs->items[i]);
}

/* "name" or "name=<default>" for a --check listing. */
static void print_param(const st__param_t *p) {
  if (p->required || !p->default_mp) {
    printf("%s", p->name);
    return;
  }
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  char text[64] = "...";
  if (msgpack_unpack_next(&u, p->default_mp, p->default_len, &off) == MSGPACK_UNPACK_SUCCESS &&
      msgpack_object_print_buffer(text, sizeof text, u.data) <= 0)
    snprintf(text, sizeof text, "...");
  msgpack_unpacked_destroy(&u);
  printf("%s=%s", p->name, text);
}

/* --check: the memory budget, the arena size cap and the arena
 * descriptor cap, with what their defaults were derived from. */
static void print_memory_limits(const st__config_t *cfg) {
  char source[256];
  uint64_t host = st__ledger_host_memory(source, sizeof source), nofile = 0;
  uint64_t fds = st__reclaim_fd_cap(cfg->max_arena_fds, &nofile);
  printf("memory: cpu budget %llu bytes (host memory %llu bytes: %s)\n",
         (unsigned long long)cfg->budgets[0].bytes, (unsigned long long)host, source);
  printf("memory: max_object_bytes %llu%s, max_arena_fds %llu%s (RLIMIT_NOFILE %llu)\n",
         (unsigned long long)cfg->max_object_bytes,
         cfg->max_object_bytes ? "" : " (the device's memory_budget)", (unsigned long long)fds,
         cfg->max_arena_fds ? "" : " (half of RLIMIT_NOFILE)", (unsigned long long)nofile);
}

/* --check: whether TLS loads, and the peer configuration (src/peer):
 * "peer: ..." on stdout, a problem on stderr. The number of errors. */
static int check_peer(const st__config_t *cfg) {
  const st__peer_conf_t *pc = &cfg->peer;
  char why[512], err[1024];
  const char *version = st__ssl_api(why, sizeof why) ? st__ssl_version() : NULL;
  if (version) printf("tls: %s loads (the peer channel can run)\n", version);
  else printf("tls: unavailable: %s\n", why);
  int rc = st__peer_check(pc, geteuid(), err, sizeof err);
  if (rc != ST_OK) {
    fprintf(stderr, "%s: %s\n", cfg->path && cfg->path[0] ? cfg->path : "config", err);
    return 1;
  }
  if (!st__peer_configured(pc)) {
    printf("peer: off (no peer.listen, no peer.peers); id %s\n", pc->id);
    return 0;
  }
  printf("peer: id %s, listen %s, trust %s, %d peer(s):", pc->id,
         pc->listen ? pc->listen : "none", pc->secret ? "cluster key" : "certificates",
         pc->npeers);
  for (int i = 0; i < pc->npeers; i++)
    printf(" %s=%s", pc->peers[i].id, pc->peers[i].addr ? pc->peers[i].addr : "(accept-only)");
  printf("; export %d glob(s)\n", pc->nexport);
  return 0;
}

/* --check: config, socket paths and every endpoint file; errors on
 * stderr (file:line: message), a summary on stdout. */
static int run_check(const st__config_t *cfg, int config_errors) {
  int nerr = config_errors;
  printf("config: %s\n", cfg->path && cfg->path[0] ? cfg->path : "none (defaults)");
  for (int i = 0; i < cfg->ndevices; i++) {
    char path[200], err[512];
    if (st__socket_path(cfg->base_path, cfg->devices[i], path, sizeof path, err, sizeof err) !=
        ST_OK) {
      fprintf(stderr, "%s: %s\n", cfg->path && cfg->path[0] ? cfg->path : "config", err);
      nerr++;
    } else {
      printf("socket: %s (device %d)\n", path, cfg->devices[i]);
    }
  }
  if (cfg->socket_group && cfg->socket_group[0]) {
    char err[256];
    gid_t gid;
    if (st__socket_group_id(cfg->socket_group, &gid, err, sizeof err) != ST_OK) {
      fprintf(stderr, "%s: %s\n", cfg->path && cfg->path[0] ? cfg->path : "config", err);
      nerr++;
    }
  }
  print_memory_limits(cfg);
  nerr += check_peer(cfg);
  printf("workers: %d spin_us=%d loop_threads=%d\n", cfg->workers, cfg->spin_us,
         cfg->loop_threads);
  st__config_print_tables(cfg, stdout);
  st__errlist_t errs = {0};
  st__generation_t *gen = NULL;
  const st__load_opts_t load = {.limit_s = cfg->endpoint_load_timeout_s};
  int rc = st__generation_load(cfg->endpoints_dir, 1, &load, &gen, &errs);
  print_errors(&errs);
  if (rc != ST_OK) {
    nerr += errs.count ? (int)errs.count : 1;
    if (!errs.count)
      fprintf(stderr, "%s: cannot load endpoints: %s\n", cfg->endpoints_dir, st_strerror(rc));
  }
  st__errlist_clear(&errs);
  printf("endpoints: %s\n", cfg->endpoints_dir);
  printf("reload: endpoint_load_timeout_s %g; reload_uids", cfg->endpoint_load_timeout_s);
  for (int i = 0; i < cfg->nreload_uids; i++) printf(" %u", (unsigned)cfg->reload_uids[i]);
  printf("%s\n", cfg->nreload_uids ? "" : " none (SIGHUP only)");
  if (gen) {
    for (size_t i = 0; i < gen->nendpoints; i++) {
      const st__endpoint_decl_t *ep = &gen->endpoints[i];
      printf("  %s(", ep->name);
      for (size_t k = 0; k < ep->nparams; k++) {
        if (k) printf(", ");
        print_param(&ep->params[k]);
      }
      printf(")  %s:%d ", ep->file, ep->line);
      for (size_t k = 0; k < ST__ENDPOINT_NOPTIONS; k++) {
        char v[256];
        printf(" %s=%s", st__endpoint_options[k].name,
               st__option_show(&st__endpoint_options[k], ep, v, sizeof v));
      }
      printf("\n");
    }
    printf("%zu endpoint%s, ", gen->nendpoints, gen->nendpoints == 1 ? "" : "s");
    st__generation_unref(gen);
  }
  printf("%d error%s\n", nerr, nerr == 1 ? "" : "s");
  return nerr ? 1 : 0;
}

/* --takeover: asks the server on this config's first socket to hand
 * over (takeover.h) and fills setup with what it handed; *channel is the
 * connection to answer it on. ST_OK, or an error printed. Main thread. */
static int take_over(const st__config_t *cfg, st__server_setup_t *setup, int *channel) {
  char path[200], err[1024];
  pid_t old = 0;
  int rc = st__socket_path(cfg->base_path, cfg->devices[0], path, sizeof path, err, sizeof err);
  if (rc == ST_OK)
    rc = st__takeover_request(path, channel, &setup->handed, &setup->nhanded, &old, err,
                              sizeof err);
  if (rc != ST_OK) {
    fprintf(stderr, "stserver: --takeover: %s\n", err);
    return rc;
  }
  ST_LOG_I("takeover", "pid %ld handed over %zu descriptors", (long)old, setup->nhanded);
  return ST_OK;
}

/* Config, flags, then --check or the server; returns the exit status.
 * Main thread. */
int st__server_main(const st__options_t *o) {
  st__config_t cfg;
  st__config_defaults(&cfg);
  int config_errors = 0;
  int endpoints_set = 0;   /* config.lua named the endpoints directory */
  /* Without --config: ./config.lua, else the installed one, else none. */
  char installed[PATH_MAX];
  const char *path = o->config ? o->config : DEFAULT_CONFIG;
  int use_config = 1;
  if (!o->config && access(DEFAULT_CONFIG, F_OK) != 0) {
    use_config = st__installed_config(installed, sizeof installed) == 0;
    path = installed;
  }
  if (use_config) {
    if (access(path, R_OK) != 0) {
      fprintf(stderr, "stserver: cannot read config file %s: %s\n", path, strerror(errno));
      st__config_free(&cfg);
      return 1;
    }
    char real[PATH_MAX];
    free(cfg.path);
    cfg.path = strdup(realpath(path, real) ? real : path);
    st__errlist_t errs = {0};
    uintptr_t default_endpoints = (uintptr_t)cfg.endpoints_dir;
    if (st__config_load(path, &cfg, &errs) != ST_OK) {
      print_errors(&errs);
      if (!errs.count) fprintf(stderr, "%s: invalid configuration\n", path);
      config_errors = errs.count ? (int)errs.count : 1;
      st__errlist_clear(&errs);
      if (!o->check) {
        fprintf(stderr, "stserver: not starting: the configuration has errors\n");
        st__config_free(&cfg);
        return 1;
      }
    }
    st__errlist_clear(&errs);
    endpoints_set = (uintptr_t)cfg.endpoints_dir != default_endpoints;
  }
  if (o->base_path) {
    free(cfg.base_path);
    cfg.base_path = strdup(o->base_path);
  }
  if (o->endpoints) {
    free(cfg.endpoints_dir);
    cfg.endpoints_dir = strdup(o->endpoints);
  }
  resolve_endpoints(&cfg, o->endpoints != NULL || endpoints_set);
  if (o->workers > 0) cfg.workers = o->workers;
  if (o->log_level >= 0) cfg.log_level = (st__log_level_t)o->log_level;
  st__log_set_level(cfg.log_level);
  char sockdir_why[1024];
  if (st__sockdir_choose(&cfg, sockdir_why, sizeof sockdir_why) != ST_OK) {
    fprintf(stderr, "stserver: out of memory\n");
    st__config_free(&cfg);
    return 1;
  }

  if (o->check) {
    if (sockdir_why[0]) printf("%s\n", sockdir_why);
    int rc = run_check(&cfg, config_errors);
    st__config_free(&cfg);
    return rc;
  }
  if (!use_config)
    ST_LOG_I("server", "no ./%s and no installed config: running on the built-in defaults",
             DEFAULT_CONFIG);
  if (sockdir_why[0]) ST_LOG_I("listen", "%s", sockdir_why);


  st__server_setup_t setup = {0};
  int channel = -1;
  if (o->takeover && take_over(&cfg, &setup, &channel) != ST_OK) {
    st__config_free(&cfg);
    return 1;
  }
  st__server_t srv;
  char err[1024] = "";
  setup.err = err;
  setup.errlen = sizeof err;
  int rc = st__server_start(&srv, &cfg, &setup);
  if (channel >= 0) st__takeover_answer(channel, rc == ST_OK, err[0] ? err : st_strerror(rc));
  for (size_t i = 0; i < setup.nhanded; i++)
    if (setup.handed[i].fd >= 0) close(setup.handed[i].fd);
  free(setup.handed);
  if (rc == ST_OK) st__server_run(&srv);
  st__server_destroy(&srv);
  st__config_free(&cfg);
  return rc == ST_OK ? 0 : 1;
}
