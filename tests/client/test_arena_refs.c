/* libstclient and arenas sent once per connection (docs/protocol.md,
 * "Arenas sent once"), against real stservers:
 *   - calls of a cached object while a result holds it bring no
 *     descriptor after the first (the server's fds_sent stays), and every
 *     result reads the object's values;
 *   - a client that freed every result of an arena still gets it, with
 *     its values, from the next call; nothing stays mapped once the server
 *     was told, and a result freed while no request is in flight is
 *     unmapped at once;
 *   - a managed object: lease, release, and the same object called again;
 *   - two servers whose arenas have the same ids: each connection reads
 *     its own server's memory, on the first call and on later ones;
 *   - a reconnect (a new server on the same socket, same arena ids) reads
 *     the new memory.
 */
#include <string.h>

#include "check.h"
#include "client_kit.h"
#include "fixture.h"

static stt_server_t A, B;

/* `v0 + i` for i in 0..15, cached (c16) and managed (m16). */
static void write_endpoints(stt_server_t *s, int v0) {
  char text[512];
  snprintf(text, sizeof text,
           "return st.endpoint{ name = 'c16', cache = true,\n"
           "  build = function() return st.arange{16, dtype = 'float32'}:add_(%d) end }\n",
           v0);
  stt_write_endpoint(s, "c16.lua", text);
  snprintf(text, sizeof text,
           "return st.endpoint{ name = 'm16', managed = true,\n"
           "  build = function() return st.arange{16, dtype = 'float32'}:add_(%d) end }\n",
           v0);
  stt_write_endpoint(s, "m16.lua", text);
}

/* info().counters.<key> of the server c is connected to; -1 on failure. */
static int64_t counter(st_client_t *c, const char *key) {
  st_result_t *r;
  if (st_client_info(c, &r) != ST_OK) return -1;
  const st_value_t *v = st_value_get(st_value_get(st_result_value(r), "counters"), key);
  int64_t n = v && v->kind == ST_VALUE_INT ? v->as.integer : -1;
  st_result_free(r);
  return n;
}

/* Calls ep and checks its tensor holds v0..v0+15; the result in *out
 * (NULL: freed). 0, or -1 with the reason printed. */
static int call_check(st_client_t *c, const char *ep, int v0, st_result_t **out) {
  st_result_t *r;
  if (stt_client_report(c, ep, st_client_call(c, ep, NULL, &r)) != ST_OK) return -1;
  const st_tensor_t *t = st_result_tensor(r, 0);
  int ok = t && t->numel == 16;
  for (int i = 0; ok && i < 16; i++) ok = ((const float *)t->data)[i] == (float)(v0 + i);
  if (!ok) fprintf(stderr, "%s: not %d..%d\n", ep, v0, v0 + 15);
  if (out && ok) *out = r;
  else st_result_free(r);
  return ok ? 0 : -1;
}

static size_t mapped_now(void) {
  size_t n;
  st_open_cache_stats(&n, NULL);
  return n;
}

TEST(a_held_object_travels_once) {
  size_t m0 = mapped_now();
  OPEN_CLIENT(c, A.socket);
  st_result_t *keep;
  CHECK(call_check(c, "c16", 0, &keep) == 0);
  int64_t sent = counter(c, "fds_sent");
  CHECK(sent > 0);
  for (int i = 0; i < 50; i++) CHECK(call_check(c, "c16", 0, NULL) == 0);
  CHECK(counter(c, "fds_sent") == sent);
  st_result_free(keep);
  st_client_close(c);
  CHECK(mapped_now() == m0);
}

TEST(a_client_that_let_go_gets_the_arena_again) {
  size_t m0 = mapped_now();
  OPEN_CLIENT(c, A.socket);
  for (int i = 0; i < 5; i++) {
    /* Freed each time: the next call tells the server, whose reply sends
     * the arena with its descriptor again. */
    CHECK(call_check(c, "c16", 0, NULL) == 0);
  }
  /* The last result is freed: the next request tells the server, and once
   * it answered nothing stays mapped. */
  CHECK_RC(st_client_ping(c, NULL), ST_OK, c);
  CHECK(mapped_now() == m0);
  st_client_close(c);
}

TEST(freed_while_no_request_is_in_flight_it_is_unmapped_at_once) {
  size_t m0 = mapped_now();
  OPEN_CLIENT(c, A.socket);
  st_result_t *r;
  CHECK(call_check(c, "c16", 0, &r) == 0);
  CHECK(mapped_now() == m0 + 1);
  /* No reply can name the arena before the next request tells the
   * server, so the pin goes with the last result: nothing of a destroyed
   * object stays alive in an idle client. */
  st_result_free(r);
  CHECK(mapped_now() == m0);
  int64_t sent = counter(c, "fds_sent");
  /* The info request told the server: the next reply sends it again. */
  CHECK(call_check(c, "c16", 0, NULL) == 0);
  CHECK(counter(c, "fds_sent") == sent + 1);
  CHECK(mapped_now() == m0);
  st_client_close(c);
}

TEST(a_managed_object_released_and_called_again) {
  size_t m0 = mapped_now();
  OPEN_CLIENT(c, A.socket);
  st_result_t *r;
  CHECK(call_check(c, "m16", 0, &r) == 0);
  st_object_info_t o;
  CHECK_RC(st_result_object(r, &o), ST_OK, c);
  int released;
  CHECK_RC(st_client_release(c, o.id, &released, NULL, NULL), ST_OK, c);
  /* Its memory stays readable through the result. */
  CHECK(((const float *)st_result_tensor(r, 0)->data)[15] == 15.0f);
  st_result_free(r);
  CHECK(call_check(c, "m16", 0, &r) == 0);
  st_result_free(r);
  CHECK_RC(st_client_ping(c, NULL), ST_OK, c);
  st_client_close(c);
  CHECK(mapped_now() == m0);
}

TEST(two_servers_with_the_same_arena_ids_stay_apart) {
  size_t m0 = mapped_now();
  OPEN_CLIENT(a, A.socket);
  OPEN_CLIENT(b, B.socket);
  st_result_t *ka, *kb;
  CHECK(call_check(a, "c16", 0, &ka) == 0);
  CHECK(call_check(b, "c16", 100, &kb) == 0);
  for (int i = 0; i < 10; i++) {
    CHECK(call_check(a, "c16", 0, NULL) == 0);
    CHECK(call_check(b, "c16", 100, NULL) == 0);
  }
  st_result_free(ka);
  st_result_free(kb);
  st_client_close(a);
  st_client_close(b);
  CHECK(mapped_now() == m0);
}

/* The client keeps its connection object across a server restart on the
 * same socket: ensure_live reconnects, and the new server's arena (with
 * the same id as the old one's) is read, not the old mapping. */
TEST(a_reconnect_to_a_new_server_reads_its_memory) {
  stt_server_t s;
  stt_server_init(&s);
  write_endpoints(&s, 0);
  stt_server_config(&s, "workers = 1,");
  CHECK(stt_server_start(&s) == 0);
  OPEN_CLIENT(c, s.socket);
  st_result_t *keep;
  CHECK(call_check(c, "c16", 0, &keep) == 0);
  CHECK(call_check(c, "c16", 0, NULL) == 0);
  CHECK(stt_server_stop(&s) == 0);
  write_endpoints(&s, 200);
  CHECK(stt_server_start(&s) == 0);
  st_object_info_t o;
  CHECK_RC(st_result_object(keep, &o), ST_OK, c);
  CHECK_RC(st_client_ensure_live(c, o.id, o.server_id), ST_ERR_STALE_HANDLE, c);
  CHECK(call_check(c, "c16", 200, NULL) == 0);
  CHECK(call_check(c, "c16", 200, NULL) == 0);
  /* The old result still reads the old memory. */
  CHECK(((const float *)st_result_tensor(keep, 0)->data)[1] == 1.0f);
  st_result_free(keep);
  st_client_close(c);
  CHECK(stt_server_stop(&s) == 0);
  stt_server_cleanup(&s);
}

int main(void) {
  stt_server_init(&A);
  write_endpoints(&A, 0);
  stt_server_config(&A, "workers = 1,");
  stt_server_start_or_exit(&A);
  stt_server_init(&B);
  write_endpoints(&B, 100);
  stt_server_config(&B, "workers = 1,");
  stt_server_start_or_exit(&B);
  RUN(a_held_object_travels_once);
  RUN(a_client_that_let_go_gets_the_arena_again);
  RUN(freed_while_no_request_is_in_flight_it_is_unmapped_at_once);
  RUN(a_managed_object_released_and_called_again);
  RUN(two_servers_with_the_same_arena_ids_stay_apart);
  RUN(a_reconnect_to_a_new_server_reads_its_memory);
  int rc = stt_server_finish(&B);
  return stt_server_finish(&A) || rc;
}
