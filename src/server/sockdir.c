/* src/server: the socket base when none is configured: the first entry of
 * the default list (common/sockdir.h) that this process can use. Nothing
 * is created here; st__listen_open makes the directory and checks it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/sockdir.h"
#include "server/server.h"
#include "st/errors.h"

/* Can this process use entry e? 1, or 0 with the reason in why. */
static int usable(const st__sockdir_t *e, char *why, size_t whylen) {
  struct stat st;
  uid_t me = geteuid();
  if (e->kind == ST__SOCKDIR_XDG) {
    /* The XDG Base Directory rule: the user's own, made by the login. */
    if (stat(e->parent, &st) != 0) {
      snprintf(why, whylen, "XDG_RUNTIME_DIR %s: %s", e->parent, strerror(errno));
      return 0;
    }
    if (!S_ISDIR(st.st_mode) || st.st_uid != me || access(e->parent, W_OK | X_OK) != 0) {
      snprintf(why, whylen, "XDG_RUNTIME_DIR %s is not a directory of uid %u that it can write",
               e->parent, (unsigned)me);
      return 0;
    }
    return 1;
  }
  if (e->kind == ST__SOCKDIR_RUN) {
    /* An existing directory is taken whoever owns it: st__listen_open
     * refuses one that is not ours, rather than serve from elsewhere
     * while clients look here first. */
    if (lstat(e->dir, &st) == 0 || access(e->parent, W_OK | X_OK) == 0) return 1;
    if (errno == ENOENT) {
      snprintf(why, whylen, "%s does not exist (nor does %s)", e->dir, e->parent);
      return 0;
    }
    snprintf(why, whylen,
             "%s does not exist and uid %u cannot make it in %s (root can; so can systemd's "
             "RuntimeDirectory=sharedtensor)",
             e->dir, (unsigned)me, e->parent);
    return 0;
  }
  return 1;
}

/* See server.h. */
int st__sockdir_choose(st__config_t *cfg, char *why, size_t whylen) {
  if (whylen) why[0] = '\0';
  if (cfg->base_path) return ST_OK;
  st__sockdir_t list[ST__SOCKDIR_MAX];
  int n = st__sockdir_list(list);
  char passed[768] = "";
  if (list[0].kind != ST__SOCKDIR_XDG)
    snprintf(passed, sizeof passed, "; passed over: XDG_RUNTIME_DIR is not set to an absolute path");
  for (int i = 0; i < n; i++) {
    char reason[320];
    if (!usable(&list[i], reason, sizeof reason)) {
      size_t k = strlen(passed);
      snprintf(passed + k, sizeof passed - k, "%s%s", k ? "; " : "; passed over: ", reason);
      continue;
    }
    cfg->base_path = strdup(list[i].base);
    if (!cfg->base_path) return ST_ERR_OUT_OF_MEMORY;
    snprintf(why, whylen, "socket base %s (the default; %s)%s", list[i].base,
             st__sockdir_kind_name(list[i].kind), passed);
    return ST_OK;
  }
  return ST_ERR_INTERNAL; /* unreachable: the last entry is always usable */
}
