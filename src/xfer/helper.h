/* src/xfer/helper.h: the transfer helper process (helper.c):
 * `stserver --xfer-helper FD`, started by the server's supervisor
 * (supervisor.c) with FD its end of a SOCK_SEQPACKET socketpair. It runs
 * the engines, maps the arenas the server sends like a client does, and
 * exits when the server's end closes (docs/multihost.md, "The transfer
 * helper"). */
#ifndef ST_XFER_HELPER_H
#define ST_XFER_HELPER_H

/* The flag that makes stserver the helper; main.c dispatches on it
 * before anything else is initialised. */
#define ST_XFER_HELPER_FLAG "--xfer-helper"

/* Runs the helper on descriptor `fd_arg` (decimal) until the server's end
 * closes; returns the process's exit status (0 at a clean close, 2 for a
 * bad argument, 1 after a failure of its socket). Never returns to a
 * server: call it from main only. */
int st__xfer_helper_main(const char *fd_arg);

#endif
