/* Fuzz target: loading config.lua (src/lua/config_load.c through the
 * rows of src/server/config.c): the sandboxed chunk runs under the load
 * time limit, then every key it returned is read by its row.
 *
 * Input: the text of config.lua. It is written to one memfd, made once
 * and rewritten for each input, and loaded by its /proc/self/fd path: the
 * load reads a file as the server does, without touching a disk. Each load
 * makes and closes its own Lua state, as the server's does.
 *
 * Properties: the load succeeds exactly when it reports no error; a
 * successful load leaves every value within the bounds of its row.
 */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz.h"
#include "server/config.h"

static int text_fd = -1;
static char text_path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  st__log_set_level(ST_LOG_ERROR);
  text_fd = memfd_create("config.lua", MFD_CLOEXEC);
  if (text_fd < 0) abort();
  snprintf(text_path, sizeof text_path, "/proc/self/fd/%d", text_fd);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (ftruncate(text_fd, 0) != 0 || pwrite(text_fd, data, size, 0) != (ssize_t)size) abort();
  st__config_t cfg;
  st__config_defaults(&cfg);
  st__errlist_t errs = {0};
  int rc = st__config_load(text_path, &cfg, &errs);
  FUZZ_CHECK((rc == ST_OK) == (errs.count == 0));
  FUZZ_CHECK(rc == ST_OK || rc == ST_ERR_CONFIGURATION);
  if (rc == ST_OK) {
    FUZZ_CHECK(cfg.workers >= 1 && cfg.workers <= ST__CONFIG_MAX_WORKERS);
    FUZZ_CHECK(cfg.ndevices >= 0 && cfg.ndevices <= ST_MAX_DEVICES);
    FUZZ_CHECK(cfg.nallow_uids >= 0 && cfg.nallow_uids <= ST_MAX_ALLOW);
    FUZZ_CHECK(cfg.nallow_gids >= 0 && cfg.nallow_gids <= ST_MAX_ALLOW);
    FUZZ_CHECK(cfg.nbudgets >= 1 && cfg.nbudgets <= ST_MAX_BUDGETS);
    FUZZ_CHECK(cfg.ndata_dirs >= 0 && cfg.ndata_dirs <= ST_MAX_DATA_DIRS);   /* {}: no file */
    /* base_path stays NULL unless set: the server then takes the first
     * usable default place (src/server/sockdir.c) */
    FUZZ_CHECK(cfg.endpoints_dir && cfg.default_device);
    for (int i = 0; i < cfg.ndata_dirs; i++) FUZZ_CHECK(cfg.data_dirs[i]);
  }
  st__errlist_clear(&errs);
  st__config_free(&cfg);
  return 0;
}
