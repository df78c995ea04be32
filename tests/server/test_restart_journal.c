/* The journal of published state (src/server/journal.h), read back as a
 * restarted server reads it: records come back in order, byte for byte;
 * a record cut by a crash at the end (only zeros after it) is ignored
 * while what came before is kept; a changed byte anywhere else, a
 * sequence gap, a changed header, a file that is no memfd, and a size
 * past its end are refused as a whole, and nothing is handed over. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "server/journal.h"
#include "st/errors.h"

typedef struct seen {
  int n;
  uint32_t types[64];
  char payloads[64][64];
} seen_t;

static int collect(void *ud, uint32_t type, const char *payload, size_t len, char *err,
                   size_t errlen) {
  (void)err;
  (void)errlen;
  seen_t *s = ud;
  if (s->n < 64 && len < 64) {
    s->types[s->n] = type;
    memcpy(s->payloads[s->n], payload, len);
    s->payloads[s->n][len] = '\0';
  }
  s->n++;
  return ST_OK;
}

/* A journal of `n` records "record <i>" of type i + 1. */
static int make(st__journal_t *j, int n) {
  char err[256];
  if (st__journal_create(j, 7, 2, err, sizeof err) != ST_OK) return -1;
  for (int i = 0; i < n; i++) {
    char text[32];
    int len = snprintf(text, sizeof text, "record %d", i);
    if (st__journal_append(j, (uint32_t)i + 1, text, (size_t)len, err, sizeof err) != ST_OK)
      return -1;
  }
  return 0;
}

static int read_all(int fd, seen_t *s, st__journal_scan_t *scan, char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  return st__journal_read(fd, collect, s, scan, err, errlen);
}

TEST(records_come_back_in_order) {
  st__journal_t j;
  CHECK(make(&j, 20) == 0);
  seen_t s;
  st__journal_scan_t scan;
  char err[256] = "";
  CHECK_EQ_INT(read_all(j.fd, &s, &scan, err, sizeof err), ST_OK);
  CHECK_EQ_INT(s.n, 20);
  CHECK_EQ_INT(scan.generation, 7);
  CHECK_EQ_INT(scan.epoch, 2);
  CHECK_EQ_INT(scan.torn_tail, 0);
  CHECK_EQ_INT(s.types[19], 20);
  CHECK_STR_EQ(s.payloads[13], "record 13");
  st__journal_close(&j);
}

TEST(the_file_grows_past_its_first_size) {
  st__journal_t j;
  char err[256];
  CHECK_EQ_INT(st__journal_create(&j, 1, 0, err, sizeof err), ST_OK);
  static char big[300000];
  memset(big, 'x', sizeof big);
  for (int i = 0; i < 8; i++) CHECK_EQ_INT(st__journal_append(&j, 3, big, sizeof big, err, sizeof err), ST_OK);
  CHECK(j.capacity >= 8 * sizeof big);
  seen_t s;
  st__journal_scan_t scan;
  CHECK_EQ_INT(read_all(j.fd, &s, &scan, err, sizeof err), ST_OK);
  CHECK_EQ_INT(s.n, 8);
  st__journal_close(&j);
}

TEST(a_record_cut_at_the_end_is_ignored) {
  st__journal_t j;
  CHECK(make(&j, 5) == 0);
  /* The last record half written: its last bytes zero, as a kill during
   * the write leaves it. */
  uint64_t end = j.tail;
  char zeros[6] = {0};
  CHECK(pwrite(j.fd, zeros, sizeof zeros, (off_t)(end - 8)) == (ssize_t)sizeof zeros);
  seen_t s;
  st__journal_scan_t scan;
  char err[256];
  CHECK_EQ_INT(read_all(j.fd, &s, &scan, err, sizeof err), ST_OK);
  CHECK_EQ_INT(s.n, 4);
  CHECK_EQ_INT(scan.torn_tail, 1);
  st__journal_close(&j);
}

TEST(a_changed_byte_in_the_middle_refuses_all) {
  st__journal_t j;
  CHECK(make(&j, 5) == 0);
  unsigned char b;
  off_t at = ST__JOURNAL_HEADER + ST__JOURNAL_RECORD_HEADER + 2;   /* record 1's payload */
  CHECK(pread(j.fd, &b, 1, at) == 1);
  b ^= 1;
  CHECK(pwrite(j.fd, &b, 1, at) == 1);
  seen_t s;
  st__journal_scan_t scan;
  char err[256] = "";
  CHECK_EQ_INT(read_all(j.fd, &s, &scan, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(s.n, 0);
  CHECK_CONTAINS(err, "record 1 at byte 64 fails its checksum, and more records follow it");
  st__journal_close(&j);
}

TEST(bytes_after_the_last_record_refuse_all) {
  st__journal_t j;
  CHECK(make(&j, 3) == 0);
  unsigned char b = 0x5a;
  CHECK(pwrite(j.fd, &b, 1, (off_t)j.tail + 100) == 1);
  seen_t s;
  st__journal_scan_t scan;
  char err[256] = "";
  CHECK_EQ_INT(read_all(j.fd, &s, &scan, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(s.n, 0);
  st__journal_close(&j);
}

TEST(a_changed_header_is_refused) {
  st__journal_t j;
  CHECK(make(&j, 2) == 0);
  uint64_t generation = 8;   /* the header's checksum no longer matches */
  CHECK(pwrite(j.fd, &generation, 8, 16) == 8);
  st__journal_scan_t scan;
  char err[256] = "";
  CHECK_EQ_INT(st__journal_header(j.fd, &scan, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err, "header checksum");
  st__journal_close(&j);
}

TEST(a_sequence_gap_is_refused) {
  st__journal_t j;
  CHECK(make(&j, 3) == 0);
  /* A second journal's record 1 copied over this one's record 2: a valid
   * checksum, the wrong place. */
  st__journal_t k;
  CHECK(make(&k, 1) == 0);
  char rec[64];
  ssize_t n = pread(k.fd, rec, sizeof rec, ST__JOURNAL_HEADER);
  CHECK(n == (ssize_t)sizeof rec);
  uint64_t second = ST__JOURNAL_HEADER + (k.tail - ST__JOURNAL_HEADER);
  CHECK(pwrite(j.fd, rec, (size_t)(k.tail - ST__JOURNAL_HEADER), (off_t)second) > 0);
  seen_t s;
  st__journal_scan_t scan;
  char err[256] = "";
  CHECK_EQ_INT(read_all(j.fd, &s, &scan, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err, "where 2 was due");
  st__journal_close(&j);
  st__journal_close(&k);
}

TEST(only_a_memfd_is_read) {
  char path[] = "/tmp/stt-journal-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  unlink(path);
  st__journal_t j;
  CHECK(make(&j, 1) == 0);
  char buf[256];
  ssize_t n = pread(j.fd, buf, sizeof buf, 0);
  CHECK(n > 0 && write(fd, buf, (size_t)n) == n);
  st__journal_scan_t scan;
  char err[256] = "";
  CHECK_EQ_INT(st__journal_header(fd, &scan, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err, "no memfd");
  close(fd);
  int mfd = memfd_create("short", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  CHECK(mfd >= 0 && ftruncate(mfd, 10) == 0);
  CHECK_EQ_INT(st__journal_header(mfd, &scan, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  close(mfd);
  st__journal_close(&j);
}

int main(void) {
  RUN(records_come_back_in_order);
  RUN(the_file_grows_past_its_first_size);
  RUN(a_record_cut_at_the_end_is_ignored);
  RUN(a_changed_byte_in_the_middle_refuses_all);
  RUN(bytes_after_the_last_record_refuse_all);
  RUN(a_changed_header_is_refused);
  RUN(a_sequence_gap_is_refused);
  RUN(only_a_memfd_is_read);
  return stt_summary();
}
