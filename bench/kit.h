/* Shared pieces of the benchmarks in bench/: percentile reports, client
 * connection, and the multi-process throughput loop. Benchmark code only:
 * failures print a message and exit. */
#ifndef ST_BENCH_KIT_H
#define ST_BENCH_KIT_H

#include "st/client.h"

/* Sorts us[0..n) and prints p50, p99 and the mean under `what`. */
void bk_report(const char *what, double *us, int n);

/* The floor of every round trip: `iters` 64-byte ping-pongs on a Unix
 * socket (made as <dir>/raw.sock) with a forked echo process, after 100
 * warm-up ones; us[i] receives each in microseconds (unsorted). */
void bk_raw_pingpong(const char *dir, double *us, int iters);

/* UCX's own figure over loopback, when ucx_perftest (ucx-utils) is
 * installed: a server and a client of `test` ("tag_bw", "tag_lat") with
 * messages of `bytes`, 200 iterations, on a free loopback port; prints its
 * last two lines under "ucx_perftest <test>, <bytes>-byte messages
 * (<what>):", or that it is not installed. */
void bk_ucx_perftest(const char *test, unsigned long long bytes, const char *what);

struct stt_server;

/* What every benchmark program does first: the test fixture's ST_SERVER_BIN
 * and ST_SOURCE_DIR default to this build's (unless set), SIGPIPE is
 * ignored and stdout is line-buffered (figures appear as they come). */
void bk_setup(void);

/* The benchmarks' server config: log level warn, 2 workers and, when
 * spin_us >= 0 (--spin-us), that spin_us (else the server's default). */
void bk_server_config(struct stt_server *s, int spin_us);

/* A connected client, or exit(1) with the reason. */
st_client_t *bk_connect(const char *sock);

/* Forks `nproc` client processes. Each connects, runs `prepare` once (may
 * be NULL; a result it leaves in *keep is freed at the end), then `call` in
 * a loop for `seconds`. Prints "<label>, N client processes: X calls/s" and
 * returns the number of calls made. Waits for its own children only (the
 * fixture's server is one too). */
long bk_throughput(const char *label, const char *sock, int nproc, double seconds,
                   int (*prepare)(st_client_t *c, st_result_t **keep),
                   int (*call)(st_client_t *c));

#endif
