/* st_client_replicate through the public API (include/st/client.h, "keys
 * between servers"; docs/multihost.md, "Pushing a key"): two stservers
 * on loopback that are peers (tests/peer/remote_kit.h). alpha pushes a
 * key to beta, which takes its pushes: the task's result names beta's
 * version, and beta holds every byte with its origin; a push to a server
 * that takes none fails the task with AUTH naming the peer; a stranger
 * is refused at once. */
#include <inttypes.h>

#include "../peer/remote_kit.h"

static const st_value_t *path(const st_value_t *v, const char *a, const char *b) {
  return st_value_get(st_value_get(v, a), b);
}

TEST(a_push_lands_on_the_peer) {
  CHECK(rk_put(ALPHA.socket, "w/push", 5) == 1);
  st_client_t *c = NULL;
  char err[256];
  CHECK(st_client_connect(ALPHA.socket, &c, err, sizeof err) == ST_OK);
  const char *to[1] = {"beta"};
  st_replicate_opts_t o = {.as = "pushed/m"};
  uint64_t id = 0;
  CHECK_EQ_INT(st_client_replicate(c, "w/push", to, 1, &o, &id), ST_OK);
  char status[64];
  CHECK_STR_EQ(rk_wait_end(c, id, status, sizeof status), "completed");
  st_result_t *r = NULL;
  CHECK_EQ_INT(st_client_task_result(c, id, &r), ST_OK);
  const st_value_t *v = st_result_value(r);
  const st_value_t *key = st_value_get(v, "key");
  CHECK(key && key->kind == ST_VALUE_STRING && !strcmp(key->as.str.ptr, "w/push"));
  const st_value_t *beta = path(v, "peers", "beta");
  const st_value_t *ok = st_value_get(beta, "ok");
  CHECK(ok && ok->kind == ST_VALUE_BOOL && ok->as.boolean);
  const st_value_t *ver = st_value_get(beta, "version");
  CHECK(ver && ver->kind == ST_VALUE_INT && ver->as.integer == 1);
  st_result_free(r);
  CHECK(rk_holds(BETA.socket, "pushed/m", 0, 5));
  st_client_close(c);
}

TEST(a_push_to_a_server_that_takes_none_fails) {
  CHECK(rk_put(BETA.socket, "w/back", 6) == 1);
  st_client_t *c = NULL;
  char err[256];
  CHECK(st_client_connect(BETA.socket, &c, err, sizeof err) == ST_OK);
  const char *to[1] = {"alpha"};
  uint64_t id = 0;
  CHECK_EQ_INT(st_client_replicate(c, "w/back", to, 1, NULL, &id), ST_OK);
  char status[64];
  CHECK_STR_EQ(rk_wait_end(c, id, status, sizeof status), "failed");
  st_result_t *r = NULL;
  CHECK_EQ_INT(st_client_task_result(c, id, &r), ST_ERR_AUTH);
  CHECK_CONTAINS(st_client_error(c), "1 of 1 peers failed");
  CHECK_CONTAINS(st_client_error(c), "alpha");
  /* A stranger: at once. */
  const char *strangers[2] = {"alpha", "gamma"};
  CHECK_EQ_INT(st_client_replicate(c, "w/back", strangers, 2, NULL, &id), ST_ERR_NOT_FOUND);
  CHECK_CONTAINS(st_client_error(c), "gamma");
  st_client_close(c);
}

int main(void) {
  rk_main_start();
  RUN(a_push_lands_on_the_peer);
  RUN(a_push_to_a_server_that_takes_none_fails);
  return rk_main_end();
}
