/* src/mem: safetensors checkpoints loaded into one arena
 * (docs/design.md, section 7; docs/endpoints.md "Loading safetensors").
 *
 *   st__safetensors_open    reads and validates the header(s) of one file or
 *                           of a sharded checkpoint (a directory holding
 *                           model.safetensors.index.json); keeps the files
 *                           open so that the load reads what was validated
 *   st__safetensors_load    lays every tensor out in ONE arena (CPU memfd or
 *                           CUDA VMM) at ST_ARENA_ALIGN offsets and fills it
 *   st__safetensors_parse   the header parser alone (bytes in, no I/O)
 *
 * Files (headers and indexes are read by src/common/json.c):
 *   safetensors_parse.c  header schema: dtypes, shapes, offsets, metadata
 *   safetensors_open.c   files, shard indexes, data_dirs confinement
 *   safetensors_load.c   layout, CPU reader threads, dtype conversion
 *   safetensors_cuda.c   the pinned staging pool and the copies to a device
 *
 * Process-wide settings (set once at start, before workers run):
 * st__safetensors_set_data_dirs, st__safetensors_set_loader_threads and,
 * when a CUDA device is served, st__staging_init.
 */
#ifndef ST_MEM_SAFETENSORS_H
#define ST_MEM_SAFETENSORS_H

#include <stddef.h>
#include <pthread.h>
#include <stdint.h>

#include "common/json.h"
#include "mem/arena.h"
#include "st/dtype.h"
#include "st/errors.h"
#include "st/wire.h"

/* Largest JSON header accepted (the format's own limit). */
#define ST_SAFETENSORS_MAX_HEADER (100ull * 1000 * 1000)
/* Largest index file accepted. */
#define ST_SAFETENSORS_MAX_INDEX (100ull * 1000 * 1000)
/* Name of the index of a sharded checkpoint inside its directory. */
#define ST_SAFETENSORS_INDEX "model.safetensors.index.json"
/* Staging chunks and CPU read pieces are at least this large. */
#define ST_SAFETENSORS_MIN_CHUNK (4ull << 20)
/* Default pinned staging pool (config staging_bytes). */
#define ST_SAFETENSORS_DEFAULT_STAGING (256ull << 20)

/* One tensor of a checkpoint. */
typedef struct st__safetensors_tensor {
  char *name;                  /* owned, NUL-terminated, non-empty        */
  st_dtype_t dtype;            /* as stored in the file                   */
  int ndim;
  int64_t shape[ST_MAX_NDIM];
  uint64_t numel;              /* product of shape (1 for ndim 0)         */
  uint64_t begin, end;         /* [begin, end) in the file's data buffer  */
  int file;                    /* index into st__safetensors_t.files      */
} st__safetensors_tensor_t;

/* One file of a checkpoint. */
typedef struct st__safetensors_file {
  char *path;                  /* owned: the resolved path (for messages) */
  int fd;                      /* owned, read-only; -1 in parse-only use  */
  uint64_t size;               /* file size in bytes                      */
  uint64_t data_start;         /* 8 + header length                       */
} st__safetensors_file_t;

/* A parsed checkpoint: files, tensors in module order, __metadata__. */
typedef struct st__safetensors {
  st__safetensors_file_t *files;
  size_t nfiles;
  st__safetensors_tensor_t *tensors;
  size_t ntensors;
  char **meta_keys;            /* owned, nmeta each */
  char **meta_values;
  size_t nmeta;
  size_t cap_tensors, cap_meta;  /* allocation sizes */
} st__safetensors_t;

/* Parses one JSON header `hdr` of `len` bytes (what follows the 8-byte
 * length; trailing spaces allowed) of a file whose data buffer holds
 * `data_bytes` bytes, and appends its tensors (in header order, file index
 * `file_index`) and its __metadata__ entries (keys already present are
 * kept) to *into. Validates the JSON, each entry's fields, dtypes, shapes
 * (non-negative, at most ST_MAX_NDIM, no overflow), offsets (inside the
 * buffer, end - begin == numel * element size), that no two non-empty
 * tensors overlap and that names are unique within the header. `file`
 * names the file in messages ("<file>: tensor 'x': ..."). ST_OK or
 * ST_ERR_INVALID_ARGUMENT (bad header), ST_ERR_OUT_OF_MEMORY; on error *into
 * may hold part of the header (the caller frees it). No I/O; any thread. */
int st__safetensors_parse(const char *hdr, size_t len, uint64_t data_bytes, const char *file,
                          int file_index, st__safetensors_t *into, char *err, size_t errlen);

/* Opens `path`: a .safetensors file, a directory holding
 * model.safetensors.index.json, or such an index file. With `confine`, the
 * path (a relative one is looked up in each data dir in turn) and every
 * shard must resolve (realpath) inside one of the data dirs set by
 * st__safetensors_set_data_dirs; otherwise relative paths are relative to
 * the working directory. Shards are plain file names inside the index's
 * directory; every tensor of every shard must be in the weight_map and
 * every weight_map entry must be in its shard. Tensors come in the order
 * of the file's header, or of the index's weight_map for shards; metadata
 * is the union of the files' __metadata__ (first value wins). On success
 * *out is owned by the caller (st__safetensors_free). Errors, each naming
 * the file and, where it applies, the tensor: ST_ERR_NOT_FOUND (missing
 * file or shard), ST_ERR_AUTH (outside the data dirs, naming them),
 * ST_ERR_INVALID_ARGUMENT (malformed or truncated file, bad index),
 * ST_ERR_OUT_OF_MEMORY. Any thread; blocking I/O. */
int st__safetensors_open(const char *path, int confine, st__safetensors_t **out, char *err,
                         size_t errlen);

/* Closes the files and frees everything of s, s included. NULL is a no-op.
 * Also frees a struct filled only by st__safetensors_parse (fds < 0) when
 * it was calloc'ed. Any thread. */
void st__safetensors_free(st__safetensors_t *s);

/* Frees what s holds but not s itself (for a struct on the stack). */
void st__safetensors_clear(st__safetensors_t *s);

/* What st__safetensors_load does. */
typedef struct st__safetensors_opts {
  st_dtype_t dtype;            /* ST_DTYPE_INVALID: keep each tensor's dtype;
                                  a floating dtype: floating tensors are
                                  converted to it, others are kept        */
  int device;                  /* -1: CPU arena; N >= 0: CUDA arena on ordinal N */
  void *stream;                /* CUstream for the copies to the device; NULL:
                                  the load creates one and destroys it      */
  int threads;                 /* reader threads; <= 0: the process default */
  /* Polled before each piece from the reader threads (may be NULL): a
   * nonzero return (ST_ERR_TIMEOUT, ST_ERR_CANCELLED) stops the load with
   * that error. Must be thread-safe. */
  int (*stop)(void *ud);
  void *stop_ud;
} st__safetensors_opts_t;

/* Creates ONE arena (CPU memfd for o->device < 0, else a CUDA VMM arena on
 * that ordinal) holding every tensor of s at the offsets of
 * safetensors_load.c's layout (filled into offsets/dtypes, caller arrays of
 * s->ntensors) and reads the data into it: on the CPU from o->threads
 * threads in pieces of >= 4 MiB, one reader at a time splicing its piece
 * into the memfd, the others preading straight into pages they commit
 * (safetensors_load.c); for CUDA
 * through the pinned staging pool (file -> pinned chunk -> device with
 * cuMemcpyHtoDAsync on the stream, reads overlapping copies); conversion
 * to o->dtype runs on the CPU per piece (in the staging chunk before the
 * copy for CUDA). The stream is synchronized before returning. On success
 * *arena holds one reference owned by the caller; on any failure nothing
 * is left allocated. Errors: those of the arena constructors
 * (ST_ERR_OUT_OF_MEMORY, ST_ERR_LIMIT, ST_ERR_CAPABILITY), ST_ERR_IO
 * (a read failed, the file shrank), ST_ERR_TIMEOUT / ST_ERR_CANCELLED (from
 * o->stop). Any thread (a worker); blocks; the device's primary context is
 * current on the calling thread afterwards for CUDA. */
int st__safetensors_load(const st__safetensors_t *s, const st__safetensors_opts_t *o,
                         st__arena_t **arena, uint64_t *offsets, st_dtype_t *dtypes, char *err,
                         size_t errlen);

/* ------------------------------------------------ process-wide settings */

/* Sets the directories that confined opens must resolve into (copies
 * them; config data_dirs). The server calls it once at start; calling it
 * again replaces the list. With no list set, every confined open is
 * refused. Any thread. */
void st__safetensors_set_data_dirs(const char *const *dirs, int n);

/* Writes the data dirs as "a, b" into buf (for messages). Any thread. */
void st__safetensors_data_dirs_text(char *buf, size_t len);

/* Default number of reader threads of a load (config loader_threads,
 * clamped to 1..64; default 4). Any thread. */
void st__safetensors_set_loader_threads(int n);
int st__safetensors_loader_threads(void);

/* Allocates the process's pinned staging pool: `bytes` (0: 256 MiB)
 * rounded down to whole chunks of max(4 MiB, bytes / 16) (at most 64 MiB),
 * one cuMemHostAlloc (portable, so every device's context can use it),
 * kept until the process exits. The server calls it at start when it
 * serves a CUDA device (pinned allocation is slow: docs/benchmarks.md,
 * "Driver and socket costs"); without
 * that call the first CUDA load allocates the default size. A second call
 * does nothing. ST_OK, ST_ERR_CAPABILITY (no CUDA device), or
 * ST_ERR_OUT_OF_MEMORY. Any thread. */
int st__staging_init(uint64_t bytes, char *err, size_t errlen);

/* Size of the pool's chunks and their count (0, 0 before it exists). */
void st__staging_info(uint64_t *chunk_bytes, int *nchunks);

/* ------------------------------------------- internal to these files */

/* Converts n elements from sdt at src to ddt at dst (st_dtype_store
 * rounding). Any thread. */
void st__safetensors_convert(void *dst, st_dtype_t ddt, const void *src, st_dtype_t sdt,
                             uint64_t n);

/* One piece of work: n elements of the tensor at file offset src_off
 * (absolute) to arena offset dst_off, converted from sdt to ddt. */
typedef struct st__sft_piece {
  int file;
  uint64_t src_off;
  uint64_t n;
  uint64_t dst_off;
  st_dtype_t sdt, ddt;
} st__sft_piece_t;

/* Reads exactly `bytes` at `off` of file f into dst. ST_OK or
 * ST_ERR_IO naming the file (short read: the file shrank). */
int st__safetensors_pread(const st__safetensors_file_t *f, void *dst, uint64_t bytes,
                          uint64_t off, char *err, size_t errlen);

/* Moves up to `bytes` of file f at `off` into the pipe `pipe_wr` with one
 * splice (page-cache pages are handed over, not copied; at most what the
 * pipe has room for). Returns the count moved (> 0), or a negative
 * ST_ERR_*: ST_ERR_IO naming the file, as st__safetensors_pread words it
 * (a failed read; the file ends before `off`: it shrank), or
 * ST_ERR_CAPABILITY when the kernel refuses to splice the file (EINVAL,
 * ENOSYS, EOPNOTSUPP, EPERM: the caller reads it another way). Any
 * thread; the pipe's reader must drain it before the next call. */
int64_t st__safetensors_splice(const st__safetensors_file_t *f, int pipe_wr, uint64_t bytes,
                               uint64_t off, char *err, size_t errlen);

/* How the CPU loads of this process filled their arenas, in bytes of
 * tensor data since the start (counters only grow): copied in the kernel
 * from the page cache into the memfd (splice, one reader at a time),
 * read into pages committed by the readers (pread into the mapping), and
 * converted (read into a buffer, converted into committed pages). Any
 * thread. */
typedef struct st__safetensors_cpu_counts {
  uint64_t spliced;
  uint64_t read;
  uint64_t converted;
} st__safetensors_cpu_counts_t;
void st__safetensors_cpu_counts(st__safetensors_cpu_counts_t *out);

/* The shared state of one parallel load: reader threads take work items
 * 0 .. count-1 in turn and record the first failure, after which the
 * others stop. Owned by the thread that runs the load (on its stack);
 * readers borrow it until they are joined. */
typedef struct st__sft_run {
  const st__safetensors_opts_t *o;  /* its stop callback is polled */
  size_t count;                     /* work items */
  size_t next;                      /* atomic: next item */
  int failed;                       /* atomic: a reader failed */
  pthread_mutex_t lock;             /* guards rc and err (and may guard more) */
  int rc;                           /* the first failure, or ST_OK */
  char err[512];
} st__sft_run_t;

/* Starts r for `count` items of the load described by o. */
void st__sft_run_init(st__sft_run_t *r, const st__safetensors_opts_t *o, size_t count);
/* Runs `reader(arg)` on `threads` threads (the caller's one of them) and
 * returns when all are done: r->rc and r->err then hold the outcome. */
void st__sft_run_readers(st__sft_run_t *r, int threads, void *(*reader)(void *), void *arg);
void st__sft_run_destroy(st__sft_run_t *r);
/* Records rc and msg unless a failure was recorded first; the other
 * readers then stop. Any reader thread. */
void st__sft_run_fail(st__sft_run_t *r, int rc, const char *msg);
/* The next item for a reader thread, or -1 when none is left, a reader
 * failed, or the load must stop (timeout or cancel: recorded). */
int64_t st__sft_run_take(st__sft_run_t *r);

/* Fills the CUDA arena `arena` (on ordinal o->device) from the pieces, in
 * safetensors_cuda.c. ST_OK or an error as st__safetensors_load. */
int st__safetensors_load_cuda(const st__safetensors_t *s, const st__safetensors_opts_t *o,
                              st__arena_t *arena, const st__sft_piece_t *pieces, size_t npieces,
                              int threads, char *err, size_t errlen);

#endif
