/* src/server: what the peer side of the server shares (peering.h). Loop
 * 0, the write side of the server lock. */
#include "server/peering.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto/viewspec.h"
#include "st/errors.h"
#include "xfer/supervisor.h"

const char *st__remote_engine_for(int src_cuda, int dst_cuda, int nccl_usable) {
  return src_cuda && dst_cuda && nccl_usable ? "nccl" : "ucx";
}

int st__remote_engine_fits(const char *engine, int cuda) {
  return !strcmp(engine, "ucx") || (cuda && !strcmp(engine, "nccl"));
}

void st__remote_ignore_reply(void *ud, const char *peer, int code, const char *message,
                             const msgpack_object *result) {
  (void)ud, (void)peer, (void)code, (void)message, (void)result;
}

void st__remote_reply_true(st__peer_t *p, st__peer_ticket_t ticket) {
  st__peer_reply(p, ticket, "\xc3", 1);   /* msgpack true */
}

void st__remote_reply_blob(st__peer_t *p, st__peer_ticket_t ticket, const uint8_t *blob,
                           size_t len) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__remote_pack_begin(&sb, &pk, 0);
  msgpack_pack_map(&pk, 1);
  st__pack_cstr(&pk, "blob");
  msgpack_pack_bin(&pk, len);
  msgpack_pack_bin_body(&pk, blob, len);
  st__peer_reply(p, ticket, sb.data, sb.size);
  msgpack_sbuffer_destroy(&sb);
}

int st__remote_answer_blob(const char *peer, const char *method, int code, const char *message,
                           const msgpack_object *result, const msgpack_object **blob, char *err,
                           size_t errlen) {
  if (code != ST_OK) {
    snprintf(err, errlen, "peer '%s': %s", peer, message ? message : st_strerror(code));
    return code;
  }
  *blob = result ? st__map_get(result, "blob") : NULL;
  if (!*blob || (*blob)->type != MSGPACK_OBJECT_BIN || (*blob)->via.bin.size > 65536) {
    snprintf(err, errlen, "peer '%s' answered %s without a blob", peer, method);
    return ST_ERR_PROTOCOL;
  }
  return ST_OK;
}

double st__remote_transfer_timeout(const st__server_t *srv) {
  double t = srv->cfg->peer.transfer_timeout_s;
  return t > 0 ? t : 600.0;
}

double st__remote_connect_timeout(const st__server_t *srv) {
  double t = srv->cfg->peer.connect_timeout_s;
  return t > 0 ? t : 10.0;
}

void st__remote_pack_begin(msgpack_sbuffer *sb, msgpack_packer *pk, int request) {
  msgpack_sbuffer_init(sb);
  msgpack_packer_init(pk, sb, msgpack_sbuffer_write);
  if (request) msgpack_pack_array(pk, 1);
}

int st__remote_peer_up(const st__server_t *srv, const char *peer, char *err, size_t errlen) {
  st__peer_state_t state = st__peer_state(srv->peer, peer);
  if (state == ST__PEER_UP) return ST_OK;
  const st__peer_conf_t *pc = &srv->cfg->peer;
  for (int i = 0; i < pc->npeers; i++)
    if (!strcmp(pc->peers[i].id, peer)) {
      snprintf(err, errlen, "peer '%s' is %s (stcli peers says why)", peer,
               st__peer_state_name(state));
      return ST_ERR_CAPABILITY;
    }
  snprintf(err, errlen, "'%s' is not a peer of this server (peer.peers)", peer);
  return ST_ERR_NOT_FOUND;
}

int st__remote_arena_fds(const st__build_result_t *res, int readonly, int *fds,
                         st__xfer_sup_arena_t *arenas, st__arena_desc_t *descs, char *err,
                         size_t errlen) {
  if (res->narenas > ST_MAX_FDS_PER_MESSAGE) {
    snprintf(err, errlen, "%zu arenas: at most %d move at once", res->narenas,
             ST_MAX_FDS_PER_MESSAGE);
    return ST_ERR_LIMIT;
  }
  for (size_t n = 0; n < res->narenas; n++) {
    st__arena_t *a = res->arenas[n];
    int cuda = st__arena_device(a) >= 0;
    fds[n] = cuda || !readonly ? st__arena_dup_fd(a, err, errlen)
                               : st__arena_dup_fd_readonly(a, err, errlen);
    if (fds[n] < 0) {
      int rc = fds[n];
      while (n-- > 0) close(fds[n]);
      return rc;
    }
    memset(&descs[n], 0, sizeof descs[n]);
    st__arena_describe(a, &descs[n]);
    arenas[n] = (st__xfer_sup_arena_t){.fd = fds[n], .bytes = st__arena_bytes(a), .cuda = cuda,
                                       .uuid = cuda ? descs[n].uuid : NULL};
  }
  return (int)res->narenas;
}

/* ------------------------------------------------------------- helpers */

int st__remote_exported(const st__peer_conf_t *pc, const char *name) {
  size_t len = strlen(name);
  for (int i = 0; i < pc->nexport; i++) {
    st__view_glob_t g;
    if (st__viewspec_glob_compile(pc->exports[i], &g) != ST_OK) continue;
    int hit = st__viewspec_glob_match(&g, name, len, NULL);
    st__viewspec_glob_free(&g);
    if (hit) return 1;
  }
  return 0;
}

int st__remote_param_str(const msgpack_object *params, const char *k, char *out, size_t cap) {
  const msgpack_object *o = params ? st__map_get(params, k) : NULL;
  return o && st__wire_cstr(o, out, cap) > 0;
}

int st__remote_param_u64(const msgpack_object *params, const char *k, uint64_t *out) {
  const msgpack_object *o = params ? st__map_get(params, k) : NULL;
  if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) return 0;
  *out = o->via.u64;
  return 1;
}

/* See remote.h. */
int st__remote_find_exported(st__server_t *srv, const char *name, uint64_t version, int live,
                             st__key_t **key, st__key_version_t **v, char *err, size_t errlen) {
  size_t len = strlen(name);
  const st__peer_conf_t *pc = &srv->cfg->peer;
  if (!st__remote_exported(pc, name)) {
    snprintf(err, errlen, "key '%s' is not exported to peers (peer.export of server '%s')", name,
             pc->id);
    return ST_ERR_AUTH;
  }
  st__who_t who = {.uid = geteuid(), .gid = getegid(), .admin = 1};
  char why[400];
  int rc = st__keys_get(&srv->keys, name, len, &who, version, key, v, why, sizeof why);
  if (rc != ST_OK) {
    snprintf(err, errlen, "server '%s': %s", pc->id, why);
    return rc;
  }
  if ((*key)->live && !live) {
    snprintf(err, errlen, "key '%s' is live (its bytes change in place): a pull copies a "
             "version that stays; pull it live to follow it", name);
    return ST_ERR_INVALID_ARGUMENT;
  }
  return ST_OK;
}


int st__remote_ask_send(st__server_t *srv, const char *peer, const char *key, uint64_t version,
                        uint64_t xfer_id, const char *engine, int live, const uint8_t *blob,
                        size_t len, st__peer_reply_fn cb, void *ud, uint64_t *req, char *err,
                        size_t errlen) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__remote_pack_begin(&sb, &pk, 1);
  msgpack_pack_map(&pk, live ? 6 : 5);
  st__pack_kv_str(&pk, "key", key);
  st__pack_kv_uint(&pk, "version", version);
  st__pack_kv_uint(&pk, "xfer", xfer_id);
  st__pack_kv_str(&pk, "engine", engine);
  if (live) st__pack_kv_bool(&pk, "live", 1);
  st__pack_cstr(&pk, "blob");
  msgpack_pack_bin(&pk, len);
  msgpack_pack_bin_body(&pk, blob, len);
  int rc = st__peer_request(srv->peer, peer, "peer_xfer_open", sb.data, sb.size,
                            st__remote_connect_timeout(srv), cb, ud, req, err, errlen);
  msgpack_sbuffer_destroy(&sb);
  return rc;
}

int st__remote_start_receive(st__server_t *srv, const char *peer, int code, const char *message,
                             const msgpack_object *result, uint64_t xfer,
                             const st__build_result_t *res, void (*at_start)(void *ud), void *ud,
                             char *err, size_t errlen) {
  const msgpack_object *blob = NULL;
  int rc = st__remote_answer_blob(peer, "peer_xfer_open", code, message, result, &blob, err,
                                  errlen);
  if (rc != ST_OK) return rc;
  int fds[ST_MAX_FDS_PER_MESSAGE];
  st__xfer_sup_arena_t arenas[ST_MAX_FDS_PER_MESSAGE];
  st__arena_desc_t descs[ST_MAX_FDS_PER_MESSAGE];
  int n = st__remote_arena_fds(res, 0, fds, arenas, descs, err, errlen);
  if (n < 0) return n;
  if (at_start) at_start(ud);
  rc = st__xfer_sup_start(srv->remote->sup, xfer, (const uint8_t *)blob->via.bin.ptr,
                              blob->via.bin.size, arenas, (size_t)n, err, errlen);
  for (int i = 0; i < n; i++) close(fds[i]);
  return rc;
}
