/* src/server: where an installed stserver finds its default config.
 *
 * `cmake --install` (and the Debian package) put the binary in
 * <prefix>/bin and the config in <sysconfdir>/sharedtensor/config.lua with
 * the endpoints beside it, where <sysconfdir> follows GNUInstallDirs:
 * /etc for the prefix /usr, <prefix>/etc otherwise. The prefix is found
 * from the running binary (/proc/self/exe), so an installed tree can be
 * moved and a build tree (build/bin/stserver) finds nothing.
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "server/server.h"

int st__installed_config(char *out, size_t cap) {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return -1;
  exe[n] = '\0';
  char *slash = strrchr(exe, '/');            /* <prefix>/bin/stserver */
  if (!slash) return -1;
  *slash = '\0';
  slash = strrchr(exe, '/');
  if (!slash || strcmp(slash, "/bin") != 0) return -1;
  *slash = '\0';                               /* <prefix> ("" for /bin) */
  const char *prefix = exe;
  int w = strcmp(prefix, "/usr") == 0 || prefix[0] == '\0'
              ? snprintf(out, cap, "/etc/sharedtensor/config.lua")
              : snprintf(out, cap, "%s/etc/sharedtensor/config.lua", prefix);
  if (w < 0 || (size_t)w >= cap) return -1;
  return access(out, R_OK) == 0 ? 0 : -1;
}
