/* `stcli stats --prometheus --textfile P` (docs/operations.md,
 * "Monitoring"), the real binary against a real stserver: it writes the
 * metrics text to P/sharedtensor.prom (or P itself, a .prom name) through
 * a temporary file renamed over it (each write is a new inode; nothing
 * else is left in the directory), --textfile alone implies --prometheus,
 * a directory that cannot be written is an error that leaves nothing, and
 * when no server answers the file is removed (exit 3). */
#include <stdlib.h>
#include <sys/stat.h>

#include "check.h"
#include "cli_run.h"
#include "fixture.h"

static stt_server_t srv;
#define SOCK "--socket", srv.socket

/* The names in dir, sorted by the shell, one per line (R.out). */
static void list_dir(const char *dir) {
  run_prog("/bin/sh", NULL, (const char *const[]){"-c", "ls -A \"$0\"", dir, NULL});
}

/* The first line of a file into buf ("" when missing). */
static void first_line(const char *path, char *buf, size_t len) {
  buf[0] = '\0';
  FILE *f = fopen(path, "r");
  if (!f) return;
  if (!fgets(buf, (int)len, f)) buf[0] = '\0';
  fclose(f);
}

TEST(writes_the_textfile_atomically) {
  char dir[400], file[450], line[256];
  snprintf(dir, sizeof dir, "%s/textfile", srv.dir);
  CHECK(mkdir(dir, 0755) == 0);
  snprintf(file, sizeof file, "%s/sharedtensor.prom", dir);
  CHECK_EQ_INT(STCLI(SOCK, "stats", "--prometheus", "--textfile", dir), 0);
  CHECK_STR_EQ(R.out, "");
  CHECK_STR_EQ(R.err, "");
  first_line(file, line, sizeof line);
  CHECK(strncmp(line, "# HELP sharedtensor_requests_total ", 35) == 0);
  struct stat a, b;
  CHECK(stat(file, &a) == 0);
  /* Again, --textfile alone: a new file replaces the old one. */
  char eq[420];
  snprintf(eq, sizeof eq, "--textfile=%s", dir);
  CHECK_EQ_INT(STCLI(SOCK, "stats", eq), 0);
  CHECK(stat(file, &b) == 0);
  CHECK(a.st_ino != b.st_ino);
  CHECK(b.st_size > 1000);
  CHECK_EQ_INT(b.st_mode & 0777, 0644);
  list_dir(dir);
  CHECK_STR_EQ(R.out, "sharedtensor.prom\n");
  /* A .prom name is the file itself. */
  char named[450];
  snprintf(named, sizeof named, "%s/st-0.prom", dir);
  CHECK_EQ_INT(STCLI(SOCK, "stats", "--prometheus", "--textfile", named), 0);
  first_line(named, line, sizeof line);
  CHECK(strncmp(line, "# HELP sharedtensor_", 20) == 0);
  list_dir(dir);
  CHECK_STR_EQ(R.out, "sharedtensor.prom\nst-0.prom\n");
  CHECK(unlink(named) == 0);
}

TEST(errors_leave_nothing) {
  char dir[400], file[450];
  snprintf(dir, sizeof dir, "%s/textfile", srv.dir);
  snprintf(file, sizeof file, "%s/sharedtensor.prom", dir);
  /* A directory that does not exist. */
  char missing[450];
  snprintf(missing, sizeof missing, "%s/none", srv.dir);
  CHECK_EQ_INT(STCLI(SOCK, "stats", "--textfile", missing), 1);
  CHECK_CONTAINS_ALL(R.err, "stcli: IO: cannot write the textfile ", "/none/",
                     "No such file or directory");
  /* Usage errors. */
  CHECK_EQ_INT(STCLI(SOCK, "stats", "--textfile"), 2);
  CHECK_CONTAINS(R.err, "--textfile needs a directory or a .prom file");
  CHECK_EQ_INT(STCLI(SOCK, "--json", "stats", "--textfile", dir), 2);
  CHECK_EQ_INT(STCLI(SOCK, "stats", "--textfil", dir), 2);
  CHECK_CONTAINS(R.err, "did you mean '--textfile'?");
  /* No server: the file goes (its metrics would be stale). */
  struct stat st;
  CHECK(stat(file, &st) == 0);
  char nosock[450];
  snprintf(nosock, sizeof nosock, "%s/none-0.sock", srv.dir);
  CHECK_EQ_INT(STCLI("--socket", nosock, "stats", "--textfile", dir), 3);
  CHECK_CONTAINS(R.err, "(no server answered)");
  CHECK(stat(file, &st) != 0);
  list_dir(dir);
  CHECK_STR_EQ(R.out, "");
  /* And again: nothing to remove, the same exit. */
  CHECK_EQ_INT(STCLI("--socket", nosock, "stats", "--textfile", dir), 3);
}

int main(void) {
  cli_setup(&srv, NULL, NULL);
  RUN(writes_the_textfile_atomically);
  RUN(errors_leave_nothing);
  return stt_server_finish(&srv);
}
