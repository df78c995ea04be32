/* The registry of what a connection holds (src/server/holdings.h) through
 * libstclient against a real stserver: a client process holds a buffer
 * handle with its writer lock, a hand-off seat, a lease and a result
 * waiting in a reply; info's "holdings" shows one row for its connection
 * with each of them; SIGKILLed, its row goes, the writer lock is free,
 * the lease and the hand-off are dropped, and the server's descriptors,
 * budget and arenas are back at the start.
 */
#include "buffer_kit.h"
#include "endpoints.h"
#include "handoff_kit.h"

static stt_server_t srv;
static st_client_t *cli;
static hk_figures_t baseline;

static const int64_t SHAPE[1] = {256};

static const stt_endpoint_t endpoints[] = {{"lin.lua", STT_EP_LIN}, {NULL, NULL}};

typedef struct hold_report {
  int rc;
  char why[200];
} hold_report_t;

/* Takes one of each kind, reports, then waits to be killed. */
static int child_holder(const char *socket, const char *name, long arg, int out) {
  (void)name;
  (void)arg;
  hold_report_t r = {-1000, ""};
  st_client_t *c = stt_client_open(socket);
  st_buffer_t *b = NULL;
  st_handoff_t *h = NULL;
  st_result_t *lease = NULL;
  if (!c) return 2;
  if ((r.rc = st_buffer_create(c, "hold_b", "cpu", ST_DTYPE_FLOAT32, 1, SHAPE, 1, &b)) ==
          ST_OK &&
      (r.rc = st_buffer_acquire(b, 1000)) == ST_OK &&
      (r.rc = st_handoff_create(c, "hold_h", "cpu", 8192, 2, 1, &h)) == ST_OK)
    r.rc = st_client_call(c, "lin", NULL, &lease);
  snprintf(r.why, sizeof r.why, "%s", st_client_error(c));
  bk_send(out, &r, sizeof r);
  for (;;) pause();
}

/* The row of info's holdings for the connection of process `pid` (NULL:
 * none), in *info (the caller frees it). */
static const st_value_t *row_of(pid_t pid, st_result_t **info) {
  if (st_client_info(cli, info) != ST_OK) return NULL;
  const st_value_t *list = st_value_get(st_result_value(*info), "holdings");
  if (!list || list->kind != ST_VALUE_ARRAY) return NULL;
  for (size_t i = 0; i < list->as.array.len; i++) {
    const st_value_t *p = st_value_get(&list->as.array.items[i], "pid");
    if (p && p->kind == ST_VALUE_INT && p->as.integer == pid) return &list->as.array.items[i];
  }
  return NULL;
}

static int64_t items(const st_value_t *row, const char *kind) {
  const st_value_t *v = st_value_get(st_value_get(row, kind), "items");
  return v && v->kind == ST_VALUE_INT ? v->as.integer : 0;
}

TEST(a_killed_connection_gives_back_everything_it_held) {
  int64_t leases0 = hk_info(cli, "objects", "leases", NULL);
  bk_child_t k = {0, -1};
  CHECK(bk_spawn(&k, srv.socket, NULL, 0, child_holder) == 0);
  /* What the holder holds is read before any check: a failed check must
   * not leave it running. */
  hold_report_t r = {-1000, "no report"};
  int reported = bk_report(&k, &r, sizeof r) == 0;
  st_result_t *info = NULL;
  const st_value_t *row = row_of(k.pid, &info);
  int64_t nbuffers = items(row, "buffers"), nhandoffs = items(row, "handoffs"),
          nleases = items(row, "leases");
  int had_row = row != NULL;
  st_result_free(info);
  int64_t leases_held = hk_info(cli, "objects", "leases", NULL);
  st_buffer_t *b = NULL;
  int open_rc = st_buffer_open(cli, "hold_b", 0, &b);
  uint64_t owner = 0;
  int pid = 0, mine = 1;
  int locked = b ? st_buffer_locked(b, &owner, &pid, &mine) : -1;
  bk_end(&k, 1);
  CHECK(reported);
  CHECK_ERR_MSG(r.rc, ST_OK, r.why);
  CHECK(had_row);
  CHECK_EQ_INT(nbuffers, 1);
  CHECK_EQ_INT(nhandoffs, 1);
  CHECK_EQ_INT(nleases, 1);
  CHECK_EQ_INT(leases_held, leases0 + 1);
  CHECK_EQ_INT(open_rc, ST_OK);
  CHECK_EQ_INT(locked, 1);
  CHECK(pid == (int)k.pid && !mine);

  double end = stt_now_ms() + 5000;
  for (;;) {
    info = NULL;
    row = row_of(k.pid, &info);
    st_result_free(info);
    if (!row || stt_now_ms() > end) break;
    stt_sleep_ms(5);
  }
  CHECK(row == NULL);
  CHECK_EQ_INT(hk_info(cli, "objects", "leases", NULL), leases0);
  /* the writer lock is back, the hand-off went with its last seat */
  CHECK_ERR_MSG(st_buffer_acquire(b, 1000), ST_OK, st_buffer_error(b));
  CHECK_EQ_INT(st_buffer_release(b), ST_OK);
  st_handoff_t *h = NULL;
  CHECK_ERR(st_handoff_open(cli, "hold_h", &h), ST_ERR_NOT_FOUND);
  CHECK_RC(st_buffer_close(b), ST_OK, cli);
  CHECK_RC(st_buffer_unlink(cli, "hold_b"), ST_OK, cli);
  /* the lease went: so did the object's bytes once the cache lets go */
  CHECK_RC(st_client_invalidate_endpoint(cli, "lin", NULL), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

int main(void) {
  stt_server_setup(&srv, "workers = 1,", endpoints);
  cli = stt_client_open(srv.socket);
  if (!cli) return 1;
  baseline = hk_figures(cli, srv.pid, "cpu");
  RUN(a_killed_connection_gives_back_everything_it_held);
  st_client_close(cli);
  return stt_server_finish(&srv);
}
