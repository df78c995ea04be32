/* src/client: the open-cache. One process-wide table of the allocations
 * this process has mapped, keyed by (server_id, arena id), so that an
 * allocation received several times (two tensors of one reply, a cached
 * object returned to two calls) is mapped once. Entries are reference
 * counted by results and unmapped when the last result using them is freed.
 *
 * CPU arenas (memfd) are mapped with mmap once the descriptor passed the
 * checks of fdcheck.c (a sealed memfd at least as long as the arena, open
 * for what the mapping needs), PROT_READ when the arena is read-only
 * (marked so, or of a request asked read-only: result.c), else
 * PROT_READ | PROT_WRITE; st__client_mapping_writable says which, for the
 * handles that write (live.c, handoff.c). The key is checked against the
 * file itself (device and inode): a server that reused a server_id could
 * otherwise make us hand out a stale mapping.
 *
 * CUDA arenas (backend "vmm") are imported with st__cuda_import on the
 * device whose UUID the descriptor names (device.c), and unmapped with
 * st__cuda_unmap, once the descriptor passed the checks of fdcheck.c.
 * Their descriptors are all of one driver device file and carry no usable
 * identity, so the key is (server_id, arena id, device UUID).
 *
 * Legacy CUDA IPC arenas (backend "legacy", which travel without a
 * descriptor: fd is -1) are refused with ST_ERR_CAPABILITY: they exist for
 * PyTorch's rebuild_cuda_tensor, and this library maps VMM memory only.
 *
 * Every received descriptor is closed here: the mapping keeps the memory.
 *
 * Own allocations (st__client_own_alloc) are the other kind of entry: memory
 * this process made to pass as tensor arguments (a sealed memfd, or an
 * exported VMM allocation). They keep their descriptor, which goes to the
 * server with each request that uses them, and sit in a list of their own
 * that st__client_own_find searches by address. They are released like any
 * mapping.
 *
 * Pool slabs and regions (pool.c) are mappings outside every list: a
 * slab is mapped for one connection, which holds it for its life, and a
 * region is a view of a slab with its own count; neither is ever found by
 * a lookup nor kept after its last reference, so no other connection can
 * be served them. A CUDA region released by a DLPack consumer
 * (st__client_mapping_release_after_device) is given back to the server
 * only once its device's queued work is done (pool.c).
 *
 * Threads: any; one mutex guards the table. Mapping happens under the lock
 * (mmap of a memfd and a CUDA import take tens of microseconds; creating a
 * CUDA context, which is slow, happens before the lock is taken) so that
 * two threads never map one allocation twice.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/client_internal.h"
#include "common/fail.h"

struct st__mapping {
  st__mapping_t *next;
  char *server_id;
  uint64_t arena_id;
  int cuda;         /* 1: a CUDA import, `cm` holds it            */
  int readonly;     /* mapped read-only (PROT_READ; CUDA read access):
                       never shared with a writable mapping          */
  char uuid[ST_CUDA_UUID_LEN];
  dev_t dev;        /* CPU: the file's identity                   */
  ino_t ino;
  void *base;       /* NULL when nothing was mapped (empty arena) */
  size_t map_len;
  uint64_t bytes;   /* what tensors may use                       */
  size_t refs;
  size_t pins;      /* of refs: held by connections (kept_arenas.c)  */
  st__cuda_mapping_t cm;
  pid_t pid;        /* the process that mapped it                 */
  int own;          /* 1: an own allocation; `fd` is its descriptor */
  int reusable;     /* an object's arena: the server may send it again */
  int idle;         /* only pins hold it: on the idle list, counted kept */
  st__mapping_t *idle_prev, *idle_next;
  int fd;
  int loose;        /* 1: a pool slab or region, in no list (pool.c) */
  st__mapping_t *slab;            /* a region: its slab (one reference) */
  st__region_freed_fn freed;      /* a region: called with the next three */
  struct st__pool_page *page;
  uint32_t slot, gen;
  int after_device; /* a region: its free waits for its device's work */
  int fault_slot;   /* read-only CPU memory: its entry in fault.c's table */
};

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static st__mapping_t *cache_head;
static st__mapping_t *own_head;   /* own allocations */
static uint64_t own_next_id = 1;
static size_t cache_mapped;
static uint64_t cache_reused;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;
/* Kept arenas: mappings of objects' arenas (st__client_mapping_mark_reusable)
 * no result uses any more, left mapped (most recent first) so that an
 * allocation received again costs a lookup; bounded by
 * keep_max_arenas and keep_max_bytes (st_open_cache_keep, or the
 * environment at first use), the oldest unmapped first. */
static st__mapping_t *kept_head;
/* Idle pinned mappings: objects' arenas no result uses that connections
 * still pin (kept_arenas.c), so the server names them by id and sends no
 * descriptor; newest first. They count as kept (kept_count, kept_bytes)
 * and are let go, oldest first, when the bound needs room. */
static st__mapping_t *idle_head, *idle_tail;
static size_t kept_count, keep_max_arenas = 16;
static uint64_t kept_bytes, keep_max_bytes = (uint64_t)256 << 20;

/* fork() while another thread holds the lock would leave it locked forever
 * in the child: take it around fork so the child starts with a consistent,
 * unlocked table (its mappings are inherited and stay valid there). */
static void fork_prepare(void) { pthread_mutex_lock(&cache_lock); }
static void fork_parent(void) { pthread_mutex_unlock(&cache_lock); }
static void fork_child(void) { pthread_mutex_unlock(&cache_lock); }
static void cache_init(void) {
  pthread_atfork(fork_prepare, fork_parent, fork_child);
  const char *e = getenv("ST_CLIENT_KEEP_ARENAS");
  if (e && *e) keep_max_arenas = (size_t)strtoull(e, NULL, 10);
  e = getenv("ST_CLIENT_KEEP_BYTES");
  if (e && *e) keep_max_bytes = strtoull(e, NULL, 10);
}

static void cache_enter(void) {
  pthread_once(&cache_once, cache_init);
  pthread_mutex_lock(&cache_lock);
}

/* See client_internal.h. Any thread. */
void st__client_lock(void) { cache_enter(); }
void st__client_unlock(void) { pthread_mutex_unlock(&cache_lock); }

/* Maps a memfd arena: checks the descriptor (fdcheck.c), then mmap. */
static int map_cpu(const st__arena_desc_t *d, int fd, const struct stat *st, st__mapping_t *m,
                   char *err, size_t errlen) {
  int rc = st__client_check_memfd(d, fd, st, err, errlen);
  if (rc != ST_OK) return rc;
  if (d->bytes > SIZE_MAX)
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "arena %llu is too large for this process",
                    (unsigned long long)d->id);
  size_t len = (size_t)d->bytes;
  if (len == 0) len = (size_t)st->st_size;
  m->map_len = len;
  m->base = NULL;
  if (len == 0) return ST_OK;
  /* The protection the mapping needs, no more: a read-only arena
   * PROT_READ (whatever its descriptor allows), any other read-write
   * (fdcheck.c checked that it can be). */
  void *p = mmap(NULL, len, d->readonly ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    /* EACCES, EPERM: the descriptor does not allow what the arena says. */
    return st__fail(e == ENOMEM ? ST_ERR_OUT_OF_MEMORY
                    : e == EACCES || e == EPERM ? ST_ERR_PROTOCOL
                                                : ST_ERR_IO,
                    err, errlen, "arena %llu: mmap %s of %zu bytes failed: %s",
                    (unsigned long long)d->id, d->readonly ? "read-only" : "read-write", len,
                    strerror(e));
  }
  m->base = p;
  /* Read-only memory is described should this process write to it. */
  if (d->readonly) {
    char what[48];
    snprintf(what, sizeof what, "arena %llu", (unsigned long long)d->id);
    m->fault_slot = st__client_fault_add(p, len, ST__FAULT_ARENA, what);
  }
  return ST_OK;
}

/* Does cached entry m stand for arena d of server_id? A CUDA entry is known
 * by its device UUID, a CPU entry by its file (st). */
static int entry_matches(const st__mapping_t *m, const char *server_id, const st__arena_desc_t *d,
                         const struct stat *st) {
  if (m->cuda != (d->cuda != 0) || m->arena_id != d->id || m->readonly != (d->readonly != 0) ||
      strcmp(m->server_id, server_id) != 0)
    return 0;
  if (d->cuda) return strcasecmp(m->uuid, d->uuid) == 0;
  return m->dev == st->st_dev && m->ino == st->st_ino;
}

/* m (pinned, no result uses it) joins the idle list. Lock held. */
static void idle_enter(st__mapping_t *m) {
  m->idle = 1;
  m->idle_prev = NULL;
  m->idle_next = idle_head;
  if (idle_head) idle_head->idle_prev = m;
  else idle_tail = m;
  idle_head = m;
  kept_count++;
  kept_bytes += m->map_len;
  cache_mapped--;
}

/* m leaves the idle list (a result uses it again, or its pins go). Lock
 * held. */
static void idle_leave(st__mapping_t *m) {
  if (m->idle_prev) m->idle_prev->idle_next = m->idle_next;
  else idle_head = m->idle_next;
  if (m->idle_next) m->idle_next->idle_prev = m->idle_prev;
  else idle_tail = m->idle_prev;
  m->idle = 0;
  m->idle_prev = m->idle_next = NULL;
  kept_count--;
  kept_bytes -= m->map_len;
  cache_mapped++;
}

/* Whether m may stay mapped once no result uses it. */
static int keepable(const st__mapping_t *m) {
  return m->reusable && keep_max_arenas > 0 && m->map_len <= keep_max_bytes &&
         m->pid == getpid();
}

/* The kept entry for arena d (one reference, out of the kept list), or
 * NULL. A CUDA mapping made before a fork is not this process's. Lock
 * held. */
static st__mapping_t *kept_take(const char *server_id, const st__arena_desc_t *d,
                                const struct stat *st) {
  for (st__mapping_t **pp = &kept_head; *pp; pp = &(*pp)->next) {
    st__mapping_t *m = *pp;
    if (!entry_matches(m, server_id, d, st) || d->bytes > m->bytes ||
        (m->cuda && m->pid != getpid()))
      continue;
    *pp = m->next;
    kept_count--;
    kept_bytes -= m->map_len;
    m->refs = 1;
    return m;
  }
  return NULL;
}

/* Unlinks kept entries, oldest first, until the bounds hold; returns them
 * (chained by `next`) for unmap_entries once the lock is dropped. Lock
 * held. */
static st__mapping_t *kept_trim(void) {
  st__mapping_t *out = NULL;
  while (kept_head && (kept_count > keep_max_arenas || kept_bytes > keep_max_bytes)) {
    st__mapping_t **pp = &kept_head;
    while ((*pp)->next) pp = &(*pp)->next;
    st__mapping_t *m = *pp;
    *pp = NULL;
    kept_count--;
    kept_bytes -= m->map_len;
    m->next = out;
    out = m;
  }
  /* Then idle pinned mappings, oldest first: their connections let go
   * (at once, or after the reply in flight: kept_arenas.c). */
  while (idle_tail && (kept_count > keep_max_arenas || kept_bytes > keep_max_bytes)) {
    st__mapping_t *m = idle_tail;
    idle_leave(m);
    size_t let_go = st__client_kept_arenas_idle_locked(m);
    m->pins -= let_go;
    m->refs -= let_go;
    if (m->refs > 0) continue;   /* unpinned when its connection's reply is in */
    for (st__mapping_t **cp = &cache_head; *cp; cp = &(*cp)->next) {
      if (*cp == m) {
        *cp = m->next;
        break;
      }
    }
    cache_mapped--;
    m->next = out;
    out = m;
  }
  return out;
}

static void unmap_entry(st__mapping_t *m);

static void unmap_entries(st__mapping_t *m) {
  while (m) {
    st__mapping_t *next = m->next;
    unmap_entry(m);
    m = next;
  }
}

/* The cached entry for arena d, or a new one that imports it (CUDA) or maps
 * the file whose stat is st (CPU; st is NULL for CUDA). Consumes fd. */
static int cache_map(const char *server_id, const st__arena_desc_t *d, int fd,
                     const struct stat *st, st__mapping_t **out, char *err, size_t errlen) {
  cache_enter();
  for (st__mapping_t *m = cache_head; m; m = m->next) {
    if (entry_matches(m, server_id, d, st)) {
      if (d->bytes > m->bytes) break; /* a larger claim: map anew */
      if (m->idle) idle_leave(m);
      m->refs++;
      cache_reused++;
      pthread_mutex_unlock(&cache_lock);
      close(fd);
      *out = m;
      return ST_OK;
    }
  }
  st__mapping_t *k = kept_take(server_id, d, st);
  if (k) {
    k->next = cache_head;
    cache_head = k;
    cache_mapped++;
    cache_reused++;
    pthread_mutex_unlock(&cache_lock);
    close(fd);
    *out = k;
    return ST_OK;
  }
  int rc = ST_ERR_OUT_OF_MEMORY;
  st__mapping_t *m = calloc(1, sizeof *m);
  char *sid = strdup(server_id);
  if (!m || !sid) {
    st__fail(rc, err, errlen, "out of memory");
    goto out_fail;
  }
  m->server_id = sid;
  m->arena_id = d->id;
  m->bytes = d->bytes;
  m->refs = 1;
  m->pid = getpid();
  m->readonly = d->readonly != 0;
  if (d->cuda) {
    m->cuda = 1;
    snprintf(m->uuid, sizeof m->uuid, "%s", d->uuid);
    rc = st__client_cuda_import(d, fd, &m->cm, err, errlen);
    if (rc == ST_OK) {
      m->base = (void *)(uintptr_t)m->cm.dptr;
      m->map_len = (size_t)m->cm.bytes;
    }
  } else {
    m->dev = st->st_dev;
    m->ino = st->st_ino;
    rc = map_cpu(d, fd, st, m, err, errlen);
  }
  if (rc != ST_OK) goto out_fail;
  m->next = cache_head;
  cache_head = m;
  cache_mapped++;
  pthread_mutex_unlock(&cache_lock);
  close(fd);
  *out = m;
  return ST_OK;

out_fail:
  pthread_mutex_unlock(&cache_lock);
  close(fd);
  free(sid);
  free(m);
  return rc;
}

/* The CUDA half of st__client_map_arena (backend "vmm": the decoder lets
 * no other through, and legacy arenas are refused before); consumes fd. */
static int map_cuda_arena(const char *server_id, const st__arena_desc_t *d, int fd,
                          st__mapping_t **out, char *err, size_t errlen) {
  /* Refuses before anything is imported when this process has no driver
   * or does not see the device, and creates the context outside the lock;
   * then refuses a descriptor that cannot be a VMM handle before the
   * driver sees it. */
  int ordinal;
  int rc = st__client_cuda_device(d, &ordinal, err, errlen);
  if (rc == ST_OK) rc = st__client_check_vmm_fd(d, fd, err, errlen);
  if (rc != ST_OK) {
    close(fd);
    return rc;
  }
  return cache_map(server_id, d, fd, NULL, out, err, errlen);
}

/* fstat of a received descriptor into *st: ST_OK, or ST_ERR_IO naming the
 * `what` (arena, slab) and its id, with fd closed. */
static int stat_or_close(int fd, struct stat *st, const char *what, uint64_t id, char *err,
                         size_t errlen) {
  if (fstat(fd, st) == 0) return ST_OK;
  int e = errno;
  close(fd);
  return st__fail(ST_ERR_IO, err, errlen, "%s %llu: fstat failed: %s", what,
                  (unsigned long long)id, strerror(e));
}

/* See client_internal.h. Consumes fd. Any thread. */
int st__client_map_arena(const char *server_id, const st__arena_desc_t *d, int fd,
                         st__mapping_t **out, char *err, size_t errlen) {
  *out = NULL;
  if (d->legacy) {
    if (fd >= 0) close(fd);
    return st__fail(ST_ERR_CAPABILITY, err, errlen,
                    "arena %llu: legacy CUDA IPC arenas are for PyTorch's rebuild_cuda_tensor; "
                    "use ipc = vmm",
                    (unsigned long long)d->id);
  }
  if (d->cuda) return map_cuda_arena(server_id, d, fd, out, err, errlen);
  struct stat st;
  int rc = stat_or_close(fd, &st, "arena", d->id, err, errlen);
  if (rc != ST_OK) return rc;
  return cache_map(server_id, d, fd, &st, out, err, errlen);
}

/* Drops one reference. The last one keeps a received arena mapped, at the
 * head of the kept list (trimming its oldest entries), or unmaps it and
 * forgets the entry (own allocations, a bound of 0, a mapping larger than
 * the bound, a child's inherited one). `after_device`: see
 * st__client_mapping_release_after_device (sticky on a region). */
static void release(st__mapping_t *m, int after_device) {
  if (!m) return;
  cache_enter();
  if (after_device && m->slab && m->cuda) m->after_device = 1;
  --m->refs;
  if (m->idle && m->refs == 0) idle_leave(m);   /* its last pin went */
  if (m->refs > 0 && !m->idle && m->pins && m->refs == m->pins) {
    if (keepable(m)) {
      /* Kept pinned: the server goes on naming it by id. */
      idle_enter(m);
      st__mapping_t *evicted = kept_trim();
      pthread_mutex_unlock(&cache_lock);
      unmap_entries(evicted);
      return;
    }
    size_t let_go = st__client_kept_arenas_idle_locked(m);
    m->pins -= let_go;
    m->refs -= let_go;
  }
  if (m->refs > 0) {
    pthread_mutex_unlock(&cache_lock);
    return;
  }
  if (m->loose) {
    if (m->slab) cache_mapped--;
    pthread_mutex_unlock(&cache_lock);
    unmap_entry(m);
    return;
  }
  for (st__mapping_t **pp = m->own ? &own_head : &cache_head; *pp; pp = &(*pp)->next) {
    if (*pp == m) {
      *pp = m->next;
      break;
    }
  }
  if (!m->own) cache_mapped--;
  st__mapping_t *unmap = m;
  if (keepable(m)) {
    m->next = kept_head;
    kept_head = m;
    kept_count++;
    kept_bytes += m->map_len;
    unmap = kept_trim();
  } else {
    m->next = NULL;
  }
  pthread_mutex_unlock(&cache_lock);
  unmap_entries(unmap);
}

/* See client_internal.h. Any thread. */
void st__client_mapping_release(st__mapping_t *m) { release(m, 0); }

/* See client_internal.h. Any thread. */
size_t st__client_mapping_refs(st__mapping_t *m) {
  cache_enter();
  size_t n = m->refs;
  pthread_mutex_unlock(&cache_lock);
  return n;
}

/* See client_internal.h. Any thread. */
void st__client_mapping_release_after_device(st__mapping_t *m) { release(m, 1); }

/* Unmaps and frees an entry no list holds any more. */
static void unmap_entry(st__mapping_t *m) {
  if (m->slab) {   /* a region: the server may hand it out again */
    /* A child that inherited the region frees nothing: the parent's
     * result may still use it (generation 0 writes nothing). The slab
     * reference goes with the free, which may wait for the device. */
    int mine = m->pid == getpid();
    m->freed(m->page, m->slot, mine ? m->gen : 0, m->slab,
             mine && m->after_device ? m->cm.ordinal : -1);
    free(m);
    return;
  }
  /* Connections whose server keeps it tell it with their next request. */
  if (m->own) st__client_argcache_freed(m->arena_id);
  if (m->own) close(m->fd);
  if (m->cuda) {
    /* A child forked without exec cannot call the driver: it only forgets
     * the parent's mapping, which stays the parent's. */
    if (m->pid == getpid()) st__client_cuda_unmap(&m->cm);
  } else if (m->base) {
    st__client_fault_remove(m->fault_slot);
    munmap(m->base, m->map_len);
  }
  free(m->server_id);
  free(m);
}

/* See client_internal.h. Any thread. */
void st__client_mapping_ref(st__mapping_t *m, int pin) {
  cache_enter();
  if (!pin && m->idle) idle_leave(m);
  m->refs++;
  if (pin) m->pins++;
  else cache_reused++;
  pthread_mutex_unlock(&cache_lock);
}

/* See client_internal.h. Any thread. */
void st__client_mapping_mark_reusable(st__mapping_t *m) {
  cache_enter();
  m->reusable = 1;
  pthread_mutex_unlock(&cache_lock);
}

/* See client_internal.h. Under the lock. */
int st__client_mapping_only_pinned_locked(const st__mapping_t *m) {
  return m->pins > 0 && m->refs == m->pins;
}

/* See client_internal.h. Any thread. */
void st__client_mapping_unpin(st__mapping_t *m) {
  cache_enter();
  m->pins--;
  pthread_mutex_unlock(&cache_lock);
  st__client_mapping_release(m);
}

/* See client_internal.h. Consumes fd. Any thread. */
int st__client_map_slab(const st__arena_desc_t *d, int fd, st__mapping_t **out, char *err,
                        size_t errlen) {
  *out = NULL;
  struct stat st;
  int ordinal = -1;
  int rc = d->cuda ? st__client_cuda_device(d, &ordinal, err, errlen)
                   : stat_or_close(fd, &st, "slab", d->id, err, errlen);
  if (d->cuda && rc == ST_OK) rc = st__client_check_vmm_fd(d, fd, err, errlen);
  if (rc != ST_OK) {
    if (d->cuda) close(fd);
    return rc;
  }
  st__mapping_t *m = calloc(1, sizeof *m);
  if (!m) {
    close(fd);
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  }
  if (!d->bytes) {
    rc = st__fail(ST_ERR_PROTOCOL, err, errlen, "slab %llu has no bytes",
                  (unsigned long long)d->id);
  } else if (d->cuda) {
    /* Imported once for the connection, like any VMM arena. */
    rc = st__client_cuda_import(d, fd, &m->cm, err, errlen);
    if (rc == ST_OK) {
      m->cuda = 1;
      snprintf(m->uuid, sizeof m->uuid, "%s", d->uuid);
      m->base = (void *)(uintptr_t)m->cm.dptr;
      m->map_len = (size_t)m->cm.bytes;
    }
  } else {
    rc = map_cpu(d, fd, &st, m, err, errlen);
  }
  close(fd);
  if (rc != ST_OK) {
    free(m);
    return rc;
  }
  m->loose = 1;
  m->refs = 1;
  m->arena_id = d->id;
  m->bytes = d->bytes;
  m->pid = getpid();
  m->readonly = d->readonly != 0;
  *out = m;
  return ST_OK;
}

/* See client_internal.h. */
int st__client_mapping_is(const st__mapping_t *m, const st__arena_desc_t *d) {
  return m->cuda == (d->cuda != 0) && (!d->cuda || strcasecmp(m->uuid, d->uuid) == 0);
}

/* See client_internal.h. Any thread. */
int st__client_map_region(st__mapping_t *slab, uint64_t offset, uint64_t size,
                          st__region_freed_fn freed, struct st__pool_page *page, uint32_t slot,
                          uint32_t gen, st__mapping_t **out) {
  *out = NULL;
  if (offset > slab->bytes || size > slab->bytes - offset) return ST_ERR_PROTOCOL;
  st__mapping_t *m = calloc(1, sizeof *m);
  if (!m) return ST_ERR_OUT_OF_MEMORY;
  cache_enter();
  slab->refs++;
  cache_mapped++;   /* a region counts as a mapping of its own results */
  pthread_mutex_unlock(&cache_lock);
  m->loose = 1;
  m->refs = 1;
  m->slab = slab;
  m->freed = freed;
  m->page = page;
  m->slot = slot;
  m->gen = gen;
  m->arena_id = slab->arena_id;
  m->base = (char *)slab->base + offset;
  m->bytes = size;
  m->pid = slab->pid;
  m->readonly = slab->readonly;
  /* A view of a CUDA slab: its device, never unmapped itself (the slab's
   * mapping is the connection's). */
  m->cuda = slab->cuda;
  snprintf(m->uuid, sizeof m->uuid, "%s", slab->uuid);
  m->cm.ordinal = slab->cm.ordinal;
  *out = m;
  return ST_OK;
}

/* ------------------------------------------------------- own allocations */

/* A sealed memfd of `bytes` (page-rounded, at least one page) mapped
 * read-write into m. */
static int own_cpu(st__mapping_t *m, uint64_t bytes, char *err, size_t errlen) {
  long page = sysconf(_SC_PAGESIZE);
  if (page <= 0) page = 4096;
  if (bytes > (uint64_t)(SIZE_MAX / 2))
    return st__fail(ST_ERR_LIMIT, err, errlen, "%llu bytes is too large",
                    (unsigned long long)bytes);
  uint64_t size = bytes ? (bytes + (uint64_t)page - 1) / (uint64_t)page * (uint64_t)page
                        : (uint64_t)page;
  int fd = memfd_create("st-tensor-arg", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    return st__fail(errno == EMFILE || errno == ENFILE ? ST_ERR_LIMIT : ST_ERR_OUT_OF_MEMORY,
                    err, errlen, "memfd_create: %s", strerror(errno));
  int rc = ST_OK;
  int fe = 0;
  if (ftruncate(fd, (off_t)size) != 0) fe = errno;
  /* Commit the pages: a shortage is an error here, not a SIGBUS later. */
  if (!fe) {
    int r = posix_fallocate(fd, 0, (off_t)size);
    if (r != 0 && r != EOPNOTSUPP && r != EINVAL) fe = r;
  }
  /* The server maps it only when it cannot shrink (F_SEAL_SHRINK). */
  if (!fe && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) fe = errno;
  void *p = MAP_FAILED;
  if (!fe) {
    p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) fe = errno;
  }
  if (fe) {
    rc = st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "cannot allocate %llu bytes of shared memory: %s",
                  (unsigned long long)size, strerror(fe));
    close(fd);
    return rc;
  }
  m->fd = fd;
  m->base = p;
  m->map_len = (size_t)size;
  m->bytes = size;
  return ST_OK;
}

/* See client_internal.h. Any thread. */
int st__client_own_alloc(int cuda_ordinal, uint64_t bytes, st__mapping_t **out, char *err,
                         size_t errlen) {
  *out = NULL;
  st__mapping_t *m = calloc(1, sizeof *m);
  if (!m) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  m->own = 1;
  m->fd = -1;
  m->refs = 1;
  m->pid = getpid();
  int rc;
  if (cuda_ordinal < 0) {
    rc = own_cpu(m, bytes, err, errlen);
  } else {
    rc = st__client_cuda_alloc(cuda_ordinal, bytes, &m->fd, &m->cm, m->uuid, err, errlen);
    if (rc == ST_OK) {
      m->cuda = 1;
      m->base = (void *)(uintptr_t)m->cm.dptr;
      m->map_len = (size_t)m->cm.bytes;
      m->bytes = m->cm.bytes;
    }
  }
  if (rc != ST_OK) {
    free(m);
    return rc;
  }
  cache_enter();
  m->arena_id = own_next_id++;
  m->next = own_head;
  own_head = m;
  pthread_mutex_unlock(&cache_lock);
  *out = m;
  return ST_OK;
}

/* See client_internal.h. Any thread. */
int st__client_own_find(const void *p, uint64_t len, int cuda_ordinal, st__mapping_t **out,
                        uint64_t *offset) {
  *out = NULL;
  uintptr_t a = (uintptr_t)p;
  cache_enter();
  for (st__mapping_t *m = own_head; m; m = m->next) {
    uintptr_t b = (uintptr_t)m->base;
    if ((m->cuda ? m->cm.ordinal : -1) != cuda_ordinal || a < b || a - b > m->bytes ||
        len > m->bytes - (a - b))
      continue;
    m->refs++;
    *out = m;
    *offset = (uint64_t)(a - b);
    break;
  }
  pthread_mutex_unlock(&cache_lock);
  return *out ? ST_OK : ST_ERR_NOT_FOUND;
}

/* See client_internal.h. */
void st__client_own_describe(const st__mapping_t *m, st__arena_desc_t *d) {
  memset(d, 0, sizeof *d);
  d->bytes = m->bytes;
  d->id = m->arena_id;
  d->cuda = m->cuda;
  snprintf(d->backend, sizeof d->backend, "%s", m->cuda ? "vmm" : "memfd");
  if (m->cuda) snprintf(d->uuid, sizeof d->uuid, "%s", m->uuid);
}

/* See client_internal.h. */
int st__client_own_fd(const st__mapping_t *m) { return m->own ? m->fd : -1; }

/* See client_internal.h. */
int st__client_mapping_writable(const st__mapping_t *m) { return !m->readonly; }

/* See client_internal.h. Any thread holding a reference: the slot is set
 * before m is handed out and cleared only when no reference is left. */
void st__client_mapping_describe(st__mapping_t *m, int kind, const char *what) {
  if (m && m->fault_slot) st__client_fault_describe(m->fault_slot, kind, what);
}

/* See client_internal.h. Any thread holding a reference. */
int st__client_mapping_describable(const st__mapping_t *m) { return m && m->fault_slot; }

/* Base of the mapping (NULL for an empty arena). Borrowed. */
void *st__client_mapping_base(const st__mapping_t *m) { return m->base; }

/* CUDA ordinal in this process, -1 for CPU memory. */
int st__client_mapping_ordinal(const st__mapping_t *m) { return m->cuda ? m->cm.ordinal : -1; }

/* See client_internal.h. */
uint64_t st__client_mapping_bytes(const st__mapping_t *m) { return m->base ? m->bytes : 0; }

/* See client.h. Any thread. */
ST_API void st_open_cache_keep(size_t max_arenas, uint64_t max_bytes) {
  cache_enter();
  keep_max_arenas = max_arenas;
  keep_max_bytes = max_bytes;
  st__mapping_t *evicted = kept_trim();
  pthread_mutex_unlock(&cache_lock);
  unmap_entries(evicted);
}

/* See client.h. Any thread. */
ST_API void st_open_cache_kept(size_t *arenas, uint64_t *bytes) {
  cache_enter();
  if (arenas) *arenas = kept_count;
  if (bytes) *bytes = kept_bytes;
  pthread_mutex_unlock(&cache_lock);
}

/* Counts for tests and stcli; see client.h. Any thread. */
ST_API void st_open_cache_stats(size_t *mapped, uint64_t *reused) {
  cache_enter();
  if (mapped) *mapped = cache_mapped;
  if (reused) *reused = cache_reused;
  pthread_mutex_unlock(&cache_lock);
}
