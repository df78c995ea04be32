/* src/server: the journal file (journal.h). Loop thread. */
#include "server/journal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/fail.h"
#include "st/errors.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the journal is little-endian");

static const char MAGIC[8] = {'S', 'T', 'J', 'R', 'N', 'L', 0, 1};
#define LAYOUT 1u
#define RECORD_MAGIC 0x43525453u   /* "STRC" */
#define FIRST_CAPACITY ((uint64_t)1 << 20)

static uint64_t pad8(uint64_t n) { return (n + 7) & ~(uint64_t)7; }

static uint32_t rd32(const unsigned char *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

static uint64_t rd64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* The header of (generation, epoch), checksummed. */
static void header_of(unsigned char h[ST__JOURNAL_HEADER], uint64_t generation, uint64_t epoch) {
  memset(h, 0, ST__JOURNAL_HEADER);
  memcpy(h, MAGIC, 8);
  uint32_t layout = LAYOUT, hbytes = ST__JOURNAL_HEADER;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t created = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  memcpy(h + 8, &layout, 4);
  memcpy(h + 12, &hbytes, 4);
  memcpy(h + 16, &generation, 8);
  memcpy(h + 24, &epoch, 8);
  memcpy(h + 32, &created, 8);
  uint32_t crc = st__crc32c(0, h, ST__JOURNAL_HEADER);
  memcpy(h + 60, &crc, 4);
}

/* See journal.h. */
int st__journal_create(st__journal_t *j, uint64_t generation, uint64_t epoch, char *err,
                       size_t errlen) {
  memset(j, 0, sizeof *j);
  j->fd = memfd_create("st-journal", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (j->fd < 0)
    return st__fail(errno == EMFILE || errno == ENFILE ? ST_ERR_LIMIT : ST_ERR_OUT_OF_MEMORY,
                    err, errlen, "journal memfd: %s", strerror(errno));
  unsigned char h[ST__JOURNAL_HEADER];
  header_of(h, generation, epoch);
  if (ftruncate(j->fd, (off_t)FIRST_CAPACITY) != 0 ||
      pwrite(j->fd, h, sizeof h, 0) != (ssize_t)sizeof h) {
    int e = errno;
    st__journal_close(j);
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "journal: %s", strerror(e));
  }
  /* Nobody may shrink it under a reader's mapping. */
  fcntl(j->fd, F_ADD_SEALS, F_SEAL_SHRINK);
  j->capacity = FIRST_CAPACITY;
  j->tail = ST__JOURNAL_HEADER;
  j->generation = generation;
  j->epoch = epoch;
  return ST_OK;
}

/* See journal.h. */
int st__journal_append(st__journal_t *j, uint32_t type, const void *payload, size_t len,
                       char *err, size_t errlen) {
  if (len > ST__JOURNAL_MAX_RECORD)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "a journal record of %zu bytes (at most %u)", len, ST__JOURNAL_MAX_RECORD);
  uint64_t total = ST__JOURNAL_RECORD_HEADER + pad8(len);
  uint64_t need = j->tail + total;
  if (need > ST__JOURNAL_MAX_BYTES)
    return st__fail(ST_ERR_LIMIT, err, errlen, "the journal would pass %llu bytes",
                    (unsigned long long)ST__JOURNAL_MAX_BYTES);
  if (need > j->capacity) {
    uint64_t cap = j->capacity;
    while (cap < need) cap *= 2;
    if (ftruncate(j->fd, (off_t)cap) != 0)
      return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "growing the journal to %llu bytes: %s",
                      (unsigned long long)cap, strerror(errno));
    j->capacity = cap;
  }
  unsigned char head[ST__JOURNAL_RECORD_HEADER];
  uint32_t magic = RECORD_MAGIC, len32 = (uint32_t)len;
  uint64_t seq = j->seq + 1;
  uint32_t crc = st__crc32c(0, &type, 4);
  crc = st__crc32c(crc, &len32, 4);
  crc = st__crc32c(crc, &seq, 8);
  crc = st__crc32c(crc, payload, len);
  memcpy(head, &magic, 4);
  memcpy(head + 4, &type, 4);
  memcpy(head + 8, &len32, 4);
  memcpy(head + 12, &crc, 4);
  memcpy(head + 16, &seq, 8);
  static const unsigned char zeros[8];
  struct iovec iov[3] = {{head, sizeof head}, {(void *)payload, len},
                         {(void *)zeros, pad8(len) - len}};
  ssize_t want = (ssize_t)total, n = pwritev(j->fd, iov, 3, (off_t)j->tail);
  if (n != want) {
    /* Nothing of it counts: zero what was written, so the tail stays
     * clean for the next record. */
    int e = n < 0 ? errno : EIO;
    if (n > 0) fallocate(j->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)j->tail, n);
    return st__fail(ST_ERR_IO, err, errlen, "journal write: %s", strerror(e));
  }
  j->tail += total;
  j->seq = seq;
  j->records++;
  return ST_OK;
}

/* See journal.h. */
void st__journal_close(st__journal_t *j) {
  if (j->fd >= 0) close(j->fd);
  j->fd = -1;
}

/* The file of fd mapped read-only in *map (size *size), after the checks
 * of its kind: a memfd within the cap. */
static int map_file(int fd, const unsigned char **map, uint64_t *size, char *err,
                    size_t errlen) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "the journal is no regular file");
  if (fcntl(fd, F_GET_SEALS) < 0)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "the journal is no memfd");
  if ((uint64_t)st.st_size < ST__JOURNAL_HEADER || (uint64_t)st.st_size > ST__JOURNAL_MAX_BYTES)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "the journal has %lld bytes (a header is %u, the cap %llu)",
                    (long long)st.st_size, ST__JOURNAL_HEADER,
                    (unsigned long long)ST__JOURNAL_MAX_BYTES);
  void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "mapping the journal: %s",
                    strerror(errno));
  *map = m;
  *size = (uint64_t)st.st_size;
  return ST_OK;
}

/* Checks the header at m. */
static int check_header(const unsigned char *m, st__journal_scan_t *scan, char *err,
                        size_t errlen) {
  unsigned char h[ST__JOURNAL_HEADER];
  memcpy(h, m, sizeof h);
  uint32_t crc = rd32(h + 60);
  memset(h + 60, 0, 4);
  if (memcmp(h, MAGIC, 8) != 0)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "the journal has no journal header");
  if (rd32(h + 8) != LAYOUT || rd32(h + 12) != ST__JOURNAL_HEADER)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "the journal's layout is %u (this server reads %u)", rd32(h + 8), LAYOUT);
  if (st__crc32c(0, h, sizeof h) != crc)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "the journal's header checksum fails");
  scan->generation = rd64(h + 16);
  scan->epoch = rd64(h + 24);
  if (scan->generation == 0)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "the journal's generation is 0");
  return ST_OK;
}

/* Maps the journal at fd (*map, *size; *map stays NULL when it cannot be
 * mapped) and checks its header into a fresh *scan. ST_OK, or the error
 * with the reason. */
static int open_scan(int fd, const unsigned char **map, uint64_t *size, st__journal_scan_t *scan,
                     char *err, size_t errlen) {
  memset(scan, 0, sizeof *scan);
  int rc = map_file(fd, map, size, err, errlen);
  if (rc != ST_OK) {
    *map = NULL;
    return rc;
  }
  scan->bytes = *size;
  return check_header(*map, scan, err, errlen);
}

/* See journal.h. */
int st__journal_header(int fd, st__journal_scan_t *scan, char *err, size_t errlen) {
  const unsigned char *m = NULL;
  uint64_t size = 0;
  int rc = open_scan(fd, &m, &size, scan, err, errlen);
  if (m) munmap((void *)m, (size_t)size);
  return rc;
}

/* Whether bytes [from, to) of m are all zero. */
static int zeros_from(const unsigned char *m, uint64_t from, uint64_t to) {
  for (uint64_t i = from; i < to; i++)
    if (m[i]) return 0;
  return 1;
}

/* Verifies the record at off (seq expected): its total length in *total,
 * or 0 when it does not verify (why in err). */
static uint64_t check_record(const unsigned char *m, uint64_t size, uint64_t off,
                             uint64_t seq, char *err, size_t errlen) {
  const unsigned char *r = m + off;
  uint32_t type = rd32(r + 4), len = rd32(r + 8), crc = rd32(r + 12);
  uint64_t rseq = rd64(r + 16);
  if (rd32(r) != RECORD_MAGIC) {
    st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "record %llu at byte %llu has no record mark",
             (unsigned long long)seq, (unsigned long long)off);
    return 0;
  }
  if (len > ST__JOURNAL_MAX_RECORD || off + ST__JOURNAL_RECORD_HEADER + pad8(len) > size) {
    st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
             "record %llu at byte %llu claims %u bytes, past the end", (unsigned long long)seq,
             (unsigned long long)off, len);
    return 0;
  }
  uint32_t c = st__crc32c(0, &type, 4);
  c = st__crc32c(c, &len, 4);
  c = st__crc32c(c, &rseq, 8);
  c = st__crc32c(c, r + ST__JOURNAL_RECORD_HEADER, len);
  if (c != crc) {
    st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "record %llu at byte %llu fails its checksum",
             (unsigned long long)seq, (unsigned long long)off);
    return 0;
  }
  if (rseq != seq) {
    st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
             "record at byte %llu has sequence %llu where %llu was due",
             (unsigned long long)off, (unsigned long long)rseq, (unsigned long long)seq);
    return 0;
  }
  return ST__JOURNAL_RECORD_HEADER + pad8(len);
}

/* The end of the verified records of m (after the header), or 0 when
 * the journal is refused (why in err). *count, *torn. */
static uint64_t verify(const unsigned char *m, uint64_t size, uint64_t *count, int *torn,
                       char *err, size_t errlen) {
  uint64_t off = ST__JOURNAL_HEADER, seq = 1;
  *count = 0;
  *torn = 0;
  while (off + ST__JOURNAL_RECORD_HEADER <= size) {
    if (zeros_from(m, off, off + ST__JOURNAL_RECORD_HEADER)) break;   /* the end */
    char why[256];
    uint64_t total = check_record(m, size, off, seq, why, sizeof why);
    if (!total) {
      /* The last write of a killed process: only zeros may follow what
       * it could have written. */
      uint32_t len = rd32(m + off + 8);
      uint64_t end = off + ST__JOURNAL_RECORD_HEADER +
                     (len <= ST__JOURNAL_MAX_RECORD ? pad8(len) : 0);
      if (end > size) end = size;
      if (zeros_from(m, end, size)) {
        *torn = 1;
        return off;
      }
      st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "%s, and more records follow it", why);
      return 0;
    }
    off += total;
    seq++;
    (*count)++;
  }
  if (!zeros_from(m, off, size)) {
    st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "bytes after the last record at byte %llu",
             (unsigned long long)off);
    return 0;
  }
  return off;
}

/* See journal.h. */
int st__journal_read(int fd, st__journal_fn fn, void *ud, st__journal_scan_t *scan, char *err,
                     size_t errlen) {
  const unsigned char *m = NULL;
  uint64_t size = 0;
  int rc = open_scan(fd, &m, &size, scan, err, errlen);
  if (!m) return rc;
  uint64_t count = 0, end = 0;
  if (rc == ST_OK) {
    end = verify(m, size, &count, &scan->torn_tail, err, errlen);
    if (!end) rc = ST_ERR_INVALID_ARGUMENT;
  }
  for (uint64_t off = ST__JOURNAL_HEADER; rc == ST_OK && off < end;) {
    uint32_t type = rd32(m + off + 4), len = rd32(m + off + 8);
    rc = fn(ud, type, (const char *)m + off + ST__JOURNAL_RECORD_HEADER, len, err, errlen);
    off += ST__JOURNAL_RECORD_HEADER + pad8(len);
    if (rc == ST_OK) scan->records++;
  }
  munmap((void *)m, (size_t)size);
  return rc;
}
