/* src/peer/tls.c: TLS 1.3 for the peer channel (tls.h). The SSL object
 * reads from and writes to two memory BIOs; this file moves their bytes
 * to and from the socket with recv and send(MSG_NOSIGNAL), so OpenSSL
 * never touches the descriptor and a caller sees only "want read" and
 * "want write". */
#include "peer/tls.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "peer/ssl_api.h"
#include "st/errors.h"

/* Ciphertext queued past this makes st__tls_write answer WANT_WRITE. */
#define OUT_HIGH (256u << 10)
/* Plaintext taken by one SSL_write. */
#define WRITE_CHUNK (64u << 10)
/* The largest key file read. */
#define KEY_FILE_MAX 4096

static int hexval(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* See tls.h. */
int st__tls_read_key(const char *path, uid_t owner, unsigned char key[ST__TLS_KEY_MAX],
                     size_t *len, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    snprintf(err, errlen, "peer.secret: cannot open the key file %s: %s", path, strerror(errno));
    return ST_ERR_CONFIGURATION;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "peer.secret: %s is not a regular file", path);
    close(fd);
    return ST_ERR_CONFIGURATION;
  }
  if (st.st_uid != owner) {
    snprintf(err, errlen, "peer.secret: the key file %s belongs to uid %u, not to this server's "
             "uid %u (chown it)", path, (unsigned)st.st_uid, (unsigned)owner);
    close(fd);
    return ST_ERR_CONFIGURATION;
  }
  if (st.st_mode & 077) {
    snprintf(err, errlen, "peer.secret: the key file %s has mode %04o: group and others must have "
             "no access (chmod 600 %s)", path, (unsigned)(st.st_mode & 07777), path);
    close(fd);
    return ST_ERR_CONFIGURATION;
  }
  unsigned char buf[KEY_FILE_MAX + 1];
  size_t n = 0;
  while (n < sizeof buf) {
    ssize_t k = read(fd, buf + n, sizeof buf - n);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      snprintf(err, errlen, "peer.secret: cannot read %s: %s", path, strerror(errno));
      close(fd);
      explicit_bzero(buf, sizeof buf);
      return ST_ERR_IO;
    }
    if (k == 0) break;
    n += (size_t)k;
  }
  close(fd);
  int rc = ST_OK;
  if (n > KEY_FILE_MAX) {
    snprintf(err, errlen, "peer.secret: %s is larger than %d bytes: not a key file", path,
             KEY_FILE_MAX);
    rc = ST_ERR_CONFIGURATION;
    goto out;
  }
  /* Hex when the trimmed text is hex digits only. */
  size_t lo = 0, hi = n;
  while (lo < hi && isspace(buf[lo])) lo++;
  while (hi > lo && isspace(buf[hi - 1])) hi--;
  int hex = hi > lo;
  for (size_t i = lo; hex && i < hi; i++) hex = hexval(buf[i]) >= 0;
  if (hex) {
    size_t digits = hi - lo;
    if (digits % 2 || digits / 2 < ST__TLS_KEY_MIN || digits / 2 > ST__TLS_KEY_MAX) {
      snprintf(err, errlen, "peer.secret: %s holds %zu hex digits; a key is %d to %d bytes "
               "(%d to %d hex digits, an even number; e.g. openssl rand -hex 32)",
               path, digits, ST__TLS_KEY_MIN, ST__TLS_KEY_MAX, 2 * ST__TLS_KEY_MIN,
               2 * ST__TLS_KEY_MAX);
      rc = ST_ERR_CONFIGURATION;
      goto out;
    }
    for (size_t i = 0; i < digits / 2; i++)
      key[i] = (unsigned char)(hexval(buf[lo + 2 * i]) << 4 | hexval(buf[lo + 2 * i + 1]));
    *len = digits / 2;
  } else {
    if (n < ST__TLS_KEY_MIN || n > ST__TLS_KEY_MAX) {
      snprintf(err, errlen, "peer.secret: %s holds %zu bytes; a key is %d to %d random bytes "
               "(e.g. openssl rand 32)", path, n, ST__TLS_KEY_MIN, ST__TLS_KEY_MAX);
      rc = ST_ERR_CONFIGURATION;
      goto out;
    }
    memcpy(key, buf, n);
    *len = n;
  }
out:
  explicit_bzero(buf, sizeof buf);
  return rc;
}

#ifdef ST_HAVE_TLS

struct st__tls_ctx {
  const st__ssl_api_t *a;
  SSL_CTX *ctx;
  int psk;
  size_t keylen;
  unsigned char key[ST__TLS_KEY_MAX];
};

struct st__tls {
  st__tls_ctx_t *ctx;
  SSL *ssl;
  BIO *rb, *wb;              /* owned by ssl */
  int fd;
  int eof;                   /* recv returned 0 */
  char *out;                 /* ciphertext not yet sent: [off, len) */
  size_t off, len, cap;
  int psk_unknown;           /* the peer offered another PSK identity */
};

/* TLS_AES_256_GCM_SHA384, by its two-byte code. */
static const unsigned char PSK_CIPHER[2] = {0x13, 0x02};

/* OpenSSL's error queue as "reason; reason", cleared. */
static void ssl_errors(const st__ssl_api_t *a, char *buf, size_t len) {
  size_t used = 0;
  unsigned long e;
  buf[0] = '\0';
  while ((e = a->ERR_get_error()) != 0) {
    char one[256];
    a->ERR_error_string_n(e, one, sizeof one);
    /* "error:0A000086:SSL routines::certificate verify failed": keep the
     * reason after the last colon. */
    const char *r = strrchr(one, ':');
    r = r ? r + 1 : one;
    if (used < len && !strstr(buf, r)) {
      int k = snprintf(buf + used, len - used, "%s%s", used ? "; " : "", r);
      if (k > 0) used += (size_t)k;
    }
  }
}

/* A PSK session holding the cluster key. NULL when out of memory. */
static SSL_SESSION *psk_session(st__tls_t *t, SSL *ssl) {
  const st__ssl_api_t *a = t->ctx->a;
  const SSL_CIPHER *c = a->SSL_CIPHER_find(ssl, PSK_CIPHER);
  SSL_SESSION *s = a->SSL_SESSION_new();
  if (!s || !c) {
    if (s) a->SSL_SESSION_free(s);
    return NULL;
  }
  if (!a->SSL_SESSION_set1_master_key(s, t->ctx->key, t->ctx->keylen) ||
      !a->SSL_SESSION_set_cipher(s, c) || !a->SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION)) {
    a->SSL_SESSION_free(s);
    return NULL;
  }
  return s;
}

/* Accepting side: the session of the identity the peer offers. Another
 * identity gets none, and the handshake then fails (there is no
 * certificate to fall back to). */
static int psk_find(SSL *ssl, const unsigned char *identity, size_t identity_len,
                    SSL_SESSION **sess) {
  *sess = NULL;
  const st__ssl_api_t *a = st__ssl_api(NULL, 0);
  st__tls_t *t = a ? a->SSL_get_ex_data(ssl, 0) : NULL;
  if (!t) return 0;
  if (identity_len != strlen(ST__TLS_PSK_IDENTITY) ||
      memcmp(identity, ST__TLS_PSK_IDENTITY, identity_len) != 0) {
    t->psk_unknown = 1;
    return 1;
  }
  *sess = psk_session(t, ssl);
  return *sess ? 1 : 0;
}

/* Connecting side: offers the cluster key under the fixed identity. */
static int psk_use(SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *idlen,
                   SSL_SESSION **sess) {
  (void)md;
  *sess = NULL;
  const st__ssl_api_t *a = st__ssl_api(NULL, 0);
  st__tls_t *t = a ? a->SSL_get_ex_data(ssl, 0) : NULL;
  if (!t) return 0;
  *sess = psk_session(t, ssl);
  if (!*sess) return 0;
  *id = (const unsigned char *)ST__TLS_PSK_IDENTITY;
  *idlen = strlen(ST__TLS_PSK_IDENTITY);
  return 1;
}

/* See tls.h. */
int st__tls_ctx_new(const st__tls_conf_t *conf, st__tls_ctx_t **out, char *err, size_t errlen) {
  *out = NULL;
  int certs = conf->cert || conf->key || conf->ca;
  if (conf->secret && certs) {
    snprintf(err, errlen, "peer.secret and peer.tls are both set: choose one way to trust peers");
    return ST_ERR_CONFIGURATION;
  }
  if (!conf->secret && !certs) {
    snprintf(err, errlen, "peer.listen needs peer.secret or peer.tls");
    return ST_ERR_CONFIGURATION;
  }
  if (certs && !(conf->cert && conf->key && conf->ca)) {
    snprintf(err, errlen, "peer.tls needs cert, key and ca (missing %s)",
             !conf->cert ? "cert" : !conf->key ? "key" : "ca");
    return ST_ERR_CONFIGURATION;
  }
  char why[512];
  const st__ssl_api_t *a = st__ssl_api(why, sizeof why);
  if (!a) {
    snprintf(err, errlen, "the peer channel needs TLS: %s", why);
    return ST_ERR_CAPABILITY;
  }
  st__tls_ctx_t *c = calloc(1, sizeof *c);
  if (!c) {
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  c->a = a;
  int rc = ST_OK;
  if (conf->secret) {
    c->psk = 1;
    rc = st__tls_read_key(conf->secret, conf->owner, c->key, &c->keylen, err, errlen);
    if (rc != ST_OK) goto fail;
  }
  a->ERR_clear_error();
  c->ctx = a->SSL_CTX_new(a->TLS_method());
  if (!c->ctx) {
    snprintf(err, errlen, "OpenSSL cannot make a context (SSL_CTX_new)");
    rc = ST_ERR_OUT_OF_MEMORY;
    goto fail;
  }
  a->SSL_CTX_ctrl(c->ctx, SSL_CTRL_SET_MIN_PROTO_VERSION, TLS1_3_VERSION, NULL);
  a->SSL_CTX_set_options(c->ctx, SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION);
  a->SSL_CTX_set_num_tickets(c->ctx, 0);
  a->SSL_CTX_ctrl(c->ctx, SSL_CTRL_MODE,
                  SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER, NULL);
  if (c->psk) {
    if (!a->SSL_CTX_set_ciphersuites(c->ctx, "TLS_AES_256_GCM_SHA384")) {
      snprintf(err, errlen, "OpenSSL refuses the cipher TLS_AES_256_GCM_SHA384");
      rc = ST_ERR_CAPABILITY;
      goto fail;
    }
    a->SSL_CTX_set_psk_find_session_callback(c->ctx, psk_find);
    a->SSL_CTX_set_psk_use_session_callback(c->ctx, psk_use);
  } else {
    char why2[512];
    if (a->SSL_CTX_use_certificate_chain_file(c->ctx, conf->cert) != 1) {
      ssl_errors(a, why2, sizeof why2);
      snprintf(err, errlen, "peer.tls.cert: cannot load %s: %s", conf->cert, why2);
      rc = ST_ERR_CONFIGURATION;
      goto fail;
    }
    if (a->SSL_CTX_use_PrivateKey_file(c->ctx, conf->key, SSL_FILETYPE_PEM) != 1) {
      ssl_errors(a, why2, sizeof why2);
      snprintf(err, errlen, "peer.tls.key: cannot load %s: %s", conf->key, why2);
      rc = ST_ERR_CONFIGURATION;
      goto fail;
    }
    if (a->SSL_CTX_check_private_key(c->ctx) != 1) {
      ssl_errors(a, why2, sizeof why2);
      snprintf(err, errlen, "peer.tls.key: %s does not match the certificate %s: %s", conf->key,
               conf->cert, why2);
      rc = ST_ERR_CONFIGURATION;
      goto fail;
    }
    if (a->SSL_CTX_load_verify_locations(c->ctx, conf->ca, NULL) != 1) {
      ssl_errors(a, why2, sizeof why2);
      snprintf(err, errlen, "peer.tls.ca: cannot load %s: %s", conf->ca, why2);
      rc = ST_ERR_CONFIGURATION;
      goto fail;
    }
    a->SSL_CTX_set_verify(c->ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
  }
  *out = c;
  return ST_OK;
fail:
  st__tls_ctx_free(c);
  return rc;
}

/* See tls.h. */
void st__tls_ctx_free(st__tls_ctx_t *c) {
  if (!c) return;
  if (c->ctx) c->a->SSL_CTX_free(c->ctx);
  explicit_bzero(c->key, sizeof c->key);
  free(c);
}

/* See tls.h. */
const char *st__tls_ctx_mode(const st__tls_ctx_t *c) {
  return c->psk ? "psk" : "certificates";
}

/* See tls.h. */
st__tls_t *st__tls_new(st__tls_ctx_t *ctx, int fd, int server, char *err, size_t errlen) {
  const st__ssl_api_t *a = ctx->a;
  st__tls_t *t = calloc(1, sizeof *t);
  if (!t) goto oom;
  t->ctx = ctx;
  t->fd = fd;
  t->ssl = a->SSL_new(ctx->ctx);
  if (!t->ssl) goto oom;
  t->rb = a->BIO_new(a->BIO_s_mem());
  t->wb = a->BIO_new(a->BIO_s_mem());
  if (!t->rb || !t->wb) {
    if (t->rb) a->BIO_free(t->rb);
    if (t->wb) a->BIO_free(t->wb);
    t->rb = t->wb = NULL;
    goto oom;
  }
  /* An empty read BIO means "more later", not the end of the stream. */
  a->BIO_ctrl(t->rb, BIO_C_SET_BUF_MEM_EOF_RETURN, -1, NULL);
  a->BIO_ctrl(t->wb, BIO_C_SET_BUF_MEM_EOF_RETURN, -1, NULL);
  a->SSL_set_bio(t->ssl, t->rb, t->wb);
  a->SSL_set_ex_data(t->ssl, 0, t);
  if (server) a->SSL_set_accept_state(t->ssl);
  else a->SSL_set_connect_state(t->ssl);
  return t;
oom:
  snprintf(err, errlen, "out of memory (TLS connection)");
  st__tls_free(t);
  return NULL;
}

/* See tls.h. */
void st__tls_free(st__tls_t *t) {
  if (!t) return;
  if (t->ssl) t->ctx->a->SSL_free(t->ssl);
  free(t->out);
  free(t);
}

/* Reads what the socket has into the read BIO: 1 bytes came, 0 none yet,
 * 2 the end of the stream, -1 an error (errno). */
static int net_in(st__tls_t *t) {
  char buf[64 << 10];
  for (;;) {
    ssize_t n = recv(t->fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      int w = t->ctx->a->BIO_write(t->rb, buf, (int)n);
      explicit_bzero(buf, (size_t)n);
      return w == (int)n ? 1 : -1;
    }
    if (n == 0) {
      t->eof = 1;
      return 2;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return -1;
  }
}

/* Moves the write BIO's ciphertext to `out` and sends what the socket
 * takes: ST__TLS_OK (all sent), WANT_WRITE, or ERROR. */
static int net_out(st__tls_t *t, char *err, size_t errlen) {
  const st__ssl_api_t *a = t->ctx->a;
  size_t pending = (size_t)a->BIO_ctrl(t->wb, BIO_CTRL_PENDING, 0, NULL);
  if (pending) {
    if (t->off && t->off == t->len) t->off = t->len = 0;
    if (t->len + pending > t->cap) {
      if (t->off) {
        memmove(t->out, t->out + t->off, t->len - t->off);
        t->len -= t->off;
        t->off = 0;
      }
      size_t cap = t->cap ? t->cap : 16384;
      while (cap < t->len + pending) cap *= 2;
      char *p = realloc(t->out, cap);
      if (!p) {
        snprintf(err, errlen, "out of memory (TLS output)");
        return ST__TLS_ERROR;
      }
      t->out = p;
      t->cap = cap;
    }
    int got = a->BIO_read(t->wb, t->out + t->len, (int)pending);
    if (got > 0) t->len += (size_t)got;
  }
  while (t->off < t->len) {
    ssize_t n = send(t->fd, t->out + t->off, t->len - t->off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      t->off += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return ST__TLS_WANT_WRITE;
    snprintf(err, errlen, "send: %s", n < 0 ? strerror(errno) : "nothing sent");
    return ST__TLS_ERROR;
  }
  t->off = t->len = 0;
  return ST__TLS_OK;
}

/* The reason a handshake failed, from OpenSSL's queue, made plain for the
 * common cases. */
static void handshake_error(st__tls_t *t, char *err, size_t errlen) {
  const st__ssl_api_t *a = t->ctx->a;
  char why[512];
  ssl_errors(a, why, sizeof why);
  const char *hint = "";
  if (t->ctx->psk) {
    if (strstr(why, "binder does not verify") || strstr(why, "decrypt error") ||
        strstr(why, "illegal parameter") ||
        strstr(why, "bad record mac"))
      hint = " (the peer's cluster key differs from ours: compare peer.secret on both)";
    else if (t->psk_unknown || strstr(why, "no shared cipher") ||
             strstr(why, "handshake failure"))
      hint = " (the peer offered no cluster key this server knows: is peer.secret set on "
             "both, and not peer.tls on one?)";
  } else if (strstr(why, "certificate verify failed")) {
    long v = a->SSL_get_verify_result(t->ssl);
    snprintf(err, errlen, "TLS handshake failed: the peer's certificate does not verify "
             "against peer.tls.ca: %s", a->X509_verify_cert_error_string(v));
    return;
  }
  if (strstr(why, "unsupported protocol") || strstr(why, "protocol version"))
    hint = " (TLS 1.3 is required)";
  if (!why[0]) snprintf(why, sizeof why, "%s", t->eof ? "the peer closed the connection"
                                                      : "no reason given");
  snprintf(err, errlen, "TLS handshake failed: %s%s", why, hint);
}

/* See tls.h. */
int st__tls_handshake(st__tls_t *t, char *err, size_t errlen) {
  const st__ssl_api_t *a = t->ctx->a;
  for (;;) {
    a->ERR_clear_error();
    int r = a->SSL_do_handshake(t->ssl);
    int e = r == 1 ? SSL_ERROR_NONE : a->SSL_get_error(t->ssl, r);
    /* Whatever the step produced (an alert too) goes out first. */
    int o = net_out(t, err, errlen);
    if (o == ST__TLS_ERROR) return ST__TLS_ERROR;
    if (r == 1) {
      if (a->SSL_version(t->ssl) != TLS1_3_VERSION) {
        snprintf(err, errlen, "TLS handshake failed: TLS 1.3 is required");
        return ST__TLS_ERROR;
      }
      return ST__TLS_OK;
    }
    if (e == SSL_ERROR_WANT_READ) {
      int i = net_in(t);
      if (i == 1) continue;
      if (i == 0) return ST__TLS_WANT_READ;
      if (i == 2) {
        handshake_error(t, err, errlen);
        return ST__TLS_ERROR;
      }
      snprintf(err, errlen, "TLS handshake failed: recv: %s", strerror(errno));
      return ST__TLS_ERROR;
    }
    if (e == SSL_ERROR_WANT_WRITE) return ST__TLS_WANT_WRITE;
    handshake_error(t, err, errlen);
    return ST__TLS_ERROR;
  }
}

/* See tls.h. */
int st__tls_read(st__tls_t *t, void *buf, size_t len, size_t *n, char *err, size_t errlen) {
  const st__ssl_api_t *a = t->ctx->a;
  *n = 0;
  if (len > INT32_MAX) len = INT32_MAX;
  for (;;) {
    a->ERR_clear_error();
    int r = a->SSL_read(t->ssl, buf, (int)len);
    if (r > 0) {
      *n = (size_t)r;
      return net_out(t, err, errlen) == ST__TLS_ERROR ? ST__TLS_ERROR : ST__TLS_OK;
    }
    int e = a->SSL_get_error(t->ssl, r);
    if (e == SSL_ERROR_ZERO_RETURN) return ST__TLS_CLOSED;
    if (e == SSL_ERROR_WANT_READ) {
      if (net_out(t, err, errlen) == ST__TLS_ERROR) return ST__TLS_ERROR;
      int i = net_in(t);
      if (i == 1) continue;
      if (i == 0) return ST__TLS_WANT_READ;
      if (i == 2) return ST__TLS_CLOSED;
      snprintf(err, errlen, "recv: %s", strerror(errno));
      return ST__TLS_ERROR;
    }
    if (e == SSL_ERROR_WANT_WRITE) return ST__TLS_WANT_WRITE;
    char why[512];
    ssl_errors(a, why, sizeof why);
    snprintf(err, errlen, "TLS read failed: %s", why[0] ? why : "no reason given");
    return ST__TLS_ERROR;
  }
}

/* See tls.h. */
int st__tls_write(st__tls_t *t, const void *buf, size_t len, size_t *n, char *err,
                  size_t errlen) {
  const st__ssl_api_t *a = t->ctx->a;
  *n = 0;
  if (t->len - t->off > OUT_HIGH) {
    int o = net_out(t, err, errlen);
    if (o == ST__TLS_ERROR) return o;
    if (t->len - t->off > OUT_HIGH) return ST__TLS_WANT_WRITE;
  }
  if (len > WRITE_CHUNK) len = WRITE_CHUNK;
  a->ERR_clear_error();
  int r = a->SSL_write(t->ssl, buf, (int)len);
  if (r <= 0) {
    int e = a->SSL_get_error(t->ssl, r);
    if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) return ST__TLS_WANT_WRITE;
    char why[512];
    ssl_errors(a, why, sizeof why);
    snprintf(err, errlen, "TLS write failed: %s", why[0] ? why : "no reason given");
    return ST__TLS_ERROR;
  }
  *n = (size_t)r;
  return net_out(t, err, errlen) == ST__TLS_ERROR ? ST__TLS_ERROR : ST__TLS_OK;
}

/* See tls.h. */
int st__tls_flush(st__tls_t *t, char *err, size_t errlen) {
  return net_out(t, err, errlen);
}

/* See tls.h. */
int st__tls_pending_out(const st__tls_t *t) {
  return t->off < t->len;
}

/* See tls.h. */
int st__tls_names_peer(st__tls_t *t, const char *id, char *err, size_t errlen) {
  if (t->ctx->psk) return 1;
  const st__ssl_api_t *a = t->ctx->a;
  X509 *x = a->SSL_get1_peer_certificate(t->ssl);
  if (!x) {
    snprintf(err, errlen, "the peer presented no certificate");
    return 0;
  }
  int ok = a->X509_check_host(x, id, strlen(id), 0, NULL) == 1;
  a->X509_free(x);
  a->ERR_clear_error();
  if (!ok)
    snprintf(err, errlen, "the peer's certificate does not name '%s' (neither a DNS name of its "
             "subjectAltName nor, without one, its CN)", id);
  return ok;
}

/* See tls.h. */
void st__tls_describe(st__tls_t *t, char *out, size_t len) {
  const st__ssl_api_t *a = t->ctx->a;
  const SSL_CIPHER *c = a->SSL_get_current_cipher(t->ssl);
  snprintf(out, len, "TLSv1.3 %s, %s", c ? a->SSL_CIPHER_get_name(c) : "?",
           t->ctx->psk ? "cluster key" : "certificates");
}

#else /* built without the OpenSSL headers */

struct st__tls_ctx {
  int unused;
};

/* See tls.h: always refused, saying why. */
int st__tls_ctx_new(const st__tls_conf_t *conf, st__tls_ctx_t **out, char *err, size_t errlen) {
  *out = NULL;
  if (!conf->secret && !conf->cert && !conf->key && !conf->ca) {
    snprintf(err, errlen, "peer.listen needs peer.secret or peer.tls");
    return ST_ERR_CONFIGURATION;
  }
  char why[512];
  st__ssl_api(why, sizeof why);
  snprintf(err, errlen, "the peer channel needs TLS: %s", why);
  return ST_ERR_CAPABILITY;
}
void st__tls_ctx_free(st__tls_ctx_t *ctx) { (void)ctx; }
const char *st__tls_ctx_mode(const st__tls_ctx_t *ctx) { (void)ctx; return "none"; }
st__tls_t *st__tls_new(st__tls_ctx_t *ctx, int fd, int server, char *err, size_t errlen) {
  snprintf(err, errlen, "built without TLS");
  return NULL;
}
void st__tls_free(st__tls_t *t) { (void)t; }
int st__tls_handshake(st__tls_t *t, char *err, size_t errlen) {
  snprintf(err, errlen, "built without TLS");
  return ST__TLS_ERROR;
}
int st__tls_read(st__tls_t *t, void *buf, size_t len, size_t *n, char *err, size_t errlen) {
  *n = 0;
  snprintf(err, errlen, "built without TLS");
  return ST__TLS_ERROR;
}
int st__tls_write(st__tls_t *t, const void *buf, size_t len, size_t *n, char *err,
                  size_t errlen) {
  *n = 0;
  snprintf(err, errlen, "built without TLS");
  return ST__TLS_ERROR;
}
int st__tls_flush(st__tls_t *t, char *err, size_t errlen) { return ST__TLS_OK; }
int st__tls_pending_out(const st__tls_t *t) { return 0; }
int st__tls_names_peer(st__tls_t *t, const char *id, char *err, size_t errlen) { return 0; }
void st__tls_describe(st__tls_t *t, char *out, size_t len) { snprintf(out, len, "none"); }

#endif
