/* src/common: descriptors passed over a Unix socket (SCM_RIGHTS): the
 * control part of a message that carries some, and the descriptors a
 * received message carried. Header only; any thread. */
#ifndef ST_COMMON_FDPASS_H
#define ST_COMMON_FDPASS_H

#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Puts n descriptors (borrowed; sent as duplicates) in mh's control part,
 * using ctl (ctllen bytes, aligned for a cmsghdr, at least
 * CMSG_SPACE(n * sizeof(int))); n 0: no control part. 0, or -1 when they
 * do not fit. */
static inline int st__fdpass_put(struct msghdr *mh, void *ctl, size_t ctllen, const int *fds,
                                 size_t n) {
  mh->msg_control = NULL;
  mh->msg_controllen = 0;
  if (n == 0) return 0;
  if (CMSG_SPACE(sizeof(int) * n) > ctllen) return -1;
  memset(ctl, 0, CMSG_SPACE(sizeof(int) * n));
  mh->msg_control = ctl;
  mh->msg_controllen = CMSG_SPACE(sizeof(int) * n);
  struct cmsghdr *c = CMSG_FIRSTHDR(mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * n);
  memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
  return 0;
}

/* The descriptors received message mh carried, appended to fds (owned by
 * the caller from then on) while *n < cap; the rest are closed. */
static inline void st__fdpass_take(struct msghdr *mh, int *fds, size_t cap, size_t *n) {
  for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (*n < cap) fds[(*n)++] = fd;
      else close(fd);
    }
  }
}

#endif
