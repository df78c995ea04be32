/* bench/soak: the server's figures the soak compares (snapshot.c): what
 * it holds (descriptors, memory, arenas, objects, device memory), waiting
 * for it to go idle, and the final report. */
#ifndef ST_SOAK_SNAPSHOT_H
#define ST_SOAK_SNAPSHOT_H

#include <stdint.h>

#include "fixture.h"
#include "soak.h"
#include "st/client.h"

typedef struct sk_snapshot {
  int fds;                   /* /proc/PID/fd entries */
  long rss_kb, shmem_kb;     /* VmRSS, RssShmem of /proc/PID/status */
  int64_t arenas, arena_bytes, objects, object_bytes;   /* info */
  int64_t pool_bytes;        /* info memory.cpu.pool_bytes: result pools' slabs */
  int64_t used_bytes;        /* info memory.cpu.used_bytes: the CPU budget's charge */
  int64_t keys, key_versions, key_bytes;   /* info keys */
  int64_t buffers;           /* named buffers (the `buffers` method) */
  int64_t held_fds, held_bytes;            /* info held */
  int64_t holdings;          /* connections info's holdings lists */
  int64_t dev_free;          /* info memory["cuda:0"].free_bytes, -1 without */
  long smi_used_mb;          /* nvidia-smi memory.used of GPU 0, -1 without */
} sk_snapshot_t;

/* info's value at a path of keys (NULL-terminated) as an integer; -1 when
 * missing or not an integer. */
int64_t sk_info_path(st_client_t *c, const char *const *keys);
#define sk_info_int(c, ...) sk_info_path((c), (const char *const[]){__VA_ARGS__, NULL})

/* Waits (60 s) until only `mon` is connected, nothing runs and no task is
 * kept, drops the soak's caches and removes the keys and buffers the load
 * left named (printing how many), and with `start` also waits (30 s) until
 * fds, arenas, objects, pool bytes and held descriptors equal start's;
 * then fills *out. 0, or -1 when a deadline passed (*out is filled
 * anyway). */
int sk_settle(st_client_t *mon, const stt_server_t *s, const sk_snapshot_t *start,
              sk_snapshot_t *out);

void sk_snapshot_print(const char *label, const sk_snapshot_t *x);

/* One progress line: time, connections, requests so far, fds, RSS.
 * Returns the server's RSS in kB. */
long sk_progress(st_client_t *mon, const stt_server_t *s, sk_shared_t *sh, int nslots,
                 double t_s);

/* Prints the request figures and the flatness rules; 1 on PASS. RSS is
 * judged against mid_rss_kb, the RSS halfway through the load (-1: the
 * start's): allocators keep what a load made them take, so what must not
 * happen is growth over the second half, not a return to the start. */
int sk_report(sk_shared_t *sh, int nslots, double load_s, const sk_snapshot_t *start,
              const sk_snapshot_t *end, long mid_rss_kb, double rss_tol_mb);

#endif
