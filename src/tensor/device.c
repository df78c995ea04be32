/* src/tensor/device.c: device names and checks, and the backend of each
 * device (see tensor.h and backend.h for the contracts). Everything that
 * talks to CUDA goes through src/mem/cuda.h, which a build without CUDA
 * still has: it refuses every device there, so no CUDA backend is ever
 * reached. Runs on the thread that owns the context. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem/cuda.h"
#include "tensor/tensor.h"

/* ------------------------------------------------------------ names */

const char *st__tensor_device_name(int device, char *buf, size_t len) {
  if (device < 0) snprintf(buf, len, "cpu");
  else snprintf(buf, len, "cuda:%d", device);
  return buf;
}

/* The device a name denotes: "cpu", "cuda" (*out = -2: the call's CUDA
 * device), "cuda:N" (1 to 4 digits). 0 for anything else. */
static int parse_name(const char *s, int *out) {
  if (strcmp(s, "cpu") == 0) {
    *out = ST__DEV_CPU;
    return 1;
  }
  if (strncmp(s, "cuda", 4) != 0) return 0;
  if (s[4] == '\0') {
    *out = -2;
    return 1;
  }
  size_t n = strlen(s + 5);
  if (s[4] != ':' || n == 0 || n > 4 || strspn(s + 5, "0123456789") != n) return 0;
  *out = atoi(s + 5);
  return 1;
}

int st__tensor_is_device_name(const char *s) {
  int d;
  return s && parse_name(s, &d);
}

int st__tensor_no_device(st__tensor_ctx_t *c, int device, const char *why, char *err,
                     size_t errlen) {
  static const char prefix[] = "no CUDA device: ";
  if (strncmp(why, prefix, sizeof prefix - 1) == 0) why += sizeof prefix - 1;
  return st__tensor_fail_call(c, ST_ERR_CAPABILITY, err, errlen, "%scuda:%d is unavailable: %s",
                              prefix, device, why);
}

int st__tensor_device_check(st__tensor_ctx_t *c, int device, const char *what, char *err,
                            size_t errlen) {
  if (device == ST__DEV_CPU) return ST_OK;
  if (!c->in_call)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                           "%s: CUDA tensors can only be built inside a build body (cuda:%d)",
                           what, device);
  if (device < 0 || device >= ST__DEV_MAX)
    return st__tensor_no_device(c, device, "no such device in this process", err, errlen);
  char why[256];
  if (st__cuda_ctx_enter(device, why, sizeof why) != ST_OK)
    return st__tensor_no_device(c, device, why, err, errlen);
  return ST_OK;
}

int st__tensor_device_parse(st__tensor_ctx_t *c, const char *name, const char *what,
                            int *device, char *err, size_t errlen) {
  int d;
  if (!name || !parse_name(name, &d))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                           "%s: unknown device '%s' (expected \"cpu\", \"cuda\" or \"cuda:N\")",
                           what, name ? name : "nil");
  if (d == -2) {
    if (c->cuda_device < 0)
      return st__tensor_fail_call(
          c, ST_ERR_CAPABILITY, err, errlen,
          "%s: no CUDA device: \"cuda\" names the CUDA device of the call's socket, and this "
          "call has none; name one, e.g. \"cuda:0\"",
          what);
    d = c->cuda_device;
  }
  int rc = st__tensor_device_check(c, d, what, err, errlen);
  if (rc == ST_OK) *device = d;
  return rc;
}
