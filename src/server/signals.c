/* src/server: signals, as libev watchers on the loop thread.
 *   SIGTERM, SIGINT  graceful shutdown (a second one stops at once)
 *   SIGHUP           reload the endpoints (a new generation)
 *   SIGPIPE          ignored; every send also passes MSG_NOSIGNAL
 * Worker threads block every signal (engine/workers.c), so the handlers only
 * ever run on the loop thread.
 */
#include <signal.h>

#include "common/log.h"
#include "server/server.h"

static void on_stop_signal(struct ev_loop *loop, ev_signal *w, int revents) {
  st__server_t *srv = w->data;
  (void)loop;
  (void)revents;
  st__server_shutdown(srv, w->signum == SIGINT ? "SIGINT" : "SIGTERM");
}

static void on_hup(struct ev_loop *loop, ev_signal *w, int revents) {
  st__server_t *srv = w->data;
  (void)loop;
  (void)revents;
  ST_LOG_I("signal", "SIGHUP: reloading endpoints from %s", srv->cfg->endpoints_dir);
  st__server_reload(srv, NULL, 0, 0);
}

/* Starts the signal watchers and ignores SIGPIPE. Loop thread. */
void st__signals_start(st__server_t *srv) {
  signal(SIGPIPE, SIG_IGN);
  ev_signal_init(&srv->sig_term, on_stop_signal, SIGTERM);
  ev_signal_init(&srv->sig_int, on_stop_signal, SIGINT);
  ev_signal_init(&srv->sig_hup, on_hup, SIGHUP);
  srv->sig_term.data = srv->sig_int.data = srv->sig_hup.data = srv;
  ev_signal_start(srv->loop, &srv->sig_term);
  ev_signal_start(srv->loop, &srv->sig_int);
  ev_signal_start(srv->loop, &srv->sig_hup);
}

/* Stops the signal watchers. Loop thread. */
void st__signals_stop(st__server_t *srv) {
  ev_signal_stop(srv->loop, &srv->sig_term);
  ev_signal_stop(srv->loop, &srv->sig_int);
  ev_signal_stop(srv->loop, &srv->sig_hup);
}
