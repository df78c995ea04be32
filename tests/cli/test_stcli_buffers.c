/* stcli buffers, buffer-create and buffer-unlink against a real stserver
 * (docs/streams.md): a buffer made from the shell is listed, opened by a
 * client, refused twice, unlinked, and the usage errors are clear. */
#include "check.h"
#include "cli_run.h"
#include "client_kit.h"
#include "fixture.h"

static stt_server_t srv;
#define SOCK "--socket", srv.socket

TEST(create_list_open_unlink) {
  CHECK_EQ_INT(STCLI(SOCK, "buffers"), 0);
  CHECK_STR_EQ(R.out, "(no buffers)\n");
  CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "cam", "uint8", "48x64x3", "4"), 0);
  CHECK_STR_EQ(R.out, "buffer 'cam': 4 slots of 9216 bytes on cpu\n");
  CHECK_EQ_INT(STCLI(SOCK, "buffers"), 0);
  CHECK_CONTAINS_ALL(R.out, "NAME", "DEVICE", "DTYPE", "SHAPE", "SLOTS", "BYTES", "HANDLES",
                     "cam", "uint8", "48x64x3", "36.0 KiB");
  CHECK_EQ_INT(STCLI(SOCK, "--json", "buffers"), 0);
  CHECK(json_ok(R.out));
  CHECK_CONTAINS(R.out, "\"frame_bytes\": 9216");
  /* it outlives stcli: a client opens it */
  OPEN_CLIENT(c, srv.socket);
  st_buffer_t *b = NULL;
  CHECK_RC(st_buffer_open(c, "cam", 1, &b), ST_OK, c);
  CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "cam", "uint8", "4"), 1);
  CHECK_CONTAINS(R.err, "stcli: INVALID_ARGUMENT: buffer_create: a buffer named 'cam' exists");
  CHECK_EQ_INT(STCLI(SOCK, "buffer-unlink", "cam"), 0);
  CHECK_STR_EQ(R.out, "buffer 'cam' unlinked\n");
  CHECK_EQ_INT(STCLI(SOCK, "buffers"), 0);
  CHECK_STR_EQ(R.out, "(no buffers)\n");
  CHECK_EQ_INT(STCLI(SOCK, "buffer-unlink", "cam"), 1);
  CHECK_CONTAINS(R.err, "stcli: NOT_FOUND: buffer_unlink: no buffer named 'cam'");
  CHECK_RC(st_buffer_close(b), ST_OK, c);
  st_client_close(c);
}

TEST(usage_errors_and_help) {
  check_command_help("buffers");
  check_command_help("buffer-create");
  check_command_help("buffer-unlink");
  CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "x", "uint8"), 2);
  CHECK_CONTAINS(R.err, "buffer-create needs NAME DTYPE SHAPE");
  CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "x", "uint8", "4x0"), 2);
  CHECK_CONTAINS(R.err, "SHAPE is sizes >= 1 joined by x");
  CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "x", "nope", "4"), 2);
  CHECK_CONTAINS(R.err, "'nope' is not a dtype");
  CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "x", "uint8", "4", "0"), 2);
  CHECK_CONTAINS(R.err, "SLOTS is 1 to 1024");
  CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "a/b", "uint8", "4"), 1);
  CHECK_CONTAINS(R.err, "a buffer name is 1 to 64 characters");
  CHECK_EQ_INT(STCLI(SOCK, "buffer-unlink"), 2);
}

int main(void) {
  cli_setup(&srv, "memory_budget = { cpu = 16 * 1024 * 1024 },", NULL);
  RUN(create_list_open_unlink);
  RUN(usage_errors_and_help);
  return stt_server_finish(&srv);
}
