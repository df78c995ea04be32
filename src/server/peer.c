/* src/server: who may use the server (SO_PEERCRED admission).
 *
 * The check runs on accept, before a byte is read: a refused peer never
 * reaches the frame reader, so nothing it sends is ever parsed. Since
 * memory travels as descriptors, admission is the access control: a process
 * that is not admitted can never receive (and so never map) an arena.
 */
#include <errno.h>
#include <msgpack.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto/proto.h"
#include "server/server.h"

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59   /* Linux 4.13 */
#endif

static int gid_allowed(const st__config_t *cfg, gid_t gid) {
  for (int i = 0; i < cfg->nallow_gids; i++)
    if (cfg->allow_gids[i] == gid) return 1;
  return 0;
}

/* Nonzero when one of the peer's supplementary groups is allowed. A
 * kernel without SO_PEERGROUPS admits by the primary gid alone. */
static int supplementary_allowed(const st__config_t *cfg, int fd) {
  gid_t some[64], *gids = some;
  socklen_t len = sizeof some;
  int rc = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, gids, &len);
  if (rc != 0 && errno == ERANGE && len > sizeof some) {
    gids = malloc(len);
    rc = gids ? getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, gids, &len) : -1;
  }
  int ok = 0;
  for (size_t i = 0; rc == 0 && !ok && i < len / sizeof *gids; i++) ok = gid_allowed(cfg, gids[i]);
  if (gids != some) free(gids);
  return ok;
}

/* Nonzero if the peer may use the server; see server.h. Loop thread. */
int st__peer_admitted(const st__config_t *cfg, int fd, const struct ucred *cred) {
  if (cred->uid == 0 || cred->uid == geteuid()) return 1;
  for (int i = 0; i < cfg->nallow_uids; i++)
    if (cfg->allow_uids[i] == cred->uid) return 1;
  if (gid_allowed(cfg, cred->gid)) return 1;
  return cfg->nallow_gids > 0 && supplementary_allowed(cfg, fd);
}

/* Sends one error response (id 0) and closes fd (owned). Loop thread. */
void st__peer_refuse(int fd, int err, const char *message) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  st__pack_error_response(&pk, 0, err, message);
  /* A fresh socket's buffer takes a small frame whole; if it does not, the
   * peer gets the close alone, which tells it the same. */
  ssize_t n;
  do {
    n = send(fd, sb.data, sb.size, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  msgpack_sbuffer_destroy(&sb);
  /* We never read from this peer. The error stays readable before the
   * end-of-file on the peer's side, whatever it sent meanwhile. */
  shutdown(fd, SHUT_RDWR);
  close(fd);
}
