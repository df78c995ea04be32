/* stserver: command-line flags. Everything else starts in
 * st__server_main (startup.c). */
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/suggest.h"
#include "server/config.h"
#include "server/server.h"
#include "st/wire.h"
#include "xfer/helper.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: stserver [options]\n"
          "\n"
          "Builds tensors with the Lua endpoints of a directory and shares them,\n"
          "zero-copy, with local clients over a Unix socket (docs/operations.md).\n"
          "\n"
          "  --config FILE      configuration file (default ./config.lua, else the\n"
          "                     installed <sysconfdir>/sharedtensor/config.lua, else\n"
          "                     the built-in defaults)\n"
          "  --base-path PATH   socket base: sockets are PATH-<device>.sock\n"
          "                     (default: config base_path, else $%s,\n"
          "                     else the first usable of $XDG_RUNTIME_DIR/%s,\n"
          "                     %s and %s; the start log\n"
          "                     says which)\n"
          "  --endpoints PATH   endpoints directory, or one endpoint file\n"
          "                     (default: config endpoints)\n"
          "  --workers N        worker threads (default: config workers, 4)\n"
          "  --log-level LEVEL  error, warn, info or debug (default: config, info)\n"
          "  --check            load the config and the endpoints, report every error\n"
          "                     as file:line, list the endpoints, and exit (0: no error)\n"
          "  --takeover         take over from the server running on the same sockets:\n"
          "                     it hands over its sockets and published state, this\n"
          "                     process serves, then it exits 0 (if this one cannot\n"
          "                     start, it serves on; docs/operations.md, \"Upgrades\n"
          "                     without a service manager\")\n"
          "  --help             this text\n"
          "  --version          version and protocol\n"
          "\n"
          "Signals: SIGTERM/SIGINT stop gracefully, SIGHUP reloads the endpoints.\n",
          ST_ENV_BASE_PATH, ST_XDG_BASE_PATH, ST_RUN_BASE_PATH, ST_DEFAULT_BASE_PATH);
}

static int bad_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad_usage(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "stserver: ");
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\nTry 'stserver --help' for the list of options.\n");
  return 2;
}

/* "unknown option '--workrs'; did you mean '--workers'?" for arg (the
 * flag as given, "=value" aside) and the long options. Exit status 2. */
static int unknown_option(const char *arg, const struct option *longopts) {
  char word[ST__SUGGEST_MAX_WORD + 1];
  size_t len = strcspn(arg, "=");
  if (len >= sizeof word) return bad_usage("unknown option '%s'", arg);
  snprintf(word, sizeof word, "%.*s", (int)len, arg);
  st__suggest_t s;
  st__suggest_init(&s, word);
  for (const struct option *o = longopts; o->name; o++) {
    char flag[ST__SUGGEST_MAX_WORD + 1];
    int n = snprintf(flag, sizeof flag, "--%s", o->name);
    if (n > 0 && (size_t)n < sizeof flag) st__suggest_add(&s, flag, (size_t)n);
  }
  const char *best = word[0] == '-' && word[1] ? st__suggest_best(&s) : NULL;
  if (best) return bad_usage("unknown option '%s'; did you mean '%s'?", word, best);
  return bad_usage("unknown option '%s'", arg);
}

/* Parses the flags (exit 2 on a bad command line) and runs the server,
 * or the transfer helper for `--xfer-helper FD`. */
int main(int argc, char **argv) {
  /* The transfer helper (src/xfer/helper.c) is this binary started by the
   * server: it runs before anything of a server is set up. */
  if (argc == 3 && strcmp(argv[1], ST_XFER_HELPER_FLAG) == 0)
    return st__xfer_helper_main(argv[2]);
  static const struct option longopts[] = {
      {"config", required_argument, NULL, 'c'},
      {"base-path", required_argument, NULL, 'b'},
      {"endpoints", required_argument, NULL, 'e'},
      {"workers", required_argument, NULL, 'w'},
      {"log-level", required_argument, NULL, 'l'},
      {"check", no_argument, NULL, 'C'},
      {"takeover", no_argument, NULL, 'T'},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},
      {NULL, 0, NULL, 0},
  };
  st__options_t o;
  memset(&o, 0, sizeof o);
  o.log_level = -1;
  opterr = 0;
  int ch;
  while ((ch = getopt_long(argc, argv, ":hV", longopts, NULL)) != -1) {
    switch (ch) {
      case 'c': o.config = optarg; break;
      case 'b':
        if (!optarg[0]) return bad_usage("--base-path needs a non-empty path");
        o.base_path = optarg;
        break;
      case 'e': o.endpoints = optarg; break;
      case 'w': {
        char *end;
        long v = strtol(optarg, &end, 10);
        if (!optarg[0] || *end || v < 1 || v > ST__CONFIG_MAX_WORKERS)
          return bad_usage("--workers must be an integer from 1 to %d, not '%s'",
                           ST__CONFIG_MAX_WORKERS, optarg);
        o.workers = (int)v;
        break;
      }
      case 'l':
        o.log_level = st__log_level_parse(optarg);
        if (o.log_level < 0)
          return bad_usage("--log-level must be error, warn, info or debug, not '%s'", optarg);
        break;
      case 'C': o.check = 1; break;
      case 'T': o.takeover = 1; break;
      case 'h': usage(stdout); return 0;
      case 'V':
        printf("stserver %s (protocol %d)\n", ST_VERSION_STRING, ST_PROTOCOL_VERSION);
        return 0;
      case ':':
        return bad_usage("option '%s' needs a value", argv[optind - 1]);
      default:
        return unknown_option(argv[optind - 1], longopts);
    }
  }
  if (optind < argc) return bad_usage("unexpected argument '%s'", argv[optind]);
  return st__server_main(&o);
}
