/* src/server: the devices this server can build on, for hello and info,
 * and where each call builds (docs/endpoints.md, "Devices").
 * The cpu device is always there. CUDA devices come from the CUDA runtime
 * when the server was built with it; a host without a driver simply has
 * none, and the runtime's reason is kept for info and for the CAPABILITY
 * errors of calls that need a CUDA device. Loop thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "cudadrv/driver.h"
#include "mem/cuda.h"
#include "server/server.h"
#include "st/errors.h"

#ifdef ST_HAVE_CUDA
#include <cuda_runtime_api.h>

static void format_uuid(const unsigned char *b, char *out, size_t len) {
  snprintf(out, len,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
           b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
           b[14], b[15]);
}

static void probe_cuda(st__devices_t *d) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(d->cuda_reason, sizeof d->cuda_reason, "%s (%s)", cudaGetErrorString(e),
             cudaGetErrorName(e));
    (void)cudaGetLastError();   /* do not leave it for later calls */
    return;
  }
  if (n == 0) {
    snprintf(d->cuda_reason, sizeof d->cuda_reason, "the CUDA runtime reports no device");
    return;
  }
  for (int i = 0; i < n && d->count < (int)(sizeof d->list / sizeof d->list[0]); i++) {
    struct cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    st__device_t *dev = &d->list[d->count++];
    dev->index = i;
    snprintf(dev->kind, sizeof dev->kind, "cuda");
    snprintf(dev->name, sizeof dev->name, "%.127s", prop.name);
    format_uuid((const unsigned char *)prop.uuid.bytes, dev->uuid, sizeof dev->uuid);
    dev->memory_bytes = (uint64_t)prop.totalGlobalMem;
    dev->gpudirect_rdma = st__cuda_gpudirect_rdma(i);
    d->cuda_count++;
  }
  if (d->cuda_count == 0)
    snprintf(d->cuda_reason, sizeof d->cuda_reason, "no CUDA device could be queried");
}
#else
static void probe_cuda(st__devices_t *d) {
  snprintf(d->cuda_reason, sizeof d->cuda_reason, "built without CUDA support");
}
#endif

/* Fills *d with the cpu device and the CUDA devices; see server.h. */
void st__devices_probe(st__devices_t *d) {
  memset(d, 0, sizeof *d);
  st__device_t *cpu = &d->list[d->count++];
  cpu->index = -1;
  snprintf(cpu->kind, sizeof cpu->kind, "cpu");
  snprintf(cpu->name, sizeof cpu->name, "cpu");
  probe_cuda(d);
}

/* CUDA device by ordinal, or NULL. */
st__device_t *st__devices_cuda(st__devices_t *d, int ordinal) {
  for (int i = 0; i < d->count; i++)
    if (d->list[i].index == ordinal && strcmp(d->list[i].kind, "cuda") == 0) return &d->list[i];
  return NULL;
}

/* Where a socket builds when neither the endpoint nor a constructor names
 * a device (config default_device): "socket" gives cuda:N for socket N
 * when the server has that CUDA device, else the CPU; "cpu" the CPU.
 * Returns -1 (the CPU) or the ordinal. */
static int device_socket_default(const st__devices_t *d, const st__config_t *cfg, int socket) {
  if (cfg->default_device && strcmp(cfg->default_device, "cpu") == 0) return -1;
  return st__devices_cuda((st__devices_t *)d, socket) ? socket : -1;
}

/* Why the server has no cuda:N, into out. */
static void why_not(const st__devices_t *d, char *out, size_t len) {
  if (d->cuda_count == 0) {
    snprintf(out, len, "%s", d->cuda_reason[0] ? d->cuda_reason : "no CUDA device");
    return;
  }
  size_t n = (size_t)snprintf(out, len, "this server has %d CUDA device%s (", d->cuda_count,
                              d->cuda_count == 1 ? "" : "s");
  int first = 1;
  for (int i = 0; i < d->count && n < len; i++) {
    if (d->list[i].index < 0) continue;
    n += (size_t)snprintf(out + n, len - n, "%scuda:%d", first ? "" : ", ", d->list[i].index);
    first = 0;
  }
  if (n < len) snprintf(out + n, len - n, ")");
}

/* Resolves and checks the device of a call; see server.h. */
int st__device_for_call(const st__devices_t *d, const st__config_t *cfg,
                        const st__endpoint_decl_t *ep, int socket, int *device, int *cuda_device,
                        char *err, size_t errlen) {
  *cuda_device = socket;
  if (!ep->device) {
    *device = device_socket_default(d, cfg, socket);
    return ST_OK;
  }
  if (strcmp(ep->device, "cpu") == 0) {
    *device = -1;
    return ST_OK;
  }
  int bare = strcmp(ep->device, "cuda") == 0;
  int dev = bare ? socket : atoi(ep->device + 5);
  if (!st__devices_cuda((st__devices_t *)d, dev)) {
    char why[320];
    why_not(d, why, sizeof why);
    snprintf(err, errlen, "no CUDA device: cuda:%d is unavailable: %s%s", dev, why,
             bare ? " (device = \"cuda\" names the CUDA device of the socket the call came "
                    "in on)"
                  : "");
    *device = -1;
    return ST_ERR_CAPABILITY;
  }
  *device = dev;
  return ST_OK;
}

/* Budgets, contexts and the start log; see server.h. */
void st__devices_start(st__server_t *srv) {
  const st__config_t *cfg = srv->cfg;
  for (int i = 0; i < srv->devices.count; i++) {
    const st__device_t *dev = &srv->devices.list[i];
    if (dev->index < 0) continue;
    char name[16];
    snprintf(name, sizeof name, "cuda:%d", dev->index);
    int set = 0;
    for (int k = 0; k < cfg->nbudgets; k++)
      if (strcmp(cfg->budgets[k].device, name) == 0) {
        set = 1;
        ST_LOG_I("server", "memory budget: %s %llu bytes%s", name,
                 (unsigned long long)cfg->budgets[k].bytes,
                 cfg->budgets[k].bytes ? "" : " (none)");
      }
    if (!set) {
      uint64_t bytes = dev->memory_bytes / 10 * 9;
      st__objects_set_budget(&srv->objects, name, bytes);
      ST_LOG_I("server", "memory budget: %s %llu bytes (90%% of %llu)", name,
               (unsigned long long)bytes, (unsigned long long)dev->memory_bytes);
    }
  }
  for (int i = 0; i < cfg->ndevices; i++) {
    int socket = cfg->devices[i];
    int d = device_socket_default(&srv->devices, cfg, socket);
    if (d < 0) {
      char why[320];
      if (cfg->default_device && strcmp(cfg->default_device, "cpu") == 0)
        snprintf(why, sizeof why, "default_device = \"cpu\"");
      else
        why_not(&srv->devices, why, sizeof why);
      ST_LOG_I("server", "socket %d builds on cpu by default (%s)", socket, why);
      continue;
    }
    /* Retain the context now: workers and info then never wait for it. */
    uint64_t free_b = 0, total_b = 0;
    char err[256];
    if (st__cuda_mem_info(d, &free_b, &total_b, err, sizeof err) != ST_OK)
      ST_LOG_W("server", "socket %d builds on cuda:%d by default, which fails: %s", socket, d,
               err);
    else
      ST_LOG_I("server", "socket %d builds on cuda:%d by default (%s, %llu of %llu bytes free)",
               socket, d, st__devices_cuda(&srv->devices, d)->name,
               (unsigned long long)free_b, (unsigned long long)total_b);
  }
}
