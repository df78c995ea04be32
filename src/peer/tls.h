/* src/peer: TLS 1.3 over a connected, non-blocking TCP socket, for the
 * peer channel (docs/multihost.md, "Peers and the channel"). Two ways to
 * trust a peer:
 *
 *   a cluster key   peer.secret: a key file (at least 32 random bytes, raw
 *                   or hex) that every server of the cluster holds; TLS 1.3
 *                   external PSK (identity ST__TLS_PSK_IDENTITY, cipher
 *                   TLS_AES_256_GCM_SHA384, (EC)DHE for forward secrecy);
 *                   no certificate anywhere.
 *   certificates    peer.tls = {cert, key, ca}: each side presents its
 *                   chain and verifies the other's against `ca`; the peer
 *                   id a side claims must be named by its certificate
 *                   (st__tls_names_peer: SAN DNS, or the CN without one).
 *
 * Anything below TLS 1.3 is refused. The socket's bytes are moved here
 * (recv/send with MSG_NOSIGNAL through memory BIOs), so SIGPIPE never
 * fires and a caller never blocks: every step returns ST__TLS_WANT_READ or
 * ST__TLS_WANT_WRITE when the socket must become readable or writable
 * before it can go on.
 *
 * Threads: a context is read-only once made and may be shared; one
 * connection (st__tls_t) is used by one thread at a time. Built without
 * the OpenSSL headers, or with OpenSSL 3 missing at run time,
 * st__tls_ctx_new fails and says why.
 */
#ifndef ST_PEER_TLS_H
#define ST_PEER_TLS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The PSK identity both sides use: the key itself is the secret. */
#define ST__TLS_PSK_IDENTITY "sharedtensor-cluster-key"
/* Key file bounds: at least 32 bytes of key, at most 256 (64-512 hex
 * digits); the file at most 4096 bytes. */
#define ST__TLS_KEY_MIN 32
#define ST__TLS_KEY_MAX 256

/* What a step returns. */
enum {
  ST__TLS_OK = 0,          /* done (handshake finished, bytes moved)     */
  ST__TLS_WANT_READ = 1,   /* wait until the socket is readable          */
  ST__TLS_WANT_WRITE = 2,  /* wait until the socket is writable          */
  ST__TLS_CLOSED = 3,      /* the peer closed the connection (read)      */
  ST__TLS_ERROR = -1       /* failed: the reason is in the error buffer  */
};

typedef struct st__tls_conf {
  const char *secret;      /* path of the cluster key file, or NULL      */
  const char *cert;        /* PEM chain, key and CA bundle, or NULL      */
  const char *key;
  const char *ca;
  uid_t owner;             /* the key file must belong to this uid       */
} st__tls_conf_t;

typedef struct st__tls_ctx st__tls_ctx_t;
typedef struct st__tls st__tls_t;

/* Reads a cluster key file: a regular file owned by `owner`, with no
 * permission bits for group or others (0600 or 0400), holding
 * ST__TLS_KEY_MIN..ST__TLS_KEY_MAX bytes of key, raw or as hex digits
 * (whitespace around them allowed). ST_OK with the key in key/len, or
 * ST_ERR_CONFIGURATION / ST_ERR_IO with the reason (naming the path, never
 * a byte of the key). Any thread. */
int st__tls_read_key(const char *path, uid_t owner, unsigned char key[ST__TLS_KEY_MAX],
                     size_t *len, char *err, size_t errlen);

/* Makes a context from conf: exactly one of secret and cert/key/ca (all
 * three) must be set. Loads OpenSSL (ssl_api.h), the key file or the
 * certificate, key (checked against the certificate) and CA. ST_OK with
 * *out (owned; st__tls_ctx_free), or ST_ERR_CONFIGURATION / ST_ERR_IO /
 * ST_ERR_CAPABILITY (OpenSSL missing) with the reason, naming the key of
 * config.lua to change. Any thread. */
int st__tls_ctx_new(const st__tls_conf_t *conf, st__tls_ctx_t **out, char *err, size_t errlen);
void st__tls_ctx_free(st__tls_ctx_t *ctx);

/* "psk" or "certificates". */
const char *st__tls_ctx_mode(const st__tls_ctx_t *ctx);

/* A connection over fd (borrowed: the caller closes it after
 * st__tls_free), as the accepting side (server != 0) or the connecting
 * one. NULL when out of memory (err says so). */
st__tls_t *st__tls_new(st__tls_ctx_t *ctx, int fd, int server, char *err, size_t errlen);
void st__tls_free(st__tls_t *t);

/* One step of the handshake: ST__TLS_OK once it finished (TLS 1.3, the
 * peer authenticated), WANT_READ / WANT_WRITE, or ERROR with the reason
 * in err ("the peer's key differs (peer.secret)", a certificate's
 * verification error, "TLS 1.3 is required"). */
int st__tls_handshake(st__tls_t *t, char *err, size_t errlen);

/* Up to len bytes of plaintext into buf: ST__TLS_OK with *n > 0, WANT_READ
 * (nothing there yet), WANT_WRITE, CLOSED (the peer shut down or the
 * socket reached its end), or ERROR. */
int st__tls_read(st__tls_t *t, void *buf, size_t len, size_t *n, char *err, size_t errlen);

/* Takes up to len bytes of plaintext: ST__TLS_OK with *n > 0 taken,
 * WANT_WRITE (the socket is full: nothing taken), or ERROR. Bytes taken
 * are sent or queued inside; st__tls_flush sends what is queued. */
int st__tls_write(st__tls_t *t, const void *buf, size_t len, size_t *n, char *err,
                  size_t errlen);

/* Sends queued ciphertext: ST__TLS_OK when none is left, WANT_WRITE, or
 * ERROR. */
int st__tls_flush(st__tls_t *t, char *err, size_t errlen);

/* Nonzero while ciphertext waits for the socket. */
int st__tls_pending_out(const st__tls_t *t);

/* Certificates mode: 1 when the peer's certificate names `id` (SAN DNS,
 * or the CN when it has no DNS name), else 0 with the reason in err. A
 * cluster-key context always answers 1. After the handshake. */
int st__tls_names_peer(st__tls_t *t, const char *id, char *err, size_t errlen);

/* The negotiated protocol and cipher ("TLSv1.3 TLS_AES_256_GCM_SHA384"),
 * for the log. */
void st__tls_describe(st__tls_t *t, char *out, size_t len);

#endif
