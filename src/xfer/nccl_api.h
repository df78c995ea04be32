/* src/xfer/nccl_api.h: NCCL loaded at run time (nccl_api.c).
 *
 * No nccl.h is needed to build: the subset below is declared here with
 * the types of NCCL 2.x's public header (the ABI is stable within major
 * version 2). The library is found as `libnccl.so.2` (ldconfig,
 * LD_LIBRARY_PATH) or at the path config.lua's peer.nccl_library names,
 * for a copy that came with a Python wheel. Compiled in every build; it
 * loads only in the transfer helper.
 */
#ifndef ST_XFER_NCCL_API_H
#define ST_XFER_NCCL_API_H

#include <stddef.h>

#include "xfer/engine.h"

/* ncclResult_t's values that the engine tells apart. */
typedef int st__nccl_result_t;
#define ST_NCCL_SUCCESS 0
#define ST_NCCL_IN_PROGRESS 7

/* ncclDataType_t: bytes move as ncclUint8. */
#define ST_NCCL_UINT8 1

/* The oldest NCCL the engine accepts: non-blocking communicators came in
 * 2.14; 2.18 is the floor the engine was written against. */
#define ST_NCCL_MIN_VERSION_CODE 21800

typedef struct st__nccl_comm *st__nccl_comm_t;   /* ncclComm_t */

/* ncclUniqueId: 128 opaque bytes, passed by value. A bearer secret:
 * whoever holds it during init may join the communicator. */
#define ST_NCCL_UNIQUE_ID_BYTES 128
typedef struct st__nccl_unique_id {
  char internal[ST_NCCL_UNIQUE_ID_BYTES];
} st__nccl_unique_id_t;

/* The prefix of ncclConfig_t that NCCL 2.14 defined. NCCL copies `size`
 * bytes of the caller's struct over its defaults and, for a caller whose
 * `version` predates a field, keeps that field's default: so this prefix,
 * with size covering exactly these four members, works with every 2.x
 * from 2.14 on (st__nccl_config_init fills it). */
typedef struct st__nccl_config {
  size_t size;
  unsigned int magic;     /* 0xcafebeef */
  unsigned int version;   /* NCCL_VERSION(2, 14, 0) = 21400 */
  int blocking;           /* 0: calls return ncclInProgress; poll the state */
} st__nccl_config_t;

void st__nccl_config_init(st__nccl_config_t *c, int blocking);

typedef struct st__nccl_api {
  st__nccl_result_t (*ncclGetVersion)(int *version);
  const char *(*ncclGetErrorString)(st__nccl_result_t result);
  st__nccl_result_t (*ncclGetUniqueId)(st__nccl_unique_id_t *id);
  st__nccl_result_t (*ncclCommInitRankConfig)(st__nccl_comm_t *comm, int nranks,
                                              st__nccl_unique_id_t id, int rank,
                                              st__nccl_config_t *config);
  st__nccl_result_t (*ncclCommGetAsyncError)(st__nccl_comm_t comm,
                                             st__nccl_result_t *async_error);
  st__nccl_result_t (*ncclCommAbort)(st__nccl_comm_t comm);
  st__nccl_result_t (*ncclCommDestroy)(st__nccl_comm_t comm);
  st__nccl_result_t (*ncclGroupStart)(void);
  st__nccl_result_t (*ncclGroupEnd)(void);
  /* stream: a cudaStream_t, the same pointer as the driver's CUstream */
  st__nccl_result_t (*ncclSend)(const void *buff, size_t count, int datatype, int peer,
                                st__nccl_comm_t comm, void *stream);
  st__nccl_result_t (*ncclRecv)(void *buff, size_t count, int datatype, int peer,
                                st__nccl_comm_t comm, void *stream);
  st__nccl_result_t (*ncclBroadcast)(const void *sendbuff, void *recvbuff, size_t count,
                                     int datatype, int root, st__nccl_comm_t comm,
                                     void *stream);
} st__nccl_api_t;

/* "2.28.9" from ncclGetVersion's code (2.9 and newer: major*10000 +
 * minor*100 + patch; older: major*1000 + minor*100 + patch). */
void st__nccl_version_string(int code, char *out, size_t len);

/* Loads `library` (NULL or "": libnccl.so.2) and reports it: the version
 * from ncclGetVersion even when another symbol is missing (servers
 * compare it: every rank must run the same NCCL, patch included), and
 * available only when every symbol resolved, the version is at least
 * 2.18 and a CUDA device is visible. The first available library is kept
 * for st__nccl_api. ST_OK or ST_ERR_CAPABILITY. One thread. */
int st__nccl_probe(const char *library, st__xfer_probe_t *out);

/* The table kept by the first available probe (one is run with `library`
 * when none ran), or NULL. One thread. */
const st__nccl_api_t *st__nccl_api(const char *library);

#endif
