/* src/server: configuration defaults (config.h). st__config_load, which
 * runs config.lua, lives in src/lua; flags are applied by the startup code. */
#include "server/config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "st/wire.h"

/* Fills every field of *c with its default. Any previous content is
 * overwritten, not freed (call st__config_free first when reusing).
 * The strings are owned by *c. Loop thread, at start. */
void st__config_defaults(st__config_t *c) {
  memset(c, 0, sizeof *c);
  c->path = strdup("");
  const char *env = getenv(ST_ENV_BASE_PATH);
  c->base_path = strdup(env && env[0] ? env : ST_DEFAULT_BASE_PATH);
  c->ndevices = 1;
  c->devices[0] = 0;
  c->workers = 4;
  c->endpoints_dir = strdup("endpoints");
  c->log_level = ST_LOG_INFO;
  c->socket_mode = 0600;
  c->socket_group = NULL;
  c->max_message_bytes = ST_DEFAULT_MAX_MESSAGE_BYTES;
  c->max_connections = ST_DEFAULT_MAX_CONNECTIONS;
  c->max_inflight = ST_DEFAULT_MAX_INFLIGHT;
  c->frame_timeout_ms = ST_DEFAULT_FRAME_TIMEOUT_MS;
  c->max_object_bytes = ST_DEFAULT_MAX_OBJECT_BYTES;
  c->shutdown_grace_s = 10.0;
  c->task_ttl_s = 600.0;
  c->task_capacity = 10000;
  c->nbudgets = 1;
  snprintf(c->budgets[0].device, sizeof c->budgets[0].device, "cpu");
  c->budgets[0].bytes = st__config_default_cpu_budget();
  c->default_device = strdup("socket");
  c->ndata_dirs = 1;
  c->data_dirs[0] = strdup(".");
  c->loader_threads = 4;
  c->staging_bytes = 256ull << 20;
}

/* Half of the physical memory; 0 (no budget) when sysconf cannot tell. */
uint64_t st__config_default_cpu_budget(void) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return (uint64_t)pages * (uint64_t)page / 2;
}

/* Sets or adds one budget entry. Loop thread, at start. */
int st__config_set_budget(st__config_t *c, const char *device, uint64_t bytes) {
  for (int i = 0; i < c->nbudgets; i++) {
    if (strcmp(c->budgets[i].device, device) == 0) {
      c->budgets[i].bytes = bytes;
      return 0;
    }
  }
  if (c->nbudgets == ST_MAX_BUDGETS) return -1;
  snprintf(c->budgets[c->nbudgets].device, sizeof c->budgets[0].device, "%s", device);
  c->budgets[c->nbudgets].bytes = bytes;
  c->nbudgets++;
  return 0;
}

/* Frees the strings of *c and clears it. Safe on a zeroed struct. */
void st__config_free(st__config_t *c) {
  free(c->path);
  free(c->base_path);
  free(c->endpoints_dir);
  free(c->socket_group);
  free(c->default_device);
  for (int i = 0; i < c->ndata_dirs; i++) free(c->data_dirs[i]);
  memset(c, 0, sizeof *c);
}

/* "error" | "warn" | "info" | "debug" (also "warning"), or -1. */
int st__log_level_parse(const char *s) {
  if (!s) return -1;
  if (strcmp(s, "error") == 0) return ST_LOG_ERROR;
  if (strcmp(s, "warn") == 0 || strcmp(s, "warning") == 0) return ST_LOG_WARN;
  if (strcmp(s, "info") == 0) return ST_LOG_INFO;
  if (strcmp(s, "debug") == 0) return ST_LOG_DEBUG;
  return -1;
}
