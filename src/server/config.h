/* src/server: the server's configuration (config.lua, docs/operations.md).
 * Plain data, filled by st__config_defaults, then st__config_load (src/lua),
 * then command-line flags. Owned by main(); read-only once the loop runs.
 */
#ifndef ST_SERVER_CONFIG_H
#define ST_SERVER_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define ST_MAX_DEVICES 16
#define ST_MAX_ALLOW   64

typedef enum { ST_LOG_ERROR = 0, ST_LOG_WARN, ST_LOG_INFO, ST_LOG_DEBUG } st__log_level_t;

typedef struct st__config {
  char *path;                   /* owned: the config file ("" if none)      */
  char *base_path;              /* owned                                    */
  int ndevices;
  int devices[ST_MAX_DEVICES];  /* socket indices served                    */
  int workers;                  /* worker threads                           */
  char *endpoints_dir;          /* owned; relative paths are resolved
                                   against the config file's directory     */
  st__log_level_t log_level;
  unsigned socket_mode;         /* default 0600                             */
  char *socket_group;           /* owned, may be NULL: group of the socket  */
  int nallow_uids;
  uid_t allow_uids[ST_MAX_ALLOW];
  int nallow_gids;
  gid_t allow_gids[ST_MAX_ALLOW];
  /* limits */
  size_t max_message_bytes;
  int max_connections;
  int max_inflight;
  int frame_timeout_ms;
  uint64_t max_object_bytes;
  double shutdown_grace_s;      /* in-flight work gets this long on SIGTERM */
} st__config_t;

/* Fills every field with its default (ST_DEFAULT_* of include/st/wire.h,
 * workers = 4, endpoints "endpoints", log "info", base path from
 * $SHARED_TENSOR_BASE_PATH or ST_DEFAULT_BASE_PATH, devices {0}). */
void st__config_defaults(st__config_t *c);
void st__config_free(st__config_t *c);

/* Parses "error" | "warn" | "info" | "debug"; -1 if unknown. */
int st__log_level_parse(const char *s);

#endif
