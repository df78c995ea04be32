/* src/server: the devices this server can build on, for hello and info.
 * The cpu device is always there. CUDA devices come from the CUDA runtime
 * when the server was built with it; a host without a driver simply has
 * none, and the runtime's reason is kept for info.
 */
#include <stdio.h>
#include <string.h>

#include "server/server.h"

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
