/* libst_fault.so: an LD_PRELOAD shim that makes chosen system and CUDA
 * driver calls of stserver fail on a schedule, so that tests can see how
 * the server answers a failure it cannot provoke otherwise.
 *
 *   ST_FAULT="rule[,rule...]"     rule = call[:after[:times[:error]]]
 *     call    memfd_create | ftruncate | fallocate (fallocate and
 *             posix_fallocate) | mmap (shared mappings of a descriptor
 *             only: anonymous memory and private file maps pass) | accept
 *             (accept, accept4) | splice | cuMemCreate
 *             | cuMemExportToShareableHandle | cuMemImportFromShareableHandle
 *     after   matching calls let through before the first failure (0)
 *     times   failures in a row (1); 0 = every call from then on
 *     error   an errno name (EMFILE, ENFILE, ENOMEM, ENOSPC, EIO, EINVAL,
 *             ENOSYS, ...) or number; for cu* a CUresult number (default 2,
 *             CUDA_ERROR_OUT_OF_MEMORY)
 *   ST_FAULT_ARM=PATH   calls are counted (and failed) only while PATH
 *                       exists, so that the server's start does not count
 *   ST_FAULT_TRACE=1    every intercepted call is logged on stderr
 *   ST_FAULT_GAI_DELAY_MS=N   getaddrinfo of a host name (not a numeric
 *                       address) first sleeps N ms: a slow DNS server
 *   ST_FAULT_LISTEN_DELAY_MS=N   listen first sleeps N ms: a wide window
 *                       between a socket's bind and its listen
 *
 * Each injected failure writes "st_fault: injected <call> -> <error>" on
 * stderr (the server log), so a test can tell that it fired.
 *
 * CUDA: stserver links the CUDA runtime statically and gets its driver
 * entry points with cudaGetDriverEntryPointByVersion (src/cudadrv/driver.c),
 * which the runtime answers through the driver's cuGetProcAddress, itself
 * found with dlsym on libcuda.so.1. The shim interposes dlsym: asked for
 * cuGetProcAddress(_v2) it hands out a wrapper that, for the three cu*
 * calls above, returns a failing stand-in of the real function, and for
 * cuGetProcAddress itself (the runtime may ask the driver for it) the
 * wrapper again.
 *
 * Test code only: nothing here is built into the server.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

enum { F_MEMFD, F_FTRUNCATE, F_FALLOCATE, F_MMAP, F_ACCEPT, F_SPLICE, F_CU_CREATE, F_CU_EXPORT,
       F_CU_IMPORT, F_N };
static const char *const call_names[F_N] = {
    "memfd_create", "ftruncate", "fallocate", "mmap", "accept", "splice",
    "cuMemCreate", "cuMemExportToShareableHandle", "cuMemImportFromShareableHandle"};

typedef struct rule {
  int on;
  long after, times, error;
  atomic_long seen;           /* matching calls counted so far */
} rule_t;

static rule_t rules[F_N];
static const char *arm_path;
static int trace;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static const struct { const char *name; int value; } errnos[] = {
    {"EMFILE", EMFILE}, {"ENFILE", ENFILE}, {"ENOMEM", ENOMEM}, {"ENOSPC", ENOSPC},
    {"EIO", EIO},       {"EINVAL", EINVAL}, {"EFBIG", EFBIG},   {"EPERM", EPERM},
    {"EAGAIN", EAGAIN}, {"EACCES", EACCES}, {"ENOSYS", ENOSYS}};

static long parse_error(const char *s, int cuda) {
  if (!s || !*s) return cuda ? 2 : ENOMEM;
  for (size_t i = 0; i < sizeof errnos / sizeof errnos[0]; i++)
    if (!strcmp(s, errnos[i].name)) return errnos[i].value;
  return strtol(s, NULL, 0);
}

/* Reads ST_FAULT once: "call:after:times:error,...". */
static void init(void) {
  arm_path = getenv("ST_FAULT_ARM");
  trace = getenv("ST_FAULT_TRACE") != NULL;
  const char *spec = getenv("ST_FAULT");
  if (!spec) return;
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", spec);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *field[4] = {tok, NULL, NULL, NULL};
    for (int i = 1; i < 4; i++) {
      char *colon = field[i - 1] ? strchr(field[i - 1], ':') : NULL;
      if (!colon) break;
      *colon = '\0';
      field[i] = colon + 1;
    }
    int k = 0;
    while (k < F_N && strcmp(field[0], call_names[k]) != 0) k++;
    if (k == F_N) {
      fprintf(stderr, "st_fault: unknown call '%s' in ST_FAULT\n", field[0]);
      continue;
    }
    rules[k].on = 1;
    rules[k].after = field[1] ? strtol(field[1], NULL, 10) : 0;
    rules[k].times = field[2] ? strtol(field[2], NULL, 10) : 1;
    rules[k].error = parse_error(field[3], k >= F_CU_CREATE);
  }
}

/* The error to inject into this call of `k`, or 0 to let it through. */
static long should_fail(int k) {
  pthread_once(&once, init);
  if (trace) fprintf(stderr, "st_fault: call %s\n", call_names[k]);
  rule_t *r = &rules[k];
  if (!r->on) return 0;
  if (arm_path && access(arm_path, F_OK) != 0) return 0;
  long n = atomic_fetch_add(&r->seen, 1);
  if (n < r->after || (r->times > 0 && n >= r->after + r->times)) return 0;
  if (k >= F_CU_CREATE) fprintf(stderr, "st_fault: injected %s -> CUresult %ld\n", call_names[k], r->error);
  else fprintf(stderr, "st_fault: injected %s -> %s\n", call_names[k], strerrorname_np((int)r->error));
  return r->error;
}

/* The next definition of `name` (libc's), looked up once per caller. */
static void *(*real_dlsym)(void *, const char *);

static void *next(const char *name) {
  if (!real_dlsym) {
    real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym)
      real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (!real_dlsym) abort();
  }
  return real_dlsym(RTLD_NEXT, name);
}

#define REAL(name)                                             \
  static __typeof__(&name) real_##name;                        \
  if (!real_##name) {                                          \
    void *p_ = next(#name);                                    \
    memcpy(&real_##name, &p_, sizeof p_);                      \
  }

/* ------------------------------------------------------------ system calls */

EXPORT int memfd_create(const char *name, unsigned int flags) {
  long e = should_fail(F_MEMFD);
  if (e) { errno = (int)e; return -1; }
  REAL(memfd_create);
  return real_memfd_create(name, flags);
}

EXPORT int ftruncate(int fd, off_t len) {
  long e = should_fail(F_FTRUNCATE);
  if (e) { errno = (int)e; return -1; }
  REAL(ftruncate);
  return real_ftruncate(fd, len);
}

EXPORT int ftruncate64(int fd, off_t len) { return ftruncate(fd, len); }

EXPORT int posix_fallocate(int fd, off_t off, off_t len) {
  long e = should_fail(F_FALLOCATE);
  if (e) return (int)e;   /* posix_fallocate returns the error number */
  REAL(posix_fallocate);
  return real_posix_fallocate(fd, off, len);
}

EXPORT int posix_fallocate64(int fd, off_t off, off_t len) { return posix_fallocate(fd, off, len); }

EXPORT int fallocate(int fd, int mode, off_t off, off_t len) {
  long e = should_fail(F_FALLOCATE);
  if (e) { errno = (int)e; return -1; }
  REAL(fallocate);
  return real_fallocate(fd, mode, off, len);
}

EXPORT int fallocate64(int fd, int mode, off_t off, off_t len) {
  return fallocate(fd, mode, off, len);
}

EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  if ((flags & MAP_SHARED) && !(flags & MAP_ANONYMOUS) && fd >= 0) {
    long e = should_fail(F_MMAP);
    if (e) { errno = (int)e; return MAP_FAILED; }
  }
  REAL(mmap);
  return real_mmap(addr, len, prot, flags, fd, off);
}

EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  return mmap(addr, len, prot, flags, fd, off);
}

EXPORT ssize_t splice(int fd_in, loff_t *off_in, int fd_out, loff_t *off_out, size_t len,
                      unsigned int flags) {
  long e = should_fail(F_SPLICE);
  if (e) { errno = (int)e; return -1; }
  REAL(splice);
  return real_splice(fd_in, off_in, fd_out, off_out, len, flags);
}

/* Sleeps the milliseconds environment variable `name` says, if any. */
static void delay_of(const char *name) {
  const char *d = getenv(name);
  long ms = d ? strtol(d, NULL, 10) : 0;
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (ms > 0 && nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

EXPORT int listen(int fd, int backlog) {
  delay_of("ST_FAULT_LISTEN_DELAY_MS");
  REAL(listen);
  return real_listen(fd, backlog);
}

/* A slow DNS server: names wait ST_FAULT_GAI_DELAY_MS before the real
 * resolution; numeric addresses (AI_NUMERICHOST) never do. */
EXPORT int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                       struct addrinfo **res) {
  if (node && !(hints && (hints->ai_flags & AI_NUMERICHOST))) delay_of("ST_FAULT_GAI_DELAY_MS");
  REAL(getaddrinfo);
  return real_getaddrinfo(node, service, hints, res);
}

EXPORT int accept4(int fd, struct sockaddr *sa, socklen_t *len, int flags) {
  long e = should_fail(F_ACCEPT);
  if (e) { errno = (int)e; return -1; }
  REAL(accept4);
  return real_accept4(fd, sa, len, flags);
}

EXPORT int accept(int fd, struct sockaddr *sa, socklen_t *len) {
  long e = should_fail(F_ACCEPT);
  if (e) { errno = (int)e; return -1; }
  REAL(accept);
  return real_accept(fd, sa, len);
}

/* ------------------------------------------------------------ CUDA driver
 * Types spelled out (CUresult is an int enum, handles are unsigned long
 * long) so that the shim builds without the CUDA headers. */

typedef unsigned long long cu_handle_t;
typedef int (*cu_create_fn)(cu_handle_t *, size_t, const void *, unsigned long long);
typedef int (*cu_export_fn)(void *, cu_handle_t, int, unsigned long long);
typedef int (*cu_import_fn)(cu_handle_t *, void *, int);
typedef int (*cu_getproc_v2_fn)(const char *, void **, int, uint64_t, int *);
typedef int (*cu_getproc_fn)(const char *, void **, int, uint64_t);

/* Set once, when the runtime asks for the entry point, before any call. */
static cu_create_fn real_cu_create;
static cu_export_fn real_cu_export;
static cu_import_fn real_cu_import;
static _Atomic(cu_getproc_v2_fn) real_getproc_v2;
static _Atomic(cu_getproc_fn) real_getproc;

static int fake_cu_create(cu_handle_t *h, size_t size, const void *prop, unsigned long long fl) {
  long e = should_fail(F_CU_CREATE);
  if (e) return (int)e;
  return real_cu_create(h, size, prop, fl);
}

static int fake_cu_export(void *out, cu_handle_t h, int type, unsigned long long fl) {
  long e = should_fail(F_CU_EXPORT);
  if (e) return (int)e;
  return real_cu_export(out, h, type, fl);
}

static int fake_cu_import(cu_handle_t *h, void *os_handle, int type) {
  long e = should_fail(F_CU_IMPORT);
  if (e) return (int)e;
  return real_cu_import(h, os_handle, type);
}

/* The faulted driver calls: name, where the real one is kept, stand-in. */
static const struct {
  const char *name;
  void *real;
  void (*fake)(void);
} entries[] = {
    {"cuMemCreate", &real_cu_create, (void (*)(void))fake_cu_create},
    {"cuMemExportToShareableHandle", &real_cu_export, (void (*)(void))fake_cu_export},
    {"cuMemImportFromShareableHandle", &real_cu_import, (void (*)(void))fake_cu_import}};

/* Swaps *pfn for a stand-in when `symbol` is one of the faulted calls
 * (function and data pointers share a representation on every platform
 * CUDA supports; memcpy keeps the conversion explicit). */
static void swap_entry(const char *symbol, void **pfn) {
  if (!pfn || !*pfn) return;
  if (trace) fprintf(stderr, "st_fault: entry point %s\n", symbol);
  for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
    if (strcmp(symbol, entries[i].name) != 0) continue;
    memcpy(entries[i].real, pfn, sizeof *pfn);
    memcpy(pfn, &entries[i].fake, sizeof *pfn);
    return;
  }
}

static int fake_getproc_v2(const char *symbol, void **pfn, int version, uint64_t flags,
                           int *status);
static int fake_getproc(const char *symbol, void **pfn, int version, uint64_t flags);

/* The driver hands out cuGetProcAddress itself too; the runtime may look
 * everything up through that one, so it comes back wrapped as well (the
 * 12.0 version of the entry point is the _v2 signature). 1 if swapped. */
static int swap_getproc(const char *symbol, void **pfn, int version) {
  if (!pfn || !*pfn || strncmp(symbol, "cuGetProcAddress", 16) != 0) return 0;
  if (trace) fprintf(stderr, "st_fault: entry point %s (version %d)\n", symbol, version);
  if (!strcmp(symbol, "cuGetProcAddress_v2") || version >= 12000) {
    cu_getproc_v2_fn real, fake = fake_getproc_v2;
    memcpy(&real, pfn, sizeof real);
    if (real != fake) atomic_store(&real_getproc_v2, real);
    memcpy(pfn, &fake, sizeof fake);
  } else {
    cu_getproc_fn real, fake = fake_getproc;
    memcpy(&real, pfn, sizeof real);
    if (real != fake) atomic_store(&real_getproc, real);
    memcpy(pfn, &fake, sizeof fake);
  }
  return 1;
}

static int fake_getproc_v2(const char *symbol, void **pfn, int version, uint64_t flags,
                           int *status) {
  pthread_once(&once, init);
  int r = atomic_load(&real_getproc_v2)(symbol, pfn, version, flags, status);
  if (r == 0 && !swap_getproc(symbol, pfn, version)) swap_entry(symbol, pfn);
  return r;
}

static int fake_getproc(const char *symbol, void **pfn, int version, uint64_t flags) {
  pthread_once(&once, init);
  int r = atomic_load(&real_getproc)(symbol, pfn, version, flags);
  if (r == 0 && !swap_getproc(symbol, pfn, version)) swap_entry(symbol, pfn);
  return r;
}

/* dlsym as libc has it, except that the driver's cuGetProcAddress comes
 * back wrapped (and the faulted cu* functions, if asked for by name). */
EXPORT void *dlsym(void *handle, const char *name) {
  if (!real_dlsym) next("dlsym");
  pthread_once(&once, init);
  void *p = real_dlsym(handle, name);
  if (!p || strncmp(name, "cu", 2) != 0) return p;
  if (trace) fprintf(stderr, "st_fault: dlsym %s\n", name);
  void *fake = NULL;
  if (!strcmp(name, "cuGetProcAddress_v2")) {
    cu_getproc_v2_fn f;
    memcpy(&f, &p, sizeof f);
    atomic_store(&real_getproc_v2, f);
    cu_getproc_v2_fn g = fake_getproc_v2;
    memcpy(&fake, &g, sizeof fake);
  } else if (!strcmp(name, "cuGetProcAddress")) {
    cu_getproc_fn f;
    memcpy(&f, &p, sizeof f);
    atomic_store(&real_getproc, f);
    cu_getproc_fn g = fake_getproc;
    memcpy(&fake, &g, sizeof fake);
  } else {
    void *slot = p;
    swap_entry(name, &slot);
    return slot;
  }
  return fake;
}
