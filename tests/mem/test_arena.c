/* CPU arenas: sealed memfds that a second mapping (a client's) sees. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "mem/arena.h"

TEST(create_write_and_map_a_dup) {
  uint64_t n0, b0;
  st__arena_stats(&n0, &b0);
  st__arena_t *a;
  char err[256];
  CHECK_ERR_MSG(st__arena_new_cpu(10000, &a, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(st__arena_bytes(a), 10000);
  unsigned char *base = st__arena_base(a);
  for (int i = 0; i < 10000; i++) CHECK_EQ_INT(base[i], 0);   /* zero-filled */
  for (int i = 0; i < 10000; i++) base[i] = (unsigned char)(i * 7);

  st__arena_desc_t d = {.fd = 3};
  st__arena_describe(a, &d);
  CHECK_EQ_INT(d.fd, 3);
  CHECK(d.bytes >= 10000 && d.bytes % 4096 == 0);
  CHECK_EQ_INT(d.cuda, 0);
  CHECK_STR_EQ(d.backend, "memfd");
  CHECK_STR_EQ(d.uuid, "");
  CHECK_EQ_INT(d.id, st__arena_id(a));

  int fd = st__arena_dup_fd(a, NULL, 0);
  CHECK(fd >= 0);
  CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);
  unsigned char *m = mmap(NULL, (size_t)d.bytes, PROT_READ, MAP_SHARED, fd, 0);
  CHECK(m != MAP_FAILED);
  close(fd);
  for (int i = 0; i < 10000; i++) CHECK_EQ_INT(m[i], (unsigned char)(i * 7));
  base[5] = 99;                       /* shared, not a copy */
  CHECK_EQ_INT(m[5], 99);

  uint64_t n1, b1;
  st__arena_stats(&n1, &b1);
  CHECK_EQ_INT(n1, n0 + 1);
  CHECK_EQ_INT(b1, b0 + d.bytes);
  st__arena_unref(a);
  st__arena_stats(&n1, &b1);
  CHECK_EQ_INT(n1, n0);
  CHECK_EQ_INT(b1, b0);
  /* the client's mapping outlives the server's reference */
  CHECK_EQ_INT(m[5], 99);
  CHECK_EQ_INT(m[9999], (unsigned char)(9999 * 7));
  munmap(m, (size_t)d.bytes);
}

TEST(seals_prevent_resizing) {
  st__arena_t *a;
  CHECK_ERR(st__arena_new_cpu(4096 * 3, &a, NULL, 0), ST_OK);
  int fd = st__arena_dup_fd(a, NULL, 0);
  CHECK(fd >= 0);
  int seals = fcntl(fd, F_GET_SEALS);
  CHECK(seals & F_SEAL_SHRINK);
  CHECK(seals & F_SEAL_GROW);
  CHECK(seals & F_SEAL_SEAL);
  CHECK(ftruncate(fd, 4096) != 0);
  CHECK_EQ_INT(errno, EPERM);
  CHECK(ftruncate(fd, 4096 * 10) != 0);
  CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) != 0);   /* sealed against more seals */
  struct stat st;
  CHECK_EQ_INT(fstat(fd, &st), 0);
  CHECK_EQ_INT(st.st_size, 4096 * 3);
  close(fd);
  st__arena_unref(a);
}

TEST(empty_arena_is_one_page) {
  st__arena_t *a;
  CHECK_ERR(st__arena_new_cpu(0, &a, NULL, 0), ST_OK);
  st__arena_desc_t d = {0};
  st__arena_describe(a, &d);
  CHECK_EQ_INT(st__arena_bytes(a), 0);
  CHECK(d.bytes > 0);
  int fd = st__arena_dup_fd(a, NULL, 0);
  void *m = mmap(NULL, (size_t)d.bytes, PROT_READ, MAP_SHARED, fd, 0);
  CHECK(m != MAP_FAILED);
  munmap(m, (size_t)d.bytes);
  close(fd);
  st__arena_unref(a);
  st__arena_unref(NULL);
}

TEST(ids_are_unique_and_refcounted) {
  st__arena_t *a, *b;
  CHECK_ERR(st__arena_new_cpu(1, &a, NULL, 0), ST_OK);
  CHECK_ERR(st__arena_new_cpu(1, &b, NULL, 0), ST_OK);
  CHECK(st__arena_id(a) != st__arena_id(b));
  uint64_t n0;
  st__arena_stats(&n0, NULL);
  st__arena_ref(a);
  st__arena_unref(a);
  uint64_t n1;
  st__arena_stats(&n1, NULL);
  CHECK_EQ_INT(n1, n0);               /* still one reference left */
  ((char *)st__arena_base(a))[0] = 1;
  st__arena_unref(a);
  st__arena_unref(b);
  st__arena_stats(&n1, NULL);
  CHECK_EQ_INT(n1, n0 - 2);
}

TEST(limit) {
  char err[256];
  st__arena_t *a = NULL;
  st__arena_set_limit(1000);
  CHECK_ERR_MSG(st__arena_new_cpu(1001, &a, err, sizeof err), ST_ERR_LIMIT, err);
  CHECK(a == NULL);
  CHECK_STR_EQ(err, "object of 1001 bytes exceeds max_object_bytes (1000)");
  CHECK_ERR_MSG(st__arena_new_cpu(1000, &a, err, sizeof err), ST_OK, err);
  st__arena_unref(a);
  st__arena_set_limit(0);
  CHECK_ERR_MSG(st__arena_new_cpu(1 << 20, &a, err, sizeof err), ST_OK, err);
  st__arena_unref(a);
}

TEST(too_large_is_a_clean_error) {
  char err[256];
  st__arena_t *a = NULL;
  int rc = st__arena_new_cpu(UINT64_MAX - 10, &a, err, sizeof err);
  CHECK(rc == ST_ERR_LIMIT || rc == ST_ERR_OUT_OF_MEMORY);
  CHECK(a == NULL);
  CHECK(err[0] != '\0');
}

/* Bytes the kernel has allocated to the arena's memfd. */
static uint64_t allocated(st__arena_t *a) {
  int fd = st__arena_dup_fd(a, NULL, 0);
  struct stat st;
  int ok = fd >= 0 && fstat(fd, &st) == 0;
  if (fd >= 0) close(fd);
  return ok ? (uint64_t)st.st_blocks * 512 : 0;
}

TEST(an_uncommitted_arena_is_committed_by_ranges) {
  char err[256];
  st__arena_t *a = NULL;
  uint64_t bytes = 64 * 4096 + 100;
  st__arena_spec_t spec = {.device = -1, .bytes = bytes, .uncommitted = 1};
  CHECK_ERR_MSG(st__arena_new(&spec, &a, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(allocated(a), 0);
  /* A range is rounded out to pages; two threads' ranges may overlap. */
  CHECK_ERR_MSG(st__arena_commit(a, 4096 + 10, 100, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(allocated(a), 4096);
  CHECK_ERR_MSG(st__arena_commit(a, 4096, 3 * 4096, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(allocated(a), 3 * 4096);
  /* The last, partial page; then everything. */
  CHECK_ERR_MSG(st__arena_commit(a, bytes - 1, 1, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(allocated(a), 4 * 4096);
  CHECK_ERR_MSG(st__arena_commit(a, 0, bytes, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(allocated(a), 65 * 4096);
  unsigned char *base = st__arena_base(a);
  CHECK(base[0] == 0 && base[bytes - 1] == 0);   /* zeros, as any new arena */
  base[bytes - 1] = 7;
  st__arena_unref(a);
  /* An ordinary arena is committed when made: nothing to do. */
  CHECK_ERR_MSG(st__arena_new_cpu(8192, &a, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(allocated(a), 8192);
  CHECK_ERR_MSG(st__arena_commit(a, 0, 8192, err, sizeof err), ST_OK, err);
  st__arena_unref(a);
}

int main(void) {
  RUN(create_write_and_map_a_dup);
  RUN(seals_prevent_resizing);
  RUN(empty_arena_is_one_page);
  RUN(ids_are_unique_and_refcounted);
  RUN(limit);
  RUN(too_large_is_a_clean_error);
  RUN(an_uncommitted_arena_is_committed_by_ranges);
  return stt_summary();
}
