/* src/cudadrv/import.h: an allocation exported by another process, mapped
 * into this one (import.c): the checks of a received descriptor before
 * the driver sees it, the import, reserve, map and access steps, and the
 * allocations a client makes to pass as arguments. The client library
 * and the server (tensor arguments, published keys) both use it.
 */
#ifndef ST_CUDADRV_IMPORT_H
#define ST_CUDADRV_IMPORT_H

#include <stdint.h>

#include "cudadrv/driver.h"
/* One allocation mapped into this process from an exported descriptor. */
typedef struct st__cuda_mapping {
  uint64_t dptr;     /* device address in this process (0: not mapped) */
  uint64_t bytes;    /* mapped size (the arena's allocated size)       */
  int ordinal;       /* device ordinal in this process                 */
} st__cuda_mapping_t;

/* Makes mapping m read-only on its device (cuMemSetAccess with
 * CU_MEM_ACCESS_FLAGS_PROT_READ): a kernel that writes it faults in this
 * process (docs/keys.md, "Read-only mappings"). ST_OK or the driver's
 * failure. Any thread; leaves m's device context current. */
int st__cuda_set_readonly(const st__cuda_mapping_t *m, char *err, size_t errlen);

/* What kind of file a st_mode names, for messages: "a regular file",
 * "a pipe", "a socket", "a character device", ... Any thread. */
const char *st__file_kind(unsigned mode);

/* Checks, without the driver, that `fd` can be an exported VMM allocation
 * (import.c): on Linux such a descriptor is a file of the NVIDIA
 * control device, a character device with the device number of
 * /dev/nvidiactl (stat'ed once per process; when it cannot be, major 195).
 * The driver checks the rest (that it is an allocation, its size) when it
 * imports. ST_OK, or ST_ERR_INVALID_ARGUMENT with "the descriptor is a
 * pipe, not an exported CUDA allocation" (a memfd, a file, a socket, ...)
 * or "the descriptor is the character device M:m, not an exported CUDA
 * allocation (a file of the NVIDIA control device, /dev/nvidiactl)" in
 * err (may be NULL). One fstat; any thread; in builds without CUDA too. */
int st__cuda_fd_check(int fd, char *err, size_t errlen);

/* Checks an allocation's description before anything imports it: the
 * device whose UUID is `uuid` is visible here (*ordinal) and `bytes` is a
 * positive multiple of its allocation granularity (*gran). Driver queries
 * only (no import, no context made current). ST_OK, ST_ERR_NOT_FOUND (no
 * visible device has that UUID), ST_ERR_INVALID_ARGUMENT (bad size or
 * UUID), ST_ERR_CAPABILITY (no driver), with the reason in err. Any
 * thread. */
int st__cuda_import_check(uint64_t bytes, const char *uuid, int *ordinal, uint64_t *gran,
                          char *err, size_t errlen);

/* Maps an allocation received as a POSIX descriptor (import.c), so
 * that the mapping alone keeps the memory: finds the device whose UUID
 * is `uuid` (st__cuda_import_check), imports `fd` (borrowed: the caller
 * closes it afterwards, the mapping does not need it), reserves `bytes`
 * of address space (a multiple of the allocation granularity, as the
 * server sends it), maps the whole allocation read-write on that device
 * and releases the imported handle. On success *out is filled; undo with
 * st__cuda_unmap. Errors: ST_ERR_NOT_FOUND (no visible device has that
 * UUID), ST_ERR_INVALID_ARGUMENT (bad fd or size; not an exported CUDA
 * allocation: "cuMemImportFromShareableHandle ..."; a size claim larger
 * than the allocation: "cuMemMap ..."), ST_ERR_OUT_OF_MEMORY (no address
 * space), ST_ERR_CAPABILITY (no driver), with the reason in err. Any thread; the device's primary
 * context is current on the calling thread afterwards. */
int st__cuda_import(int fd, uint64_t bytes, const char *uuid, st__cuda_mapping_t *out,
                    char *err, size_t errlen);

/* Creates a VMM allocation of `bytes` (rounded up to the granularity; one
 * granule for 0) on device `ordinal`, exportable as a POSIX descriptor
 * (st__cuda_alloc_prop), exports it and releases the handle: *fd (owned by
 * the caller, close-on-exec) then names the memory alone, and *size is the
 * allocated size to import it with (st__cuda_import). A client makes the
 * tensors it passes as arguments this way. ST_ERR_OUT_OF_MEMORY (with the
 * free bytes), ST_ERR_INVALID_ARGUMENT (bad ordinal), ST_ERR_CAPABILITY.
 * Any thread; the device's primary context is current afterwards. */
int st__cuda_create_fd(int ordinal, uint64_t bytes, int *fd, uint64_t *size, char *err,
                       size_t errlen);

/* Unmaps and frees the address range of a mapping filled by
 * st__cuda_import and clears it; the driver frees the memory once no
 * process maps it and no descriptor or handle remains. NULL or an
 * unmapped struct is a no-op. Any thread. */
void st__cuda_unmap(st__cuda_mapping_t *m);

#endif
