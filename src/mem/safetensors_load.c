/* src/mem/safetensors_load.c: a parsed checkpoint into ONE arena
 * (safetensors.h; docs/design.md, section 3, decision 3).
 *
 * Layout: tensors in module order, each at the next multiple of
 * ST_ARENA_ALIGN, in its own dtype or, when a conversion is asked for and
 * the tensor is floating, in the requested dtype (integer and bool
 * tensors keep theirs: token ids must not become floats).
 *
 * Reading: the tensors are cut into pieces (at most 16 MiB of file data on
 * the CPU, one staging chunk for CUDA), sorted by file and offset so that
 * each file is read front to back, and handed to reader threads through
 * an atomic counter. On the CPU the memfd is made uncommitted (arena.h:
 * no fallocate of the whole on one thread first) and its pages are made
 * by the readers, in parallel with the reads, two ways at once:
 *   - the kernel-copy lane: a reader that finds it free takes it for one
 *     piece kept in its dtype and splices that piece file -> pipe ->
 *     memfd (st__safetensors_splice, st__arena_splice): the kernel copies
 *     from the page cache into new pages of the memfd without zero-filling
 *     them first or mapping them here, about twice the speed of a fault
 *     and a copy on one core. The memfd's writes are serialized by its
 *     inode lock, so one lane, one reader in it at a time;
 *   - the others commit the pages of their piece in one call
 *     (st__arena_commit: MADV_POPULATE_WRITE) and pread straight into
 *     them (no bounce buffer); a converted piece is read into a per-thread
 *     buffer and converted into the arena.
 * Either way a shortage of memory is an error, not a SIGBUS. The lane is
 * off where the host gives shared memory huge pages (those come to pages
 * committed through the mapping, which asks for them: st__arena_shmem_huge)
 * and for an arena with no memfd of its own (a pool region); it turns off
 * for the rest of the load when the kernel refuses a splice (EINVAL and
 * the like: a filesystem without splice, a seccomp filter), and that
 * piece is read the other way. Every page of the arena holds bytes of
 * some piece (tensors lie at most ST_ARENA_ALIGN bytes apart), so the
 * pieces commit all of it. docs/benchmarks.md, "safetensors -> CPU arena:
 * pieces copied in the kernel", has the measurements behind this.
 * CUDA arenas go through safetensors_cuda.c.
 *
 * Contracts of the non-static functions: their comments in safetensors.h.
 */
#include "mem/safetensors.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* File bytes per CPU piece. */
#define CPU_PIECE (16ull << 20)
/* Staging offsets of pieces packed into one chunk are multiples of this. */
#define STAGE_ALIGN 256u

/* ------------------------------------------------------------ conversion */

static float to_float(st_dtype_t t, const unsigned char *p) {
  switch (t) {
  case ST_DTYPE_FLOAT32: { float f; memcpy(&f, p, 4); return f; }
  case ST_DTYPE_FLOAT16: { uint16_t h; memcpy(&h, p, 2); return st_half_to_float(h); }
  case ST_DTYPE_BFLOAT16: {
    /* A signaling NaN comes out quiet, as st_dtype_load's trip through
     * double makes it. */
    uint32_t u = (uint32_t)p[0] << 16 | (uint32_t)p[1] << 24;
    if ((u & 0x7fffffff) > 0x7f800000) u |= 0x400000;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  case ST_DTYPE_FLOAT8_E4M3FN: return st_e4m3fn_to_float(*p);
  default: return st_e5m2_to_float(*p);
  }
}

static void from_float(st_dtype_t t, unsigned char *p, float f) {
  switch (t) {
  case ST_DTYPE_FLOAT32: memcpy(p, &f, 4); break;
  case ST_DTYPE_FLOAT16: { uint16_t h = st_float_to_half(f); memcpy(p, &h, 2); break; }
  case ST_DTYPE_BFLOAT16: { uint16_t h = st_float_to_bfloat16(f); memcpy(p, &h, 2); break; }
  case ST_DTYPE_FLOAT8_E4M3FN: *p = st_float_to_e4m3fn(f); break;
  default: *p = st_float_to_e5m2(f); break;
  }
}

static int small_float(st_dtype_t t) {
  return t == ST_DTYPE_FLOAT32 || t == ST_DTYPE_FLOAT16 || t == ST_DTYPE_BFLOAT16 ||
         t == ST_DTYPE_FLOAT8_E4M3FN || t == ST_DTYPE_FLOAT8_E5M2;
}

/* Lookup tables: for a 16- or 8-bit float source, every source code maps
 * to the destination's bytes, computed once with the same to_float and
 * from_float as the per-element path, so the results are identical by
 * construction (both backends round as st_dtype_store does).
 * At most 256 KiB each; built on first use and kept for the process. */
static pthread_mutex_t lut_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned char *luts[ST_DTYPE_COUNT][ST_DTYPE_COUNT];

static const unsigned char *lut_for(st_dtype_t sdt, st_dtype_t ddt) {
  unsigned char *t = __atomic_load_n(&luts[sdt][ddt], __ATOMIC_ACQUIRE);
  if (t) return t;
  pthread_mutex_lock(&lut_lock);
  t = luts[sdt][ddt];
  if (!t) {
    size_t ss = st_dtype_size(sdt), ds = st_dtype_size(ddt), count = (size_t)1 << (8 * ss);
    t = malloc(count * ds);
    for (size_t c = 0; t && c < count; c++) {
      /* The code, little-endian; 4 bytes so that to_float may read any
       * source dtype's width (tables exist for 1- and 2-byte ones). */
      unsigned char code[4] = {(unsigned char)c, (unsigned char)(c >> 8), 0, 0};
      from_float(ddt, t + c * ds, to_float(sdt, code));
    }
    __atomic_store_n(&luts[sdt][ddt], t, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&lut_lock);
  return t;
}

/* dst[i] = lut[src[i]] for source codes of ss bytes and results of ds. */
static void convert_lut(unsigned char *d, size_t ds, const unsigned char *s, size_t ss,
                        const unsigned char *lut, uint64_t n) {
  if (ss == 2 && ds == 2) {
    for (uint64_t i = 0; i < n; i++) {
      uint16_t c, v;
      memcpy(&c, s + 2 * i, 2);
      memcpy(&v, lut + 2 * (size_t)c, 2);
      memcpy(d + 2 * i, &v, 2);
    }
  } else if (ss == 2 && ds == 4) {
    for (uint64_t i = 0; i < n; i++) {
      uint16_t c;
      uint32_t v;
      memcpy(&c, s + 2 * i, 2);
      memcpy(&v, lut + 4 * (size_t)c, 4);
      memcpy(d + 4 * i, &v, 4);
    }
  } else {
    for (uint64_t i = 0; i < n; i++) {
      size_t c = ss == 2 ? (size_t)(s[2 * i] | s[2 * i + 1] << 8) : s[i];
      memcpy(d + ds * i, lut + ds * c, ds);
    }
  }
}

/* See safetensors.h. Between float32 and the 16- and 8-bit formats the
 * values go through float, which is what st_dtype_load/store do for them
 * (16- and 8-bit sources through a lookup table of exactly those results);
 * anything else goes through st_dtype_load/store (double). Any thread. */
void st__safetensors_convert(void *dst, st_dtype_t ddt, const void *src, st_dtype_t sdt,
                             uint64_t n) {
  size_t ds = st_dtype_size(ddt), ss = st_dtype_size(sdt);
  if (ddt == sdt) {
    memcpy(dst, src, (size_t)n * ds);
    return;
  }
  const unsigned char *s = src;
  unsigned char *d = dst;
  if (small_float(sdt) && small_float(ddt)) {
    const unsigned char *lut = ss <= 2 ? lut_for(sdt, ddt) : NULL;
    if (lut) {
      convert_lut(d, ds, s, ss, lut, n);
      return;
    }
    for (uint64_t i = 0; i < n; i++) from_float(ddt, d + i * ds, to_float(sdt, s + i * ss));
    return;
  }
  for (uint64_t i = 0; i < n; i++) st_dtype_store(ddt, d, (size_t)i, st_dtype_load(sdt, s, (size_t)i));
}

/* ------------------------------------------------------------ layout */

/* Lays out s's tensors in module order at ST_ARENA_ALIGN offsets
 * (offsets[i], dtypes[i]: caller arrays of s->ntensors, may be NULL for an
 * empty checkpoint) and returns the arena size in *total. ST_OK or
 * ST_ERR_LIMIT when the total overflows. Any thread. */
static int safetensors_layout(const st__safetensors_t *s, st_dtype_t dtype, uint64_t *offsets,
                              st_dtype_t *dtypes, uint64_t *total, char *err, size_t errlen) {
  uint64_t at = 0;
  for (size_t i = 0; i < s->ntensors; i++) {
    const st__safetensors_tensor_t *t = &s->tensors[i];
    st_dtype_t d = dtype != ST_DTYPE_INVALID && st_dtype_is_float(t->dtype) ? dtype : t->dtype;
    uint64_t es = st_dtype_size(d);
    if (at > UINT64_MAX - ST_ARENA_ALIGN || (es && t->numel > UINT64_MAX / es)) goto overflow;
    at = (at + ST_ARENA_ALIGN - 1) / ST_ARENA_ALIGN * ST_ARENA_ALIGN;
    offsets[i] = at;
    dtypes[i] = d;
    if (t->numel * es > UINT64_MAX - at) goto overflow;
    at += t->numel * es;
  }
  *total = at;
  return ST_OK;
overflow:
  snprintf(err, errlen, "the checkpoint's tensors add up to more than 2^64 bytes");
  return ST_ERR_LIMIT;
}

/* ------------------------------------------------------------ pieces */

static int by_source(const void *a, const void *b) {
  const st__sft_piece_t *x = a, *y = b;
  if (x->file != y->file) return x->file < y->file ? -1 : 1;
  return x->src_off < y->src_off ? -1 : x->src_off > y->src_off ? 1 : 0;
}

/* Cuts every non-empty tensor into pieces whose footprint (file bytes, plus
 * the converted bytes and alignment when `room` says the conversion needs
 * space beside them) is at most `limit`; sorted by file and offset. */
static int make_pieces(const st__safetensors_t *s, const uint64_t *offsets,
                       const st_dtype_t *dtypes, uint64_t limit, int room,
                       st__sft_piece_t **out, size_t *nout, char *err, size_t errlen) {
  size_t n = 0, cap = s->ntensors + 16;
  st__sft_piece_t *p = malloc(cap * sizeof *p);
  if (!p) goto oom;
  for (size_t i = 0; i < s->ntensors; i++) {
    const st__safetensors_tensor_t *t = &s->tensors[i];
    uint64_t ss = st_dtype_size(t->dtype), ds = st_dtype_size(dtypes[i]);
    uint64_t per = ss + (room && dtypes[i] != t->dtype ? ds : 0);
    uint64_t max = (limit - (room ? 2 * STAGE_ALIGN : 0)) / per;
    for (uint64_t e = 0; e < t->numel; e += max) {
      if (n == cap) {
        cap *= 2;
        st__sft_piece_t *q = realloc(p, cap * sizeof *q);
        if (!q) goto oom;
        p = q;
      }
      uint64_t k = t->numel - e < max ? t->numel - e : max;
      p[n].file = t->file;
      p[n].src_off = s->files[t->file].data_start + t->begin + e * ss;
      p[n].n = k;
      p[n].dst_off = offsets[i] + e * ds;
      p[n].sdt = t->dtype;
      p[n].ddt = dtypes[i];
      n++;
    }
  }
  qsort(p, n, sizeof *p, by_source);
  *out = p;
  *nout = n;
  return ST_OK;
oom:
  free(p);
  snprintf(err, errlen, "out of memory planning the load");
  return ST_ERR_OUT_OF_MEMORY;
}

/* ------------------------------------------------------------ CPU readers */

typedef struct cpu_run {
  const st__safetensors_t *s;
  const st__sft_piece_t *pieces;
  size_t npieces;
  st__arena_t *arena;
  char *base;
  st__sft_run_t run;           /* items: pieces */
  /* The kernel-copy lane: one reader at a time (the one holding `lane`)
   * splices a piece file -> pipe -> memfd. pipe[0] < 0: no lane. */
  pthread_mutex_t lane;
  int pipe[2];
  uint64_t pipe_bytes;         /* what one splice into the pipe may move */
  int lane_off;                /* atomic: the kernel refused a splice    */
} cpu_run_t;

static uint64_t count_spliced, count_read, count_converted;   /* atomics */

/* See safetensors.h. */
void st__safetensors_cpu_counts(st__safetensors_cpu_counts_t *out) {
  out->spliced = __atomic_load_n(&count_spliced, __ATOMIC_RELAXED);
  out->read = __atomic_load_n(&count_read, __ATOMIC_RELAXED);
  out->converted = __atomic_load_n(&count_converted, __ATOMIC_RELAXED);
}

/* See safetensors.h. */
void st__sft_run_init(st__sft_run_t *r, const st__safetensors_opts_t *o, size_t count) {
  memset(r, 0, sizeof *r);
  r->o = o;
  r->count = count;
  pthread_mutex_init(&r->lock, NULL);
}

/* See safetensors.h. */
void st__sft_run_readers(st__sft_run_t *r, int threads, void *(*reader)(void *), void *arg) {
  pthread_t tid[64];
  int started = 0;
  for (int i = 1; i < threads && i < 64; i++)
    if (pthread_create(&tid[started], NULL, reader, arg) == 0) started++;
  reader(arg);
  for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
}

/* See safetensors.h. */
void st__sft_run_destroy(st__sft_run_t *r) { pthread_mutex_destroy(&r->lock); }

/* See safetensors.h. */
void st__sft_run_fail(st__sft_run_t *r, int rc, const char *msg) {
  pthread_mutex_lock(&r->lock);
  if (r->rc == ST_OK) {
    r->rc = rc;
    snprintf(r->err, sizeof r->err, "%s", msg);
  }
  pthread_mutex_unlock(&r->lock);
  __atomic_store_n(&r->failed, 1, __ATOMIC_RELEASE);
}

/* See safetensors.h. */
int64_t st__sft_run_take(st__sft_run_t *r) {
  size_t i = __atomic_fetch_add(&r->next, 1, __ATOMIC_RELAXED);
  if (i >= r->count || __atomic_load_n(&r->failed, __ATOMIC_ACQUIRE)) return -1;
  int stop = r->o->stop ? r->o->stop(r->o->stop_ud) : 0;
  if (stop) {
    st__sft_run_fail(r, stop, stop == ST_ERR_TIMEOUT ? "the load ran past the time limit"
                                                     : "the load was cancelled");
    return -1;
  }
  return (int64_t)i;
}

/* Copies piece p (no conversion) in the kernel: file -> the lane's pipe
 * -> memfd, never mapping or zero-filling the pages it fills. ST_OK, the
 * load's error, or ST_ERR_CAPABILITY when the kernel refused a splice
 * (the caller turns the lane off and reads the piece itself: the pipe may
 * hold bytes, which nothing reads again). The caller holds the lane. */
static int splice_piece(cpu_run_t *r, const st__safetensors_file_t *f, const st__sft_piece_t *p,
                        uint64_t bytes, char *err, size_t errlen) {
  uint64_t src = p->src_off, dst = p->dst_off;
  while (bytes > 0) {
    uint64_t want = bytes < r->pipe_bytes ? bytes : r->pipe_bytes;
    int64_t n = st__safetensors_splice(f, r->pipe[1], want, src, err, errlen);
    if (n < 0) return (int)n;
    int rc = st__arena_splice(r->arena, dst, r->pipe[0], (uint64_t)n, err, errlen);
    if (rc != ST_OK) return rc;
    src += (uint64_t)n;
    dst += (uint64_t)n;
    bytes -= (uint64_t)n;
  }
  return ST_OK;
}

/* Takes the kernel-copy lane when it is on and free: 1 held, 0 not. Its
 * state is read again under the lock: a holder that turned it off may
 * have left bytes in the pipe. */
static int take_lane(cpu_run_t *r) {
  if (r->pipe[0] < 0 || __atomic_load_n(&r->lane_off, __ATOMIC_RELAXED) ||
      pthread_mutex_trylock(&r->lane) != 0)
    return 0;
  if (!__atomic_load_n(&r->lane_off, __ATOMIC_RELAXED)) return 1;
  pthread_mutex_unlock(&r->lane);
  return 0;
}

static void *cpu_reader(void *arg) {
  cpu_run_t *r = arg;
  char *tmp = NULL;
  char err[512];
  for (int64_t i; (i = st__sft_run_take(&r->run)) >= 0;) {
    const st__sft_piece_t *p = &r->pieces[i];
    const st__safetensors_file_t *f = &r->s->files[p->file];
    uint64_t sbytes = p->n * st_dtype_size(p->sdt);
    char *dst = r->base + p->dst_off;
    int rc = ST_ERR_CAPABILITY;
    /* A piece kept as it is: copied in the kernel when the lane is free
     * (the memfd's writes are serialized there, so one reader at a time). */
    if (p->sdt == p->ddt && take_lane(r)) {
      rc = splice_piece(r, f, p, sbytes, err, sizeof err);
      if (rc == ST_ERR_CAPABILITY) __atomic_store_n(&r->lane_off, 1, __ATOMIC_RELAXED);
      pthread_mutex_unlock(&r->lane);
      if (rc == ST_OK) __atomic_fetch_add(&count_spliced, sbytes, __ATOMIC_RELAXED);
    }
    if (rc == ST_ERR_CAPABILITY) {
      /* Its pages, committed in one call (pread would fault one per
       * page), then read or converted into. */
      rc = st__arena_commit(r->arena, p->dst_off, p->n * st_dtype_size(p->ddt), err,
                            sizeof err);
      if (rc == ST_OK && p->sdt == p->ddt) {
        rc = st__safetensors_pread(f, dst, sbytes, p->src_off, err, sizeof err);
        if (rc == ST_OK) __atomic_fetch_add(&count_read, sbytes, __ATOMIC_RELAXED);
      } else if (rc == ST_OK) {
        if (!tmp && !(tmp = malloc(CPU_PIECE))) {
          st__sft_run_fail(&r->run, ST_ERR_OUT_OF_MEMORY, "out of memory for a conversion buffer");
          break;
        }
        rc = st__safetensors_pread(f, tmp, sbytes, p->src_off, err, sizeof err);
        if (rc == ST_OK) {
          st__safetensors_convert(dst, p->ddt, tmp, p->sdt, p->n);
          __atomic_fetch_add(&count_converted, sbytes, __ATOMIC_RELAXED);
        }
      }
    }
    if (rc != ST_OK) {
      st__sft_run_fail(&r->run, rc, err);
      break;
    }
  }
  free(tmp);
  return NULL;
}

/* The kernel-copy lane's pipe, as large as the host lets a process make
 * one (1 MiB by default: fewer splices per piece). None (all pieces read
 * into committed pages) for an arena that is no memfd of its own (a pool
 * region), and where the host gives shared memory huge pages: those come
 * to pages committed through the mapping, which asked for them, and not
 * to the memfd's writes. */
static void lane_open(cpu_run_t *r) {
  uint64_t dev, ino;
  r->pipe[0] = r->pipe[1] = -1;
  if (!st__arena_file_id(r->arena, &dev, &ino) || st__arena_shmem_huge(NULL, 0) ||
      pipe2(r->pipe, O_CLOEXEC) != 0) {
    r->pipe[0] = r->pipe[1] = -1;
    return;
  }
  fcntl(r->pipe[1], F_SETPIPE_SZ, 1 << 20);
  int sz = fcntl(r->pipe[1], F_GETPIPE_SZ);
  r->pipe_bytes = sz > 0 ? (uint64_t)sz : 65536;
}

static int load_cpu(const st__safetensors_t *s, const st__safetensors_opts_t *o,
                    st__arena_t *arena, const st__sft_piece_t *pieces, size_t npieces,
                    int threads, char *err, size_t errlen) {
  cpu_run_t r;
  memset(&r, 0, sizeof r);
  r.s = s;
  r.pieces = pieces;
  r.npieces = npieces;
  r.arena = arena;
  r.base = st__arena_base(arena);
  pthread_mutex_init(&r.lane, NULL);
  lane_open(&r);
  st__sft_run_init(&r.run, o, npieces);
  st__sft_run_readers(&r.run, threads, cpu_reader, &r);
  st__sft_run_destroy(&r.run);
  if (r.pipe[0] >= 0) {
    close(r.pipe[0]);
    close(r.pipe[1]);
  }
  pthread_mutex_destroy(&r.lane);
  if (r.run.rc != ST_OK) snprintf(err, errlen, "%s", r.run.err);
  return r.run.rc;
}

/* ------------------------------------------------------------ entry */

/* See safetensors.h. A worker thread; blocks. */
int st__safetensors_load(const st__safetensors_t *s, const st__safetensors_opts_t *o,
                         st__arena_t **arena, uint64_t *offsets, st_dtype_t *dtypes, char *err,
                         size_t errlen) {
  char dummy[1];
  if (!err) { err = dummy; errlen = sizeof dummy; }
  *arena = NULL;
  if (o->dtype != ST_DTYPE_INVALID && !st_dtype_is_float(o->dtype)) {
    snprintf(err, errlen, "conversion target %s is not a floating dtype",
             st_dtype_name(o->dtype) ? st_dtype_name(o->dtype) : "(invalid)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  uint64_t total = 0;
  int rc = safetensors_layout(s, o->dtype, offsets, dtypes, &total, err, errlen);
  if (rc != ST_OK) return rc;
  int threads = o->threads > 0 ? o->threads : st__safetensors_loader_threads();
  if (threads > 64) threads = 64;

  uint64_t limit = CPU_PIECE;
  if (o->device >= 0) {
    rc = st__staging_init(0, err, errlen);      /* no-op once the pool exists */
    if (rc != ST_OK) return rc;
    int nchunks = 0;
    st__staging_info(&limit, &nchunks);
  }
  st__sft_piece_t *pieces = NULL;
  size_t npieces = 0;
  rc = make_pieces(s, offsets, dtypes, limit, o->device >= 0, &pieces, &npieces, err, errlen);
  if (rc != ST_OK) return rc;
  if ((size_t)threads > npieces) threads = npieces ? (int)npieces : 1;

  st__arena_t *a = NULL;
  /* A CPU arena with pieces to read is committed by the readers. */
  rc = st__arena_new(&(st__arena_spec_t){.device = o->device, .bytes = total,
                                          .uncommitted = o->device < 0 && npieces > 0},
                     &a, err, errlen);
  if (rc == ST_OK && npieces)
    rc = o->device < 0 ? load_cpu(s, o, a, pieces, npieces, threads, err, errlen)
                       : st__safetensors_load_cuda(s, o, a, pieces, npieces, threads, err, errlen);
  free(pieces);
  if (rc != ST_OK) {
    st__arena_unref(a);
    return rc;
  }
  *arena = a;
  return ST_OK;
}
