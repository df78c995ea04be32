/* tls.c over a socketpair: the cluster key's handshake and bytes both
 * ways, a different key refused on both ends, a client that offers TLS 1.2
 * at most refused, and the key file's checks. */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "fixture.h"
#include "peer/ssl_api.h"
#include "peer/tls.h"
#include "st/errors.h"

static char dir[256];

static void key_file(const char *name, const char *text, mode_t mode, char *path, size_t len) {
  snprintf(path, len, "%s/%s", dir, name);
  stt_write_file(path, text);
  chmod(path, mode);
}

static const char HEX_A[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n";
static const char HEX_B[] = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100\n";

/* Runs both handshakes to their end: 0 both done, else -1 with the two
 * errors. */
static int handshake_pair(st__tls_t *s, st__tls_t *c, int sfd, int cfd, char *es, char *ec) {
  int rs = ST__TLS_WANT_READ, rc = ST__TLS_WANT_READ;
  for (int i = 0; i < 1000 && (rs > 0 || rc > 0); i++) {
    if (rc > 0) rc = st__tls_handshake(c, ec, 512);
    if (rs > 0) rs = st__tls_handshake(s, es, 512);
    struct pollfd pf[2] = {{sfd, POLLIN, 0}, {cfd, POLLIN, 0}};
    if (rs > 0 || rc > 0) poll(pf, 2, 10);
  }
  return rs == ST__TLS_OK && rc == ST__TLS_OK ? 0 : -1;
}

TEST(cluster_key_handshake_and_bytes) {
  char ka[400], es[512] = "", ec[512] = "";
  key_file("a.key", HEX_A, 0600, ka, sizeof ka);
  st__tls_conf_t conf = {.secret = ka, .owner = geteuid()};
  st__tls_ctx_t *ctx = NULL;
  CHECK(st__tls_ctx_new(&conf, &ctx, es, sizeof es) == ST_OK);
  CHECK_STR_EQ(st__tls_ctx_mode(ctx), "psk");
  int sv[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
  st__tls_t *s = st__tls_new(ctx, sv[0], 1, es, sizeof es);
  st__tls_t *c = st__tls_new(ctx, sv[1], 0, ec, sizeof ec);
  CHECK(handshake_pair(s, c, sv[0], sv[1], es, ec) == 0);
  /* 1 MiB from the client, read back on the server side. */
  size_t total = 1 << 20, sent = 0, got = 0, n;
  char *buf = malloc(total), *in = malloc(total);
  for (size_t i = 0; i < total; i++) buf[i] = (char)(i * 7);
  for (int i = 0; i < 100000 && got < total; i++) {
    if (sent < total) {
      int r = st__tls_write(c, buf + sent, total - sent, &n, ec, sizeof ec);
      CHECK(r != ST__TLS_ERROR);
      if (r == ST__TLS_OK) sent += n;
    } else {
      st__tls_flush(c, ec, sizeof ec);
    }
    int r = st__tls_read(s, in + got, total - got, &n, es, sizeof es);
    CHECK(r != ST__TLS_ERROR && r != ST__TLS_CLOSED);
    if (r == ST__TLS_OK) got += n;
    if (r == ST__TLS_ERROR || r == ST__TLS_CLOSED) break;
  }
  CHECK(got == total && memcmp(buf, in, total) == 0);
  free(buf);
  free(in);
  st__tls_free(c);
  close(sv[1]);
  /* The peer gone: the server's read says so. */
  int r = ST__TLS_WANT_READ;
  for (int i = 0; i < 100 && r == ST__TLS_WANT_READ; i++) {
    char b[64];
    r = st__tls_read(s, b, sizeof b, &n, es, sizeof es);
  }
  CHECK(r == ST__TLS_CLOSED);
  st__tls_free(s);
  close(sv[0]);
  st__tls_ctx_free(ctx);
}

TEST(different_keys_refused_on_both_ends) {
  char ka[400], kb[400], es[512] = "", ec[512] = "";
  key_file("a.key", HEX_A, 0600, ka, sizeof ka);
  key_file("b.key", HEX_B, 0600, kb, sizeof kb);
  st__tls_conf_t ca = {.secret = ka, .owner = geteuid()}, cb = {.secret = kb, .owner = geteuid()};
  st__tls_ctx_t *xa = NULL, *xb = NULL;
  CHECK(st__tls_ctx_new(&ca, &xa, es, sizeof es) == ST_OK);
  CHECK(st__tls_ctx_new(&cb, &xb, es, sizeof es) == ST_OK);
  int sv[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
  st__tls_t *s = st__tls_new(xa, sv[0], 1, es, sizeof es);
  st__tls_t *c = st__tls_new(xb, sv[1], 0, ec, sizeof ec);
  CHECK(handshake_pair(s, c, sv[0], sv[1], es, ec) != 0);
  CHECK(strstr(es, "cluster key"));
  CHECK(strstr(ec, "TLS handshake failed"));
  st__tls_free(s);
  st__tls_free(c);
  close(sv[0]);
  close(sv[1]);
  st__tls_ctx_free(xa);
  st__tls_ctx_free(xb);
}

#ifdef ST_HAVE_TLS
/* A TLS 1.2-only client, blocking, on its own thread. */
static void *tls12_client(void *arg) {
  int fd = *(int *)arg;
  const st__ssl_api_t *a = st__ssl_api(NULL, 0);
  SSL_CTX *ctx = a->SSL_CTX_new(a->TLS_method());
  a->SSL_CTX_ctrl(ctx, SSL_CTRL_SET_MIN_PROTO_VERSION, TLS1_2_VERSION, NULL);
  a->SSL_CTX_ctrl(ctx, SSL_CTRL_SET_MAX_PROTO_VERSION, TLS1_2_VERSION, NULL);
  SSL *ssl = a->SSL_new(ctx);
  a->SSL_set_fd(ssl, fd);
  long ok = a->SSL_connect(ssl) == 1;
  a->SSL_free(ssl);
  a->SSL_CTX_free(ctx);
  return (void *)ok;
}

TEST(tls12_client_refused) {
  char ka[400], es[512] = "";
  key_file("a.key", HEX_A, 0600, ka, sizeof ka);
  st__tls_conf_t conf = {.secret = ka, .owner = geteuid()};
  st__tls_ctx_t *ctx = NULL;
  CHECK(st__tls_ctx_new(&conf, &ctx, es, sizeof es) == ST_OK);
  int sv[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  fcntl(sv[0], F_SETFL, O_NONBLOCK);
  pthread_t th;
  pthread_create(&th, NULL, tls12_client, &sv[1]);
  st__tls_t *s = st__tls_new(ctx, sv[0], 1, es, sizeof es);
  int r = ST__TLS_WANT_READ;
  for (int i = 0; i < 500 && r > 0; i++) {
    r = st__tls_handshake(s, es, sizeof es);
    struct pollfd pf = {sv[0], POLLIN, 0};
    if (r > 0) poll(&pf, 1, 10);
  }
  CHECK(r == ST__TLS_ERROR);
  CHECK(strstr(es, "TLS 1.3 is required"));
  st__tls_free(s);
  close(sv[0]);
  void *ok;
  pthread_join(th, &ok);
  CHECK(ok == NULL);
  close(sv[1]);
  st__tls_ctx_free(ctx);
}
#endif

TEST(key_file_checks) {
  unsigned char key[ST__TLS_KEY_MAX];
  size_t len = 0;
  char path[400], err[512];
  key_file("ok.key", HEX_A, 0600, path, sizeof path);
  CHECK(st__tls_read_key(path, geteuid(), key, &len, err, sizeof err) == ST_OK);
  CHECK_EQ_INT(len, 32);
  CHECK(key[0] == 0x00 && key[1] == 0x11 && key[31] == 0xff);
  key_file("open.key", HEX_A, 0644, path, sizeof path);
  CHECK(st__tls_read_key(path, geteuid(), key, &len, err, sizeof err) == ST_ERR_CONFIGURATION);
  CHECK(strstr(err, "mode 0644"));
  key_file("ok2.key", HEX_A, 0600, path, sizeof path);
  CHECK(st__tls_read_key(path, geteuid() + 1, key, &len, err, sizeof err) ==
        ST_ERR_CONFIGURATION);
  CHECK(strstr(err, "belongs to uid"));
  key_file("short.key", "0011223344\n", 0600, path, sizeof path);
  CHECK(st__tls_read_key(path, geteuid(), key, &len, err, sizeof err) == ST_ERR_CONFIGURATION);
  CHECK(strstr(err, "hex digits"));
  key_file("raw.key", "this is a key of thirty-two+ raw bytes!", 0600, path, sizeof path);
  CHECK(st__tls_read_key(path, geteuid(), key, &len, err, sizeof err) == ST_OK);
  CHECK_EQ_INT(len, strlen("this is a key of thirty-two+ raw bytes!"));
  CHECK(st__tls_read_key(dir, geteuid(), key, &len, err, sizeof err) == ST_ERR_CONFIGURATION);
  CHECK(strstr(err, "not a regular file"));
  /* No trust configured at all. */
  st__tls_conf_t none = {0};
  st__tls_ctx_t *ctx = NULL;
  CHECK(st__tls_ctx_new(&none, &ctx, err, sizeof err) == ST_ERR_CONFIGURATION);
  CHECK(strstr(err, "peer.listen needs peer.secret or peer.tls"));
}

int main(void) {
  char why[512];
  if (!st__ssl_api(why, sizeof why)) stt_skip(why);
  snprintf(dir, sizeof dir, "/tmp/st-tls-XXXXXX");
  if (!mkdtemp(dir)) return 1;
  RUN(cluster_key_handshake_and_bytes);
  RUN(different_keys_refused_on_both_ends);
#ifdef ST_HAVE_TLS
  RUN(tls12_client_refused);
#endif
  RUN(key_file_checks);
  stt_remove_tree(dir);
  return stt_summary();
}
