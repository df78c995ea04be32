/* Concurrency options over the real socket: singleflight joins concurrent
 * calls into one build (one object, a lease each, refcount 2), errors reach
 * every joiner and are not cached; serialized endpoints run one build at a
 * time, the waiting call occupying no worker, while other endpoints keep
 * answering; a waiting call leaves the queue when its client does, and
 * ends CANCELLED when the server shuts down. */
#include <signal.h>

#include "check.h"
#include "wire.h"

static stt_server_t S;

TEST(singleflight_builds_once_and_shares_the_object) {
  rc_t a, b, w;
  CHECK(rc_open(&a, S.socket) == 0);
  CHECK(rc_open(&b, S.socket) == 0);
  CHECK(rc_open(&w, S.socket) == 0);
  int64_t builds0 = rc_info_int(&w, "counters.builds");
  int64_t joins0 = rc_info_int(&w, "counters.joins");
  CHECK(rc_sendf(&a, "[0, 1, 'call', [{endpoint: 'sf', args: {n: 6}}]]") == 0);
  CHECK(rc_sendf(&b, "[0, 2, 'call', [{endpoint: 'sf', args: {n: 6}}]]") == 0);
  msg_t ma, mb;
  CHECK(rc_next(&a, &ma, 10000) == 1);
  CHECK(rc_next(&b, &mb, 10000) == 1);
  CHECK(ma.error == NULL && mb.error == NULL);
  /* One object, one arena, a lease for each caller. */
  int64_t oid = obj_field(&ma, "id");
  CHECK(oid > 0);
  CHECK_EQ_INT(obj_field(&mb, "id"), oid);
  CHECK_EQ_INT(arena_id(&ma, 0), arena_id(&mb, 0));
  CHECK_EQ_INT(obj_field(&ma, "lease"), 1);
  CHECK_EQ_INT(obj_field(&mb, "lease"), 1);
  CHECK_EQ_INT(obj_field(&ma, "managed"), 1);
  CHECK_EQ_INT(obj_field(&ma, "cached"), 0);
  CHECK_EQ_INT(obj_field(&ma, "refcount") + obj_field(&mb, "refcount"), 3);  /* 1 then 2 */
  CHECK_STR_EQ(obj_str(obj_get(obj_get(ma.result, "object"), "cache_key")), "{\"n\":6}");
  CHECK_EQ_INT(a.nfds, 1);
  CHECK_EQ_INT(b.nfds, 1);
  msg_free(&ma);
  msg_free(&mb);
  CHECK_EQ_INT(info_field(&w, (uint64_t)oid, "refcount"), 2);
  CHECK_EQ_INT(rc_info_int(&w, "counters.builds"), builds0 + 1);
  CHECK_EQ_INT(rc_info_int(&w, "counters.joins"), joins0 + 1);
  /* The leases go with the connections; then the object goes. */
  rc_close(&a);
  double end = stt_now_ms() + 5000;
  while (info_field(&w, (uint64_t)oid, "refcount") != 1 && stt_now_ms() < end) stt_sleep_ms(2);
  CHECK_EQ_INT(info_field(&w, (uint64_t)oid, "refcount"), 1);
  rc_close(&b);
  CHECK(rc_wait_info(&w, "objects.count", 0, 5000) == 0);
  CHECK(rc_wait_info(&w, "arenas.count", 0, 5000) == 0);
  rc_close(&w);
}

TEST(singleflight_error_reaches_every_joiner_and_is_not_kept) {
  rc_t a, b;
  CHECK(rc_open(&a, S.socket) == 0);
  CHECK(rc_open(&b, S.socket) == 0);
  int64_t builds0 = rc_info_int(&a, "counters.builds");
  CHECK(rc_sendf(&a, "[0, 1, 'call', [{endpoint: 'sferr', args: {}}]]") == 0);
  CHECK(rc_sendf(&b, "[0, 2, 'call', [{endpoint: 'sferr', args: {}}]]") == 0);
  msg_t ma, mb;
  CHECK(rc_next(&a, &ma, 10000) == 1);
  CHECK(rc_next(&b, &mb, 10000) == 1);
  CHECK_REPLY(&ma, ST_ERR_ENDPOINT, NULL);
  CHECK_REPLY(&mb, ST_ERR_ENDPOINT, NULL);
  CHECK_CONTAINS(msg_errmsg(&ma), "sferr.lua:3: boom");
  CHECK_CONTAINS(msg_errmsg(&mb), "sferr.lua:3: boom");
  msg_free(&ma);
  msg_free(&mb);
  CHECK_EQ_INT(rc_info_int(&a, "counters.builds"), builds0 + 1);
  /* Not cached: the next call builds (and fails) again. */
  msg_t m;
  CHECK(rk_call(&a, "sferr", NULL, 0, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_ENDPOINT, NULL);
  msg_free(&m);
  CHECK_EQ_INT(rc_info_int(&a, "counters.builds"), builds0 + 2);
  rc_close(&a);
  rc_close(&b);
}

TEST(serialized_builds_one_at_a_time) {
  rc_t a, b, p;
  CHECK(rc_open(&a, S.socket) == 0);
  CHECK(rc_open(&b, S.socket) == 0);
  CHECK(rc_open(&p, S.socket) == 0);
  double t0 = stt_now_ms();
  CHECK(rc_sendf(&a, "[0, 1, 'call', [{endpoint: 'ser', args: {s: 0.15}}]]") == 0);
  CHECK(rc_sendf(&b, "[0, 2, 'call', [{endpoint: 'ser', args: {s: 0.15}}]]") == 0);
  /* The second call waits in the endpoint's queue, not on a worker. */
  CHECK(rc_wait_info(&p, "waiting", 1, 2000) == 0);
  /* Another endpoint answers at once meanwhile. */
  double tp = stt_now_ms();
  msg_t m;
  CHECK(rk_call(&p, "quick", NULL, 0, &m) == 1);
  CHECK(m.error == NULL);
  msg_free(&m);
  double quick_ms = stt_now_ms() - tp;
  msg_t ma, mb;
  CHECK(rc_next(&a, &ma, 10000) == 1);
  double ta = stt_now_ms() - t0;
  CHECK(rc_next(&b, &mb, 10000) == 1);
  double tb = stt_now_ms() - t0;
  CHECK(ma.error == NULL && mb.error == NULL);
  msg_free(&ma);
  msg_free(&mb);
  fprintf(stderr, "   quick %.1f ms; first %.1f ms, second %.1f ms\n", quick_ms, ta, tb);
  CHECK(quick_ms < 100);
  CHECK(tb >= 300);
  CHECK(ta >= 150);
  CHECK_EQ_INT(rc_info_int(&p, "waiting"), 0);
  rc_close(&a);
  rc_close(&b);
  rc_close(&p);
}

TEST(serialized_waiter_whose_client_leaves_never_runs) {
  rc_t a, b, w;
  CHECK(rc_open(&a, S.socket) == 0);
  CHECK(rc_open(&b, S.socket) == 0);
  CHECK(rc_open(&w, S.socket) == 0);
  int64_t builds0 = rc_info_int(&w, "counters.builds");
  /* The first build runs long enough for the second caller to leave
   * while it still waits, even on a loaded machine. */
  CHECK(rc_sendf(&a, "[0, 1, 'call', [{endpoint: 'ser', args: {s: 0.4}}]]") == 0);
  CHECK(rc_wait_info(&w, "inflight", 1, 2000) == 0);   /* a's build has the turn */
  CHECK(rc_sendf(&b, "[0, 2, 'call', [{endpoint: 'ser', args: {s: 0.1}}]]") == 0);
  CHECK(rc_wait_info(&w, "waiting", 1, 2000) == 0);
  rc_close(&b);
  CHECK(rc_wait_info(&w, "waiting", 0, 2000) == 0);
  msg_t m;
  CHECK(rc_next(&a, &m, 10000) == 1);
  CHECK(m.error == NULL);
  msg_free(&m);
  CHECK_EQ_INT(rc_info_int(&w, "counters.builds"), builds0 + 1);
  rc_close(&a);
  rc_close(&w);
}

/* SIGTERM with a short grace: the running serialized build is cancelled
 * and the one waiting behind it ends CANCELLED without running. */
TEST(shutdown_cancels_waiting_serialized_builds) {
  stt_server_t T;
  stt_server_init(&T);
  stt_server_config(&T, "workers = 2, shutdown_grace_s = 0.2,");
  stt_write_endpoint(&T, "ser.lua",
                     "return st.endpoint{ name = 'ser', concurrency = 'serialized',\n"
                     "  build = function() st.sleep(30); return 1 end }\n");
  if (stt_server_start(&T) != 0) {
    stt_server_cleanup(&T);
    CHECK(0);
  }
  rc_t a, b;
  int ok = rc_open(&a, T.socket) == 0 && rc_open(&b, T.socket) == 0;
  ok = ok && rc_sendf(&a, "[0, 1, 'call', [{endpoint: 'ser', args: {}}]]") == 0 &&
       rc_wait_info(&b, "inflight", 1, 2000) == 0;
  ok = ok && rc_sendf(&b, "[0, 2, 'call', [{endpoint: 'ser', args: {}}]]") == 0 &&
       rc_wait_info(&a, "waiting", 1, 2000) == 0;
  double t0 = stt_now_ms();
  kill(T.pid, SIGTERM);
  msg_t ma, mb;
  int ga = ok ? rc_next(&a, &ma, 5000) : -1, gb = ok ? rc_next(&b, &mb, 5000) : -1;
  double took = stt_now_ms() - t0;
  int status = stt_server_wait_exit(&T, 10000);
  if (status < 0) stt_server_stop(&T);
  stt_server_cleanup(&T);
  CHECK(ok);
  CHECK(ga == 1 && gb == 1);
  CHECK_REPLY(&ma, ST_ERR_CANCELLED, NULL);
  CHECK_REPLY(&mb, ST_ERR_CANCELLED, "shutting down");
  msg_free(&ma);
  msg_free(&mb);
  rc_close(&a);
  rc_close(&b);
  CHECK(took < 3000);
  CHECK_EQ_INT(status, 0);
}

static const stt_endpoint_t endpoints[] = {
    {"sf.lua",
     "return st.endpoint{ name = 'sf', managed = true, singleflight = true,\n"
     "  params = { n = 4 },\n"
     "  build = function(a) st.sleep(0.15); return st.arange{a.n} end }\n"},
    {"sferr.lua",
     "return st.endpoint{ name = 'sferr', singleflight = true,\n"
     "  build = function() st.sleep(0.1)\n"
     "    error('boom') end }\n"},
    {"ser.lua",
     "return st.endpoint{ name = 'ser', concurrency = 'serialized',\n"
     "  params = { s = 0.15 },\n"
     "  build = function(a) st.sleep(a.s); return 1 end }\n"},
    {"quick.lua",
     "return st.endpoint{ name = 'quick', build = function() return 1 end }\n"},
    {NULL, NULL},
};

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  stt_server_setup(&S, "workers = 4,", endpoints);
  RUN(singleflight_builds_once_and_shares_the_object);
  RUN(singleflight_error_reaches_every_joiner_and_is_not_kept);
  RUN(serialized_builds_one_at_a_time);
  RUN(serialized_waiter_whose_client_leaves_never_runs);
  int status = stt_server_stop(&S);
  RUN(shutdown_cancels_waiting_serialized_builds);
  return stt_server_end(&S, status);
}
