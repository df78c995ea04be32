/* The peer channel end to end (docs/multihost.md, "Peers and the
 * channel"): two and three stservers on loopback, each in its own
 * directory with its own peer.id, listening on 127.0.0.1:0. Links come up
 * with a cluster key and with certificates; a wrong key, a peer not
 * listed, a certificate naming another id are refused with the reason in
 * `peers`, and both servers serve on; a listener without trust and a key
 * file others can read stop the start; a non-peer method on the TCP port
 * closes the link; a killed peer comes back; descriptors return to their
 * count; a peer named by a host name that resolves slowly never holds
 * the loop. */
#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "peer/tls.h"
#include "peer_kit.h"

static const char *bin;

TEST(psk_links_up_and_come_back) {
  stt_server_t a, b, c;
  stt_server_init(&a);
  stt_server_init(&b);
  stt_server_init(&c);
  char key[400];
  make_key(a.dir, "cluster.key", key, sizeof key);
  CHECK(start_pair(&a, &b, key, key, "b = {}, c = {}", "b") == 0);
  CHECK(wait_peer(&a, "b", "up", NULL));
  CHECK(wait_peer(&b, "a", "up", NULL));
  /* A third server dials both. */
  char aa[128], ba[128];
  listen_addr(&a, aa, sizeof aa);
  listen_addr(&b, ba, sizeof ba);
  peer_config(&b, "peer = { id = 'b', listen = '%s', secret = '%s', peers = { a = '%s', c = {} } },",
              ba, key, aa);
  /* b restarts on the port it had, now also accepting c. */
  CHECK(stt_server_stop(&b) == 0);
  CHECK(stt_server_start(&b) == 0);
  peer_config(&c, "peer = { id = 'c', secret = '%s', peers = { a = '%s', b = '%s' } },", key, aa,
              ba);
  CHECK(stt_server_start(&c) == 0);
  CHECK(wait_peer(&c, "a", "up", NULL));
  CHECK(wait_peer(&c, "b", "up", NULL));
  CHECK(wait_peer(&a, "c", "up", NULL));
  CHECK(wait_peer(&b, "c", "up", NULL));
  CHECK(wait_peer(&a, "b", "up", NULL));
  /* fds with every link up, then b killed and started again. */
  int fds0 = settled_fds(a.pid);
  kill(b.pid, SIGKILL);
  waitpid(b.pid, NULL, 0);
  b.pid = 0;
  CHECK(wait_peer(&a, "b", "down", NULL));
  CHECK(serves(&a));
  CHECK(stt_server_start(&b) == 0);
  CHECK(wait_peer(&a, "b", "up", NULL));
  CHECK(wait_peer(&b, "a", "up", NULL));
  CHECK(wait_peer(&c, "b", "up", NULL));
  /* The closed links' descriptors are gone. */
  CHECK_EQ_INT(settled_fds(a.pid), fds0);
  CHECK(stt_server_stop(&c) == 0);
  CHECK(stt_server_stop(&b) == 0);
  CHECK(stt_server_stop(&a) == 0);
  stt_server_cleanup(&c);
  stt_server_cleanup(&b);
  stt_server_cleanup(&a);
}

TEST(wrong_key_refused_both_serve) {
  stt_server_t a, b;
  stt_server_init(&a);
  stt_server_init(&b);
  char ka[400], kb[400];
  make_key(a.dir, "a.key", ka, sizeof ka);
  make_key(b.dir, "b.key", kb, sizeof kb);
  CHECK(start_pair(&a, &b, ka, kb, "b = {}", "b") == 0);
  CHECK(wait_peer(&b, "a", "refused", "cluster key"));
  /* a refused the link: counted in info. */
  OPEN_RC(c, a.socket);
  double end = stt_now_ms() + 10000;
  while (rc_info_int(&c, "peer.refused") < 1 && stt_now_ms() < end) stt_sleep_ms(20);
  CHECK(rc_info_int(&c, "peer.refused") >= 1);
  rc_close(&c);
  char st[4096], err[4096];
  CHECK(peer_entry(&a, "b", st, err, sizeof st) == 0);
  CHECK(strcmp(st, "up") != 0);
  CHECK(serves(&a));
  CHECK(serves(&b));
  char *log = stt_server_log(&a);
  CHECK(log && strstr(log, "cluster key differs"));
  free(log);
  CHECK(stt_server_stop(&b) == 0);
  CHECK(stt_server_stop(&a) == 0);
  stt_server_cleanup(&b);
  stt_server_cleanup(&a);
}

TEST(unlisted_peer_refused) {
  stt_server_t a, b;
  stt_server_init(&a);
  stt_server_init(&b);
  char key[400];
  make_key(a.dir, "k", key, sizeof key);
  CHECK(start_pair(&a, &b, key, key, "c = {}", "b") == 0);
  CHECK(wait_peer(&b, "a", "refused", "'b' is not a peer of server 'a'"));
  CHECK(serves(&a));
  CHECK(serves(&b));
  CHECK(stt_server_stop(&b) == 0);
  CHECK(stt_server_stop(&a) == 0);
  stt_server_cleanup(&b);
  stt_server_cleanup(&a);
}

/* stserver with config text; its exit code, stderr in p. */
static int run_config(stt_proc_t *p, const stt_server_t *s, const char *peer) {
  char path[400], text[2000];
  snprintf(path, sizeof path, "%s/refused.lua", s->dir);
  snprintf(text, sizeof text, "return { base_path = '%s', endpoints = '%s', %s }", s->base,
           s->endpoints, peer);
  stt_write_file(path, text);
  return stt_run(p, bin, (const char *const[]){"--config", path, NULL}, NULL, 0);
}

TEST(bad_trust_stops_the_start) {
  stt_server_t s;
  stt_server_init(&s);
  stt_proc_t p;
  CHECK(run_config(&p, &s, "peer = { id = 'a', listen = '127.0.0.1:0' }") != 0);
  CHECK(strstr(p.err, "peer.listen needs peer.secret or peer.tls"));
  char key[400], text[800];
  make_key(s.dir, "open.key", key, sizeof key);
  chmod(key, 0644);
  snprintf(text, sizeof text, "peer = { id = 'a', listen = '127.0.0.1:0', secret = '%s' }", key);
  CHECK(run_config(&p, &s, text) != 0);
  CHECK(strstr(p.err, "mode 0644"));
  /* --check says the same, and whether TLS loads. */
  char path[400];
  snprintf(path, sizeof path, "%s/refused.lua", s.dir);
  CHECK(stt_run(&p, bin, (const char *const[]){"--config", path, "--check", NULL}, NULL, 0) != 0);
  CHECK(strstr(p.err, "mode 0644"));
  CHECK(strstr(p.out, "tls: "));
  stt_server_cleanup(&s);
}

/* A client of a's port with the cluster key: TLS, then one frame. */
static int tls_connect(const char *addr, const char *key, st__tls_ctx_t **ctx, st__tls_t **t) {
  char host[64];
  int port;
  if (sscanf(addr, "%63[^:]:%d", host, &port) != 2) return -1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, host, &sa.sin_addr);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) return -1;
  char err[512];
  st__tls_conf_t tc = {.secret = key, .owner = geteuid()};
  if (st__tls_ctx_new(&tc, ctx, err, sizeof err) != ST_OK) return -1;
  *t = st__tls_new(*ctx, fd, 0, err, sizeof err);
  for (int i = 0; i < 500; i++) {
    int r = st__tls_handshake(*t, err, sizeof err);
    if (r == ST__TLS_OK) return fd;
    if (r == ST__TLS_ERROR) break;
    struct pollfd pf = {fd, r == ST__TLS_WANT_WRITE ? POLLOUT : POLLIN, 0};
    poll(&pf, 1, 20);
  }
  return -1;
}

TEST(non_peer_method_closes_the_link) {
  stt_server_t a;
  stt_server_init(&a);
  char key[400];
  make_key(a.dir, "k", key, sizeof key);
  peer_config(&a, "peer = { id = 'a', listen = '127.0.0.1:0', secret = '%s', peers = { b = {} }, "
              "connect_timeout_s = 1 },", key);
  CHECK(stt_server_start(&a) == 0);
  int fds0 = settled_fds(a.pid);
  char addr[128];
  listen_addr(&a, addr, sizeof addr);
  st__tls_ctx_t *ctx = NULL;
  st__tls_t *t = NULL;
  int fd = tls_connect(addr, key, &ctx, &t);
  CHECK(fd >= 0);
  if (fd >= 0) {
    mpbuf_t b;
    mpbuf_init(&b);
    stt_pack(&b.pk, "[0, 1, 'ping', []]");
    size_t n;
    char err[512], buf[4096];
    CHECK(st__tls_write(t, b.sb.data, b.sb.size, &n, err, sizeof err) == ST__TLS_OK);
    mpbuf_free(&b);
    int r = ST__TLS_WANT_READ;
    double end = stt_now_ms() + 10000;
    while (stt_now_ms() < end) {
      r = st__tls_read(t, buf, sizeof buf, &n, err, sizeof err);
      if (r == ST__TLS_CLOSED || r == ST__TLS_ERROR) break;
      struct pollfd pf = {fd, POLLIN, 0};
      poll(&pf, 1, 20);
    }
    CHECK(r == ST__TLS_CLOSED || r == ST__TLS_ERROR);
    st__tls_free(t);
    close(fd);
  }
  st__tls_ctx_free(ctx);
  char *log = stt_server_log(&a);
  CHECK(log && strstr(log, "only peer_* methods are served on the peer port"));
  free(log);
  /* Plain bytes, not TLS: closed too (by the handshake's deadline, when
   * they look like the start of a long record). */
  fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  char host[64];
  int port = 0;
  sscanf(addr, "%63[^:]:%d", host, &port);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, host, &sa.sin_addr);
  CHECK(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
  mpbuf_t b;
  mpbuf_init(&b);
  stt_pack(&b.pk, "[0, 1, 'ping', []]");
  CHECK(send(fd, b.sb.data, b.sb.size, MSG_NOSIGNAL) == (ssize_t)b.sb.size);
  mpbuf_free(&b);
  char buf[256];
  struct pollfd pf = {fd, POLLIN, 0};
  CHECK(poll(&pf, 1, 10000) == 1);
  ssize_t k;
  while ((k = recv(fd, buf, sizeof buf, 0)) > 0) {
  }
  CHECK(k == 0 || k < 0);
  close(fd);
  CHECK(serves(&a));
  CHECK_EQ_INT(settled_fds(a.pid), fds0);
  CHECK(stt_server_stop(&a) == 0);
  stt_server_cleanup(&a);
}

/* The longest ping of server s over `ms` milliseconds of back-to-back
 * pings on one connection; -1 when one failed. */
static double longest_ping(const stt_server_t *s, double ms) {
  int fd = stt_connect(s->socket);
  if (fd < 0) return -1;
  double worst = 0, end = stt_now_ms() + ms;
  for (uint32_t id = 1; stt_now_ms() < end; id++) {
    double t0 = stt_now_ms();
    if (stt_ping(fd, id) != 0) {
      close(fd);
      return -1;
    }
    double dt = stt_now_ms() - t0;
    if (dt > worst) worst = dt;
    stt_sleep_ms(5);
  }
  close(fd);
  return worst;
}

/* A peer named by host name, behind a DNS server that takes 2 s per
 * answer (the fault shim's ST_FAULT_GAI_DELAY_MS): the link comes up
 * through the name, and while the peer is gone and every redial waits
 * for the name, the server answers pings within a fraction of that (the
 * resolution runs off the loop; before, each redial held the loop 2 s). */
TEST(a_slow_host_name_never_stalls_the_loop) {
  const char *shim = getenv("ST_FAULT_LIB");
  if (!shim) {
    fprintf(stderr, "   ST_FAULT_LIB not set: not tested\n");
    return;
  }
  /* Listen where "localhost" points first for this host. */
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
  CHECK(getaddrinfo("localhost", "1", &hints, &res) == 0 && res);
  if (!res) return;
  const char *listen = res->ai_family == AF_INET6 ? "[::1]:0" : "127.0.0.1:0";
  freeaddrinfo(res);
  stt_server_t a, b;
  stt_server_init(&a);
  stt_server_init(&b);
  char key[400], addr[128];
  make_key(a.dir, "k", key, sizeof key);
  peer_config(&a, "peer = { id = 'a', listen = '%s', secret = '%s', peers = { b = {} } },", listen,
              key);
  CHECK(stt_server_start(&a) == 0);
  listen_addr(&a, addr, sizeof addr);
  const char *port = strrchr(addr, ':');
  CHECK(port != NULL);
  peer_config(&b, "peer = { id = 'b', secret = '%s', peers = { a = 'localhost%s' } },", key,
              port ? port : ":1");
  setenv("LD_PRELOAD", shim, 1);
  setenv("ST_FAULT_GAI_DELAY_MS", "2000", 1);
  int started = stt_server_start(&b);
  unsetenv("LD_PRELOAD");
  unsetenv("ST_FAULT_GAI_DELAY_MS");
  CHECK(started == 0);
  /* Resolving: b serves meanwhile, then the link comes up by the name. */
  double during_start = longest_ping(&b, 1000);
  CHECK(during_start >= 0 && during_start < 1000);
  CHECK(wait_peer(&b, "a", "up", NULL));
  /* a goes: b redials every backoff, each dial waiting 2 s for the name. */
  kill(a.pid, SIGKILL);
  waitpid(a.pid, NULL, 0);
  a.pid = 0;
  CHECK(wait_peer(&b, "a", "down", NULL) || wait_peer(&b, "a", "connecting", NULL));
  double during_redials = longest_ping(&b, 5000);
  fprintf(stderr, "   longest ping: %.1f ms while starting, %.1f ms while redialling\n",
          during_start, during_redials);
  CHECK(during_redials >= 0 && during_redials < 1000);
  char *log = stt_server_log(&b);
  CHECK(log && strstr(log, "fatal") == NULL);
  free(log);
  CHECK(stt_server_stop(&b) == 0);
  stt_server_cleanup(&b);
  stt_server_cleanup(&a);
}

/* openssl: a CA and a certificate for `cn` signed by it. */
static int sh(const char *cmd) {
  stt_proc_t p;
  int rc = stt_run(&p, "/bin/sh", (const char *const[]){"-c", cmd, NULL}, NULL, 0);
  if (rc != 0) fprintf(stderr, "%s: %s\n", cmd, p.err);
  return rc;
}

static int make_cert(const char *dir, const char *name, const char *cn) {
  char cmd[2000];
  snprintf(cmd, sizeof cmd,
           "cd %s && openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
           "-keyout %s.key -subj /CN=%s -out %s.csr 2>/dev/null && "
           "printf 'subjectAltName=DNS:%s\\n' > %s.ext && "
           "openssl x509 -req -in %s.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
           "-extfile %s.ext -out %s.pem 2>/dev/null && chmod 600 %s.key",
           dir, name, cn, name, cn, name, name, name, name, name);
  return sh(cmd);
}

TEST(certificates) {
  if (sh("command -v openssl >/dev/null") != 0) {
    fprintf(stderr, "openssl not installed: certificates not tested\n");
    return;
  }
  stt_server_t a, b;
  stt_server_init(&a);
  stt_server_init(&b);
  char cmd[1200];
  snprintf(cmd, sizeof cmd,
           "cd %s && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
           "-keyout ca.key -subj /CN=test-ca -days 2 -out ca.pem 2>/dev/null", a.dir);
  CHECK(sh(cmd) == 0);
  CHECK(make_cert(a.dir, "a", "a") == 0);
  CHECK(make_cert(a.dir, "b", "b") == 0);
  CHECK(make_cert(a.dir, "x", "x") == 0);
  const char *d = a.dir;
  peer_config(&a, "peer = { id = 'a', listen = '127.0.0.1:0', tls = { cert = '%s/a.pem', "
              "key = '%s/a.key', ca = '%s/ca.pem' }, peers = { b = {} } },", d, d, d);
  CHECK(stt_server_start(&a) == 0);
  char addr[128];
  listen_addr(&a, addr, sizeof addr);
  peer_config(&b, "peer = { id = 'b', tls = { cert = '%s/b.pem', key = '%s/b.key', "
              "ca = '%s/ca.pem' }, peers = { a = '%s' } },", d, d, d, addr);
  CHECK(stt_server_start(&b) == 0);
  CHECK(wait_peer(&b, "a", "up", NULL));
  CHECK(wait_peer(&a, "b", "up", NULL));
  CHECK(stt_server_stop(&b) == 0);
  /* b with a certificate that names x: refused. */
  peer_config(&b, "peer = { id = 'b', tls = { cert = '%s/x.pem', key = '%s/x.key', "
              "ca = '%s/ca.pem' }, peers = { a = '%s' } },", d, d, d, addr);
  CHECK(stt_server_start(&b) == 0);
  CHECK(wait_peer(&b, "a", "refused", "does not name 'b'"));
  CHECK(serves(&a));
  CHECK(stt_server_stop(&b) == 0);
  CHECK(stt_server_stop(&a) == 0);
  stt_server_cleanup(&b);
  stt_server_cleanup(&a);
}

int main(void) {
  bin = getenv("ST_SERVER_BIN");
  if (!bin) stt_skip("ST_SERVER_BIN is not set");
  char why[256];
  st__tls_conf_t none = {0};
  st__tls_ctx_t *ctx = NULL;
  none.secret = "/nonexistent";
  if (st__tls_ctx_new(&none, &ctx, why, sizeof why) == ST_ERR_CAPABILITY) stt_skip(why);
  RUN(psk_links_up_and_come_back);
  RUN(wrong_key_refused_both_serve);
  RUN(unlisted_peer_refused);
  RUN(bad_trust_stops_the_start);
  RUN(non_peer_method_closes_the_link);
  RUN(certificates);
  RUN(a_slow_host_name_never_stalls_the_loop);
  return stt_summary();
}
