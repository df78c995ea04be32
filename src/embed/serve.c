/* src/embed: st_embed_serve, the server in the foreground of its host
 * (st/embed.h). The same start, loop and shutdown as stserver's main
 * (server/startup.c), on libev's default loop with the signal watchers:
 * a zero-branch script in the server role becomes a server process as
 * stserver is one, pid and signals included. */
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "embed/embed_int.h"
#include "server/server.h"

/* See st/embed.h. Main thread of a process that only serves. */
ST_API int st_embed_serve(const st_embed_options_t *opts, char *err, size_t errlen) {
  char dummy[1];
  if (!err || !errlen) {
    err = dummy;
    errlen = sizeof dummy;
  }
  err[0] = '\0';
  st__config_t cfg;
  int rc = st__embed_config(opts, NULL, &cfg, err, errlen);
  if (rc != ST_OK) {
    ST_LOG_E("server", "not starting:");
    for (const char *p = err; *p;) {          /* one log line per problem */
      const char *nl = strchr(p, '\n');
      int len = nl ? (int)(nl - p) : (int)strlen(p);
      st__log_all(ST_LOG_ERROR, "server", "%.*s", len, p);
      p += len + (nl ? 1 : 0);
    }
    return rc;
  }
  st__log_set_level(cfg.log_level);
  char why[1024];
  if (st__sockdir_choose(&cfg, why, sizeof why) != ST_OK) {
    snprintf(err, errlen, "out of memory");
    st__config_free(&cfg);
    return ST_ERR_OUT_OF_MEMORY;
  }
  if (why[0]) ST_LOG_I("listen", "%s", why);
  st__server_t srv;
  st__server_setup_t setup = {.loop = NULL, .no_signals = 0, .err = err, .errlen = errlen};
  rc = st__server_start(&srv, &cfg, &setup);
  if (rc == ST_OK) st__server_run(&srv);
  st__server_destroy(&srv);
  st__config_free(&cfg);
  return rc;
}
