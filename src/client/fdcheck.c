/* src/client: what a received descriptor must be before it is mapped
 * (docs/protocol.md, "Arena"). The server is not trusted: a descriptor
 * that disagrees with its arena's description is ST_ERR_PROTOCOL here,
 * never a signal later.
 *
 *   memfd (cpu)  a regular file of the kernel's shared memory (tmpfs; a
 *                memfd, not hugetlbfs, whose pages a holder can punch out
 *                from under a mapping), sealed against shrinking
 *                (F_SEAL_SHRINK: nobody can truncate it under our mapping,
 *                which would kill us with SIGBUS), at least as long as the
 *                arena says (every tensor was checked against that
 *                length), and open for what its mapping needs: reading
 *                for one mapped read-only (d->readonly: the reply marks
 *                it, or the caller asked read-only; O_RDONLY or O_RDWR,
 *                mapped PROT_READ either way, whatever seals it has);
 *                reading and writing, with no seal against writing
 *                (F_SEAL_WRITE, F_SEAL_FUTURE_WRITE), for every other
 *                (mapped PROT_READ | PROT_WRITE: results are writable,
 *                and pages and hand-offs are written). A descriptor that
 *                cannot be mapped writable is refused here rather than
 *                mapped read-only where something will write;
 *   vmm (cuda)   what an exported VMM allocation is on Linux: a descriptor
 *                of the NVIDIA control device (the character device of
 *                /dev/nvidiactl: st__cuda_fd_check, the server's check at
 *                a put too), open read-write. The driver checks the rest
 *                (an allocation, its size) when it imports.
 *
 * No state; any thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include "client/client_internal.h"
#include "common/fail.h"
#include "cudadrv/import.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

/* Every refusal here is PROTOCOL and names the arena. */
#define refuse(d, err, errlen, fmt, ...)                                                    \
  st__fail(ST_ERR_PROTOCOL, err, errlen, "arena %llu: " fmt, (unsigned long long)(d)->id, \
           __VA_ARGS__)

/* ST_OK when fd is open for reading and writing. */
static int check_read_write(const st__arena_desc_t *d, int fd, const char *what, char *err,
                            size_t errlen) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || (fl & O_ACCMODE) != O_RDWR)
    return refuse(d, err, errlen, "the %s descriptor is not open for reading and writing%s", what,
                  d->readonly ? "" : ", and the arena is not read-only (it is mapped to be "
                  "written)");
  return ST_OK;
}

/* See client_internal.h. */
int st__client_check_memfd(const st__arena_desc_t *d, int fd, const struct stat *st, char *err,
                           size_t errlen) {
  if (!S_ISREG(st->st_mode))
    return refuse(d, err, errlen, "backend memfd, but the descriptor is %s",
                  st__file_kind(st->st_mode));
  struct statfs fs;
  if (fstatfs(fd, &fs) != 0)
    return st__fail(ST_ERR_IO, err, errlen, "arena %llu: fstatfs failed: %s",
                    (unsigned long long)d->id, strerror(errno));
  if (fs.f_type != TMPFS_MAGIC)
    return refuse(d, err, errlen,
                  "backend memfd, but the descriptor is a file of another file system "
                  "(type 0x%llx; a memfd's is tmpfs, 0x%llx)",
                  (unsigned long long)fs.f_type, (unsigned long long)TMPFS_MAGIC);
  /* A read-only mapping (the reply marks the arena, or the caller asked
   * read-only: keys.c, buffer.c mark d) needs a descriptor open for
   * reading; the server reopens it O_RDONLY, and one open read-write is
   * mapped PROT_READ all the same. A writable one needs reading and
   * writing and no seal against writing: mmap(PROT_WRITE, MAP_SHARED) of
   * anything else fails (EACCES, EPERM), and a mapping that was read-only
   * where the library or its caller writes would be a SIGSEGV later. */
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || (fl & O_ACCMODE) == O_WRONLY)
    return refuse(d, err, errlen, "%s", "the memfd descriptor is not open for reading");
  int rc = d->readonly ? ST_OK : check_read_write(d, fd, "memfd", err, errlen);
  if (rc != ST_OK) return rc;
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK))
    return refuse(d, err, errlen, "%s",
                  "the memfd is not sealed against shrinking (F_SEAL_SHRINK)");
  if (!d->readonly && (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)))
    return refuse(d, err, errlen, "%s",
                  "the memfd is sealed against writing, and the arena is not read-only (it "
                  "is mapped to be written)");
  if ((uint64_t)st->st_size < d->bytes)
    return refuse(d, err, errlen, "the descriptor says %llu bytes but the file has %lld",
                  (unsigned long long)d->bytes, (long long)st->st_size);
  return ST_OK;
}

/* See client_internal.h. */
int st__client_check_vmm_fd(const st__arena_desc_t *d, int fd, char *err, size_t errlen) {
  char why[200];
  if (st__cuda_fd_check(fd, why, sizeof why) != ST_OK)
    return refuse(d, err, errlen, "backend vmm, but %s", why);
  return check_read_write(d, fd, "vmm", err, errlen);
}
