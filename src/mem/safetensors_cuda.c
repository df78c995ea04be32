/* src/mem/safetensors_cuda.c: checkpoint data into a CUDA arena through a
 * pinned staging pool (safetensors.h; docs/design.md, section 3: pinned
 * host->device copies run several times faster than pageable ones and
 * pinned memory is slow to allocate, docs/benchmarks.md, "Driver and
 * socket costs", so the pool is allocated once per process and shared).
 *
 * The pool: `staging_bytes` of portable pinned memory in equal chunks of
 * >= 4 MiB. A load leases up to threads + 2 chunks (at least one; it waits
 * while none is free) for its whole duration and gives them back after
 * its stream is synchronized, so concurrent loads share the pool and no
 * chunk is reused while a copy may still read it.
 *
 * A load: pieces (sorted by file offset) are packed into batches of one
 * chunk each. Reader threads take batches through an atomic counter; each
 * takes a leased chunk whose previous copies have finished (its event),
 * preads the batch into it, converts dtypes in place when asked (the
 * converted bytes sit beside the file bytes in the chunk), queues
 * cuMemcpyHtoDAsync for each piece on the load's stream and records the
 * chunk's event. Reading the next batch therefore overlaps the copies of
 * the previous ones. One stream keeps the copy engine busy; the readers are
 * what limits throughput.
 *
 * Driver functions that the shared table (cuda.h) lacks are looked up here
 * the same way, once (pinned allocation, events).
 *
 * Contracts of the non-static functions: their comments in safetensors.h.
 */
#include "mem/safetensors.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mem/cuda.h"

#ifdef ST_HAVE_CUDA

#include <cuda_runtime_api.h>

#define MAX_CHUNKS 1024
#define STAGE_ALIGN 256u

typedef struct extra_api {
  PFN_cuMemHostAlloc_v2020 cuMemHostAlloc;
  PFN_cuEventCreate_v2000 cuEventCreate;
  PFN_cuEventRecord_v2000 cuEventRecord;
  PFN_cuEventSynchronize_v2000 cuEventSynchronize;
  PFN_cuEventDestroy_v4000 cuEventDestroy;
} extra_api_t;

static pthread_once_t extra_once = PTHREAD_ONCE_INIT;
static extra_api_t extra;
static int extra_ok;
static char extra_reason[160];

static int lookup(const char *name, void *slot) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess || !fn) {
    snprintf(extra_reason, sizeof extra_reason, "driver entry point %s unavailable", name);
    return 0;
  }
  memcpy(slot, &fn, sizeof fn);       /* function and data pointers share a representation */
  return 1;
}

static void load_extra(void) {
  extra_ok = lookup("cuMemHostAlloc", &extra.cuMemHostAlloc) &&
             lookup("cuEventCreate", &extra.cuEventCreate) &&
             lookup("cuEventRecord", &extra.cuEventRecord) &&
             lookup("cuEventSynchronize", &extra.cuEventSynchronize) &&
             lookup("cuEventDestroy", &extra.cuEventDestroy);
}

/* Both tables, or NULL with "no CUDA device: ..." in err. */
static const st__cuda_api_t *apis(char *err, size_t errlen) {
  const st__cuda_api_t *a = st__cuda_api(err, errlen);
  if (!a) return NULL;
  pthread_once(&extra_once, load_extra);
  if (!extra_ok) {
    snprintf(err, errlen, "no CUDA device: %s", extra_reason);
    return NULL;
  }
  return a;
}

/* ------------------------------------------------------------ the pool */

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_cond = PTHREAD_COND_INITIALIZER;
static char *pool_base;              /* pinned; never freed */
static uint64_t pool_chunk;
static int pool_n, pool_free;
static unsigned char pool_busy[MAX_CHUNKS];

/* See safetensors.h. Any thread; device 0's primary context is current on
 * the calling thread afterwards. */
int st__staging_init(uint64_t bytes, char *err, size_t errlen) {
  char dummy[1];
  if (!err) { err = dummy; errlen = sizeof dummy; }
  const st__cuda_api_t *a = apis(err, errlen);
  if (!a) return ST_ERR_CAPABILITY;
  pthread_mutex_lock(&pool_lock);
  if (pool_base) {
    pthread_mutex_unlock(&pool_lock);
    return ST_OK;
  }
  if (bytes == 0) bytes = ST_SAFETENSORS_DEFAULT_STAGING;
  if (bytes < ST_SAFETENSORS_MIN_CHUNK) bytes = ST_SAFETENSORS_MIN_CHUNK;
  uint64_t chunk = (bytes / 16) & ~((2ull << 20) - 1);
  if (chunk < ST_SAFETENSORS_MIN_CHUNK) chunk = ST_SAFETENSORS_MIN_CHUNK;
  if (chunk > (64ull << 20)) chunk = 64ull << 20;
  uint64_t n = bytes / chunk;
  if (n > MAX_CHUNKS) n = MAX_CHUNKS;
  int rc = st__cuda_ctx_enter(0, err, errlen);
  void *p = NULL;
  if (rc == ST_OK)
    rc = st__cuda_error(extra.cuMemHostAlloc(&p, (size_t)(n * chunk), CU_MEMHOSTALLOC_PORTABLE),
                        "cuMemHostAlloc (pinned staging pool)", err, errlen);
  if (rc == ST_OK) {
    pool_base = p;
    pool_chunk = chunk;
    pool_n = pool_free = (int)n;
  }
  pthread_mutex_unlock(&pool_lock);
  return rc;
}

/* See safetensors.h. Any thread. */
void st__staging_info(uint64_t *chunk_bytes, int *nchunks) {
  pthread_mutex_lock(&pool_lock);
  *chunk_bytes = pool_chunk;
  *nchunks = pool_n;
  pthread_mutex_unlock(&pool_lock);
}

/* Leases up to `want` chunks (at least one; waits while none is free,
 * polling o->stop every 100 ms). Returns the count, or a negative error
 * from o->stop. */
static int lease(int want, int *ids, const st__safetensors_opts_t *o) {
  pthread_mutex_lock(&pool_lock);
  while (pool_free == 0) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100000000;
    if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
    pthread_cond_timedwait(&pool_cond, &pool_lock, &ts);
    int stop = pool_free == 0 && o->stop ? o->stop(o->stop_ud) : 0;
    if (stop) {
      pthread_mutex_unlock(&pool_lock);
      return stop;
    }
  }
  int got = 0;
  for (int i = 0; i < pool_n && got < want; i++)
    if (!pool_busy[i]) {
      pool_busy[i] = 1;
      ids[got++] = i;
    }
  pool_free -= got;
  pthread_mutex_unlock(&pool_lock);
  return got;
}

static void unlease(const int *ids, int n) {
  pthread_mutex_lock(&pool_lock);
  for (int i = 0; i < n; i++) pool_busy[ids[i]] = 0;
  pool_free += n;
  pthread_cond_broadcast(&pool_cond);
  pthread_mutex_unlock(&pool_lock);
}

/* ------------------------------------------------------------ one load */

typedef struct slot {
  char *mem;
  CUevent ev;
  int recorded;                /* copies were queued from it */
  int busy;                    /* a reader is filling it */
} slot_t;

typedef struct batch {
  size_t first, count;         /* pieces */
} batch_t;

typedef struct cuda_run {
  const st__cuda_api_t *a;
  const st__safetensors_t *s;
  const st__sft_piece_t *pieces;
  batch_t *batches;
  size_t nbatches;
  CUstream stream;
  CUdeviceptr base;
  int ordinal;
  slot_t *slots;
  int nslots;
  st__sft_run_t run;           /* items: batches; run.lock also guards slots */
  pthread_cond_t cond;         /* a slot was given back */
} cuda_run_t;

static uint64_t align_up(uint64_t x) { return (x + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN; }

/* Bytes a piece takes in a chunk: the file bytes, plus the converted ones. */
static uint64_t footprint(const st__sft_piece_t *p) {
  uint64_t f = align_up(p->n * st_dtype_size(p->sdt));
  if (p->sdt != p->ddt) f += align_up(p->n * st_dtype_size(p->ddt));
  return f;
}

static slot_t *take_slot(cuda_run_t *r) {
  pthread_mutex_lock(&r->run.lock);
  slot_t *got = NULL;
  while (!got) {
    for (int i = 0; i < r->nslots && !got; i++)
      if (!r->slots[i].busy) got = &r->slots[i];
    if (!got) pthread_cond_wait(&r->cond, &r->run.lock);
  }
  got->busy = 1;
  pthread_mutex_unlock(&r->run.lock);
  return got;
}

static void give_slot(cuda_run_t *r, slot_t *s) {
  pthread_mutex_lock(&r->run.lock);
  s->busy = 0;
  pthread_cond_signal(&r->cond);
  pthread_mutex_unlock(&r->run.lock);
}

/* Reads, converts and queues the copies of batch b through slot sl. */
static int fill_batch(cuda_run_t *r, const batch_t *b, slot_t *sl, char *err, size_t errlen) {
  const st__cuda_api_t *a = r->a;
  if (sl->recorded) {
    int rc = st__cuda_error(extra.cuEventSynchronize(sl->ev), "cuEventSynchronize", err, errlen);
    if (rc != ST_OK) return rc;
    sl->recorded = 0;
  }
  uint64_t off = 0;
  for (size_t k = 0; k < b->count; k++) {
    const st__sft_piece_t *p = &r->pieces[b->first + k];
    uint64_t sbytes = p->n * st_dtype_size(p->sdt), dbytes = p->n * st_dtype_size(p->ddt);
    char *src = sl->mem + off;
    int rc = st__safetensors_pread(&r->s->files[p->file], src, sbytes, p->src_off, err, errlen);
    if (rc != ST_OK) return rc;
    char *from = src;
    if (p->sdt != p->ddt) {
      from = src + align_up(sbytes);
      st__safetensors_convert(from, p->ddt, src, p->sdt, p->n);
    }
    off += footprint(p);
    rc = st__cuda_error(a->cuMemcpyHtoDAsync(r->base + p->dst_off, from, (size_t)dbytes,
                                             r->stream),
                        "cuMemcpyHtoDAsync", err, errlen);
    if (rc != ST_OK) return rc;
  }
  int rc = st__cuda_error(extra.cuEventRecord(sl->ev, r->stream), "cuEventRecord", err, errlen);
  if (rc == ST_OK) sl->recorded = 1;
  return rc;
}

static void *cuda_reader(void *arg) {
  cuda_run_t *r = arg;
  char err[512];
  if (st__cuda_ctx_enter(r->ordinal, err, sizeof err) != ST_OK) {
    st__sft_run_fail(&r->run, ST_ERR_CAPABILITY, err);
    return NULL;
  }
  for (int64_t i; (i = st__sft_run_take(&r->run)) >= 0;) {
    slot_t *sl = take_slot(r);
    int rc = fill_batch(r, &r->batches[i], sl, err, sizeof err);
    give_slot(r, sl);
    if (rc != ST_OK) {
      st__sft_run_fail(&r->run, rc, err);
      break;
    }
  }
  return NULL;
}

/* Packs consecutive pieces into batches that fit one chunk. */
static batch_t *make_batches(const st__sft_piece_t *p, size_t n, uint64_t chunk, size_t *nb) {
  batch_t *b = malloc((n ? n : 1) * sizeof *b);
  if (!b) return NULL;
  size_t m = 0;
  uint64_t used = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t f = footprint(&p[i]);
    if (m == 0 || used + f > chunk) {
      b[m].first = i;
      b[m].count = 0;
      m++;
      used = 0;
    }
    b[m - 1].count++;
    used += f;
  }
  *nb = m;
  return b;
}

/* See safetensors.h. A worker thread; blocks. */
int st__safetensors_load_cuda(const st__safetensors_t *s, const st__safetensors_opts_t *o,
                              st__arena_t *arena, const st__sft_piece_t *pieces, size_t npieces,
                              int threads, char *err, size_t errlen) {
  const st__cuda_api_t *a = apis(err, errlen);
  if (!a) return ST_ERR_CAPABILITY;
  cuda_run_t r;
  memset(&r, 0, sizeof r);
  r.a = a;
  r.s = s;
  r.pieces = pieces;
  r.ordinal = o->device;
  r.base = (CUdeviceptr)(uintptr_t)st__arena_base(arena);
  st__sft_run_init(&r.run, o, 0);
  pthread_cond_init(&r.cond, NULL);
  int ids[MAX_CHUNKS];
  int nleased = 0, own_stream = 0, rc = st__cuda_ctx_enter(o->device, err, errlen);
  uint64_t chunk = 0;
  int nchunks = 0;
  st__staging_info(&chunk, &nchunks);
  if (rc == ST_OK && !(r.batches = make_batches(pieces, npieces, chunk, &r.nbatches))) {
    snprintf(err, errlen, "out of memory planning the load");
    rc = ST_ERR_OUT_OF_MEMORY;
  }
  if (rc == ST_OK) {
    r.stream = (CUstream)o->stream;
    if (!r.stream) {
      rc = st__cuda_error(a->cuStreamCreate(&r.stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate",
                          err, errlen);
      own_stream = rc == ST_OK;
    }
  }
  if (rc == ST_OK) {
    int want = threads + 2;
    if ((size_t)want > r.nbatches + 1) want = (int)r.nbatches + 1;
    nleased = lease(want, ids, o);
    if (nleased < 0) {
      rc = nleased;
      nleased = 0;
      snprintf(err, errlen, "%s while waiting for pinned staging memory",
               rc == ST_ERR_TIMEOUT ? "the load ran past the time limit" : "the load was cancelled");
    }
  }
  if (rc == ST_OK && !(r.slots = calloc((size_t)nleased, sizeof *r.slots))) {
    snprintf(err, errlen, "out of memory");
    rc = ST_ERR_OUT_OF_MEMORY;
  }
  for (int i = 0; rc == ST_OK && i < nleased; i++) {
    r.slots[i].mem = pool_base + (uint64_t)ids[i] * chunk;
    rc = st__cuda_error(extra.cuEventCreate(&r.slots[i].ev, CU_EVENT_DISABLE_TIMING),
                        "cuEventCreate", err, errlen);
    if (rc == ST_OK) r.nslots++;
  }
  if (rc == ST_OK) {
    r.run.count = r.nbatches;
    st__sft_run_readers(&r.run, threads, cuda_reader, &r);
    if (r.run.rc != ST_OK) {
      rc = r.run.rc;
      snprintf(err, errlen, "%s", r.run.err);
    }
  }
  /* Copies may still read the chunks: wait for them before anything goes
   * back, also on failure. */
  if (r.stream) {
    char serr[256];
    int src = st__cuda_error(a->cuStreamSynchronize(r.stream), "cuStreamSynchronize", serr,
                             sizeof serr);
    if (rc == ST_OK && src != ST_OK) {
      rc = src;
      snprintf(err, errlen, "%s", serr);
    }
  }
  for (int i = 0; i < r.nslots; i++) extra.cuEventDestroy(r.slots[i].ev);
  if (nleased) unlease(ids, nleased);
  if (own_stream) a->cuStreamDestroy(r.stream);
  free(r.slots);
  free(r.batches);
  pthread_cond_destroy(&r.cond);
  st__sft_run_destroy(&r.run);
  return rc;
}

#else /* !ST_HAVE_CUDA */

/* See safetensors.h: ST_ERR_CAPABILITY in a build without CUDA. */
int st__staging_init(uint64_t bytes, char *err, size_t errlen) {
  if (err && errlen) snprintf(err, errlen, "no CUDA device: built without CUDA support");
  return ST_ERR_CAPABILITY;
}

/* See safetensors.h. */
void st__staging_info(uint64_t *chunk_bytes, int *nchunks) {
  *chunk_bytes = 0;
  *nchunks = 0;
}

/* See safetensors.h: never reached without CUDA arenas. */
int st__safetensors_load_cuda(const st__safetensors_t *s, const st__safetensors_opts_t *o,
                              st__arena_t *arena, const st__sft_piece_t *pieces, size_t npieces,
                              int threads, char *err, size_t errlen) {
  if (err && errlen) snprintf(err, errlen, "no CUDA device: built without CUDA support");
  return ST_ERR_CAPABILITY;
}

#endif
