/* src/peer/conf.c: the peer table's checks (peer.h: st__peer_configured,
 * st__peer_check) and the ids and addresses in it (channel_int.h). No
 * state: any thread. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "peer/channel_int.h"
#include "st/errors.h"

/* Ids: 1..255 of [A-Za-z0-9._-] (a host name fits). */
int st__peer_id_ok(const char *id) {
  size_t n = strlen(id);
  if (n == 0 || n > ST__PEER_ID_MAX) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = id[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
          c == '.' || c == '_' || c == '-'))
      return 0;
  }
  return 1;
}

/* "host:port" or "[v6]:port" into host and port. 0, or -1 with err. */
int st__peer_split_addr(const char *key, const char *addr, char *host, size_t hostlen,
                        char *port, size_t portlen, int allow_zero, char *err, size_t errlen) {
  const char *colon;
  if (addr[0] == '[') {
    const char *close = strchr(addr, ']');
    if (!close || close[1] != ':') goto bad;
    if ((size_t)(close - addr - 1) >= hostlen) goto bad;
    snprintf(host, hostlen, "%.*s", (int)(close - addr - 1), addr + 1);
    colon = close + 1;
  } else {
    colon = strrchr(addr, ':');
    if (!colon || colon == addr || (size_t)(colon - addr) >= hostlen) goto bad;
    if (memchr(addr, ':', (size_t)(colon - addr))) goto bad;   /* bare v6 */
    snprintf(host, hostlen, "%.*s", (int)(colon - addr), addr);
  }
  char *end;
  errno = 0;
  long p = strtol(colon + 1, &end, 10);
  if (!colon[1] || *end || errno || p < (allow_zero ? 0 : 1) || p > 65535) goto bad;
  snprintf(port, portlen, "%ld", p);
  return 0;
bad:
  snprintf(err, errlen, "%s: expected \"host:port\" (a port in %d..65535; an IPv6 address in "
           "brackets, \"[::1]:7070\"), got \"%s\"", key, allow_zero ? 0 : 1, addr);
  return -1;
}

/* ------------------------------------------------------------- config */

/* See peer.h. */
int st__peer_configured(const st__peer_conf_t *conf) {
  return conf->listen || conf->npeers > 0;
}

/* See peer.h. */
int st__peer_check(const st__peer_conf_t *conf, uid_t owner, char *err, size_t errlen) {
  char host[256], port[16];
  if (!conf->id || !st__peer_id_ok(conf->id)) {
    snprintf(err, errlen, "peer.id: \"%s\" is not a valid id (1 to %d characters of A-Z a-z 0-9 "
             ". _ -)", conf->id ? conf->id : "", ST__PEER_ID_MAX);
    return ST_ERR_CONFIGURATION;
  }
  if (conf->listen &&
      st__peer_split_addr("peer.listen", conf->listen, host, sizeof host, port, sizeof port, 1,
                          err, errlen) != 0)
    return ST_ERR_CONFIGURATION;
  for (int i = 0; i < conf->npeers; i++) {
    const st__peer_entry_t *e = &conf->peers[i];
    char key[300];
    snprintf(key, sizeof key, "peer.peers.%s", e->id);
    if (!st__peer_id_ok(e->id)) {
      snprintf(err, errlen, "%s: not a valid peer id (1 to %d characters of A-Z a-z 0-9 . _ -)",
               key, ST__PEER_ID_MAX);
      return ST_ERR_CONFIGURATION;
    }
    if (strcmp(e->id, conf->id) == 0) {
      snprintf(err, errlen, "%s: that is this server's own id (peer.id)", key);
      return ST_ERR_CONFIGURATION;
    }
    if (e->addr &&
        st__peer_split_addr(key, e->addr, host, sizeof host, port, sizeof port, 0, err,
                            errlen) != 0)
      return ST_ERR_CONFIGURATION;
  }
  if (!st__peer_configured(conf)) return ST_OK;   /* nothing opens */
  if (!conf->secret && !conf->tls_cert && !conf->tls_key && !conf->tls_ca) {
    snprintf(err, errlen, "%s needs peer.secret or peer.tls",
             conf->listen ? "peer.listen" : "peer.peers");
    return ST_ERR_CONFIGURATION;
  }
  st__tls_conf_t tc = {.secret = conf->secret, .cert = conf->tls_cert, .key = conf->tls_key,
                       .ca = conf->tls_ca, .owner = owner};
  st__tls_ctx_t *ctx = NULL;
  int rc = st__tls_ctx_new(&tc, &ctx, err, errlen);
  st__tls_ctx_free(ctx);
  return rc;
}

