/* The info map over the real socket (docs/protocol.md, "info"): exactly
 * the documented keys, once each, at the top and in `generation`; the
 * parts that move only at start or on a reload (the server packs them
 * once and keeps them) are the same from one call to the next and follow
 * every reload, good or failed: generation number and endpoint count,
 * last_reload's ok, error and time. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "wire.h"

static stt_server_t S;

static const char *const TOP_KEYS[] = {
    "server_id", "version", "protocol", "pid", "uptime_s", "ready", "generation", "devices",
    "cuda", "sockets", "workers", "connections", "inflight", "waiting", "counters", "methods",
    "errors_by_name", "limits", "held", "holdings", "arenas", "objects", "keys", "memory", "tasks", "peer",
    "transfers", "restart",
    NULL};
static const char *const GEN_KEYS[] = {"number",    "reloading", "loaded_at", "endpoints",
                                       "dir",       "last_reload", NULL};

/* Whether map m has exactly the keys of `want`, each once; says why not. */
static int has_exactly(const msgpack_object *m, const char *const *want, char *why, size_t len) {
  size_t n = 0;
  while (want[n]) n++;
  if (!m || m->type != MSGPACK_OBJECT_MAP) return snprintf(why, len, "not a map"), 0;
  if (m->via.map.size != n)
    return snprintf(why, len, "%u keys, want %zu", m->via.map.size, n), 0;
  for (size_t i = 0; i < n; i++) {
    int seen = 0;
    for (uint32_t k = 0; k < m->via.map.size; k++) {
      const msgpack_object *key = &m->via.map.ptr[k].key;
      seen += key->type == MSGPACK_OBJECT_STR && key->via.str.size == strlen(want[i]) &&
              memcmp(key->via.str.ptr, want[i], key->via.str.size) == 0;
    }
    if (seen != 1) return snprintf(why, len, "key %s seen %d times", want[i], seen), 0;
  }
  return 1;
}

/* Whether the value at `path` is the same in both replies (as msgpack). */
static int same_at(const msg_t *a, const msg_t *b, const char *path) {
  const msgpack_object *x = obj_path(a->result, path), *y = obj_path(b->result, path);
  return x && y && msgpack_object_equal(*x, *y);
}

TEST(info_has_the_documented_keys_once) {
  OPEN_RC(c, S.socket);
  for (int round = 0; round < 3; round++) {   /* the first packs, later ones reuse */
    msg_t m;
    CHECK(rc_info(&c, 1, &m) == 1);
    CHECK_WHY(has_exactly(m.result, TOP_KEYS, stt_why_, sizeof stt_why_));
    CHECK_WHY(has_exactly(obj_get(m.result, "generation"), GEN_KEYS, stt_why_, sizeof stt_why_));
    CHECK(obj_path(m.result, "generation.last_reload")->type == MSGPACK_OBJECT_NIL);
    CHECK_EQ_INT(obj_int(obj_path(m.result, "generation.reloading")), 0);
    CHECK_EQ_INT(obj_int(obj_get(m.result, "workers")), 2);
    CHECK_EQ_INT(obj_int(obj_get(m.result, "connections")), 1);
    msg_free(&m);
  }
  msg_t a, b;
  CHECK(rc_info(&c, 2, &a) == 1);
  CHECK(rc_call(&c, "one", NULL, 0, &b) == 1 && !b.error);
  msg_free(&b);
  CHECK(rc_info(&c, 3, &b) == 1);
  static const char *const fixed[] = {"server_id", "version", "protocol", "pid", "devices",
                                      "cuda", "sockets", "limits", "workers", "generation",
                                      NULL};
  for (int i = 0; fixed[i]; i++)
    if (!same_at(&a, &b, fixed[i])) STT_FAIL("%s changed between two calls", fixed[i]);
  /* What moves is packed afresh. */
  CHECK_EQ_INT(obj_int(obj_path(b.result, "counters.calls")),
               obj_int(obj_path(a.result, "counters.calls")) + 1);
  CHECK_EQ_INT(obj_int(obj_path(b.result, "methods.info.requests")),
               obj_int(obj_path(a.result, "methods.info.requests")) + 1);
  msg_free(&a);
  msg_free(&b);
  rc_close(&c);
}

static int64_t reload_ok(rc_t *c) {
  msg_t m;
  if (rc_rpcf(c, &m, "[0, 40, 'reload', []]") != 1 || m.error) return -1;
  int64_t ok = obj_int(obj_get(m.result, "ok"));
  msg_free(&m);
  return ok;
}

/* last_reload.at of info, or -1. */
static double reload_at(rc_t *c) {
  msg_t m;
  if (rc_info(c, 5, &m) != 1) return -1;
  const msgpack_object *at = obj_path(m.result, "generation.last_reload.at");
  double v = at && at->type == MSGPACK_OBJECT_FLOAT64 ? at->via.f64 : -1;
  msg_free(&m);
  return v;
}

TEST(info_follows_every_reload) {
  OPEN_RC(c, S.socket);
  int64_t gen0 = rc_info_int(&c, "generation.number");
  int64_t eps0 = rc_info_int(&c, "generation.endpoints");
  stt_write_endpoint(&S, "two.lua", "return st.endpoint{ name = 'two', build = function() "
                                    "return 2 end }\n");
  CHECK_EQ_INT(reload_ok(&c), 1);
  CHECK_EQ_INT(rc_info_int(&c, "generation.number"), gen0 + 1);
  CHECK_EQ_INT(rc_info_int(&c, "generation.endpoints"), eps0 + 1);
  CHECK_EQ_INT(rc_info_int(&c, "generation.last_reload.ok"), 1);
  msg_t m;
  CHECK(rc_info(&c, 4, &m) == 1);
  CHECK(obj_path(m.result, "generation.last_reload.error")->type == MSGPACK_OBJECT_NIL);
  msg_free(&m);
  double at1 = reload_at(&c);
  CHECK(at1 > 0);

  /* A failed reload: the generation stays, last_reload says why. */
  stt_write_endpoint(&S, "two.lua", "-- broken\nreturn st.endpoint{ name = 'two',, }\n");
  CHECK_EQ_INT(reload_ok(&c), 0);
  CHECK_EQ_INT(rc_info_int(&c, "generation.number"), gen0 + 1);
  CHECK_EQ_INT(rc_info_int(&c, "generation.endpoints"), eps0 + 1);
  CHECK_EQ_INT(rc_info_int(&c, "generation.last_reload.ok"), 0);
  CHECK(rc_info(&c, 4, &m) == 1);
  CHECK_CONTAINS(obj_str(obj_path(m.result, "generation.last_reload.error")), "two.lua:2:");
  msg_free(&m);
  double at2 = reload_at(&c);
  CHECK(at2 >= at1);

  /* The same failure again: a new time, the same error. */
  stt_sleep_ms(5);
  CHECK_EQ_INT(reload_ok(&c), 0);
  CHECK(reload_at(&c) > at2);

  /* Fixed: ok again, no error, the endpoints of the start. */
  char path[700];
  snprintf(path, sizeof path, "%s/two.lua", S.endpoints);
  CHECK(unlink(path) == 0);
  CHECK_EQ_INT(reload_ok(&c), 1);
  CHECK_EQ_INT(rc_info_int(&c, "generation.number"), gen0 + 2);
  CHECK_EQ_INT(rc_info_int(&c, "generation.endpoints"), eps0);
  CHECK_EQ_INT(rc_info_int(&c, "generation.last_reload.ok"), 1);
  CHECK(rc_info(&c, 4, &m) == 1);
  CHECK(obj_path(m.result, "generation.last_reload.error")->type == MSGPACK_OBJECT_NIL);
  msg_free(&m);
  rc_close(&c);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  stt_server_init(&S);
  stt_server_config(&S, "workers = 2,");
  stt_write_endpoint(&S, "one.lua",
                     "return st.endpoint{ name = 'one', build = function() return 1 end }\n");
  stt_server_start_or_exit(&S);
  RUN(info_has_the_documented_keys_once);
  RUN(info_follows_every_reload);
  return stt_server_finish(&S);
}
