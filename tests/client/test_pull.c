/* st_client_pull through the public API (include/st/client.h, "keys
 * between servers"; docs/multihost.md): two stservers on loopback that
 * are peers (tests/peer/remote_kit.h). A three-tensor key pulled and
 * followed with the task functions, its result read, every byte compared
 * on the receiver and its origin listed by keys; the options (as,
 * version, policy); refusals at once (not a peer, arguments the library
 * checks) and in the task (not exported: AUTH); a cancel while the bytes
 * cannot move. */
#include <inttypes.h>

#include "../peer/remote_kit.h"

static const char *str_of(const st_value_t *v) {
  return v && v->kind == ST_VALUE_STRING ? v->as.str.ptr : "";
}

static int64_t int_of(const st_value_t *v) { return v && v->kind == ST_VALUE_INT ? v->as.integer : -1; }

static const st_value_t *path(const st_value_t *v, const char *a, const char *b) {
  return st_value_get(st_value_get(v, a), b);
}

#define CONNECT(c, s)                                                      \
  st_client_t *c = NULL;                                                   \
  do {                                                                     \
    char e_[256];                                                          \
    CHECK(st_client_connect((s).socket, &c, e_, sizeof e_) == ST_OK);      \
  } while (0)

TEST(a_pull_moves_every_byte_and_reports_its_origin) {
  CHECK(rk_put(ALPHA.socket, "w/model", 1) == 1);
  CONNECT(c, BETA);
  uint64_t id = 0;
  CHECK_EQ_INT(st_client_pull(c, "w/model", "alpha", NULL, &id), ST_OK);
  CHECK(id > 0);
  char status[64];
  CHECK_STR_EQ(rk_wait_end(c, id, status, sizeof status), "completed");
  /* The task info of a pull names it; its progress ended at every byte. */
  st_result_t *info = NULL;
  CHECK_EQ_INT(st_client_task_status(c, id, &info), ST_OK);
  CHECK_STR_EQ(str_of(st_value_get(st_result_value(info), "endpoint")), "pull");
  st_result_free(info);
  st_result_t *r = NULL;
  CHECK_EQ_INT(st_client_task_result(c, id, &r), ST_OK);
  const st_value_t *v = st_result_value(r);
  CHECK_STR_EQ(str_of(st_value_get(v, "key")), "w/model");
  CHECK_EQ_INT(int_of(st_value_get(v, "version")), 1);
  CHECK_STR_EQ(str_of(path(v, "origin", "peer")), "alpha");
  CHECK_STR_EQ(str_of(path(v, "origin", "key")), "w/model");
  CHECK_EQ_INT(int_of(path(v, "origin", "version")), 1);
  /* The bytes of the key's arenas: each tensor's, rounded up to pages. */
  int64_t bytes = int_of(st_value_get(v, "bytes"));
  int64_t sum = (int64_t)(RK_SIZES[0] + RK_SIZES[1] + RK_SIZES[2]);
  CHECK(bytes >= sum && bytes < sum + 3 * 65536);
  const st_value_t *secs = st_value_get(v, "seconds");
  CHECK(secs && (secs->kind == ST_VALUE_FLOAT || secs->kind == ST_VALUE_INT));
  st_result_free(r);
  /* A plain result is handed over once. */
  CHECK_EQ_INT(st_client_task_result(c, id, &r), ST_ERR_TASK);
  CHECK(rk_holds(BETA.socket, "w/model", 0, 1));
  /* keys lists the copy with its origin. */
  CHECK_EQ_INT(st_client_keys(c, "w/", &r), ST_OK);
  v = st_result_value(r);
  CHECK(v->kind == ST_VALUE_ARRAY && v->as.array.len == 1);
  if (v->kind == ST_VALUE_ARRAY && v->as.array.len == 1) {
    CHECK_STR_EQ(str_of(path(&v->as.array.items[0], "origin", "peer")), "alpha");
    CHECK_EQ_INT(int_of(path(&v->as.array.items[0], "origin", "version")), 1);
  }
  st_result_free(r);
  CHECK_EQ_INT(st_client_delete(c, "w/model"), ST_OK);
  st_client_close(c);
}

TEST(options_name_the_copy_its_version_and_policy) {
  CHECK(rk_put(ALPHA.socket, "w/opts", 1) == 1);
  CHECK(rk_put(ALPHA.socket, "w/opts", 2) == 2);
  CONNECT(c, BETA);
  uint32_t uid = 4242;
  st_readers_t readers = {.uids = &uid, .nuids = 1};
  st_pull_opts_t o = {.version = 1, .as = "copy/opts", .device = "cpu",
                      .policy = ST_KEY_EVICTABLE, .readers = &readers};
  uint64_t id = 0;
  CHECK_EQ_INT(st_client_pull(c, "w/opts", "alpha", &o, &id), ST_OK);
  char status[64];
  CHECK_STR_EQ(rk_wait_end(c, id, status, sizeof status), "completed");
  st_result_t *r = NULL;
  CHECK_EQ_INT(st_client_task_result(c, id, &r), ST_OK);
  CHECK_STR_EQ(str_of(st_value_get(st_result_value(r), "key")), "copy/opts");
  CHECK_EQ_INT(int_of(path(st_result_value(r), "origin", "version")), 1);
  st_result_free(r);
  CHECK(rk_holds(BETA.socket, "copy/opts", 0, 1));   /* version 1's bytes, not 2's */
  CHECK_EQ_INT(st_client_keys(c, "copy/", &r), ST_OK);
  const st_value_t *v = st_result_value(r);
  CHECK(v->kind == ST_VALUE_ARRAY && v->as.array.len == 1);
  if (v->kind == ST_VALUE_ARRAY && v->as.array.len == 1)
    CHECK_STR_EQ(str_of(st_value_get(&v->as.array.items[0], "policy")), "evictable");
  st_result_free(r);
  /* The latest by default. */
  o = (st_pull_opts_t){.as = "copy/latest"};
  CHECK_EQ_INT(st_client_pull(c, "w/opts", "alpha", &o, &id), ST_OK);
  CHECK_STR_EQ(rk_wait_end(c, id, status, sizeof status), "completed");
  CHECK(rk_holds(BETA.socket, "copy/latest", 0, 2));
  CHECK_EQ_INT(st_client_delete(c, "copy/opts"), ST_OK);
  CHECK_EQ_INT(st_client_delete(c, "copy/latest"), ST_OK);
  st_client_close(c);
}

TEST(refusals_are_clear_errors) {
  CONNECT(c, BETA);
  uint64_t id = 7;
  /* Not a peer: at once, nothing started. */
  CHECK_EQ_INT(st_client_pull(c, "w/model", "gamma", NULL, &id), ST_ERR_NOT_FOUND);
  CHECK_CONTAINS(st_client_error(c), "'gamma' is not a peer of this server (peer.peers)");
  CHECK_EQ_INT((int64_t)id, 0);
  /* What the library checks itself. */
  CHECK_EQ_INT(st_client_pull(c, "w/model", NULL, NULL, &id), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_client_error(c), "a key and a peer id are required");
  st_pull_opts_t bad = {.policy = 7};
  CHECK_EQ_INT(st_client_pull(c, "w/model", "alpha", &bad, &id), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_client_error(c), "unknown policy 7");
  st_readers_t readers = {.uids = NULL, .nuids = 2};
  bad = (st_pull_opts_t){.readers = &readers};
  CHECK_EQ_INT(st_client_pull(c, "w/model", "alpha", &bad, &id), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st_client_replicate(c, "w/model", NULL, 0, NULL, &id), ST_ERR_INVALID_ARGUMENT);
  const char *to[2] = {"alpha", ""};
  CHECK_EQ_INT(st_client_replicate(c, "w/model", to, 2, NULL, &id), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_client_error(c), "peer 1 of 2 is empty");
  /* A bad device: the server's words. */
  bad = (st_pull_opts_t){.device = "gpu"};
  CHECK_EQ_INT(st_client_pull(c, "w/model", "alpha", &bad, &id), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_client_error(c), "'device' must be cpu, cuda or cuda:N");
  /* Not exported: the task fails with AUTH, and its result says why. */
  CHECK(rk_put(ALPHA.socket, "secret", 1) == 1);
  CHECK_EQ_INT(st_client_pull(c, "secret", "alpha", NULL, &id), ST_OK);
  char status[64];
  CHECK_STR_EQ(rk_wait_end(c, id, status, sizeof status), "failed");
  st_result_t *r = NULL;
  CHECK_EQ_INT(st_client_task_result(c, id, &r), ST_ERR_AUTH);
  CHECK_CONTAINS(st_client_error(c), "key 'secret' is not exported to peers (peer.export of "
                 "server 'alpha')");
  CHECK(r == NULL);
  CHECK_EQ_INT(st_client_get(c, "secret", 0, 0, &r, NULL), ST_ERR_NOT_FOUND);
  st_client_close(c);
}

TEST(a_cancelled_pull_leaves_nothing) {
  CHECK(rk_put(ALPHA.socket, "w/slow", 3) >= 1);
  int64_t used0 = server_info_int(&BETA, "memory.cpu.used_bytes");
  /* alpha's helper stopped: the transfer opens and no byte moves. */
  pid_t helper = (pid_t)server_info_int(&ALPHA, "transfers.helper_pid");
  CHECK(helper > 0 && kill(helper, SIGSTOP) == 0);
  CONNECT(c, BETA);
  uint64_t id = 0;
  CHECK_EQ_INT(st_client_pull(c, "w/slow", "alpha", NULL, &id), ST_OK);
  CHECK(server_wait_info(&ALPHA, "transfers.lends", 1));
  st_result_t *info = NULL;
  CHECK_EQ_INT(st_client_task_cancel(c, id, &info), ST_OK);
  st_result_free(info);
  char status[64];
  CHECK_STR_EQ(rk_wait_end(c, id, status, sizeof status), "cancelled");
  st_result_t *r = NULL;
  CHECK_EQ_INT(st_client_task_result(c, id, &r), ST_ERR_CANCELLED);
  if (helper > 0) kill(helper, SIGCONT);
  CHECK_EQ_INT(st_client_get(c, "w/slow", 0, 0, &r, NULL), ST_ERR_NOT_FOUND);
  CHECK(server_wait_info(&BETA, "memory.cpu.used_bytes", used0));
  CHECK(server_wait_info(&ALPHA, "transfers.lends", 0));
  st_client_close(c);
}

int main(void) {
  rk_main_start();
  RUN(a_pull_moves_every_byte_and_reports_its_origin);
  RUN(options_name_the_copy_its_version_and_policy);
  RUN(refusals_are_clear_errors);
  RUN(a_cancelled_pull_leaves_nothing);
  return rk_main_end();
}
