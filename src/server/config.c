/* src/server: configuration defaults (config.h). st__config_load, which
 * runs config.lua, lives in src/lua; flags are applied by the startup code. */
#include "server/config.h"

#include <stdlib.h>
#include <string.h>

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
}

/* Frees the strings of *c and clears it. Safe on a zeroed struct. */
void st__config_free(st__config_t *c) {
  free(c->path);
  free(c->base_path);
  free(c->endpoints_dir);
  free(c->socket_group);
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
