/* src/xfer/nccl_api.c: libnccl resolved with dlopen/dlsym (see
 * nccl_api.h). */
#include "xfer/nccl_api.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "cudadrv/driver.h"
#include "st/errors.h"

#define NCCL_SONAME "libnccl.so.2"

static st__nccl_api_t api;
static int api_loaded;

#define NCCL_SYM(name) {#name, offsetof(st__nccl_api_t, name)}
static const struct {
  const char *name;
  size_t off;
} nccl_syms[] = {
    NCCL_SYM(ncclGetVersion),        NCCL_SYM(ncclGetErrorString),
    NCCL_SYM(ncclGetUniqueId),       NCCL_SYM(ncclCommInitRankConfig),
    NCCL_SYM(ncclCommGetAsyncError), NCCL_SYM(ncclCommAbort),
    NCCL_SYM(ncclCommDestroy),       NCCL_SYM(ncclGroupStart),
    NCCL_SYM(ncclGroupEnd),          NCCL_SYM(ncclSend),
    NCCL_SYM(ncclRecv),              NCCL_SYM(ncclBroadcast),
};

void st__nccl_config_init(st__nccl_config_t *c, int blocking) {
  memset(c, 0, sizeof *c);
  /* The four members only: the struct's tail padding is no field of
   * NCCL's and must not be copied over its next one. */
  c->size = offsetof(st__nccl_config_t, blocking) + sizeof c->blocking;
  c->magic = 0xcafebeefu;
  c->version = 21400;
  c->blocking = blocking;
}

void st__nccl_version_string(int code, char *out, size_t len) {
  if (code >= 10000)
    snprintf(out, len, "%d.%d.%d", code / 10000, code % 10000 / 100, code % 100);
  else
    snprintf(out, len, "%d.%d.%d", code / 1000, code % 1000 / 100, code % 100);
}

int st__nccl_probe(const char *library, st__xfer_probe_t *out) {
  memset(out, 0, sizeof *out);
  const char *lib = library && library[0] ? library : NCCL_SONAME;
  snprintf(out->library, sizeof out->library, "%s", lib);
  dlerror();
  void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    snprintf(out->reason, sizeof out->reason, "dlopen(%s): %s (config.lua peer.nccl_library)",
             lib, e ? e : "failed");
    return ST_ERR_CAPABILITY;
  }
  st__nccl_api_t t;
  memset(&t, 0, sizeof t);
  void *gv = dlsym(h, "ncclGetVersion");
  if (!gv) {
    snprintf(out->reason, sizeof out->reason, "%s has no ncclGetVersion: not NCCL", lib);
    dlclose(h);
    return ST_ERR_CAPABILITY;
  }
  memcpy(&t.ncclGetVersion, &gv, sizeof gv);
  int code = 0;
  if (t.ncclGetVersion(&code) != ST_NCCL_SUCCESS || code <= 0) {
    snprintf(out->reason, sizeof out->reason, "ncclGetVersion of %s failed", lib);
    dlclose(h);
    return ST_ERR_CAPABILITY;
  }
  st__nccl_version_string(code, out->version, sizeof out->version);
  if (code < ST_NCCL_MIN_VERSION_CODE) {
    snprintf(out->reason, sizeof out->reason,
             "%s is NCCL %s; 2.18 or newer is needed (config.lua peer.nccl_library)", lib,
             out->version);
    dlclose(h);
    return ST_ERR_CAPABILITY;
  }
  for (size_t i = 0; i < sizeof nccl_syms / sizeof nccl_syms[0]; i++) {
    void *p = dlsym(h, nccl_syms[i].name);
    if (!p) {
      snprintf(out->reason, sizeof out->reason, "symbol %s not found in %s (NCCL %s)",
               nccl_syms[i].name, lib, out->version);
      dlclose(h);
      return ST_ERR_CAPABILITY;
    }
    memcpy((char *)&t + nccl_syms[i].off, &p, sizeof p);
  }
  char cuda_why[200];
  if (st__cuda_available(cuda_why, sizeof cuda_why) != ST_OK) {
    snprintf(out->reason, sizeof out->reason, "NCCL %s loaded from %s, but CUDA is unavailable: %s",
             out->version, lib, cuda_why);
    dlclose(h);
    return ST_ERR_CAPABILITY;
  }
  out->available = 1;
  if (!api_loaded) {
    api = t;
    api_loaded = 1;
  } else {
    dlclose(h);
  }
  return ST_OK;
}

const st__nccl_api_t *st__nccl_api(const char *library) {
  if (!api_loaded) {
    st__xfer_probe_t p;
    (void)st__nccl_probe(library, &p);
  }
  return api_loaded ? &api : NULL;
}
