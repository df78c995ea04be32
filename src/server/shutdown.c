/* src/server: a graceful shutdown (SIGTERM, SIGINT, st__server_request_stop):
 * stop accepting, let the calls in flight finish within shutdown_grace_s,
 * cancel what is left, then stop the loop (server.h). Loop thread only.
 */
#include "common/log.h"
#include "server/server.h"
#include "server/work.h"

/* Shutdown deadline. First expiry: the grace period is over, so the calls
 * still running are cancelled (they answer CANCELLED within moments: the
 * Lua hook and st.sleep check the flag); second expiry, one second later:
 * stop whatever is left. */
static void on_grace(struct ev_loop *loop, ev_timer *w, int revents) {
  st__server_t *srv = w->data;
  (void)revents;
  size_t left = srv->workers ? st__workers_outstanding(srv->workers, -1) : 0;
  if (!srv->grace_expired) {
    srv->grace_expired = 1;
    ST_LOG_W("server", "%zu calls still running after %.1f s: cancelling them", left,
             srv->cfg->shutdown_grace_s);
    if (srv->workers) st__workers_cancel_all(srv->workers);
    st__builds_cancel_waiting(srv);
    ev_timer_set(&srv->grace, 1.0, 0.);
    ev_timer_start(loop, &srv->grace);
    return;
  }
  ST_LOG_W("server", "%zu cancelled calls did not stop within 1 s: stopping without them",
           left);
  srv->stopped = 1;
  ev_break(loop, EVBREAK_ALL);
}

/* Prepares the grace timer (not started). Loop thread, at start. */
void st__shutdown_init(st__server_t *srv) {
  ev_init(&srv->grace, on_grace);
  srv->grace.data = srv;
}

/* Ends a shutdown once no call is in flight: the loop checks before each
 * poll. Loop thread. */
void st__server_check_drained(st__server_t *srv) {
  if (!srv->shutting_down || srv->stopped) return;
  if (srv->workers && st__workers_outstanding(srv->workers, -1) > 0) return;
  ev_timer_stop(srv->loop, &srv->grace);
  ST_LOG_I("server", "in-flight calls finished");
  srv->stopped = 1;
  ev_break(srv->loop, EVBREAK_ALL);
}

/* SIGTERM/SIGINT; see server.h. Loop thread. */
void st__server_shutdown(st__server_t *srv, const char *why) {
  if (srv->shutting_down) {
    ST_LOG_W("server", "%s again: stopping now", why);
    if (srv->workers) st__workers_cancel_all(srv->workers);
    srv->stopped = 1;
    ev_break(srv->loop, EVBREAK_ALL);
    return;
  }
  srv->shutting_down = 1;
  st__notify("STOPPING=1\nSTATUS=stopping: %s", why);
  st__listen_close_all(srv);
  size_t left = srv->workers ? st__workers_outstanding(srv->workers, -1) : 0;
  if (left == 0) {
    ST_LOG_I("server", "%s: shutting down", why);
    srv->stopped = 1;
    ev_break(srv->loop, EVBREAK_ALL);
    return;
  }
  ST_LOG_I("server", "%s: shutting down; waiting up to %.1f s for %zu in-flight calls", why,
           srv->cfg->shutdown_grace_s, left);
  ev_timer_set(&srv->grace, srv->cfg->shutdown_grace_s, 0.);
  ev_timer_start(srv->loop, &srv->grace);
}
