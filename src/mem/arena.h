/* src/mem: arenas, the allocations that hold tensor data and travel to
 * clients as file descriptors (docs/design.md, section 3).
 *
 * An arena is one allocation: for the CPU backend a sealed memfd mapped
 * read-write in the server; for the CUDA backend an exported VMM allocation
 * mapped on its device (st__arena_new_cuda, src/mem/cuda.h); for endpoints
 * declared with ipc = "legacy", a dedicated cuMemAlloc allocation exported
 * as a legacy CUDA IPC handle, which travels without a descriptor
 * (st__arena_new_cuda_legacy, src/mem/cuda_legacy.c). Tensors live in an arena at byte offsets; an
 * object (a module, a result tensor) is one arena. The server's reference
 * and each client's mapping are independent: the kernel keeps the memory
 * while any fd or mapping exists, so unref'ing the last server reference
 * never invalidates what a client mapped.
 *
 * Every arena the server allocates is charged to the ledger (ledger.h)
 * before its memory exists and discharged by its last unref: its
 * allocated bytes on its device, and one descriptor when it keeps one
 * open (memfd arenas and tensor arguments; a VMM arena keeps only its
 * allocation handle and exports a descriptor per reply).
 *
 * Mapped or not: every arena the server makes is mapped in the server from
 * birth (st__arena_base is its address). An allocation a client sent
 * (st__arena_import) is mapped for CPU at import (an mmap costs little)
 * but for CUDA only on first need: the import keeps the received
 * descriptor (which keeps the allocation alive whether or not anything
 * maps it) after an fstat that it is a CUDA one, and st__arena_map
 * imports the handle, reserves, maps and sets access the first time
 * server code reads or writes it (an endpoint reading a key or an
 * argument, a `contiguous` copy). A put that nothing in the server reads
 * makes no driver call that costs (docs/keys.md, section 1, "Cost"). Code
 * that touches the memory of an arena
 * it did not make goes through st__arena_map (st__tensor_from_desc does,
 * so every tensor of the tensor core has a mapped arena) and turns its
 * failure into an error reply; st__arena_base alone is for the server's
 * own arenas and for arenas st__arena_map succeeded on.
 *
 * Threads: arenas are created and filled on worker threads and handed to the
 * loop thread; the reference count is atomic, so ref/unref may be called
 * from any thread. st__arena_map is thread-safe (one mapping, whoever asks
 * first; the loop and workers may race to it). The data itself is not
 * locked.
 */
#ifndef ST_MEM_ARENA_H
#define ST_MEM_ARENA_H

#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

typedef struct st__arena st__arena_t;
struct st__cuda_alloc;           /* src/mem/cuda.h */

/* Offsets of tensors inside an arena are multiples of this. */
#define ST_ARENA_ALIGN 256u

/* Creates a CPU arena of `bytes` (0 is allowed and still yields a valid,
 * mappable arena of one page), zero-filled: a memfd named
 * "st-arena-<id>", sized, sealed against shrinking and growing (a client
 * cannot truncate it under the server), and mapped read-write.
 * On success *out holds one reference owned by the caller.
 * Errors: ST_ERR_OUT_OF_MEMORY (the cpu memory budget, or the kernel),
 * ST_ERR_LIMIT (bytes above the process-wide cap set by
 * st__arena_set_limit or above the host's memory, the descriptor cap of
 * the ledger, out of descriptors), with a reason in err. Any thread;
 * may wait for the ledger's reclaim hook. */
int st__arena_new_cpu(uint64_t bytes, st__arena_t **out, char *err, size_t errlen);

/* Creates a CUDA arena of `bytes` on device `ordinal` of this process
 * (src/mem/cuda_arena.c): one VMM allocation (cuMemCreate, POSIX-fd
 * shareable, never FABRIC) of `bytes` rounded up to the allocation
 * granularity (one granule for 0), exported to a descriptor once, mapped
 * read-write on that device in the server (st__arena_base is then a device
 * address, usable by kernels in that device's context) and zero-filled.
 * The server keeps no descriptor: st__arena_dup_fd exports a new one
 * each time (st__cuda_alloc_export); describe() says cuda,
 * "vmm" and the device UUID. On success *out holds one reference owned by
 * the caller. Errors: ST_ERR_LIMIT (over the cap of st__arena_set_limit),
 * ST_ERR_OUT_OF_MEMORY (the device's memory budget, or the device, with
 * the requested and free bytes in err),
 * ST_ERR_INVALID_ARGUMENT (no such ordinal), ST_ERR_CAPABILITY ("no CUDA
 * device: <reason>"). Any thread; leaves the device's primary context
 * current on the calling thread. */
int st__arena_new_cuda(int ordinal, uint64_t bytes, st__arena_t **out, char *err, size_t errlen);

/* Creates a legacy CUDA IPC arena of `bytes` on device `ordinal`
 * (src/mem/cuda_legacy.c): one dedicated cuMemAlloc allocation of `bytes`
 * rounded up to the VMM allocation granularity (one granule for 0; never
 * shared with another arena or with VMM memory), zero-filled, and its
 * cudaIpcMemHandle_t taken once (cuIpcGetMemHandle of the base).
 * st__arena_base is the device address; the arena has no descriptor
 * (st__arena_has_fd is 0); describe() says cuda, "legacy", the UUID, the
 * handle, the ordinal and the usable bytes. Freed with cuMemFree on the
 * last unref. Errors as st__arena_new_cuda. Any thread; leaves the
 * device's primary context current on the calling thread. */
int st__arena_new_cuda_legacy(int ordinal, uint64_t bytes, st__arena_t **out, char *err,
                              size_t errlen);

/* How a CUDA arena travels to clients: an exported VMM allocation (a
 * descriptor), or a legacy CUDA IPC handle (endpoints with ipc = "legacy"). */
typedef enum {
  ST__CUDA_IPC_VMM = 0,
  ST__CUDA_IPC_LEGACY = 1
} st__cuda_ipc_t;

/* What st__arena_new makes. */
typedef struct st__arena_spec {
  int device;                 /* -1: the CPU, else a CUDA ordinal         */
  st__cuda_ipc_t ipc;         /* CUDA only                                */
  uint64_t bytes;
  int no_zero_fill;           /* a recycled pool region is not zero-filled
                                 first: the caller writes every one of
                                 `bytes` before anything reads them, or
                                 promises no contents (st.empty); such a
                                 region holds only earlier results of the
                                 pool's own connection                    */
  void *stream;               /* CUDA: the caller's stream (a CUstream)
                                 where a recycled region's zero fill is
                                 queued; the caller synchronizes it before
                                 the memory is used elsewhere. NULL: the
                                 fill is synchronous                      */
  int uncommitted;            /* CPU: the memfd's pages are not committed
                                 when it is made (no fallocate, which runs
                                 on one thread at a few GB/s): the caller
                                 commits every page with st__arena_commit,
                                 from as many threads as it likes, or
                                 writes it with st__arena_splice, before
                                 anything else touches it. Large ones are
                                 asked for huge pages (MADV_HUGEPAGE: used
                                 where the host's shmem_enabled allows,
                                 st__arena_shmem_huge).
                                 Ignored for a pool region and CUDA      */
} st__arena_spec_t;

/* The one choice of backend for a new arena: a region of the pool the
 * thread's source gives (st__arena_use_source), else a device -1 (the
 * CPU) makes st__arena_new_cpu's memfd, a CUDA ordinal
 * st__arena_new_cuda's VMM allocation, or st__arena_new_cuda_legacy's
 * for ST__CUDA_IPC_LEGACY. Every arena reads as zeros except where a
 * `no_zero_fill` spec reuses a recycled region (a new memfd or VMM allocation is
 * zero-filled whatever the spec says: it may hold another process's
 * old data). Contract and errors as those functions. */
int st__arena_new(const st__arena_spec_t *s, st__arena_t **out, char *err, size_t errlen);

/* Commits the pages of [off, off + len) of an arena made `uncommitted`
 * (rounded out to pages): faulted in writable with one call
 * (MADV_POPULATE_WRITE), or, on a kernel without it, allocated in the
 * memfd (fallocate). So a shortage of memory is an error here instead of
 * a SIGBUS at the first write. Other arenas are committed already:
 * ST_OK. Errors: ST_ERR_OUT_OF_MEMORY with the reason in err. Any thread;
 * threads may commit disjoint or overlapping ranges at once. */
int st__arena_commit(st__arena_t *a, uint64_t off, uint64_t len, char *err, size_t errlen);

/* Writes the `len` bytes waiting in the pipe `pipe_rd` (all of them, or
 * fewer than it holds) into a CPU arena's memfd at `off`, for an arena
 * made `uncommitted` (splice: the kernel copies them into the memfd's
 * pages, allocating those it lacks without zero-filling a page the copy
 * covers whole, and maps nothing in this process). Those pages are then
 * committed as by st__arena_commit; a page it covers in part is
 * zero-filled around the bytes (the kernel locks the page: a reader
 * committing and writing the rest of it at once is safe). The memfd's
 * writes are serialized by the kernel (its inode lock), so one writer at a
 * time is the useful number. Errors: ST_ERR_CAPABILITY when the kernel
 * refuses to splice into the memfd (EINVAL, ENOSYS, EOPNOTSUPP, EPERM:
 * the caller writes the bytes another way; the pipe may still hold some),
 * or for an arena with no memfd of its own (a pool region, CUDA);
 * ST_ERR_OUT_OF_MEMORY when the pages cannot be allocated, worded as
 * st__arena_commit's; ST_ERR_INVALID_ARGUMENT for a range past its end or
 * a pipe holding less than `len` (it never blocks). Any thread. */
int st__arena_splice(st__arena_t *a, uint64_t off, int pipe_rd, uint64_t len, char *err,
                     size_t errlen);

/* 1 when this host gives large folios to shared memory that asks for them
 * (MADV_HUGEPAGE, as st__arena_new does for a large uncommitted arena):
 * transparent_hugepage/shmem_enabled is always, within_size, advise or
 * force, or one of the per-size hugepages-<size>/shmem_enabled files is
 * always, within_size or advise (or inherit from an enabled top). 0
 * otherwise (never, deny, no such files). `what` (may be NULL) gets the
 * settings read, e.g. "shmem_enabled never" or "shmem_enabled never, 64kB
 * advise". Reads sysfs on each call. Any thread. */
int st__arena_shmem_huge(char *what, size_t len);

/* Caps the size of one arena (config max_object_bytes). Call once at start
 * before any worker runs. 0 means no cap. */
void st__arena_set_limit(uint64_t max_bytes);

/* Reference counting; unref of the last reference unmaps and closes: at
 * once, or on the releaser thread when the caller is a loop thread and
 * the teardown is slow (mem/arena_release.h: CUDA arenas, big memfds),
 * the ledger charge going with the teardown. NULL is a no-op for unref.
 * Any thread. */
void st__arena_ref(st__arena_t *a);
void st__arena_unref(st__arena_t *a);

/* Base address in the server (borrowed, valid while a reference is held;
 * a device address for a CUDA arena; NULL for an imported CUDA arena that
 * st__arena_map has not mapped yet), usable size (what was asked for),
 * and the process-unique id. */
void *st__arena_base(const st__arena_t *a);
uint64_t st__arena_bytes(const st__arena_t *a);
uint64_t st__arena_id(const st__arena_t *a);

/* The arena's memory mapped in the server, mapped here on first need:
 * ST_OK with the base address in *base (may be NULL; borrowed, valid while
 * a reference is held). Every arena is mapped already but an imported CUDA
 * one (st__arena_import), which the first caller imports and maps once
 * for all (st__cuda_import of its descriptor: cuMemImportFromShareableHandle,
 * cuMemAddressReserve, cuMemMap, cuMemSetAccess read-write on its device,
 * cuMemRelease of the handle; under the arena's lock); later callers only
 * load the address. A failed mapping leaves the arena unmapped (and still
 * held: its descriptor keeps the memory), a later call tries again.
 * Errors: ST_ERR_INVALID_ARGUMENT (the descriptor is no exported
 * allocation: the import refuses; the allocation is smaller than its
 * descriptor claimed: cuMemMap refuses),
 * ST_ERR_OUT_OF_MEMORY (no address space or device memory),
 * ST_ERR_CAPABILITY, another ST_ERR_* for a driver failure, with
 * "mapping imported CUDA allocation (arena <id>, <bytes> bytes on <uuid>)
 * in the server: <reason>" in err (may be NULL). Any thread; a CUDA
 * mapping leaves the device's primary context current. */
int st__arena_map(st__arena_t *a, void **base, char *err, size_t errlen);

/* Nonzero when the arena travels to clients as a descriptor (memfd and
 * VMM arenas); 0 for a legacy CUDA IPC arena, which a reply describes by
 * its handle alone. Any thread. */
int st__arena_has_fd(const st__arena_t *a);

/* A new descriptor for the allocation, to send to one client (the caller
 * owns it and closes it after sendmsg): a dup of a memfd arena's or
 * tensor argument's descriptor, a new export of a VMM arena. Returns the
 * fd, or a negative ST_ERR_* (ST_ERR_LIMIT when the process is out of
 * descriptors, ST_ERR_INVALID_ARGUMENT for an arena without one:
 * st__arena_has_fd) with the reason in err (may be NULL). Any thread. */
int st__arena_dup_fd(const st__arena_t *a, char *err, size_t errlen);

/* As st__arena_dup_fd, but for a CPU arena a descriptor that cannot map
 * the memory writable: the memfd reopened O_RDONLY through /proc/self/fd
 * (mmap with PROT_WRITE and MAP_SHARED fails with EACCES). A CUDA arena's
 * descriptor is st__arena_dup_fd's: read-only access to it is set by the
 * importer (the client library). Any thread. */
int st__arena_dup_fd_readonly(const st__arena_t *a, char *err, size_t errlen);

/* Fills everything of *d except d->fd (the message-local index; a legacy
 * arena has none and sets d->legacy). */
void st__arena_describe(const st__arena_t *a, st__arena_desc_t *d);

/* Device ordinal (in this process) of a CUDA arena (VMM or legacy); -1
 * for a CPU arena. */
int st__arena_device(const st__arena_t *a);

/* For backends (cuda_arena.c): ST_OK when an arena of `bytes` is within
 * the cap of st__arena_set_limit, else ST_ERR_LIMIT with the reason. */
int st__arena_check_limit(uint64_t bytes, char *err, size_t errlen);

/* For backends: wraps a CUDA allocation (ownership moves to the arena,
 * which frees it with st__cuda_alloc_free on the last unref) into a new
 * arena holding one reference, with the ledger charge of `size` bytes that
 * st__cuda_arena_prepare made on its device. `base` is the server's
 * device address, `size` the allocated size. NULL when out of host memory
 * (the caller still owns c and the charge). */
st__arena_t *st__arena_adopt_cuda(struct st__cuda_alloc *c, uint64_t bytes, uint64_t size,
                                  void *base);

/* Regions of a pool (mem/pool.h), without this file knowing pools:
 * st__arena_adopt_region wraps region `slot` of `owner` at `base` (a
 * device address when `device` >= 0; `bytes` asked for, `size` the
 * region's) into an arena holding one reference; its last unref calls
 * release(owner, slot). The ledger holds nothing for it (the slab is
 * charged), and st__arena_dup_fd refuses it: a reply describes it by its
 * slab (server/pool_conn.c). NULL when out of host memory. Any thread. */
typedef void (*st__arena_release_fn)(void *owner, uint32_t slot);
st__arena_t *st__arena_adopt_region(st__arena_release_fn release, void *owner, uint32_t slot,
                                    int device, void *base, uint64_t bytes, uint64_t size);

/* 1 with its owner and slot when `a` is a region, else 0. Any thread. */
int st__arena_region(const st__arena_t *a, void **owner, uint32_t *slot);

/* Where st__arena_new takes arenas from on this thread before it makes
 * one of their own: fn(ctx, spec, out) returns ST_OK with a region,
 * anything else to fall back (NULL fn: none). Worker thread; the caller
 * keeps ctx alive while it is set. */
typedef int (*st__arena_source_fn)(void *ctx, const st__arena_spec_t *s, st__arena_t **out);
void st__arena_use_source(st__arena_source_fn fn, void *ctx);

/* For backends: wraps a legacy allocation (ownership moves to the arena,
 * which frees it with st__cuda_legacy_free on the last unref) into a new
 * arena holding one reference and the ledger charge of `size` bytes;
 * `base` is its device address, `size` the allocated size. NULL when out
 * of host memory (the caller still owns l and the charge). */
struct st__cuda_legacy;
st__arena_t *st__arena_adopt_cuda_legacy(struct st__cuda_legacy *l, uint64_t bytes,
                                         uint64_t size, void *base);

/* Adopts an allocation a client sent as a tensor argument
 * (docs/protocol.md, "Tensor arguments"): `d` is the request's arena
 * descriptor, `fd` its received descriptor (ownership moves to the arena,
 * closed on failure too). A CPU arena must be a memfd sealed against
 * shrinking (so that no other holder can truncate it under the server's
 * mapping: a SIGBUS) and at least d->bytes long; it is mapped read-write.
 * A CUDA arena ("vmm") is checked without importing it: its descriptor
 * must be a file of the NVIDIA control device (st__cuda_fd_check, one
 * fstat: a memfd, pipe, socket or file is refused here), its UUID a
 * visible device's and its size a multiple of that device's granularity
 * (st__cuda_import_check). It is neither imported nor mapped:
 * st__arena_map does both on first need, and a descriptor the driver
 * refuses or a size claim larger than the allocation fails there (the
 * driver cannot tell either before it imports and maps). The arena
 * describes itself
 * with a new server id and the same backend, and st__arena_dup_fd dups the
 * received descriptor, so an endpoint may return it. The descriptor it
 * keeps is charged to the ledger (the memory is the client's and is not).
 * On success *out holds
 * one reference owned by the caller. Errors: ST_ERR_INVALID_ARGUMENT (not
 * a sealed memfd, too short, not writable; "backend vmm, but the
 * descriptor is a pipe, not an exported CUDA allocation"; a size that is
 * no granularity multiple; a legacy arena), ST_ERR_NOT_FOUND (no visible
 * device has the UUID), ST_ERR_CAPABILITY (no CUDA), ST_ERR_OUT_OF_MEMORY,
 * ST_ERR_LIMIT (the ledger's descriptor cap), with the reason in err. Any
 * thread: no driver call but queries (the loop thread imports a put's
 * arguments). */
int st__arena_import(const st__arena_desc_t *d, int fd, st__arena_t **out, char *err,
                     size_t errlen);

/* For st__arena_import: wraps a client's CUDA allocation of `bytes`
 * received as `fd` (moves to the arena, which closes it on the last
 * unref) from device `uuid` (ordinal `ordinal` here) into a new arena
 * holding one reference, neither imported nor mapped (st__arena_map),
 * with the ledger charge of one descriptor that the caller made
 * (st__ledger_charge(-1, 0, 1)). NULL when out of host memory (the caller
 * still owns fd and the charge). Any thread. */
st__arena_t *st__arena_adopt_cuda_import(int fd, uint64_t bytes, int ordinal, const char *uuid);

/* The memory file a CPU arena keeps open, as the kernel names it (its
 * device and inode: two descriptors of one memfd name the same file):
 * 1 with *dev and *ino set; 0 for an arena with no memory file (CUDA
 * arenas among them: a driver's exported descriptors can share one
 * inode). Any thread. */
int st__arena_file_id(const st__arena_t *a, uint64_t *dev, uint64_t *ino);

/* What the ledger holds for the arena: its device (-1: the CPU), bytes
 * (0 for a tensor argument) and descriptors (0 or 1). Any thread. */
void st__arena_charge(const st__arena_t *a, int *device, uint64_t *bytes, unsigned *fds);

/* Live arenas and their bytes in this process (for info and leak checks). */
void st__arena_stats(uint64_t *count, uint64_t *bytes);

#endif
