/* src/client: the handle of a named buffer, shared by buffer.c (open,
 * map, close) and buffer_io.c (write, read, wait, lock). */
#ifndef ST_CLIENT_BUFFER_H
#define ST_CLIENT_BUFFER_H

#include <stdint.h>

#include "client/client_internal.h"
#include "shm/buffer_page.h"

struct st_buffer {
  st_client_t *c;               /* borrowed: must outlive the handle      */
  char name[65];
  st_buffer_info_t info;
  int64_t shape[16];            /* info.shape                             */
  st__buffer_page_t *page;      /* mapped read-only for a read-only handle */
  size_t page_len;
  uint8_t *data;                /* host or device address of slot 0       */
  size_t data_len;
  st__cuda_mapping_t cm;        /* CUDA: the import of the data           */
  uint64_t stride;
  uint32_t slots;
  uint64_t me;                  /* this connection's id (the lock's word) */
  int pid;                      /* getpid() at open: a system call per
                                   write would cost more than the write */
  _Atomic uint64_t last_read;   /* the newest write this handle read      */
  _Atomic int writing;          /* a write is begun on this handle        */
  uint64_t write_seq;           /* its number                             */
  int took_lock;                /* the write took the lock itself         */
  _Atomic int holds;            /* st_buffer_acquire calls not yet released
                                   (the lock is this handle's while > 0)  */
  _Atomic int taking;           /* a thread of this handle is taking it   */
  _Atomic int64_t spin_ns;      /* waits poll the page this long first    */
  int fault_data, fault_page;   /* read-only: their entries in fault.c's
                                   table (0: none)                        */
};

/* The spin of new handles: $ST_CLIENT_SPIN_US, else 50 us when this
 * process may run on four CPUs or more, else 0 (on fewer, a poll often
 * keeps the writer from running: docs/benchmarks.md, "Buffers and
 * streams"). Any thread. */
int64_t st__buffer_default_spin_ns(void);

#endif
