/* src/embed: the configuration of an embedded server (embed_int.h).
 * Precedence, as for stserver: options > config file > environment
 * (SHARED_TENSOR_BASE_PATH) > built-in defaults (a base path left unset
 * is chosen by st_embed_serve: server/sockdir.c). Unlike stserver, no
 * ./config.lua is read unless opts->config names it: a script's server
 * must not change with the directory it is started from. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "embed/embed_int.h"
#include "server/config.h"
#include "st/errors.h"

/* The directory of an endpoint file, or the directory itself; owned. */
static char *endpoints_home(const char *endpoints) {
  struct stat st;
  if (stat(endpoints, &st) == 0 && S_ISDIR(st.st_mode)) return strdup(endpoints);
  const char *slash = strrchr(endpoints, '/');
  if (!slash) return strdup(".");
  if (slash == endpoints) return strdup("/");
  return strndup(endpoints, (size_t)(slash - endpoints));
}

static int replace(char **field, const char *value) {
  char *copy = strdup(value);
  if (!copy) return 0;
  free(*field);
  *field = copy;
  return 1;
}

/* See embed_int.h. Any thread. */
int st__embed_config(const st_embed_options_t *o, const char *private_base, st__config_t *cfg,
                     char *err, size_t errlen) {
  st__config_defaults(cfg);
  int rc = ST_ERR_INVALID_ARGUMENT;
  if (!o || !o->endpoints || !o->endpoints[0]) {
    snprintf(err, errlen, "options: endpoints (a .lua file or a directory) is required");
    goto fail;
  }
  if (o->device < -1 || o->device > 4095) {
    snprintf(err, errlen, "options: device must be a socket index from 0 to 4095, or -1");
    goto fail;
  }
  if (o->workers < 0 || o->workers > ST__CONFIG_MAX_WORKERS) {
    snprintf(err, errlen, "options: workers must be from 1 to %d, or 0 for the config's",
             ST__CONFIG_MAX_WORKERS);
    goto fail;
  }
  int level = -1;
  if (o->log_level && (level = st__log_level_parse(o->log_level)) < 0) {
    snprintf(err, errlen, "options: log_level must be error, warn, info or debug, not '%s'",
             o->log_level);
    goto fail;
  }
  if (o->config) {
    st__errlist_t errs = {0};
    if (!replace(&cfg->path, o->config)) goto oom;
    if (st__config_load(o->config, cfg, &errs) != ST_OK) {
      char *joined = st__errlist_join(&errs);
      snprintf(err, errlen, "%s", joined ? joined : "invalid configuration");
      free(joined);
      st__errlist_clear(&errs);
      rc = ST_ERR_CONFIGURATION;
      goto fail;
    }
    st__errlist_clear(&errs);
  } else {
    char *home = endpoints_home(o->endpoints);
    if (!home) goto oom;
    free(cfg->data_dirs[0]);
    cfg->data_dirs[0] = home;
  }
  /* The options name the endpoints relative to the working directory, as
   * stserver's --endpoints flag does. */
  if (!replace(&cfg->endpoints_dir, o->endpoints)) goto oom;
  if (private_base) {
    if (!replace(&cfg->base_path, private_base)) goto oom;
  } else if (o->base_path && o->base_path[0]) {
    if (!replace(&cfg->base_path, o->base_path)) goto oom;
  }
  if (o->device >= 0) {
    cfg->ndevices = 1;
    cfg->devices[0] = o->device;
  }
  if (o->workers > 0) cfg->workers = o->workers;
  if (level >= 0) cfg->log_level = (st__log_level_t)level;
  else if (private_base) cfg->log_level = ST_LOG_WARN;
  return ST_OK;

oom:
  snprintf(err, errlen, "out of memory");
  rc = ST_ERR_OUT_OF_MEMORY;
fail:
  st__config_free(cfg);
  return rc;
}
