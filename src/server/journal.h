/* src/server: the journal of the published tables (docs/lifecycle.md,
 * "Restarts"): a memfd kept in the service's fd store, written before a
 * change of the tables is acknowledged, read by the next process.
 *
 * Layout (little-endian; the file grows by doubling, unwritten bytes are
 * zero):
 *
 *   header, 64 bytes: magic "STJRNL\0\1", u32 layout (1), u32 header
 *     bytes (64), u64 generation (the process that wrote it: one more
 *     than the one it restored from, 1 for the first), u64 epoch
 *     (compactions within the generation), u64 created (unix ns),
 *     reserved zeros, u32 CRC-32C of the 64 bytes with this field 0 (at
 *     byte 60).
 *   records from byte 64, each 8-byte aligned: u32 magic "STRC", u32
 *     type, u32 payload length, u32 CRC-32C of (type, length, seq,
 *     payload), u64 seq (1, 2, ... in file order), then the payload (a
 *     msgpack map, restart.c says which) and zero padding to 8.
 *
 * A record is acknowledged once written (pwrite returned): a process
 * killed in the middle of a write leaves at most one record whose
 * checksum fails, at the end, with only zeros after it (a torn tail: the
 * change was never acknowledged, and is ignored with a log line).
 * Anything else that does not verify (header, a record followed by more
 * bytes, a sequence gap, a size past the cap) refuses the whole journal.
 *
 * Ownership: st__journal_t owns its descriptor. Loop thread.
 */
#ifndef ST_SERVER_JOURNAL_H
#define ST_SERVER_JOURNAL_H

#include <stddef.h>
#include <stdint.h>

#define ST__JOURNAL_HEADER 64u
#define ST__JOURNAL_RECORD_HEADER 24u
/* The largest journal read back, and the largest record. */
#define ST__JOURNAL_MAX_BYTES ((uint64_t)1 << 32)
#define ST__JOURNAL_MAX_RECORD (64u << 20)

typedef struct st__journal {
  int fd;                     /* owned memfd; -1: none                     */
  uint64_t capacity;          /* the file's size                           */
  uint64_t tail;              /* end of the last record                    */
  uint64_t seq;               /* the last record's                         */
  uint64_t generation, epoch;
  uint64_t records;           /* written since the file began              */
} st__journal_t;

/* A new empty journal (a memfd "st-journal" of 1 MiB) of `generation`
 * and `epoch` with its header written. ST_OK, or OUT_OF_MEMORY / LIMIT
 * with the reason in err. */
int st__journal_create(st__journal_t *j, uint64_t generation, uint64_t epoch, char *err,
                       size_t errlen);

/* Appends one record; the file grows as needed. ST_OK once written;
 * INVALID_ARGUMENT (past ST__JOURNAL_MAX_RECORD), OUT_OF_MEMORY / IO
 * (the file cannot grow or take the write: nothing of the record counts)
 * with the reason in err. */
int st__journal_append(st__journal_t *j, uint32_t type, const void *payload, size_t len,
                       char *err, size_t errlen);

/* Closes j's descriptor. */
void st__journal_close(st__journal_t *j);

/* What st__journal_read found. */
typedef struct st__journal_scan {
  uint64_t generation, epoch;
  uint64_t records;           /* verified records handed to the callback  */
  uint64_t bytes;             /* the file's size                           */
  int torn_tail;              /* one unacknowledged record was ignored     */
} st__journal_scan_t;

/* Called for each verified record in order; payload is borrowed for the
 * call. A nonzero return stops the read with that code (err filled by
 * the callback). */
typedef int (*st__journal_fn)(void *ud, uint32_t type, const char *payload, size_t len,
                              char *err, size_t errlen);

/* Reads the header of journal descriptor fd (borrowed: a memfd whose
 * size is within the cap): its generation and epoch into *scan. ST_OK or
 * INVALID_ARGUMENT with the reason in err. */
int st__journal_header(int fd, st__journal_scan_t *scan, char *err, size_t errlen);

/* Verifies the whole journal first (every record's checksum and sequence;
 * see the top), then hands each record to fn. ST_OK; INVALID_ARGUMENT
 * (refused: nothing was handed to fn) with the reason in err; or fn's
 * code. *scan says what was read. */
int st__journal_read(int fd, st__journal_fn fn, void *ud, st__journal_scan_t *scan, char *err,
                     size_t errlen);

#endif
