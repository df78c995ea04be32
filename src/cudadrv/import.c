/* src/cudadrv/import.c: importing and mapping an exported VMM allocation
 * (docs/design.md, section 3, decision 1; see import.h).
 *
 * Steps, each undone in reverse on failure:
 *   1. the device whose UUID the descriptor names -> ordinal here (a client
 *      with another CUDA_VISIBLE_DEVICES numbers devices differently);
 *   2. cuMemImportFromShareableHandle(fd) -> a handle to the allocation
 *      (handle_import);
 *   3. cuMemAddressReserve(bytes, aligned to the granularity) -> a VA range;
 *   4. cuMemMap(range, handle) and cuMemSetAccess(range, device, RW)
 *      (handle_map);
 *   5. cuMemRelease(handle) (handle_release): the mapping alone keeps the
 *      memory.
 * st__cuda_import does all five, in a client when it maps a reply and in
 * the server when it first maps an allocation a client sent. A put makes
 * no driver call beyond step 1: the server checks the descriptor's kind
 * (st__cuda_fd_check, an fstat) and the UUID and size
 * (st__cuda_import_check), and keeps the descriptor, which keeps the
 * allocation. The descriptor stays the caller's to close.
 *
 * Depends only on driver.h / driver.c, so libstclient can link both.
 */
#include "cudadrv/import.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

/* The NVIDIA control device: an exported VMM allocation's descriptor is
 * a file of it (its character device, major 195). */
#define NVIDIA_CONTROL_DEVICE "/dev/nvidiactl"
#define NVIDIA_MAJOR 195u

/* See import.h. Any thread. */
const char *st__file_kind(unsigned mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a pipe";
  if (S_ISSOCK(mode)) return "a socket";
  return "a file of an unknown kind";
}

static pthread_once_t ctl_once = PTHREAD_ONCE_INIT;
static dev_t ctl_rdev;      /* /dev/nvidiactl's device number ... */
static int ctl_known;       /* ... when it could be stat'ed */

static void stat_control_device(void) {
  struct stat st;
  if (stat(NVIDIA_CONTROL_DEVICE, &st) == 0 && S_ISCHR(st.st_mode)) {
    ctl_rdev = st.st_rdev;
    ctl_known = 1;
  }
}

/* See import.h. Any thread; no driver call. */
int st__cuda_fd_check(int fd, char *err, size_t errlen) {
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    if (err && errlen) snprintf(err, errlen, "fstat of descriptor %d: %s", fd, strerror(errno));
    return ST_ERR_INVALID_ARGUMENT;
  }
  if (!S_ISCHR(st.st_mode)) {
    if (err && errlen)
      snprintf(err, errlen, "the descriptor is %s, not an exported CUDA allocation",
               st__file_kind(st.st_mode));
    return ST_ERR_INVALID_ARGUMENT;
  }
  pthread_once(&ctl_once, stat_control_device);
  if (ctl_known ? st.st_rdev == ctl_rdev : major(st.st_rdev) == NVIDIA_MAJOR) return ST_OK;
  if (err && errlen)
    snprintf(err, errlen,
             "the descriptor is the character device %u:%u, not an exported CUDA allocation "
             "(a file of the NVIDIA control device, " NVIDIA_CONTROL_DEVICE ")",
             major(st.st_rdev), minor(st.st_rdev));
  return ST_ERR_INVALID_ARGUMENT;
}

#ifdef ST_HAVE_CUDA

/* See import.h. Any thread. */
int st__cuda_import_check(uint64_t bytes, const char *uuid, int *ordinal, uint64_t *gran,
                          char *err, size_t errlen) {
  char dummy[1];
  if (!err) { err = dummy; errlen = sizeof dummy; }
  *ordinal = -1;
  *gran = 0;
  if (!st__cuda_api(err, errlen)) return ST_ERR_CAPABILITY;
  int rc = st__cuda_device_by_uuid(uuid, ordinal, err, errlen);
  if (rc == ST_OK) rc = st__cuda_granularity(*ordinal, gran, err, errlen);
  if (rc != ST_OK) return rc;
  if (bytes == 0 || bytes % *gran != 0 || bytes > (uint64_t)(SIZE_MAX / 2)) {
    snprintf(err, errlen,
             "import: size %llu is not a positive multiple of the allocation granularity (%llu)",
             (unsigned long long)bytes, (unsigned long long)*gran);
    return ST_ERR_INVALID_ARGUMENT;
  }
  return ST_OK;
}

/* Steps 3 and 4: maps allocation handle h (`bytes`, aligned to `gran`)
 * read-write on device `ordinal`, whose context is current. ST_OK with
 * *out filled, or st__cuda_import's errors (a size claim larger than the
 * allocation fails here). */
static int map_handle(const st__cuda_api_t *a, CUmemGenericAllocationHandle h, uint64_t bytes,
                      uint64_t gran, int ordinal, st__cuda_mapping_t *out, char *err,
                      size_t errlen) {
  CUdeviceptr va = 0;
  int rc = st__cuda_error(a->cuMemAddressReserve(&va, (size_t)bytes, (size_t)gran, 0, 0),
                          "cuMemAddressReserve", err, errlen);
  if (rc != ST_OK) return rc;
  /* A size larger than the allocation fails here (the driver says
   * CUDA_ERROR_NOT_SUPPORTED or INVALID_VALUE): a lying descriptor cannot
   * map past its end. */
  CUresult r = a->cuMemMap(va, (size_t)bytes, 0, h, 0);
  if (r != CUDA_SUCCESS) {
    char what[96];
    snprintf(what, sizeof what, "cuMemMap of %llu bytes (larger than the allocation?)",
             (unsigned long long)bytes);
    rc = st__cuda_error(r, what, err, errlen);
    if (rc != ST_ERR_OUT_OF_MEMORY) rc = ST_ERR_INVALID_ARGUMENT;
    goto free_va;
  }
  CUmemAccessDesc acc;
  memset(&acc, 0, sizeof acc);
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = ordinal;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  rc = st__cuda_error(a->cuMemSetAccess(va, (size_t)bytes, &acc, 1), "cuMemSetAccess", err,
                      errlen);
  if (rc != ST_OK) goto unmap;
  out->dptr = (uint64_t)va;
  out->bytes = bytes;
  out->ordinal = ordinal;
  return ST_OK;

unmap:
  a->cuMemUnmap(va, (size_t)bytes);
free_va:
  a->cuMemAddressFree(va, (size_t)bytes);
  return rc;
}

/* See import.h. Any thread. */
int st__cuda_import(int fd, uint64_t bytes, const char *uuid, st__cuda_mapping_t *out,
                    char *err, size_t errlen) {
  char dummy[1];
  if (!err) { err = dummy; errlen = sizeof dummy; }
  memset(out, 0, sizeof *out);
  out->ordinal = -1;
  const st__cuda_api_t *a = st__cuda_api(err, errlen);
  if (!a) return ST_ERR_CAPABILITY;
  if (fd < 0 || fcntl(fd, F_GETFD) < 0) {
    snprintf(err, errlen, "import: %d is not an open descriptor", fd);
    return ST_ERR_INVALID_ARGUMENT;
  }
  int ordinal;
  uint64_t gran;
  int rc = st__cuda_import_check(bytes, uuid, &ordinal, &gran, err, errlen);
  if (rc == ST_OK) rc = st__cuda_ctx_enter(ordinal, err, errlen);
  if (rc != ST_OK) return rc;
  CUmemGenericAllocationHandle h;
  CUresult r = a->cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
                                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS) {
    /* The driver answers CUDA_ERROR_UNKNOWN for a descriptor that is not an
     * exported allocation (a pipe, a memfd): that is the caller's input. */
    rc = st__cuda_error(r, "cuMemImportFromShareableHandle (not an exported CUDA allocation?)",
                        err, errlen);
    return rc == ST_ERR_OUT_OF_MEMORY ? rc : ST_ERR_INVALID_ARGUMENT;
  }
  rc = map_handle(a, h, bytes, gran, ordinal, out, err, errlen);
  /* The mapping holds its own reference to the physical memory. */
  a->cuMemRelease(h);
  return rc;
}

/* See import.h. Any thread. */
int st__cuda_create_fd(int ordinal, uint64_t bytes, int *fd, uint64_t *size, char *err,
                       size_t errlen) {
  char dummy[1];
  if (!err) { err = dummy; errlen = sizeof dummy; }
  *fd = -1;
  *size = 0;
  const st__cuda_api_t *a = st__cuda_api(err, errlen);
  if (!a) return ST_ERR_CAPABILITY;
  int rc = st__cuda_ctx_enter(ordinal, err, errlen);
  uint64_t gran = 0;
  if (rc == ST_OK) rc = st__cuda_granularity(ordinal, &gran, err, errlen);
  if (rc != ST_OK) return rc;
  if (bytes > UINT64_MAX - gran || bytes > (uint64_t)(SIZE_MAX / 2)) {
    snprintf(err, errlen, "%llu bytes is too large", (unsigned long long)bytes);
    return ST_ERR_LIMIT;
  }
  uint64_t sz = bytes ? (bytes + gran - 1) / gran * gran : gran;
  CUmemAllocationProp prop;
  st__cuda_alloc_prop(ordinal, &prop);
  CUmemGenericAllocationHandle h;
  CUresult r = a->cuMemCreate(&h, (size_t)sz, &prop, 0);
  if (r != CUDA_SUCCESS) {
    uint64_t free_b = 0, total_b = 0;
    char ignore[8];
    st__cuda_mem_info(ordinal, &free_b, &total_b, ignore, sizeof ignore);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      snprintf(err, errlen, "out of device memory on cuda:%d: %llu bytes requested, %llu free",
               ordinal, (unsigned long long)sz, (unsigned long long)free_b);
      return ST_ERR_OUT_OF_MEMORY;
    }
    return st__cuda_error(r, "cuMemCreate", err, errlen);
  }
  int out = -1;
  rc = st__cuda_error(
      a->cuMemExportToShareableHandle(&out, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
      "cuMemExportToShareableHandle", err, errlen);
  a->cuMemRelease(h);   /* the descriptor keeps the allocation */
  if (rc != ST_OK) return rc;
  fcntl(out, F_SETFD, FD_CLOEXEC);
  *fd = out;
  *size = sz;
  return ST_OK;
}

/* See import.h. Any thread. */
void st__cuda_unmap(st__cuda_mapping_t *m) {
  if (!m || !m->dptr) return;
  const st__cuda_api_t *a = st__cuda_api(NULL, 0);
  if (a && st__cuda_ctx_enter(m->ordinal, NULL, 0) == ST_OK) {
    a->cuMemUnmap((CUdeviceptr)m->dptr, (size_t)m->bytes);
    a->cuMemAddressFree((CUdeviceptr)m->dptr, (size_t)m->bytes);
  }
  memset(m, 0, sizeof *m);
  m->ordinal = -1;
}

/* See import.h. Any thread. */
int st__cuda_set_readonly(const st__cuda_mapping_t *m, char *err, size_t errlen) {
  const st__cuda_api_t *a = st__cuda_api(err, errlen);
  if (!a) return ST_ERR_CAPABILITY;
  int rc = st__cuda_ctx_enter(m->ordinal, err, errlen);
  if (rc != ST_OK) return rc;
  CUmemAccessDesc acc;
  memset(&acc, 0, sizeof acc);
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = m->ordinal;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
  return st__cuda_error(a->cuMemSetAccess((CUdeviceptr)m->dptr, (size_t)m->bytes, &acc, 1),
                        "cuMemSetAccess(PROT_READ)", err, errlen);
}

#else /* !ST_HAVE_CUDA */

/* Every stub's answer: CAPABILITY. */
static int no_cuda(char *err, size_t errlen) {
  if (err && errlen) snprintf(err, errlen, "no CUDA device: built without CUDA support");
  return ST_ERR_CAPABILITY;
}

/* See import.h. */
int st__cuda_set_readonly(const st__cuda_mapping_t *m, char *err, size_t errlen) {
  (void)m;
  return no_cuda(err, errlen);
}

/* See import.h: always ST_ERR_CAPABILITY in a build without CUDA. */
int st__cuda_import_check(uint64_t bytes, const char *uuid, int *ordinal, uint64_t *gran,
                          char *err, size_t errlen) {
  (void)bytes;
  (void)uuid;
  *ordinal = -1;
  *gran = 0;
  return no_cuda(err, errlen);
}

/* See import.h: always ST_ERR_CAPABILITY in a build without CUDA. */
int st__cuda_import(int fd, uint64_t bytes, const char *uuid, st__cuda_mapping_t *out,
                    char *err, size_t errlen) {
  (void)fd;
  (void)bytes;
  (void)uuid;
  memset(out, 0, sizeof *out);
  out->ordinal = -1;
  return no_cuda(err, errlen);
}

/* See import.h. */
void st__cuda_unmap(st__cuda_mapping_t *m) {
  if (!m) return;
  memset(m, 0, sizeof *m);
  m->ordinal = -1;
}

/* See import.h. */
int st__cuda_create_fd(int ordinal, uint64_t bytes, int *fd, uint64_t *size, char *err,
                       size_t errlen) {
  (void)ordinal;
  (void)bytes;
  *fd = -1;
  *size = 0;
  return no_cuda(err, errlen);
}

#endif

