/* src/embed: declarations shared by the files of libstembed only.
 *
 * Files:
 *   config.c   st_embed_options_t -> st__config_t (both entry points)
 *   embed.c    st_embed_start/stop: the server on a background thread,
 *              its private socket directory, the atexit stop
 *   serve.c    st_embed_serve: the server in the foreground
 */
#ifndef ST_EMBED_INT_H
#define ST_EMBED_INT_H

#include <stddef.h>

#include "server/config.h"
#include "st/embed.h"

/* Fills *cfg from opts: the built-in defaults, then opts->config (when
 * set), then the options. `private_base` (st_embed_start's socket base in
 * its own directory) replaces every other base path when not NULL; it
 * also makes the log level "warn" unless opts->log_level names one (the
 * config file's log_level is for st_embed_serve). Without a config file
 * the data directories are the endpoints' own directory. ST_OK, or an
 * error with the reason in err (*cfg is then freed). The strings of *cfg
 * are owned by it (st__config_free). Any thread. */
int st__embed_config(const st_embed_options_t *opts, const char *private_base,
                     st__config_t *cfg, char *err, size_t errlen);

#endif
