/* src/xfer/ucx_api.h: UCX's UCP library loaded at run time (ucx_api.c).
 *
 * Nothing links libucp: the table below is filled with dlsym from
 * `libucp.so.0` (the soname) or from a path the caller names (config.lua's
 * peer.ucx_library, handed down by the server). The types come from
 * libucx-dev's headers at build time (CMake ST_UCX=AUTO); a build without
 * them still reads the library's version (ucp_get_version has plain
 * arguments) and reports "built without UCX".
 *
 * The table is loaded once per process, by the transfer helper only: the
 * server itself never loads UCX (docs/multihost.md, "Engines").
 */
#ifndef ST_XFER_UCX_API_H
#define ST_XFER_UCX_API_H

#include <stddef.h>

#include "xfer/engine.h"

#ifdef ST_HAVE_UCX
#include <ucp/api/ucp.h>

/* The declared subset of UCP, in the order ucx.c uses it. Every entry is
 * required: a library that lacks one is unavailable, with the name. */
typedef struct st__ucx_api {
  void (*ucp_get_version)(unsigned *major, unsigned *minor, unsigned *release);
  ucs_status_t (*ucp_config_read)(const char *env_prefix, const char *filename,
                                  ucp_config_t **config_p);
  void (*ucp_config_release)(ucp_config_t *config);
  ucs_status_t (*ucp_init_version)(unsigned api_major, unsigned api_minor,
                                   const ucp_params_t *params, const ucp_config_t *config,
                                   ucp_context_h *context_p);
  void (*ucp_cleanup)(ucp_context_h context);
  ucs_status_t (*ucp_worker_create)(ucp_context_h context, const ucp_worker_params_t *params,
                                    ucp_worker_h *worker_p);
  void (*ucp_worker_destroy)(ucp_worker_h worker);
  ucs_status_t (*ucp_worker_get_address)(ucp_worker_h worker, ucp_address_t **address_p,
                                         size_t *address_length_p);
  void (*ucp_worker_release_address)(ucp_worker_h worker, ucp_address_t *address);
  unsigned (*ucp_worker_progress)(ucp_worker_h worker);
  ucs_status_t (*ucp_worker_get_efd)(ucp_worker_h worker, int *fd);
  ucs_status_t (*ucp_worker_arm)(ucp_worker_h worker);
  ucs_status_t (*ucp_ep_create)(ucp_worker_h worker, const ucp_ep_params_t *params,
                                ucp_ep_h *ep_p);
  ucs_status_ptr_t (*ucp_ep_close_nbx)(ucp_ep_h ep, const ucp_request_param_t *param);
  ucs_status_ptr_t (*ucp_tag_send_nbx)(ucp_ep_h ep, const void *buffer, size_t count,
                                       ucp_tag_t tag, const ucp_request_param_t *param);
  ucs_status_ptr_t (*ucp_tag_recv_nbx)(ucp_worker_h worker, void *buffer, size_t count,
                                       ucp_tag_t tag, ucp_tag_t tag_mask,
                                       const ucp_request_param_t *param);
  ucs_status_t (*ucp_request_check_status)(void *request);
  void (*ucp_request_cancel)(ucp_worker_h worker, void *request);
  void (*ucp_request_free)(void *request);
  const char *(*ucs_status_string)(ucs_status_t status);
} st__ucx_api_t;

/* The loaded table, or NULL when UCX is unavailable here (the reason from
 * st__ucx_probe). The first call loads with `library` (NULL: the soname);
 * later calls return what the first one loaded, whatever they name. Not
 * thread-safe: the helper's one thread calls it. */
const st__ucx_api_t *st__ucx_api(const char *library);
#endif

/* Loads `library` (NULL or "": libucp.so.0) and reports what it is:
 * out->version ("1.13.1", read with ucp_get_version even when other
 * symbols are missing: a version mismatch between servers is told from a
 * library that lacks the rest), out->available (every symbol of the table
 * found and the build has the headers), out->reason otherwise
 * ("dlopen(libucp.so.0): libucp.so.0: cannot open shared object file: No
 * such file or directory", "symbol ucp_tag_recv_nbx not found in
 * /x/libucp.so", "built without UCX (the build found no libucx-dev
 * headers; CMake ST_UCX)"). Loads into this process: the helper calls it,
 * tests may. Returns ST_OK when available, else ST_ERR_CAPABILITY. */
int st__ucx_probe(const char *library, st__xfer_probe_t *out);

#endif
