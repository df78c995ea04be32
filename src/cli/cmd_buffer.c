/* stcli buffers, buffer-create, buffer-unlink: named buffers and streams
 * (docs/streams.md), through the public client API. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* --------------------------------------------------------------- buffers */

static int fetch_buffers(st_client_t *c, st_result_t **out) {
  return st_client_rpc(c, "buffers", NULL, out);
}

static char *text_cell(const st_value_t *v) {
  const char *s = cli_value_str(v);
  return strdup(s && *s ? s : "-");
}

static char *int_cell(const st_value_t *v) {
  double d;
  return cli_value_number(v, &d) ? cli_strdupf("%.0f", d) : strdup("-");
}

/* "480x640x3" of a shape array ("scalar" for []). */
static char *shape_cell(const st_value_t *v) {
  size_t n = v && v->kind == ST_VALUE_ARRAY ? v->as.array.len : 0;
  if (n == 0) return strdup(v ? "scalar" : "-");
  char buf[256] = "";
  size_t len = 0;
  for (size_t i = 0; i < n && len < sizeof buf - 24; i++) {
    double d = 0;
    cli_value_number(&v->as.array.items[i], &d);
    len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%.0f", i ? "x" : "", d);
  }
  return strdup(buf);
}

static void buffer_row(const st_value_t *e, double now, char **row) {
  (void)now;
  double slots = 0, frame = 0;
  cli_value_number(st_value_get(e, "slots"), &slots);
  cli_value_number(st_value_get(e, "frame_bytes"), &frame);
  char bytes[32];
  cli_format_bytes(slots * frame, bytes, sizeof bytes);
  row[0] = text_cell(st_value_get(e, "name"));
  row[1] = text_cell(st_value_get(e, "device"));
  row[2] = text_cell(st_value_get(e, "dtype"));
  row[3] = shape_cell(st_value_get(e, "shape"));
  row[4] = int_cell(st_value_get(e, "slots"));
  row[5] = strdup(bytes);
  row[6] = int_cell(st_value_get(e, "handles"));
}

static int run_buffers(cli_t *g, int argc, char **argv) {
  const char *pos[1];
  int done;
  int names = cli_take_flag(&argc, argv, "--names");
  int code = cli_parse_plain(g, &cli_buffers_command, argc, argv, 0, 0, "", pos, &done);
  if (code != CLI_OK || done) return code;
  st_result_t *r;
  if ((code = cli_fetch(g, fetch_buffers, &r)) != CLI_OK) return code;
  if (names) return cli_print_members(g, r, "name");
  static const char *const heads[] = {"NAME", "DEVICE", "DTYPE", "SHAPE",
                                      "SLOTS", "BYTES", "HANDLES"};
  return cli_print_listing(g, r, 7, heads, buffer_row, "(no buffers)\n");
}

const cli_command_t cli_buffers_command = {
    "buffers",
    "buffers [--names]",
    "List the named buffers and streams of your uid.",
    "Columns: NAME, DEVICE, DTYPE, SHAPE (of one frame), SLOTS, BYTES (all\n"
    "slots), HANDLES (open handles, all processes). Unlinked buffers that\n"
    "handles still hold are not listed. With --json, prints the server's\n"
    "array of buffer maps.\n\n"
    "Options:\n"
    "  --names        only the names, one per line (with --json, an array);\n"
    "                 shell completion uses it\n",
    run_buffers,
    "--names",
};

/* --------------------------------------------------------- buffer-create */

/* "480x640x3" into shape[] (at most 16); the count, or -1. */
static int parse_shape(const char *s, int64_t *shape) {
  int n = 0;
  if (strcmp(s, "scalar") == 0) return 0;
  while (*s) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || v < 1 || n == 16) return -1;
    shape[n++] = v;
    s = *end == 'x' ? end + 1 : end;
    if (*end && *end != 'x') return -1;
  }
  return n;
}

/* cli_take_option's step for --readers. */
static int take_readers(const char *v, void *ud) {
  return cli_parse_readers("buffer-create", v, ud);
}

static int run_buffer_create(cli_t *g, int argc, char **argv) {
  const char *pos[5] = {NULL};
  int done;
  cli_readers_t readers;
  memset(&readers, 0, sizeof readers);
  int code = cli_take_option(&argc, argv, "--readers", take_readers, &readers);
  if (code != CLI_OK) return code;
  code = cli_parse_plain(g, &cli_buffer_create_command, argc, argv, 3, 5, "NAME DTYPE SHAPE",
                         pos, &done);
  if (code != CLI_OK || done) return code;
  int64_t shape[16];
  int ndim = parse_shape(pos[2], shape);
  if (ndim < 0)
    return cli_usage("buffer-create", "SHAPE is sizes >= 1 joined by x (480x640x3), not '%s'",
                     pos[2]);
  st_dtype_t dt = st_dtype_from_name(pos[1]);
  if (dt == ST_DTYPE_INVALID)
    return cli_usage("buffer-create", "'%s' is not a dtype (float32, uint8, ...)", pos[1]);
  long slots = 1;
  if (pos[3] && (cli_parse_count(pos[3], 1024, &slots) != 0 || slots < 1))
    return cli_usage("buffer-create", "SLOTS is 1 to 1024, not '%s'", pos[3]);
  st_client_t *c;
  if ((code = cli_connect(g, &c)) != CLI_OK) return code;
  st_buffer_t *b = NULL;
  st_readers_t rd;
  int rc = st_buffer_create_ex(c, pos[0], pos[4] ? pos[4] : "cpu", dt, ndim, shape, (int)slots,
                               cli_readers_of(&readers, &rd), &b);
  if (rc != ST_OK) {
    code = cli_fail(c, rc);
  } else {
    st_buffer_info_t in;
    st_buffer_info(b, &in);
    printf("buffer '%s': %d slots of %llu bytes on %s\n", pos[0], in.slots,
           (unsigned long long)in.frame_bytes, pos[4] ? pos[4] : "cpu");
    st_buffer_close(b);
  }
  st_client_close(c);
  return code;
}

const cli_command_t cli_buffer_create_command = {
    "buffer-create",
    "buffer-create NAME DTYPE SHAPE [SLOTS] [DEVICE] [--readers LIST]",
    "Create a named buffer (zero-filled); it lives until buffer-unlink.",
    "SHAPE is the frame's sizes joined by x (480x640x3; \"scalar\" for one\n"
    "element), SLOTS 1 to 1024 (default 1: more make a ring), DEVICE cpu\n"
    "(default), cuda or cuda:N. Prints \"buffer 'NAME': N slots of B bytes on\n"
    "DEVICE\". Processes of your uid open it by name (docs/streams.md); other\n"
    "uids get NOT_FOUND unless --readers grants them read.\n\n"
    "Options:\n"
    "  --readers LIST  uids and groups that may open it read-only: uid:N and\n"
    "                  gid:N joined by commas (uid:1000,gid:27; N a number or\n"
    "                  a user or group name of this host), at most 16 of each;\n"
    "                  may be repeated\n",
    run_buffer_create,
    "--readers=",
};

/* --------------------------------------------------------- buffer-unlink */

/* buffer_unlink {name, force: true}: root's removal of another uid's
 * buffer. */
static int unlink_forced(st_client_t *c, const char *name) {
  st_args_t *a = st_args_new();
  if (!a) return ST_ERR_OUT_OF_MEMORY;
  st_result_t *r = NULL;
  int rc = st_args_string(a, "name", name);
  if (rc == ST_OK) rc = st_args_bool(a, "force", 1);
  if (rc == ST_OK) rc = st_client_rpc(c, "buffer_unlink", a, &r);
  st_args_free(a);
  st_result_free(r);
  return rc;
}

static int run_buffer_unlink(cli_t *g, int argc, char **argv) {
  const char *pos[1] = {NULL};
  int done;
  int force = cli_take_flag(&argc, argv, "--force");
  int code = cli_parse_plain(g, &cli_buffer_unlink_command, argc, argv, 1, 1, "a buffer name",
                             pos, &done);
  if (code != CLI_OK || done) return code;
  st_client_t *c;
  if ((code = cli_connect(g, &c)) != CLI_OK) return code;
  int rc = force ? unlink_forced(c, pos[0]) : st_buffer_unlink(c, pos[0]);
  if (rc != ST_OK) code = cli_fail(c, rc);
  else printf("buffer '%s' unlinked\n", pos[0]);
  st_client_close(c);
  return code;
}

const cli_command_t cli_buffer_unlink_command = {
    "buffer-unlink",
    "buffer-unlink NAME [--force]",
    "Remove a buffer's name; its memory goes with the last open handle.",
    "Only the uid that created it may, or root and the server's uid with\n"
    "--force. Processes that have it open keep reading and writing it; the\n"
    "name is free for a new buffer at once.\n",
    run_buffer_unlink,
    "",
};
