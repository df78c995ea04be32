/* src/mem: arenas (see arena.h).
 *
 * The CPU backend is a sealed memfd mapped shared read-write. The struct
 * carries a `kind` so that the CUDA backends (VMM, legacy IPC) live beside
 * it: the
 * reference counting, ids, the size cap and the live statistics below are
 * backend independent; only creation, release and describe() switch on the
 * kind.
 *
 * Contracts of the non-static functions: their comments in arena.h.
 */
#include "mem/arena.h"
#include "mem/arena_release.h"
#include "mem/cuda.h"
#include "mem/ledger.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "common/fail.h"

typedef enum {
  ST__ARENA_CPU = 0,           /* memfd, mapped in the server */
  ST__ARENA_CUDA = 1,          /* VMM allocation (cuda_arena.c) */
  ST__ARENA_CUDA_LEGACY = 2,   /* cuMemAlloc + IPC handle (cuda_legacy.c) */
  ST__ARENA_CUDA_IMPORT = 3,   /* a client's VMM allocation (tensor argument, put):
                                  its descriptor; imported and mapped on first
                                  need */
  ST__ARENA_POOL = 4           /* a region of a connection's pool (pool.h) */
} st__arena_kind_t;

struct st__arena {
  st__arena_kind_t kind;
  atomic_int refs;
  uint64_t id;                 /* process-unique, never reused */
  uint64_t bytes;              /* usable size: what the caller asked for */
  uint64_t size;               /* allocated size (page / granularity rounded) */
  int uncommitted;             /* CPU: pages committed by st__arena_commit */
  int fd;                      /* memfd / received descriptor, dups go to clients;
                                  -1 for VMM (exported per reply) and legacy */
  void *base;                  /* CPU: the server's mapping; CUDA: device address;
                                  CUDA_IMPORT: NULL until st__arena_map, then
                                  set once (under map_lock, read with acquire) */
  struct st__cuda_alloc *cuda; /* CUDA: the allocation, owned */
  struct st__cuda_legacy *legacy; /* CUDA_LEGACY: the allocation, owned */
  int ordinal;                 /* CUDA_IMPORT: the device in this process */
  st__cuda_mapping_t import;   /* CUDA_IMPORT: the mapping once made, owned
                                  (the descriptor, fd, keeps the memory with
                                  or without it) */
  pthread_mutex_t map_lock;    /* CUDA_IMPORT: one mapping, whoever asks first */
  char uuid[ST_CUDA_UUID_LEN]; /* CUDA_IMPORT: the device */
  st__arena_release_fn release; /* POOL: called with (owner, slot) on the last unref */
  void *owner;
  uint32_t slot;
  int pool_device;             /* POOL: -1 (a memfd slab) or a CUDA ordinal */
  int charge_device;           /* what the ledger holds for it (ledger.h) */
  uint64_t charge_bytes;
  unsigned charge_fds;
};

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
/* Arenas from this size up ask for huge pages when made uncommitted. */
#define HUGE_BYTES (2ull << 20)

static atomic_uint_fast64_t next_id = 1;
static _Thread_local st__arena_source_fn source;   /* st__arena_use_source */
static _Thread_local void *source_ctx;
static atomic_uint_fast64_t live_count;
static atomic_uint_fast64_t live_bytes;
static atomic_uint_fast64_t limit_bytes;

void st__arena_set_limit(uint64_t max_bytes) {
  atomic_store(&limit_bytes, max_bytes);
}

/* Maps an errno of an allocation step to an ST_ERR_* and a message. */
static int alloc_error(int e, const char *step, uint64_t bytes, char *err, size_t errlen) {
  if (e == EMFILE || e == ENFILE) {
    snprintf(err, errlen, "%s: out of file descriptors (%s)", step, strerror(e));
    return ST_ERR_LIMIT;
  }
  if (e == ENOMEM || e == ENOSPC || e == EFBIG) {
    snprintf(err, errlen, "%s: cannot allocate an arena of %llu bytes (%s)", step,
             (unsigned long long)bytes, strerror(e));
    return ST_ERR_OUT_OF_MEMORY;
  }
  snprintf(err, errlen, "%s: %s", step, strerror(e));
  return ST_ERR_OUT_OF_MEMORY;
}

/* A sealed memfd arena, its pages committed now (st__arena_new_cpu) or
 * by the caller (`uncommitted`: st__arena_commit). */
static int new_cpu(uint64_t bytes, int uncommitted, st__arena_t **out, char *err,
                   size_t errlen) {
  char dummy[1];
  if (!err) { err = dummy; errlen = sizeof dummy; }
  *out = NULL;
  uint64_t cap = atomic_load(&limit_bytes);
  if (cap && bytes > cap) {
    snprintf(err, errlen, "object of %llu bytes exceeds max_object_bytes (%llu)",
             (unsigned long long)bytes, (unsigned long long)cap);
    return ST_ERR_LIMIT;
  }
  long page = sysconf(_SC_PAGESIZE);
  if (page <= 0) page = 4096;
  if (bytes > UINT64_MAX - (uint64_t)page || bytes > (uint64_t)(SIZE_MAX / 2)) {
    snprintf(err, errlen, "object of %llu bytes is too large", (unsigned long long)bytes);
    return ST_ERR_LIMIT;
  }
  /* At least one page so that a client can always mmap it. */
  uint64_t size = bytes ? (bytes + (uint64_t)page - 1) / (uint64_t)page * (uint64_t)page
                        : (uint64_t)page;
  /* With no budget a memfd is still never larger than what this host lets
   * the process have (fallocate would not fail: the OOM killer would run). */
  char source[128];
  uint64_t host = st__ledger_host_memory(source, sizeof source);
  if (host && size > host)
    return st__fail(ST_ERR_LIMIT, err, errlen,
                    "object of %llu bytes is larger than the memory of this host (%llu bytes: "
                    "%s)",
                    (unsigned long long)bytes, (unsigned long long)host, source);
  int rc = st__ledger_charge(-1, size, 1, err, errlen);
  if (rc != ST_OK) return rc;

  st__arena_t *a = calloc(1, sizeof *a);
  if (!a) {
    st__ledger_discharge(-1, size, 1);
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  a->kind = ST__ARENA_CPU;
  a->charge_device = -1;
  a->charge_bytes = size;
  a->charge_fds = 1;
  a->id = atomic_fetch_add(&next_id, 1);
  a->bytes = bytes;
  a->size = size;
  a->fd = -1;

  char name[48];
  snprintf(name, sizeof name, "st-arena-%llu", (unsigned long long)a->id);
  a->fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (a->fd < 0) {
    rc = alloc_error(errno, "memfd_create", bytes, err, errlen);
    goto fail;
  }
  if (ftruncate(a->fd, (off_t)size) != 0) {
    rc = alloc_error(errno, "ftruncate", bytes, err, errlen);
    goto fail;
  }
  /* Commit the pages now: a shortage is reported here as OUT_OF_MEMORY
   * instead of a SIGBUS when the worker first writes to them (or in
   * st__arena_commit, by the caller's threads). */
  int fe = uncommitted ? 0 : posix_fallocate(a->fd, 0, (off_t)size);
  if (fe != 0 && fe != EOPNOTSUPP && fe != EINVAL) {
    rc = alloc_error(fe, "fallocate", bytes, err, errlen);
    goto fail;
  }
  if (fcntl(a->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    rc = alloc_error(errno, "seal", bytes, err, errlen);
    goto fail;
  }
  a->base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
  if (a->base == MAP_FAILED) {
    a->base = NULL;
    rc = alloc_error(errno, "mmap", bytes, err, errlen);
    goto fail;
  }
  a->uncommitted = uncommitted;
  /* Huge pages where the host's shmem_enabled is "advise" (fewer faults
   * to commit, fewer TLB misses to read); elsewhere a no-op. */
  if (uncommitted && size >= HUGE_BYTES) madvise(a->base, (size_t)size, MADV_HUGEPAGE);
  atomic_init(&a->refs, 1);
  atomic_fetch_add(&live_count, 1);
  atomic_fetch_add(&live_bytes, size);
  *out = a;
  return ST_OK;

fail:
  if (a->fd >= 0) close(a->fd);
  st__ledger_discharge(-1, size, 1);
  free(a);
  return rc;
}

/* Creates a sealed memfd arena. Any thread; *out gets one reference. */
int st__arena_new_cpu(uint64_t bytes, st__arena_t **out, char *err, size_t errlen) {
  return new_cpu(bytes, 0, out, err, errlen);
}

/* See arena.h. Any thread. */
int st__arena_commit(st__arena_t *a, uint64_t off, uint64_t len, char *err, size_t errlen) {
  if (a->kind != ST__ARENA_CPU || !a->uncommitted || len == 0) return ST_OK;
  uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
  uint64_t lo = off / pg * pg, hi = off + len;
  hi = hi > a->size - pg ? a->size : (hi + pg - 1) / pg * pg;
  if (lo >= hi) return ST_OK;
  if (madvise((char *)a->base + lo, (size_t)(hi - lo), MADV_POPULATE_WRITE) == 0) return ST_OK;
  int e = errno;
  if (e == EINVAL) {   /* a kernel before 5.14: allocate in the memfd instead */
    e = posix_fallocate(a->fd, (off_t)lo, (off_t)(hi - lo));
    if (e == 0 || e == EOPNOTSUPP) return ST_OK;
  }
  return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen,
                  "committing %llu bytes of a %llu-byte CPU arena: %s (the host's memory, or "
                  "its shared memory, ran out)",
                  (unsigned long long)(hi - lo), (unsigned long long)a->size,
                  strerror(e == EFAULT ? ENOMEM : e));
}

/* See arena.h. Any thread. */
int st__arena_splice(st__arena_t *a, uint64_t off, int pipe_rd, uint64_t len, char *err,
                     size_t errlen) {
  if (a->kind != ST__ARENA_CPU || a->fd < 0)
    return st__fail(ST_ERR_CAPABILITY, err, errlen, "the arena is not a memfd of its own");
  if (off > a->size || len > a->size - off)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "splicing %llu bytes at %llu into a %llu-byte arena", (unsigned long long)len,
                    (unsigned long long)off, (unsigned long long)a->size);
  loff_t at = (loff_t)off;
  while (len > 0) {
    /* Never blocking: a pipe holding less than len is the caller's bug. */
    ssize_t n = splice(pipe_rd, NULL, a->fd, &at, (size_t)len, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN)
      return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                      "splicing into the memfd: the pipe holds less than the %llu bytes said",
                      (unsigned long long)len);
    if (n <= 0) {
      int e = n < 0 ? errno : EIO;
      if (e == EINVAL || e == ENOSYS || e == EOPNOTSUPP || e == EPERM)
        return st__fail(ST_ERR_CAPABILITY, err, errlen, "splice into the memfd: %s",
                        strerror(e));
      return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen,
                      "committing %llu bytes of a %llu-byte CPU arena: %s (the host's memory, "
                      "or its shared memory, ran out)",
                      (unsigned long long)len, (unsigned long long)a->size, strerror(e));
    }
    len -= (uint64_t)n;
  }
  return ST_OK;
}

/* The bracketed choice of a transparent_hugepage file ("never"), or "". */
static void thp_choice(const char *path, char *out, size_t len) {
  char buf[160];
  out[0] = '\0';
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  buf[n > 0 ? n : 0] = '\0';
  char *lb = strchr(buf, '['), *rb = lb ? strchr(lb, ']') : NULL;
  if (rb) snprintf(out, len, "%.*s", (int)(rb - lb - 1), lb + 1);
}

/* See arena.h. Any thread. */
int st__arena_shmem_huge(char *what, size_t len) {
  static const char thp[] = "/sys/kernel/mm/transparent_hugepage";
  char top[32], path[320];
  snprintf(path, sizeof path, "%s/shmem_enabled", thp);
  thp_choice(path, top, sizeof top);
  int top_on = !strcmp(top, "always") || !strcmp(top, "within_size") || !strcmp(top, "advise") ||
               !strcmp(top, "force");
  int on = top_on;
  size_t used = 0;
  if (what && len) used = (size_t)snprintf(what, len, "shmem_enabled %s", top[0] ? top : "absent");
  /* Sizes of their own (multi-size THP, Linux 6.11 on): "inherit" follows
   * the top setting, which "deny" overrides for all. */
  DIR *d = strcmp(top, "deny") ? opendir(thp) : NULL;
  for (struct dirent *e; d && (e = readdir(d));) {
    if (strncmp(e->d_name, "hugepages-", 10) != 0) continue;
    char v[32];
    snprintf(path, sizeof path, "%s/%.64s/shmem_enabled", thp, e->d_name);
    thp_choice(path, v, sizeof v);
    if (!strcmp(v, "always") || !strcmp(v, "within_size") || !strcmp(v, "advise")) {
      on = 1;
      if (what && used < len)
        used += (size_t)snprintf(what + used, len - used, ", %s %s", e->d_name + 10, v);
    } else if (!strcmp(v, "inherit") && top_on) {
      on = 1;
    }
  }
  if (d) closedir(d);
  return on;
}

/* See arena.h. Any thread. */
int st__arena_new(const st__arena_spec_t *s, st__arena_t **out, char *err, size_t errlen) {
  /* A worker running a plain call of a pooled connection: a region. */
  if (source && source(source_ctx, s, out) == ST_OK) return ST_OK;
  if (s->device < 0) return new_cpu(s->bytes, s->uncommitted, out, err, errlen);
  if (s->ipc == ST__CUDA_IPC_LEGACY)
    return st__arena_new_cuda_legacy(s->device, s->bytes, out, err, errlen);
  return st__arena_new_cuda(s->device, s->bytes, out, err, errlen);
}

void st__arena_ref(st__arena_t *a) {
  atomic_fetch_add_explicit(&a->refs, 1, memory_order_relaxed);
}

static void teardown(void *arena);

/* 1 when tearing `a` down costs driver calls or a big munmap: worth
 * handing to the releaser (arena_release.h). */
static int slow_teardown(const st__arena_t *a) {
  switch (a->kind) {
  case ST__ARENA_CPU: return a->size >= ST__ARENA_DEFER_CPU_BYTES;
  case ST__ARENA_POOL: return 0;   /* the pool's slab stays */
  default: return 1;
  }
}

/* Any thread; the last reference releases the allocation, at once or on
 * the releaser (arena_release.h). The kernel keeps the memory while
 * clients still hold a descriptor or a mapping. */
void st__arena_unref(st__arena_t *a) {
  if (!a) return;
  if (atomic_fetch_sub_explicit(&a->refs, 1, memory_order_acq_rel) != 1) return;
  if (slow_teardown(a) && st__arena_release_defer(teardown, a)) return;
  teardown(a);
}

/* Releases everything the arena holds (mapping, descriptor, allocation),
 * then its ledger charge and live statistics, and frees it. Any thread
 * (no reference is left): st__arena_unref's, or the releaser. */
static void teardown(void *arena) {
  st__arena_t *a = arena;
  switch (a->kind) {
  case ST__ARENA_CPU:
    if (a->base) munmap(a->base, (size_t)a->size);
    if (a->fd >= 0) close(a->fd);
    break;
  case ST__ARENA_CUDA:
    st__cuda_alloc_free(a->cuda);   /* unmaps, releases the handle */
    break;
  case ST__ARENA_CUDA_LEGACY:
    st__cuda_legacy_free(a->legacy);  /* cuMemFree; there is no fd */
    break;
  case ST__ARENA_CUDA_IMPORT:
    /* The client's memory stays the client's: this drops the server's
     * mapping (if one was made) and its descriptor. */
    st__cuda_unmap(&a->import);
    close(a->fd);
    pthread_mutex_destroy(&a->map_lock);
    break;
  case ST__ARENA_POOL:
    a->release(a->owner, a->slot);   /* the slab is the pool's */
    break;
  }
  st__ledger_discharge(a->charge_device, a->charge_bytes, a->charge_fds);
  atomic_fetch_sub(&live_count, 1);
  atomic_fetch_sub(&live_bytes, a->size);
  free(a);
}

/* Any thread: NULL for an imported CUDA arena not mapped yet. */
void *st__arena_base(const st__arena_t *a) { return __atomic_load_n(&a->base, __ATOMIC_ACQUIRE); }

/* See arena.h. Any thread; the first caller of an imported CUDA arena
 * imports and maps it under its lock, every later one (and every other
 * kind) only loads the base. */
int st__arena_map(st__arena_t *a, void **base, char *err, size_t errlen) {
  void *p = st__arena_base(a);
  if (!p && a->kind == ST__ARENA_CUDA_IMPORT) {
    char why[320];
    int rc = ST_OK;
    pthread_mutex_lock(&a->map_lock);
    if (!a->base) {
      st__cuda_mapping_t m;
      rc = st__cuda_import(a->fd, a->size, a->uuid, &m, why, sizeof why);
      if (rc == ST_OK) {
        a->import = m;
        __atomic_store_n(&a->base, (void *)(uintptr_t)m.dptr, __ATOMIC_RELEASE);
      }
    }
    p = a->base;
    pthread_mutex_unlock(&a->map_lock);
    if (rc != ST_OK) {
      if (base) *base = NULL;
      return st__fail(rc, err, errlen,
                      "mapping imported CUDA allocation (arena %llu, %llu bytes on %s) in the "
                      "server: %s",
                      (unsigned long long)a->id, (unsigned long long)a->size, a->uuid, why);
    }
  }
  if (base) *base = p;
  return ST_OK;
}
uint64_t st__arena_bytes(const st__arena_t *a) { return a->bytes; }
uint64_t st__arena_id(const st__arena_t *a) { return a->id; }

/* Any thread. */
int st__arena_has_fd(const st__arena_t *a) { return a->kind != ST__ARENA_CUDA_LEGACY; }

/* A close-on-exec dup of the arena's descriptor (a new export of a VMM
 * allocation), owned by the caller. */
int st__arena_dup_fd(const st__arena_t *a, char *err, size_t errlen) {
  if (a->kind == ST__ARENA_CUDA) return st__cuda_alloc_export(a->cuda, err, errlen);
  if (a->kind == ST__ARENA_POOL) {
    /* A region never travels as a descriptor of its slab by accident. */
    if (err && errlen) snprintf(err, errlen, "a pooled region has no descriptor of its own");
    return ST_ERR_INVALID_ARGUMENT;
  }
  if (a->fd < 0) {
    if (err && errlen) snprintf(err, errlen, "the arena has no descriptor");
    return ST_ERR_INVALID_ARGUMENT;
  }
  int fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
  if (fd >= 0) return fd;
  if (err && errlen) snprintf(err, errlen, "dup: %s", strerror(errno));
  if (errno == EMFILE || errno == ENFILE) return ST_ERR_LIMIT;
  return ST_ERR_INTERNAL;
}

/* See arena.h. Any thread. */
int st__arena_dup_fd_readonly(const st__arena_t *a, char *err, size_t errlen) {
  if (a->kind == ST__ARENA_CUDA || a->kind == ST__ARENA_POOL || a->fd < 0 ||
      st__arena_device(a) >= 0)
    return st__arena_dup_fd(a, err, errlen);
  /* A new open file description of the same memfd, read-only: mmap of it
   * with PROT_WRITE and MAP_SHARED fails with EACCES, and so does a later
   * mprotect to PROT_WRITE. */
  char path[40];
  snprintf(path, sizeof path, "/proc/self/fd/%d", a->fd);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) return fd;
  if (err && errlen) snprintf(err, errlen, "reopening the memfd read-only: %s", strerror(errno));
  if (errno == EMFILE || errno == ENFILE) return ST_ERR_LIMIT;
  return ST_ERR_INTERNAL;
}

/* Fills everything but d->fd. `bytes` is the allocated size, which is what
 * a client maps (never 0). */
void st__arena_describe(const st__arena_t *a, st__arena_desc_t *d) {
  uint32_t fd = d->fd;
  memset(d, 0, sizeof *d);
  d->fd = fd;
  d->bytes = a->size;
  d->id = a->id;
  switch (a->kind) {
  case ST__ARENA_POOL:
    if (a->pool_device >= 0) {   /* as its slab describes itself */
      d->cuda = 1;
      snprintf(d->backend, sizeof d->backend, "vmm");
      st__cuda_device_uuid(a->pool_device, d->uuid, NULL, 0);
    } else {
      snprintf(d->backend, sizeof d->backend, "memfd");
    }
    break;
  case ST__ARENA_CPU:
    d->cuda = 0;
    snprintf(d->backend, sizeof d->backend, "memfd");
    break;
  case ST__ARENA_CUDA:
    d->cuda = 1;
    snprintf(d->backend, sizeof d->backend, "vmm");
    snprintf(d->uuid, sizeof d->uuid, "%s", st__cuda_alloc_uuid(a->cuda));
    break;
  case ST__ARENA_CUDA_LEGACY:
    d->cuda = 1;
    d->legacy = 1;
    d->fd = 0;   /* no descriptor travels */
    snprintf(d->backend, sizeof d->backend, "legacy");
    snprintf(d->uuid, sizeof d->uuid, "%s", st__cuda_legacy_uuid(a->legacy));
    memcpy(d->ipc_handle, st__cuda_legacy_handle(a->legacy), ST_IPC_HANDLE_LEN);
    d->device_index = st__cuda_legacy_ordinal(a->legacy);
    d->storage_bytes = a->bytes;
    break;
  case ST__ARENA_CUDA_IMPORT:
    d->cuda = 1;
    snprintf(d->backend, sizeof d->backend, "vmm");
    snprintf(d->uuid, sizeof d->uuid, "%s", a->uuid);
    break;
  }
}

/* -1 for CPU arenas. Any thread. */
int st__arena_device(const st__arena_t *a) {
  switch (a->kind) {
  case ST__ARENA_CUDA: return st__cuda_alloc_ordinal(a->cuda);
  case ST__ARENA_CUDA_LEGACY: return st__cuda_legacy_ordinal(a->legacy);
  case ST__ARENA_CUDA_IMPORT: return a->ordinal;
  case ST__ARENA_POOL: return a->pool_device;
  default: return -1;
  }
}

/* The cap of st__arena_set_limit, for backends. Any thread. */
int st__arena_check_limit(uint64_t bytes, char *err, size_t errlen) {
  uint64_t cap = atomic_load(&limit_bytes);
  if (cap && bytes > cap) {
    if (err && errlen)
      snprintf(err, errlen, "object of %llu bytes exceeds max_object_bytes (%llu)",
               (unsigned long long)bytes, (unsigned long long)cap);
    return ST_ERR_LIMIT;
  }
  return ST_OK;
}

/* A new arena record holding one reference, counted live, that takes
 * over a ledger charge of `charge_bytes` on `device` and `charge_fds`
 * descriptors; NULL when out of host memory (the charge is then still the
 * caller's). Every backend but the memfd one (which fills its record step
 * by step) makes its record here. */
static st__arena_t *new_record(st__arena_kind_t kind, uint64_t bytes, uint64_t size, int fd,
                               void *base, int device, uint64_t charge_bytes,
                               unsigned charge_fds) {
  st__arena_t *a = calloc(1, sizeof *a);
  if (!a) return NULL;
  a->kind = kind;
  a->charge_device = device;
  a->charge_bytes = charge_bytes;
  a->charge_fds = charge_fds;
  a->id = atomic_fetch_add(&next_id, 1);
  a->bytes = bytes;
  a->size = size;
  a->fd = fd;
  a->base = base;
  atomic_init(&a->refs, 1);
  atomic_fetch_add(&live_count, 1);
  atomic_fetch_add(&live_bytes, size);
  return a;
}

/* Wraps a CUDA allocation; NULL when calloc fails. Any thread. */
st__arena_t *st__arena_adopt_cuda(struct st__cuda_alloc *c, uint64_t bytes, uint64_t size,
                                  void *base) {
  st__arena_t *a = new_record(ST__ARENA_CUDA, bytes, size, -1, base,
                              st__cuda_alloc_ordinal(c), size, 0);
  if (a) a->cuda = c;
  return a;
}

/* Wraps a legacy allocation; NULL when calloc fails. Any thread. */
st__arena_t *st__arena_adopt_cuda_legacy(struct st__cuda_legacy *l, uint64_t bytes,
                                         uint64_t size, void *base) {
  st__arena_t *a = new_record(ST__ARENA_CUDA_LEGACY, bytes, size, -1, base,
                              st__cuda_legacy_ordinal(l), size, 0);
  if (a) a->legacy = l;
  return a;
}

/* Wraps a client's CUDA allocation, not imported; see arena.h. Any
 * thread. */
st__arena_t *st__arena_adopt_cuda_import(int fd, uint64_t bytes, int ordinal, const char *uuid) {
  st__arena_t *a = new_record(ST__ARENA_CUDA_IMPORT, bytes, bytes, fd, NULL, -1, 0, 1);
  if (!a) return NULL;
  a->ordinal = ordinal;
  a->import.ordinal = -1;
  pthread_mutex_init(&a->map_lock, NULL);
  snprintf(a->uuid, sizeof a->uuid, "%s", uuid);
  return a;
}

/* Wraps a region of a pool; see arena.h. Any thread. */
st__arena_t *st__arena_adopt_region(st__arena_release_fn release, void *owner, uint32_t slot,
                                    int device, void *base, uint64_t bytes, uint64_t size) {
  st__arena_t *a = new_record(ST__ARENA_POOL, bytes, size, -1, base, -1, 0, 0);
  if (a) {
    a->release = release;
    a->owner = owner;
    a->slot = slot;
    a->pool_device = device;
  }
  return a;
}

/* See arena.h. Any thread. */
int st__arena_region(const st__arena_t *a, void **owner, uint32_t *slot) {
  if (a->kind != ST__ARENA_POOL) return 0;
  *owner = a->owner;
  *slot = a->slot;
  return 1;
}

/* See arena.h. The thread's own; no reference is kept. */
void st__arena_use_source(st__arena_source_fn fn, void *ctx) {
  source = fn;
  source_ctx = ctx;
}

/* See arena.h. */
int st__arena_file_id(const st__arena_t *a, uint64_t *dev, uint64_t *ino) {
  struct stat st;
  /* Memory files only: the descriptors a CUDA driver exports can all share
   * one inode (an anonymous inode of the driver), so equal numbers would
   * not mean one allocation there. */
  if (a->kind != ST__ARENA_CPU || a->fd < 0 || fstat(a->fd, &st) != 0 || !S_ISREG(st.st_mode))
    return 0;
  *dev = (uint64_t)st.st_dev;
  *ino = (uint64_t)st.st_ino;
  return 1;
}

/* The CPU half of st__arena_import: a sealed memfd of at least d->bytes. */
static int import_cpu(const st__arena_desc_t *d, int fd, st__arena_t **out, char *err,
                      size_t errlen) {
  struct stat st;
  struct statfs fs;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "the descriptor is not a memory file");
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "the descriptor is not a memfd sealed against shrinking (F_SEAL_SHRINK)");
  /* tmpfs only: a hugetlbfs memfd sealed against shrinking can still have
   * pages punched out of it, and the server would fault on them. */
  if (fstatfs(fd, &fs) != 0 || fs.f_type != TMPFS_MAGIC)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "the descriptor is not a memfd on tmpfs (hugetlbfs and others are refused)");
  if (d->bytes == 0 || (uint64_t)st.st_size < d->bytes || d->bytes > (uint64_t)(SIZE_MAX / 2))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "the arena says %llu bytes but the memfd has %lld",
                    (unsigned long long)d->bytes, (long long)st.st_size);
  void *p = mmap(NULL, (size_t)d->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    return st__fail(e == ENOMEM ? ST_ERR_OUT_OF_MEMORY : ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "mmap of %llu bytes read-write failed: %s (a read-only descriptor?)",
                    (unsigned long long)d->bytes, strerror(e));
  }
  *out = new_record(ST__ARENA_CPU, d->bytes, d->bytes, fd, p, -1, 0, 1);
  if (!*out) {
    munmap(p, (size_t)d->bytes);
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  }
  return ST_OK;
}

/* See arena.h. Takes fd. Any thread. */
int st__arena_import(const st__arena_desc_t *d, int fd, st__arena_t **out, char *err,
                     size_t errlen) {
  char dummy[1];
  if (!err) { err = dummy; errlen = sizeof dummy; }
  *out = NULL;
  /* The memory is the client's; the descriptor it keeps open is ours. */
  int rc = st__ledger_charge(-1, 0, 1, err, errlen);
  if (rc != ST_OK) {
    close(fd);
    return rc;
  }
  if (d->legacy || strcmp(d->backend, d->cuda ? "vmm" : "memfd") != 0) {
    rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                  "backend \"%s\" cannot carry an argument (memfd for cpu, vmm for cuda)",
                  d->backend);
  } else if (!d->cuda) {
    rc = import_cpu(d, fd, out, err, errlen);
  } else {
    /* No driver import: the descriptor's kind (an fstat), the device and
     * the size's granularity; the import and the mapping wait for
     * st__arena_map (a put that nobody in the server reads never makes
     * them). The descriptor alone keeps the allocation. */
    int ordinal = -1;
    uint64_t gran;
    char why[256];
    rc = st__cuda_fd_check(fd, why, sizeof why);
    if (rc != ST_OK)
      st__fail(rc, err, errlen, "backend vmm, but %s", why);
    else
      rc = st__cuda_import_check(d->bytes, d->uuid, &ordinal, &gran, err, errlen);
    if (rc == ST_OK && !(*out = st__arena_adopt_cuda_import(fd, d->bytes, ordinal, d->uuid)))
      rc = st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  }
  if (rc != ST_OK) {
    close(fd);
    st__ledger_discharge(-1, 0, 1);
  }
  return rc;
}

/* Ledger figures of one arena. Any thread. */
void st__arena_charge(const st__arena_t *a, int *device, uint64_t *bytes, unsigned *fds) {
  if (device) *device = a->charge_device;
  if (bytes) *bytes = a->charge_bytes;
  if (fds) *fds = a->charge_fds;
}

/* Live arenas and their allocated bytes. Any thread. */
void st__arena_stats(uint64_t *count, uint64_t *bytes) {
  if (count) *count = atomic_load(&live_count);
  if (bytes) *bytes = atomic_load(&live_bytes);
}
