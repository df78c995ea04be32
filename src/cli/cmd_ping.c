/* stcli ping: round trips to the server. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted values. */
static double percentile(const double *v, size_t n, double p) {
  size_t rank = (size_t)(p * (double)n + 0.999999);
  if (rank < 1) rank = 1;
  if (rank > n) rank = n;
  return v[rank - 1];
}

static int run_ping(cli_t *g, int argc, char **argv) {
  long count = 1;
  for (int i = 1; i < argc; i++) {
    int r = cli_global_option(g, argc, argv, &i);
    if (r < 0) return CLI_USAGE;
    if (r > 0) continue;
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0) {
      cli_print_command_help(&cli_ping_command, stdout);
      return CLI_OK;
    }
    const char *v = NULL;
    if (strncmp(a, "--count=", 8) == 0) v = a + 8;
    else if (strcmp(a, "--count") == 0 || strcmp(a, "-c") == 0) {
      if (i + 1 >= argc) return cli_usage("ping", "--count needs a number");
      v = argv[++i];
    } else {
      return cli_usage_unknown(&cli_ping_command, a);
    }
    if (cli_parse_count(v, 100000000, &count) != 0 || count < 1)
      return cli_usage("ping", "--count needs a positive number, not '%s'", v);
  }
  double *rtt = malloc((size_t)count * sizeof *rtt);
  if (!rtt) {
    fprintf(stderr, "stcli: OUT_OF_MEMORY: cannot hold %ld round trips\n", count);
    return CLI_SERVER_ERROR;
  }
  st_client_t *c;
  int code = cli_connect(g, &c);
  if (code != CLI_OK) {
    free(rtt);
    return code;
  }
  for (long k = 0; k < count; k++) {
    int rc = st_client_ping(c, &rtt[k]);
    if (rc != ST_OK) {
      code = cli_fail(c, rc);
      goto out;
    }
    if (count == 1 && !g->json)
      printf("pong from %s in %.1f us\n", st_client_server_id(c), rtt[k]);
  }
  qsort(rtt, (size_t)count, sizeof *rtt, cmp_double);
  double mn = rtt[0], p50 = percentile(rtt, (size_t)count, 0.50),
         p99 = percentile(rtt, (size_t)count, 0.99);
  if (g->json) {
    printf("{\"server_id\": ");
    cli_print_json_string(stdout, st_client_server_id(c));
    printf(", \"count\": %ld, \"min_us\": %.3f, \"p50_us\": %.3f, \"p99_us\": %.3f}\n", count,
           mn, p50, p99);
  } else if (count > 1) {
    printf("%ld pongs from %s: min %.1f us, p50 %.1f us, p99 %.1f us\n", count,
           st_client_server_id(c), mn, p50, p99);
  }
out:
  free(rtt);
  st_client_close(c);
  return code;
}

const cli_command_t cli_ping_command = {
    "ping",
    "ping [--count N]",
    "Check that the server answers and measure the round trip.",
    "Prints \"pong from <server_id> in <t> us\". With --count N, pings N times and\n"
    "prints the minimum, median (p50) and 99th percentile of the round trips.\n\n"
    "Options:\n"
    "  --count N, -c N   number of round trips (default 1)\n",
    run_ping,
    "--count=",
};
