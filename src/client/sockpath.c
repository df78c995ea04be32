/* src/client: socket paths and connecting by device. Without a base (no
 * argument, no $SHARED_TENSOR_BASE_PATH) the socket is looked for in the
 * default bases of common/sockdir.h, in their order: the first where the
 * device's socket exists is the one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "client/client_internal.h"
#include "common/sockdir.h"

/* "<base>-<device>.sock" into out: ST_OK, or ST_ERR_INVALID_ARGUMENT
 * (out emptied) when it does not fit. */
static int join(const char *base, int device, char *out, size_t len) {
  int n = snprintf(out, len, "%s-%d.sock", base, device);
  if (n < 0 || (size_t)n >= len) {
    if (len) out[0] = '\0';
    return ST_ERR_INVALID_ARGUMENT;
  }
  return ST_OK;
}

/* Copies s into out: ST_OK, or ST_ERR_INVALID_ARGUMENT when it does not
 * fit. */
static int put(const char *s, char *out, size_t len) {
  int n = snprintf(out, len, "%s", s);
  return n < 0 || (size_t)n >= len ? ST_ERR_INVALID_ARGUMENT : ST_OK;
}

/* The socket of `device` in the default bases: the first that exists
 * (ST_OK), else the first base's (ST_ERR_IO) with every path looked at
 * ("A, B or C") in tried. ST_ERR_INVALID_ARGUMENT when out is too
 * small. */
static int search(int device, char *out, size_t len, char *tried, size_t triedlen) {
  st__sockdir_t list[ST__SOCKDIR_MAX];
  int n = st__sockdir_list(list);
  char paths[ST__SOCKDIR_MAX][sizeof list[0].base + 16];
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (join(list[i].base, device, paths[m], sizeof paths[m]) != ST_OK) continue;
    struct stat st;
    if (stat(paths[m], &st) == 0 && S_ISSOCK(st.st_mode)) return put(paths[m], out, len);
    m++;
  }
  st__text_t t = {0};
  for (int i = 0; i < m; i++) {
    st__client_text_puts(&t, i == 0 ? "" : i == m - 1 ? " or " : ", ");
    st__client_text_puts(&t, paths[i]);
  }
  if (triedlen) snprintf(tried, triedlen, "%s", t.ptr ? t.ptr : "");
  free(t.ptr);
  int rc = put(m ? paths[0] : "", out, len);
  return rc == ST_OK ? ST_ERR_IO : rc;
}

/* "<base>-<device>.sock" into out; see client.h. Any thread. */
ST_API int st_socket_path(const char *base, int device, char *out, size_t len) {
  if (!out || device < 0) return ST_ERR_INVALID_ARGUMENT;
  if (!base || !*base) base = getenv(ST_ENV_BASE_PATH);
  if (base && *base) return join(base, device, out, len);
  int rc = search(device, out, len, NULL, 0);
  return rc == ST_ERR_IO ? ST_OK : rc;
}

/* Connects to the socket of `device` under `base`; see client.h. Any
 * thread. */
ST_API int st_client_connect_device_opts(const char *base, int device,
                                         const st_client_options_t *opts, st_client_t **out,
                                         char *err, size_t errlen) {
  char path[sizeof(((st_client_t *)0)->path)];
  char tried[3 * sizeof path + 16];
  if (err && errlen) err[0] = '\0';
  if (out) *out = NULL;
  if (!out) return ST_ERR_INVALID_ARGUMENT;
  if (!base || !*base) base = getenv(ST_ENV_BASE_PATH);
  int rc = device < 0 ? ST_ERR_INVALID_ARGUMENT
           : base && *base ? join(base, device, path, sizeof path)
                           : search(device, path, sizeof path, tried, sizeof tried);
  if (rc == ST_ERR_IO) {
    if (err && errlen)
      snprintf(err, errlen, "no server is listening for device %d: no socket at %s", device,
               tried);
    return ST_ERR_IO;
  }
  if (rc != ST_OK) {
    if (err && errlen)
      snprintf(err, errlen, "no usable socket path for device %d (too long or negative)",
               device);
    return ST_ERR_INVALID_ARGUMENT;
  }
  return st_client_connect_opts(path, opts, out, err, errlen);
}

/* st_client_connect_device_opts with every default; see client.h. */
ST_API int st_client_connect_device(const char *base, int device, st_client_t **out, char *err,
                                    size_t errlen) {
  return st_client_connect_device_opts(base, device, NULL, out, err, errlen);
}
