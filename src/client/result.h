/* src/client: the layout of a result, shared by result.c (decoding) and
 * value.c (accessors). */
#ifndef ST_CLIENT_RESULT_H
#define ST_CLIENT_RESULT_H

#include <stddef.h>

#include "client/client_internal.h"

/* One chunk of a result's memory; everything a value points to lives in
 * the chain and is freed with the result. */
typedef struct st__block {
  struct st__block *next;
  size_t used, cap;
  _Alignas(16) unsigned char data[];
} st__block_t;

struct st_result {
  st__block_t *blocks;
  st_value_t *value;
  const st_tensor_t **tensors;   /* depth-first, reply order */
  size_t ntensors, tensors_cap;
  st__mapping_t **maps;          /* one reference per arena of the reply */
  size_t nmaps;
  int has_object;                /* the reply named a server object      */
  const char *server_id;         /* of the client that decoded the reply */
  st_object_info_t object;       /* strings point into the blocks        */
  int extra_refs;                /* st_result_ref calls not yet matched by
                                    st_result_free (atomic; 0 at decode)  */
  int after_device;              /* a DLPack consumer let a tensor go: the
                                    CUDA regions' frees wait for the device
                                    (atomic; st__client_result_after_device) */
  /* kept_objects.c: a result its connection keeps, which a `same` reply
   * returns again. Set before the result is returned, never cleared: its
   * extra_refs are counted under the library's lock, -1 while only the
   * connection's table holds it (parked). */
  int kept;
  st_client_t *keeper;           /* the connection whose table holds it;
                                    NULL once let go (under the lock)      */
  /* binding.c: st_result_summary's identity, computed once (atomic). */
  uint64_t identity;
  int identity_known;
};

/* Frees r and everything it holds, whatever its references (the last
 * st_result_free, or kept_objects.c letting a parked result go). Any thread. */
void st__client_result_destroy(st_result_t *r);

/* A DLPack consumer released its tensor of r (dlpack.c): device work on
 * it may still be queued, so whichever reference of r goes last, its CUDA
 * pool regions are given back once the work queued on their device's
 * legacy default stream by then is done (map.c, pool.c). Any thread
 * holding a reference. */
void st__client_result_after_device(st_result_t *r);

/* 16-byte aligned memory owned by r, or NULL when out of memory. */
void *st__client_result_alloc(st_result_t *r, size_t size);

#endif
