/* src/client: what a received descriptor must be before it is mapped
 * (docs/protocol.md, "Arena"). The server is not trusted: a descriptor
 * that disagrees with its arena's description is ST_ERR_PROTOCOL here,
 * never a signal later.
 *
 *   memfd (cpu)  a regular file of the kernel's shared memory (tmpfs; a
 *                memfd, not hugetlbfs, whose pages a holder can punch out
 *                from under a mapping), open read-write, sealed against
 *                shrinking (F_SEAL_SHRINK: nobody can truncate it under
 *                our mapping, which would kill us with SIGBUS), not sealed
 *                against writing (results are writable), and at least as
 *                long as the arena says (every tensor was checked against
 *                that length);
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
    return refuse(d, err, errlen, "the %s descriptor is not open for reading and writing", what);
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
  /* A read-only arena (the reply marks it so, or the caller's handle is
   * read-only: buffer.c marks d) comes open for reading only: the server
   * reopened it O_RDONLY. Every other one for reading and writing. */
  int fl = fcntl(fd, F_GETFL);
  if (d->readonly && (fl < 0 || (fl & O_ACCMODE) != O_RDONLY))
    return refuse(d, err, errlen, "%s", "a read-only memfd descriptor is not open read-only");
  int rc = d->readonly ? ST_OK : check_read_write(d, fd, "memfd", err, errlen);
  if (rc != ST_OK) return rc;
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK))
    return refuse(d, err, errlen, "%s",
                  "the memfd is not sealed against shrinking (F_SEAL_SHRINK)");
  if (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE))
    return refuse(d, err, errlen, "%s", "the memfd is sealed against writing");
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
