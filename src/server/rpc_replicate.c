/* src/server: `replicate`, a push of a key to peers (remote.h;
 * docs/multihost.md, "Pushing a key"; docs/protocol.md, "replicate").
 *
 * A push is a pull the receiver makes, so that the receiver decides (its
 * budget, its names, its uid) and one code path moves the bytes: the
 * pushing server asks each peer with peer_pull {key, version, as,
 * replicate}; the peer starts a pull from it under the uid its config
 * names for the pusher (peer.peers[id].as_uid; none: refused) and
 * answers when that pull ends. The pushing side's task ends when every
 * peer answered: completed when all of them hold the version, else
 * failed naming each peer's outcome. A cancel tells every peer
 * (peer_pull_cancel). Loop 0, the write side of the server lock.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "engine/keys.h"
#include "peer/peer.h"
#include "server/rpc.h"
#include "server/rpc_pull.h"
#include "server/rpc_replicate.h"
#include "server/work.h"
#include "st/errors.h"

/* Peers one replicate reaches at most. */
#define MAX_TARGETS ST__PEER_MAX_PEERS

typedef struct target {
  char id[ST__PEER_ID_MAX + 1];
  uint64_t req;               /* the peer_pull in flight (0: answered) */
  int answered, ok, code;
  uint64_t version;           /* the receiver's version */
  char error[400];
} target_t;

typedef struct push {
  st__server_t *srv;
  st__task_t *task;
  char key[ST__KEY_NAME_MAX + 1], as[ST__KEY_NAME_MAX + 1];
  uint64_t version;
  size_t n, left;
  target_t t[MAX_TARGETS];
} push_t;

/* Ends the replicate task (every target answered, or a cancel). */
static void push_end(push_t *x, int cancelled) {
  st__server_t *srv = x->srv;
  x->task->cancel = NULL;
  x->task->op = NULL;
  if (cancelled) {
    st__task_finish_error(srv, x->task, ST_ERR_CANCELLED, NULL);
    free(x);
    return;
  }
  size_t failed = 0;
  for (size_t i = 0; i < x->n; i++) failed += !x->t[i].ok;
  if (failed) {
    char m[2000];
    size_t used = (size_t)snprintf(m, sizeof m, "replicate: %zu of %zu peers failed:", failed, x->n);
    for (size_t i = 0; i < x->n && used < sizeof m; i++)
      used += (size_t)snprintf(m + used, sizeof m - used, " %s: %s;", x->t[i].id,
                               x->t[i].ok ? "ok" : x->t[i].error);
    int code = ST_ERR_IO;
    for (size_t i = x->n; i-- > 0;)
      if (!x->t[i].ok) code = x->t[i].code;   /* the first failure's */
    st__task_finish_error(srv, x->task, code, m);
    free(x);
    return;
  }
  st__build_result_t out;
  st__build_result_init(&out);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &out.value, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 3);
  st__pack_kv_str(&pk, "key", x->key);
  st__pack_kv_uint(&pk, "version", x->version);
  st__pack_cstr(&pk, "peers");
  msgpack_pack_map(&pk, x->n);
  for (size_t i = 0; i < x->n; i++) {
    st__pack_cstr(&pk, x->t[i].id);
    msgpack_pack_map(&pk, 2);
    st__pack_kv_bool(&pk, "ok", 1);
    st__pack_kv_uint(&pk, "version", x->t[i].version);
  }
  st__task_finish_plain(srv, x->task, &out);
  free(x);
}

static void answered(void *ud, const char *peer, int code, const char *message,
                     const msgpack_object *result) {
  push_t *x = ud;
  target_t *t = NULL;
  for (size_t i = 0; i < x->n && !t; i++)
    if (!strcmp(x->t[i].id, peer) && !x->t[i].answered) t = &x->t[i];
  if (!t) return;
  t->answered = 1;
  t->req = 0;
  t->code = code;
  if (code == ST_OK) {
    const msgpack_object *v = result ? st__map_get(result, "version") : NULL;
    t->ok = v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER;
    t->version = t->ok ? v->via.u64 : 0;
    if (!t->ok) {
      t->code = ST_ERR_PROTOCOL;
      snprintf(t->error, sizeof t->error, "its answer named no version");
    }
  } else {
    snprintf(t->error, sizeof t->error, "%s", message ? message : st_strerror(code));
  }
  char note[96];
  int len = snprintf(note, sizeof note, "%zu of %zu peers answered", x->n - x->left + 1, x->n);
  st__progress_set(&x->task->progress, (double)(x->n - x->left + 1) / (double)x->n, note,
                   len > 0 ? (size_t)len : 0);
  if (--x->left == 0) push_end(x, 0);
}

static void cancel_sent(void *ud, const char *peer, int code, const char *message,
                        const msgpack_object *result) {
  (void)ud, (void)peer, (void)code, (void)message, (void)result;
}

static void on_cancel(st__server_t *srv, st__task_t *task) {
  push_t *x = task->op;
  if (!x) return;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__remote_pack_begin(&sb, &pk, 1);
  msgpack_pack_map(&pk, 1);
  st__pack_kv_uint(&pk, "replicate", task->id);
  for (size_t i = 0; i < x->n; i++) {
    if (x->t[i].answered) continue;
    st__peer_cancel(srv->peer, x->t[i].req);
    st__peer_request(srv->peer, x->t[i].id, "peer_pull_cancel", sb.data, sb.size, 10.0,
                     cancel_sent, NULL, NULL, NULL, 0);
  }
  msgpack_sbuffer_destroy(&sb);
  push_end(x, 1);
}

/* replicate {key, to: [peer], version?, as?} -> {task_id}; the task's
 * result: {key, version, peers: {id: {ok, version}}}. The caller must
 * see the key (its publisher, a reader it granted, an admin), and the key
 * must be exported (peer.export): a push is a peer's pull. */
void st__rpc_replicate(st__rpc_req_t *r) {
  st__server_t *srv = r->c->srv;
  const msgpack_object *key = st__rpc_arg(r, "key"), *to = st__rpc_arg(r, "to");
  const msgpack_object *as = st__rpc_arg(r, "as");
  if (!srv->peer) {
    st__rpc_error(r, ST_ERR_CAPABILITY, "replicate: this server has no peers (config.lua: peer "
                  "= { ... }; docs/multihost.md)");
    return;
  }
  push_t *x = calloc(1, sizeof *x);
  if (!x) {
    st__rpc_error(r, ST_ERR_OUT_OF_MEMORY, "replicate: out of memory");
    return;
  }
  x->srv = srv;
  char err[700];
  if (st__wire_cstr(key, x->key, sizeof x->key) <= 0 ||
      (as && st__wire_cstr(as, x->as, sizeof x->as) <= 0)) {
    free(x);
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "replicate: key and as must be key names");
    return;
  }
  if (!as) snprintf(x->as, sizeof x->as, "%s", x->key);
  if (to->type != MSGPACK_OBJECT_ARRAY || to->via.array.size == 0 ||
      to->via.array.size > MAX_TARGETS) {
    free(x);
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "replicate: to must list 1 to %d peer ids",
                  MAX_TARGETS);
    return;
  }
  for (uint32_t i = 0; i < to->via.array.size; i++) {
    target_t *t = &x->t[x->n];
    if (st__wire_cstr(&to->via.array.ptr[i], t->id, sizeof t->id) <= 0) {
      free(x);
      st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "replicate: to[%u] is not a peer id", i);
      return;
    }
    int twice = 0;
    for (size_t k = 0; k < x->n; k++) twice |= !strcmp(x->t[k].id, t->id);
    if (twice) continue;
    int up = st__remote_peer_up(srv, t->id, err, sizeof err);
    if (up != ST_OK) {
      st__rpc_error(r, up, "replicate: %s", err);
      free(x);
      return;
    }
    x->n++;
  }
  /* The caller must see the version it pushes; which one is fixed now. */
  st__who_t who;
  st__rpc_who(r, &who);
  st__key_t *k;
  st__key_version_t *v;
  if (st__keys_get(&srv->keys, x->key, strlen(x->key), &who, st__rpc_u64(r, "version", 0), &k, &v,
                   err, sizeof err) != ST_OK) {
    free(x);
    st__rpc_error(r, ST_ERR_NOT_FOUND, "replicate: %s", err);
    return;
  }
  x->version = st__keys_version_of(k, v);
  int code;
  x->task = st__task_new(srv, "replicate", r->c->cred.uid, err, sizeof err, &code);
  if (!x->task) {
    free(x);
    st__rpc_error(r, code, "replicate: %s", err);
    return;
  }
  uint64_t id = x->task->id;
  x->task->cancel = on_cancel;
  x->task->op = x;
  st__task_started(srv, x->task, st__now_unix());
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__remote_pack_begin(&sb, &pk, 1);
  msgpack_pack_map(&pk, 4);
  st__pack_kv_str(&pk, "key", x->key);
  st__pack_kv_uint(&pk, "version", x->version);
  st__pack_kv_str(&pk, "as", x->as);
  st__pack_kv_uint(&pk, "replicate", id);
  /* Each peer answers when its pull ends: the transfer's limit and a
   * margin for the describe and the allocation. */
  double timeout = st__remote_transfer_timeout(srv) + 60.0;
  x->left = x->n;
  size_t n = x->n;
  for (size_t i = 0; i < n; i++) {
    target_t *t = &x->t[i];
    char why[400];
    if (st__peer_request(srv->peer, t->id, "peer_pull", sb.data, sb.size, timeout, answered, x,
                         &t->req, why, sizeof why) != ST_OK) {
      t->answered = 1;
      t->code = ST_ERR_CAPABILITY;
      snprintf(t->error, sizeof t->error, "%s", why);
      if (--x->left == 0) push_end(x, 0);   /* x is gone: every one failed at once */
    }
  }
  msgpack_sbuffer_destroy(&sb);
  msgpack_sbuffer reply;
  st__reply_begin(&reply, &pk, r->id);
  msgpack_pack_map(&pk, 1);
  st__pack_kv_uint(&pk, "task_id", id);
  st__reply_send(r->c, r->id, &reply);
}

/* ------------------------------------------------------------- the receiver */

/* peer_pull {key, version, as, replicate} -> {key, version} once the pull
 * it starts here ended (an error when it failed): the pusher's push,
 * under the uid this server's config names for it. */
static void on_peer_pull(st__peer_t *p, const st__peer_req_t *req, void *ud) {
  st__server_t *srv = ud;
  const st__peer_conf_t *pc = &srv->cfg->peer;
  char key[ST__KEY_NAME_MAX + 1], as[ST__KEY_NAME_MAX + 1], err[700];
  uint64_t version = 0, push = 0;
  st__remote_param_u64(req->params, "version", &version);
  st__remote_param_u64(req->params, "replicate", &push);
  if (!st__remote_param_str(req->params, "key", key, sizeof key) ||
      !st__remote_param_str(req->params, "as", as, sizeof as) || !version || !push) {
    st__peer_reply_error(p, req->ticket, ST_ERR_INVALID_ARGUMENT,
                         "peer_pull needs key, version, as and replicate");
    return;
  }
  int64_t as_uid = -1;
  for (int i = 0; i < pc->npeers; i++)
    if (!strcmp(pc->peers[i].id, req->peer)) as_uid = pc->peers[i].as_uid;
  if (as_uid < 0) {
    snprintf(err, sizeof err, "server '%s' takes no pushes from '%s' (peer.peers['%s'].as_uid "
             "names no local uid)", pc->id, req->peer, req->peer);
    st__peer_reply_error(p, req->ticket, ST_ERR_AUTH, err);
    return;
  }
  st__pull_req_t q = {.peer = req->peer, .key = key, .as = as, .version = version, .device = -3,
                      .policy = ST__KEY_PINNED, .uid = (uid_t)as_uid, .pushed = 1,
                      .push_ticket = req->ticket, .push_id = push};
  uint64_t id;
  int rc = st__pull_start(srv, &q, &id, err, sizeof err);
  if (rc != ST_OK) {
    char m[800];
    snprintf(m, sizeof m, "server '%s': %s", pc->id, err);
    st__peer_reply_error(p, req->ticket, rc, m);
    return;
  }
  ST_LOG_I("peer", "'%s' pushes key '%s' version %llu: pull task %llu as '%s' for uid %lld",
           req->peer, key, (unsigned long long)version, (unsigned long long)id, as,
           (long long)as_uid);
}

/* peer_pull_cancel {replicate} -> true: the pusher's task was cancelled. */
static void on_peer_pull_cancel(st__peer_t *p, const st__peer_req_t *req, void *ud) {
  st__server_t *srv = ud;
  uint64_t push = 0;
  if (st__remote_param_u64(req->params, "replicate", &push) && push)
    st__pulls_stop_pushed(srv, req->peer, push);
  st__remote_reply_true(p, req->ticket);
}

int st__replicate_methods(st__server_t *srv) {
  int rc = st__peer_method_add(srv->peer, "peer_pull", on_peer_pull, srv);
  if (rc == ST_OK) rc = st__peer_method_add(srv->peer, "peer_pull_cancel", on_peer_pull_cancel, srv);
  return rc;
}
