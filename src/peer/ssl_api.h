/* src/peer: OpenSSL 3 without linking it. libssl.so.3 and libcrypto.so.3
 * are opened by soname at run time (dlopen) and the functions the peer
 * channel uses are resolved into one table; the OpenSSL headers are used
 * at build time for types and constants only (CMake ST_TLS=AUTO: built
 * when openssl/ssl.h is found). Many OpenSSL "functions" are macros over
 * SSL_CTX_ctrl, SSL_ctrl and BIO_ctrl: callers use the ctrl functions of
 * the table with the macro's constant.
 *
 * Threads: st__ssl_api loads once (pthread_once); the table is read-only
 * afterwards and any thread may use it.
 */
#ifndef ST_PEER_SSL_API_H
#define ST_PEER_SSL_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef ST_HAVE_TLS
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

/* The declared subset, one field per function, named as OpenSSL names it. */
#define ST__SSL_FUNCS(X)                                                                  \
  /* libcrypto */                                                                         \
  X(crypto, unsigned long, OpenSSL_version_num, (void))                                   \
  X(crypto, const char *, OpenSSL_version, (int t))                                       \
  X(crypto, unsigned long, ERR_get_error, (void))                                         \
  X(crypto, void, ERR_error_string_n, (unsigned long e, char *buf, size_t len))           \
  X(crypto, void, ERR_clear_error, (void))                                                \
  X(crypto, BIO *, BIO_new, (const BIO_METHOD *type))                                     \
  X(crypto, const BIO_METHOD *, BIO_s_mem, (void))                                        \
  X(crypto, int, BIO_read, (BIO *b, void *data, int dlen))                                \
  X(crypto, int, BIO_write, (BIO *b, const void *data, int dlen))                         \
  X(crypto, long, BIO_ctrl, (BIO *b, int cmd, long larg, void *parg))                     \
  X(crypto, int, BIO_free, (BIO *b))                                                      \
  X(crypto, void, X509_free, (X509 *x))                                                   \
  X(crypto, int, X509_check_host,                                                         \
    (X509 *x, const char *chk, size_t chklen, unsigned int flags, char **peername))       \
  X(crypto, const char *, X509_verify_cert_error_string, (long n))                        \
  /* libssl */                                                                            \
  X(ssl, int, OPENSSL_init_ssl, (uint64_t opts, const OPENSSL_INIT_SETTINGS *settings))   \
  X(ssl, const SSL_METHOD *, TLS_method, (void))                                          \
  X(ssl, SSL_CTX *, SSL_CTX_new, (const SSL_METHOD *meth))                                \
  X(ssl, void, SSL_CTX_free, (SSL_CTX *ctx))                                              \
  X(ssl, long, SSL_CTX_ctrl, (SSL_CTX *ctx, int cmd, long larg, void *parg))              \
  X(ssl, uint64_t, SSL_CTX_set_options, (SSL_CTX *ctx, uint64_t op))                      \
  X(ssl, int, SSL_CTX_set_ciphersuites, (SSL_CTX *ctx, const char *str))                  \
  X(ssl, void, SSL_CTX_set_verify,                                                        \
    (SSL_CTX *ctx, int mode, SSL_verify_cb callback))                                     \
  X(ssl, int, SSL_CTX_load_verify_locations,                                              \
    (SSL_CTX *ctx, const char *CAfile, const char *CApath))                               \
  X(ssl, int, SSL_CTX_use_certificate_chain_file, (SSL_CTX *ctx, const char *file))       \
  X(ssl, int, SSL_CTX_use_PrivateKey_file, (SSL_CTX *ctx, const char *file, int type))    \
  X(ssl, int, SSL_CTX_check_private_key, (const SSL_CTX *ctx))                            \
  X(ssl, int, SSL_CTX_set_num_tickets, (SSL_CTX *ctx, size_t num_tickets))                \
  X(ssl, void, SSL_CTX_set_psk_find_session_callback,                                     \
    (SSL_CTX *ctx, SSL_psk_find_session_cb_func cb))                                      \
  X(ssl, void, SSL_CTX_set_psk_use_session_callback,                                      \
    (SSL_CTX *ctx, SSL_psk_use_session_cb_func cb))                                       \
  X(ssl, SSL *, SSL_new, (SSL_CTX *ctx))                                                  \
  X(ssl, void, SSL_free, (SSL *ssl))                                                      \
  X(ssl, long, SSL_ctrl, (SSL *ssl, int cmd, long larg, void *parg))                      \
  X(ssl, void, SSL_set_bio, (SSL *s, BIO *rbio, BIO *wbio))                               \
  X(ssl, int, SSL_set_fd, (SSL *s, int fd))                                               \
  X(ssl, void, SSL_set_accept_state, (SSL *s))                                            \
  X(ssl, void, SSL_set_connect_state, (SSL *s))                                           \
  X(ssl, int, SSL_connect, (SSL *s))                                                      \
  X(ssl, int, SSL_do_handshake, (SSL *s))                                                 \
  X(ssl, int, SSL_read, (SSL *ssl, void *buf, int num))                                   \
  X(ssl, int, SSL_write, (SSL *ssl, const void *buf, int num))                            \
  X(ssl, int, SSL_shutdown, (SSL *s))                                                     \
  X(ssl, int, SSL_get_error, (const SSL *s, int ret_code))                                \
  X(ssl, int, SSL_version, (const SSL *s))                                                \
  X(ssl, const SSL_CIPHER *, SSL_get_current_cipher, (const SSL *s))                      \
  X(ssl, const char *, SSL_CIPHER_get_name, (const SSL_CIPHER *c))                        \
  X(ssl, const SSL_CIPHER *, SSL_CIPHER_find, (SSL *ssl, const unsigned char *ptr))       \
  X(ssl, long, SSL_get_verify_result, (const SSL *ssl))                                   \
  X(ssl, X509 *, SSL_get1_peer_certificate, (const SSL *s))                               \
  X(ssl, int, SSL_set_ex_data, (SSL *ssl, int idx, void *data))                           \
  X(ssl, void *, SSL_get_ex_data, (const SSL *ssl, int idx))                              \
  X(ssl, SSL_SESSION *, SSL_SESSION_new, (void))                                          \
  X(ssl, void, SSL_SESSION_free, (SSL_SESSION *ses))                                      \
  X(ssl, int, SSL_SESSION_set1_master_key,                                                \
    (SSL_SESSION *sess, const unsigned char *in, size_t len))                             \
  X(ssl, int, SSL_SESSION_set_cipher, (SSL_SESSION *s, const SSL_CIPHER *cipher))         \
  X(ssl, int, SSL_SESSION_set_protocol_version, (SSL_SESSION *s, int version))

typedef struct st__ssl_api {
#define ST__SSL_FIELD(lib, ret, name, args) ret(*name) args;
  ST__SSL_FUNCS(ST__SSL_FIELD)
#undef ST__SSL_FIELD
} st__ssl_api_t;

/* The table, loaded on first use: NULL when OpenSSL 3 cannot be loaded,
 * with the reason (which library or function is missing, the dlerror
 * text) in why (may be NULL). Borrowed, valid until the process ends.
 * Any thread. */
const st__ssl_api_t *st__ssl_api(char *why, size_t whylen);

#else

typedef struct st__ssl_api st__ssl_api_t;

/* Built without the OpenSSL headers: always NULL, and why says so. */
const st__ssl_api_t *st__ssl_api(char *why, size_t whylen);

#endif

/* The loaded library's version text ("OpenSSL 3.0.x ..."), or NULL when
 * it is not loaded. Any thread. */
const char *st__ssl_version(void);

#endif
