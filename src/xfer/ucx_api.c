/* src/xfer/ucx_api.c: libucp resolved with dlopen/dlsym (see ucx_api.h). */
#include "xfer/ucx_api.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "st/errors.h"

#define UCX_SONAME "libucp.so.0"

typedef void (*get_version_fn)(unsigned *, unsigned *, unsigned *);

#ifdef ST_HAVE_UCX
static st__ucx_api_t api;
static int api_loaded;

/* One row per table entry: its name and where its pointer goes. */
#define UCX_SYM(name) {#name, offsetof(st__ucx_api_t, name)}
static const struct {
  const char *name;
  size_t off;
} ucx_syms[] = {
    UCX_SYM(ucp_get_version),          UCX_SYM(ucp_config_read),
    UCX_SYM(ucp_config_release),       UCX_SYM(ucp_init_version),
    UCX_SYM(ucp_cleanup),              UCX_SYM(ucp_worker_create),
    UCX_SYM(ucp_worker_destroy),       UCX_SYM(ucp_worker_get_address),
    UCX_SYM(ucp_worker_release_address), UCX_SYM(ucp_worker_progress),
    UCX_SYM(ucp_worker_get_efd),       UCX_SYM(ucp_worker_arm),
    UCX_SYM(ucp_ep_create),            UCX_SYM(ucp_ep_close_nbx),
    UCX_SYM(ucp_tag_send_nbx),         UCX_SYM(ucp_tag_recv_nbx),
    UCX_SYM(ucp_request_check_status), UCX_SYM(ucp_request_cancel),
    UCX_SYM(ucp_request_free),         UCX_SYM(ucs_status_string),
};

/* Resolves every row into *t from handle h: 1, or 0 with the first
 * missing name in reason. ucs_status_string lives in libucs, which libucp
 * needs: dlsym on libucp's handle searches its dependencies too. */
static int resolve(void *h, const char *lib, st__ucx_api_t *t, char *reason, size_t len) {
  for (size_t i = 0; i < sizeof ucx_syms / sizeof ucx_syms[0]; i++) {
    void *p = dlsym(h, ucx_syms[i].name);
    if (!p) {
      snprintf(reason, len, "symbol %s not found in %s (UCX 1.10 or newer is needed)",
               ucx_syms[i].name, lib);
      return 0;
    }
    memcpy((char *)t + ucx_syms[i].off, &p, sizeof p);
  }
  return 1;
}
#endif

int st__ucx_probe(const char *library, st__xfer_probe_t *out) {
  memset(out, 0, sizeof *out);
  const char *lib = library && library[0] ? library : UCX_SONAME;
  snprintf(out->library, sizeof out->library, "%s", lib);
  dlerror();
  void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    snprintf(out->reason, sizeof out->reason, "dlopen(%s): %s (config.lua peer.ucx_library)",
             lib, e ? e : "failed");
    return ST_ERR_CAPABILITY;
  }
  void *gv = dlsym(h, "ucp_get_version");
  if (!gv) {
    snprintf(out->reason, sizeof out->reason, "%s has no ucp_get_version: not UCX's libucp",
             lib);
    dlclose(h);
    return ST_ERR_CAPABILITY;
  }
  get_version_fn get_version;
  memcpy(&get_version, &gv, sizeof gv);
  unsigned major = 0, minor = 0, release = 0;
  get_version(&major, &minor, &release);
  snprintf(out->version, sizeof out->version, "%u.%u.%u", major, minor, release);
#ifdef ST_HAVE_UCX
  if (major != UCP_API_MAJOR) {
    snprintf(out->reason, sizeof out->reason,
             "%s is UCX %s; this build speaks UCX %d.x (config.lua peer.ucx_library)", lib,
             out->version, UCP_API_MAJOR);
    dlclose(h);
    return ST_ERR_CAPABILITY;
  }
  st__ucx_api_t t;
  if (!resolve(h, lib, &t, out->reason, sizeof out->reason)) {
    dlclose(h);
    return ST_ERR_CAPABILITY;
  }
  out->available = 1;
  if (!api_loaded) {
    api = t;          /* the handle stays open: the table points into it */
    api_loaded = 1;
  } else {
    dlclose(h);
  }
  return ST_OK;
#else
  snprintf(out->reason, sizeof out->reason,
           "built without UCX (the build found no libucx-dev headers; CMake ST_UCX)");
  dlclose(h);
  return ST_ERR_CAPABILITY;
#endif
}

#ifdef ST_HAVE_UCX
const st__ucx_api_t *st__ucx_api(const char *library) {
  if (!api_loaded) {
    st__xfer_probe_t p;
    (void)st__ucx_probe(library, &p);
  }
  return api_loaded ? &api : NULL;
}
#endif
