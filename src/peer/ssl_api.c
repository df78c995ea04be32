/* src/peer/ssl_api.c: OpenSSL 3 resolved at run time (ssl_api.h). The
 * libraries are opened by soname (libcrypto.so.3, then libssl.so.3, which
 * needs it) with RTLD_LOCAL, so no other code of the process binds to
 * them by accident; each function of the declared subset is looked up by
 * name. Neither library is ever closed: their atexit handlers and thread
 * keys must outlive every caller. */
#include "peer/ssl_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#ifdef ST_HAVE_TLS

static pthread_once_t once = PTHREAD_ONCE_INIT;
static st__ssl_api_t api;
static int api_ok;
static char api_why[512];

/* One library by soname, or NULL with the reason in api_why. */
static void *open_lib(const char *soname) {
  void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    snprintf(api_why, sizeof api_why, "cannot load %s (OpenSSL 3): %s", soname,
             e ? e : "not found");
  }
  return h;
}

/* pthread_once body: opens both libraries and fills `api`, or leaves the
 * reason in api_why. */
static void load(void) {
  void *crypto = open_lib("libcrypto.so.3");
  if (!crypto) return;
  void *ssl = open_lib("libssl.so.3");
  if (!ssl) return;
  void *p;
#define ST__SSL_LOAD(lib, ret, name, args)                                              \
  p = dlsym(lib, #name);                                                                \
  if (!p) {                                                                             \
    snprintf(api_why, sizeof api_why, "lib%s.so.3 has no %s (OpenSSL 3.0 or newer is needed)", \
             #lib, #name);                                                              \
    return;                                                                             \
  }                                                                                     \
  memcpy(&api.name, &p, sizeof p);
  ST__SSL_FUNCS(ST__SSL_LOAD)
#undef ST__SSL_LOAD
  if (api.OpenSSL_version_num() < 0x30000000UL) {
    snprintf(api_why, sizeof api_why, "libssl.so.3 reports version %s; OpenSSL 3.0 or newer "
             "is needed", api.OpenSSL_version(OPENSSL_VERSION));
    return;
  }
  if (!api.OPENSSL_init_ssl(OPENSSL_INIT_LOAD_SSL_STRINGS | OPENSSL_INIT_LOAD_CRYPTO_STRINGS,
                            NULL)) {
    snprintf(api_why, sizeof api_why, "OpenSSL could not initialize (OPENSSL_init_ssl)");
    return;
  }
  api_ok = 1;
}

/* See ssl_api.h. */
const st__ssl_api_t *st__ssl_api(char *why, size_t whylen) {
  pthread_once(&once, load);
  if (!api_ok && why && whylen) snprintf(why, whylen, "%s", api_why);
  return api_ok ? &api : NULL;
}

/* See ssl_api.h. */
const char *st__ssl_version(void) {
  const st__ssl_api_t *a = st__ssl_api(NULL, 0);
  return a ? a->OpenSSL_version(OPENSSL_VERSION) : NULL;
}

#else

/* See ssl_api.h. */
const st__ssl_api_t *st__ssl_api(char *why, size_t whylen) {
  if (why && whylen)
    snprintf(why, whylen, "built without TLS (the OpenSSL 3 headers, libssl-dev, were not "
             "found when this stserver was built; configure with -DST_TLS=ON to require "
             "them)");
  return NULL;
}

/* See ssl_api.h. */
const char *st__ssl_version(void) { return NULL; }

#endif
