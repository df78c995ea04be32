/* src/mem/safetensors_open.c: opening a checkpoint (safetensors.h).
 *
 * A path is a .safetensors file, a directory holding
 * model.safetensors.index.json (a Hugging Face sharded checkpoint), or that
 * index file itself. Each file is opened once, its header read and
 * validated (st__safetensors_parse), and its descriptor kept, so the load
 * reads the very files that were validated even if a name is replaced in
 * between.
 *
 * Confinement: endpoint code names files, so a confined open resolves the
 * path (realpath: symlinks, "..") and accepts it only inside one of the
 * data dirs (config data_dirs). Shard names in an index must be plain file
 * names; each shard is resolved and checked too (Hugging Face caches link
 * snapshot files to blobs, so links are followed, but they must land in a
 * data dir).
 *
 * Contracts of the non-static functions: their comments in safetensors.h.
 */
#include "mem/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------ process-wide settings */

static pthread_mutex_t dirs_lock = PTHREAD_MUTEX_INITIALIZER;
static char **data_dirs;
static int ndata_dirs;
static int loader_threads = 4;

/* See safetensors.h. Any thread. */
void st__safetensors_set_data_dirs(const char *const *dirs, int n) {
  char **copy = n > 0 ? calloc((size_t)n, sizeof *copy) : NULL;
  int m = 0;
  for (int i = 0; copy && i < n; i++)
    if (dirs[i] && (copy[m] = strdup(dirs[i]))) m++;
  pthread_mutex_lock(&dirs_lock);
  char **old = data_dirs;
  int nold = ndata_dirs;
  data_dirs = copy;
  ndata_dirs = m;
  pthread_mutex_unlock(&dirs_lock);
  for (int i = 0; i < nold; i++) free(old[i]);
  free(old);
}

/* See safetensors.h. Any thread. */
void st__safetensors_data_dirs_text(char *buf, size_t len) {
  size_t used = 0;
  buf[0] = '\0';
  pthread_mutex_lock(&dirs_lock);
  for (int i = 0; i < ndata_dirs && used < len; i++) {
    int w = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", data_dirs[i]);
    if (w < 0) break;
    used += (size_t)w;
  }
  if (ndata_dirs == 0) snprintf(buf, len, "none configured");
  pthread_mutex_unlock(&dirs_lock);
}

/* See safetensors.h. Any thread. */
void st__safetensors_set_loader_threads(int n) {
  __atomic_store_n(&loader_threads, n < 1 ? 1 : n > 64 ? 64 : n, __ATOMIC_RELAXED);
}

/* See safetensors.h. Any thread. */
int st__safetensors_loader_threads(void) {
  return __atomic_load_n(&loader_threads, __ATOMIC_RELAXED);
}

/* Nonzero when the resolved path `real` is one of the data dirs or lies
 * under one (each dir resolved now: it may have been created after start). */
static int inside_data_dirs(const char *real) {
  int ok = 0;
  pthread_mutex_lock(&dirs_lock);
  for (int i = 0; i < ndata_dirs && !ok; i++) {
    char dir[PATH_MAX];
    if (!realpath(data_dirs[i], dir)) continue;
    size_t n = strlen(dir);
    if (n == 1 && dir[0] == '/') ok = 1;                 /* "/" holds everything */
    else ok = strncmp(real, dir, n) == 0 && (real[n] == '\0' || real[n] == '/');
  }
  pthread_mutex_unlock(&dirs_lock);
  return ok;
}

static int outside(const char *what, const char *real, char *err, size_t errlen) {
  char dirs[1024];
  st__safetensors_data_dirs_text(dirs, sizeof dirs);
  snprintf(err, errlen, "%s '%s' is outside the allowed data_dirs (%s)", what, real, dirs);
  return ST_ERR_AUTH;
}

static int not_found(const char *path, int e, char *err, size_t errlen) {
  snprintf(err, errlen, "%s: %s", path, strerror(e));
  return e == ENOENT || e == ENOTDIR ? ST_ERR_NOT_FOUND : e == EACCES ? ST_ERR_AUTH : ST_ERR_IO;
}

/* Resolves `path` into real (PATH_MAX): with confine, a relative path is
 * tried under each data dir in turn, and the result must lie inside one. */
static int resolve(const char *path, int confine, char *real, char *err, size_t errlen) {
  if (!path[0]) {
    snprintf(err, errlen, "empty path");
    return ST_ERR_INVALID_ARGUMENT;
  }
  if (!confine || path[0] == '/') {
    if (!realpath(path, real)) return not_found(path, errno, err, errlen);
    if (confine && !inside_data_dirs(real)) return outside("path", real, err, errlen);
    return ST_OK;
  }
  pthread_mutex_lock(&dirs_lock);
  int n = ndata_dirs, found = 0;
  for (int i = 0; i < n && !found; i++) {
    char joined[PATH_MAX * 2];
    snprintf(joined, sizeof joined, "%s/%s", data_dirs[i], path);
    found = realpath(joined, real) != NULL;
  }
  pthread_mutex_unlock(&dirs_lock);
  if (!found) {
    char dirs[1024];
    st__safetensors_data_dirs_text(dirs, sizeof dirs);
    snprintf(err, errlen, "%s: not found in any data dir (%s)", path, dirs);
    return ST_ERR_NOT_FOUND;
  }
  if (!inside_data_dirs(real)) return outside("path", real, err, errlen);
  return ST_OK;
}

/* See safetensors.h. Any thread. */
int st__safetensors_pread(const st__safetensors_file_t *f, void *dst, uint64_t bytes,
                          uint64_t off, char *err, size_t errlen) {
  char *p = dst;
  while (bytes > 0) {
    size_t want = bytes > (1u << 30) ? (1u << 30) : (size_t)bytes;
    ssize_t n = pread(f->fd, p, want, (off_t)off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      snprintf(err, errlen, "%s: read of %zu bytes at offset %llu failed: %s", f->path, want,
               (unsigned long long)off, strerror(errno));
      return ST_ERR_IO;
    }
    if (n == 0) {
      snprintf(err, errlen, "%s: the file ends at offset %llu, before the data it declares "
               "(it was truncated)", f->path, (unsigned long long)off);
      return ST_ERR_IO;
    }
    p += n;
    off += (uint64_t)n;
    bytes -= (uint64_t)n;
  }
  return ST_OK;
}

/* See safetensors.h. Any thread. */
int64_t st__safetensors_splice(const st__safetensors_file_t *f, int pipe_wr, uint64_t bytes,
                               uint64_t off, char *err, size_t errlen) {
  size_t want = bytes > (1u << 30) ? (1u << 30) : (size_t)bytes;
  for (;;) {
    loff_t at = (loff_t)off;
    ssize_t n = splice(f->fd, &at, pipe_wr, NULL, want, SPLICE_F_MOVE);
    if (n > 0) return n;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP || errno == EPERM)) {
      snprintf(err, errlen, "%s: splice: %s", f->path, strerror(errno));
      return ST_ERR_CAPABILITY;
    }
    if (n < 0) {
      snprintf(err, errlen, "%s: read of %zu bytes at offset %llu failed: %s", f->path, want,
               (unsigned long long)off, strerror(errno));
      return ST_ERR_IO;
    }
    snprintf(err, errlen, "%s: the file ends at offset %llu, before the data it declares "
             "(it was truncated)", f->path, (unsigned long long)off);
    return ST_ERR_IO;
  }
}

/* Adds a file entry (fd and path owned by s from here on). */
static int add_file(st__safetensors_t *s, const char *real, int fd, uint64_t size, char *err,
                    size_t errlen) {
  st__safetensors_file_t *f = realloc(s->files, (s->nfiles + 1) * sizeof *f);
  char *p = f ? strdup(real) : NULL;
  if (!p) {
    if (f) s->files = f;
    close(fd);
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  s->files = f;
  f[s->nfiles].path = p;
  f[s->nfiles].fd = fd;
  f[s->nfiles].size = size;
  f[s->nfiles].data_start = 0;
  s->nfiles++;
  return ST_OK;
}

/* Opens the resolved file `real`, reads and parses its header, appends its
 * tensors to s as file number s->nfiles. */
static int open_file(st__safetensors_t *s, const char *real, char *err, size_t errlen) {
  int fd = open(real, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return not_found(real, errno, err, errlen);
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    snprintf(err, errlen, "%s: not a regular file", real);
    return ST_ERR_INVALID_ARGUMENT;
  }
  int rc = add_file(s, real, fd, (uint64_t)st.st_size, err, errlen);
  if (rc != ST_OK) return rc;
  st__safetensors_file_t *f = &s->files[s->nfiles - 1];
  if (f->size < 8) {
    snprintf(err, errlen, "%s: the file is %llu bytes, too short for the 8-byte header length "
             "(truncated, or not a safetensors file)", real, (unsigned long long)f->size);
    return ST_ERR_INVALID_ARGUMENT;
  }
  unsigned char lenb[8];
  rc = st__safetensors_pread(f, lenb, 8, 0, err, errlen);
  if (rc != ST_OK) return rc;
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | lenb[i];
  if (hlen > ST_SAFETENSORS_MAX_HEADER) {
    snprintf(err, errlen, "%s: header length %llu is larger than the 100 MB limit (not a "
             "safetensors file?)", real, (unsigned long long)hlen);
    return ST_ERR_INVALID_ARGUMENT;
  }
  if (hlen > f->size - 8) {
    snprintf(err, errlen, "%s: header length %llu runs past the end of the file (%llu bytes; "
             "truncated?)", real, (unsigned long long)hlen, (unsigned long long)f->size);
    return ST_ERR_INVALID_ARGUMENT;
  }
  f->data_start = 8 + hlen;
  char *hdr = malloc(hlen ? hlen : 1);
  if (!hdr) {
    snprintf(err, errlen, "%s: out of memory for a header of %llu bytes", real,
             (unsigned long long)hlen);
    return ST_ERR_OUT_OF_MEMORY;
  }
  rc = st__safetensors_pread(f, hdr, hlen, 8, err, errlen);
  if (rc == ST_OK)
    rc = st__safetensors_parse(hdr, (size_t)hlen, f->size - f->data_start, real,
                               (int)(s->nfiles - 1), s, err, errlen);
  free(hdr);
  return rc;
}

/* Reads a whole small file (the index) into a new buffer. */
static int slurp(const char *real, char **out, size_t *len, char *err, size_t errlen) {
  int fd = open(real, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return not_found(real, errno, err, errlen);
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      (uint64_t)st.st_size > ST_SAFETENSORS_MAX_INDEX) {
    close(fd);
    snprintf(err, errlen, "%s: not a regular file of at most 100 MB", real);
    return ST_ERR_INVALID_ARGUMENT;
  }
  char *buf = malloc((size_t)st.st_size + 1);
  st__safetensors_file_t f = {(char *)real, fd, (uint64_t)st.st_size, 0};
  int rc = buf ? st__safetensors_pread(&f, buf, (uint64_t)st.st_size, 0, err, errlen)
               : ST_ERR_OUT_OF_MEMORY;
  close(fd);
  if (rc != ST_OK) {
    if (!buf) snprintf(err, errlen, "out of memory");
    free(buf);
    return rc;
  }
  *out = buf;
  *len = (size_t)st.st_size;
  return ST_OK;
}

static int plain_name(const char *s, size_t len) {
  return len > 0 && strlen(s) == len && !strchr(s, '/') && strcmp(s, ".") != 0 &&
         strcmp(s, "..") != 0;
}

/* Index of the tensor called `name` among sorted[0..n) (indexes into t). */
static long find_sorted(const st__safetensors_tensor_t *t, const size_t *sorted, size_t n,
                        const char *name) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    int c = strcmp(t[sorted[mid]].name, name);
    if (c == 0) return (long)sorted[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return -1;
}

static int cmp_name(const void *a, const void *b, void *arg) {
  const st__safetensors_tensor_t *t = arg;
  return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

/* Opens every shard named by the index at `real` (in order of first
 * appearance in weight_map) and orders the tensors as weight_map lists
 * them. */
static int open_index(st__safetensors_t *s, const char *real, int confine, char *err,
                      size_t errlen) {
  char *text = NULL;
  size_t len = 0;
  int rc = slurp(real, &text, &len, err, errlen);
  if (rc != ST_OK) return rc;
  st__json_t doc;
  char jerr[256];
  rc = st__json_parse(text, len, &doc, jerr, sizeof jerr);
  if (rc != ST_OK) {
    free(text);
    snprintf(err, errlen, "%s: %s", real, jerr);
    return rc;
  }
  const st__json_node_t *wm = NULL;
  if (doc.nodes[0].type == ST__JSON_OBJECT)
    for (uint32_t i = doc.nodes[0].first; i; i = doc.nodes[i].next)
      if (strcmp(doc.nodes[i].key, "weight_map") == 0) wm = &doc.nodes[i];
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", real);
  char *slash = strrchr(dir, '/');
  if (slash) *slash = '\0';
  if (!wm || wm->type != ST__JSON_OBJECT) {
    snprintf(err, errlen, "%s: the index has no \"weight_map\" object", real);
    rc = ST_ERR_INVALID_ARGUMENT;
  }
  /* Shards in order of first appearance; each checked as a plain name. */
  const char **shards = NULL;
  size_t nshards = 0;
  if (rc == ST_OK) shards = calloc(wm->count ? wm->count : 1, sizeof *shards);
  if (rc == ST_OK && !shards) {
    snprintf(err, errlen, "out of memory");
    rc = ST_ERR_OUT_OF_MEMORY;
  }
  for (uint32_t i = rc == ST_OK ? wm->first : 0; i && rc == ST_OK; i = doc.nodes[i].next) {
    const st__json_node_t *e = &doc.nodes[i];
    if (e->type != ST__JSON_STRING || !plain_name(e->str, e->len)) {
      snprintf(err, errlen, "%s: weight_map entry '%.200s' must name a shard file inside the "
               "index's directory (a plain file name)", real, e->key);
      rc = ST_ERR_INVALID_ARGUMENT;
      break;
    }
    size_t k = 0;
    while (k < nshards && strcmp(shards[k], e->str) != 0) k++;
    if (k == nshards) shards[nshards++] = e->str;
  }
  for (size_t k = 0; k < nshards && rc == ST_OK; k++) {
    char path[PATH_MAX * 2], shard_real[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, shards[k]);
    if (!realpath(path, shard_real)) {
      int e = errno;
      snprintf(err, errlen, "%s: shard '%s' named by the index cannot be opened: %s", real,
               shards[k], strerror(e));
      rc = e == ENOENT ? ST_ERR_NOT_FOUND : ST_ERR_IO;
    } else if (confine && !inside_data_dirs(shard_real)) {
      rc = outside("shard", shard_real, err, errlen);
    } else {
      rc = open_file(s, shard_real, err, errlen);
    }
  }
  /* Reorder: weight_map order; every entry in its shard, nothing extra.
   * `ordered` borrows the names until it replaces s->tensors. */
  size_t n = s->ntensors;
  size_t *sorted = rc == ST_OK ? malloc((n ? n : 1) * sizeof *sorted) : NULL;
  unsigned char *used = sorted ? calloc(n ? n : 1, 1) : NULL;
  st__safetensors_tensor_t *ordered = used ? malloc((n ? n : 1) * sizeof *ordered) : NULL;
  if (rc == ST_OK && !ordered) {
    snprintf(err, errlen, "out of memory");
    rc = ST_ERR_OUT_OF_MEMORY;
  }
  if (rc == ST_OK) {
    for (size_t i = 0; i < n; i++) sorted[i] = i;
    qsort_r(sorted, n, sizeof *sorted, cmp_name, s->tensors);
    for (size_t i = 1; i < n && rc == ST_OK; i++)
      if (strcmp(s->tensors[sorted[i]].name, s->tensors[sorted[i - 1]].name) == 0) {
        snprintf(err, errlen, "%s: tensor '%.200s' is in two shards (%s and %s)", real,
                 s->tensors[sorted[i]].name, s->files[s->tensors[sorted[i - 1]].file].path,
                 s->files[s->tensors[sorted[i]].file].path);
        rc = ST_ERR_INVALID_ARGUMENT;
      }
  }
  size_t m = 0;
  for (uint32_t i = rc == ST_OK ? wm->first : 0; i && rc == ST_OK; i = doc.nodes[i].next) {
    const st__json_node_t *e = &doc.nodes[i];
    long t = find_sorted(s->tensors, sorted, n, e->key);
    size_t k = 0;
    while (strcmp(shards[k], e->str) != 0) k++;   /* shard k is file k */
    if (t < 0 || s->tensors[t].file != (int)k) {
      snprintf(err, errlen, "%s: tensor '%.200s' is not in shard '%s' as the weight_map says",
               real, e->key, e->str);
      rc = ST_ERR_INVALID_ARGUMENT;
    } else if (used[t]) {
      snprintf(err, errlen, "%s: tensor '%.200s' appears twice in the weight_map", real, e->key);
      rc = ST_ERR_INVALID_ARGUMENT;
    } else {
      used[t] = 1;
      ordered[m++] = s->tensors[t];
    }
  }
  if (rc == ST_OK && m != n) {
    for (size_t i = 0; i < n; i++)
      if (!used[i]) {
        snprintf(err, errlen, "%s: tensor '%.200s' of shard %s is not in the weight_map", real,
                 s->tensors[i].name, s->files[s->tensors[i].file].path);
        break;
      }
    rc = ST_ERR_INVALID_ARGUMENT;
  }
  if (rc == ST_OK) {
    free(s->tensors);
    s->tensors = ordered;
    s->cap_tensors = n ? n : 1;
    ordered = NULL;
  }
  free(used);
  free(ordered);
  free(sorted);
  free(shards);
  st__json_free(&doc);
  free(text);
  return rc;
}

/* See safetensors.h. Any thread. */
int st__safetensors_open(const char *path, int confine, st__safetensors_t **out, char *err,
                         size_t errlen) {
  char dummy[1];
  if (!err) { err = dummy; errlen = sizeof dummy; }
  *out = NULL;
  char real[PATH_MAX];
  int rc = resolve(path, confine, real, err, errlen);
  if (rc != ST_OK) return rc;
  st__safetensors_t *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  struct stat st;
  size_t rl = strlen(real);
  if (stat(real, &st) == 0 && S_ISDIR(st.st_mode)) {
    char index[PATH_MAX + 64];
    snprintf(index, sizeof index, "%s/%s", real, ST_SAFETENSORS_INDEX);
    if (access(index, F_OK) != 0) {
      snprintf(err, errlen, "%s: a directory without %s (a sharded checkpoint needs its index)",
               real, ST_SAFETENSORS_INDEX);
      rc = ST_ERR_NOT_FOUND;
    } else {
      rc = open_index(s, index, confine, err, errlen);
    }
  } else if (rl >= 11 && strcmp(real + rl - 11, ".index.json") == 0) {
    rc = open_index(s, real, confine, err, errlen);
  } else {
    rc = open_file(s, real, err, errlen);
  }
  if (rc != ST_OK) {
    st__safetensors_free(s);
    return rc;
  }
  *out = s;
  return ST_OK;
}
