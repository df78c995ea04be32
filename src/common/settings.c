/* src/common/settings.c: defaults, stores and frees by the rows of a
 * settings schema (settings.h). */
#include "common/settings.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* See settings.h. */
const st__setting_t *st__settings_find(const st__setting_t *rows, const char *name) {
  for (const st__setting_t *r = rows; r && r->name; r++)
    if (strcmp(r->name, name) == 0) return r;
  return NULL;
}

/* The row's field in obj. */
void *st__setting_field(const st__setting_t *row, void *obj) {
  return (char *)obj + row->offset;
}

/* See settings.h. Any thread. */
void st__settings_print(FILE *out, const char *prefix, const st__setting_t *rows,
                        const void *obj) {
  int n = 0;
  for (const st__setting_t *r = rows; r->name; r++) {
    const char *field = (const char *)obj + r->offset;
    if (r->type == ST_SET_INT) {
      int64_t v = r->size == 8 ? *(const int64_t *)(const void *)field
                               : *(const int32_t *)(const void *)field;
      fprintf(out, "%s%s=%lld", n++ ? " " : prefix, r->name, (long long)v);
      if (v == 0 && r->zero) fprintf(out, " (%s)", r->zero);
    } else if (r->type == ST_SET_SECONDS) {
      fprintf(out, "%s%s=%g", n++ ? " " : prefix, r->name, *(const double *)(const void *)field);
    }
  }
  if (n) fputc('\n', out);
}

/* The count field of a list row in obj. */
int *st__setting_count(const st__setting_t *row, void *obj) {
  return (int *)((char *)obj + row->count_offset);
}

/* See settings.h: 4- and 8-byte integers, signed or not alike. */
void st__setting_set_int(const st__setting_t *row, void *obj, size_t i, int64_t v) {
  char *p = (char *)st__setting_field(row, obj) + i * row->size;
  if (row->size == sizeof(int32_t)) {
    int32_t n = (int32_t)v;
    memcpy(p, &n, sizeof n);
  } else {
    memcpy(p, &v, sizeof v);
  }
}

/* Replaces the owned string of the row's field (takes text). */
void st__setting_set_text(const st__setting_t *row, void *obj, char *text) {
  char **field = st__setting_field(row, obj);
  free(*field);
  *field = text;
}

/* See settings.h. */
int st__settings_defaults(const st__setting_t *rows, void *obj) {
  int rc = 0;
  for (const st__setting_t *r = rows; r && r->name; r++) {
    switch (r->type) {
    case ST_SET_INT: st__setting_set_int(r, obj, 0, r->def); break;
    case ST_SET_SECONDS: *(double *)st__setting_field(r, obj) = r->def_seconds; break;
    case ST_SET_MODE: *(unsigned *)st__setting_field(r, obj) = (unsigned)r->def; break;
    case ST_SET_WORD:
    case ST_SET_STRING:
    case ST_SET_PATH:
    case ST_SET_NAME_OR_ID: {
      if (r->type == ST_SET_WORD && !(r->flags & ST_SET_AS_TEXT)) {
        *(int *)st__setting_field(r, obj) = (int)r->def;
        break;
      }
      char *s = r->def_text ? strdup(r->def_text) : NULL;
      if (r->def_text && !s) rc = -1;
      *(char **)st__setting_field(r, obj) = s;
      break;
    }
    case ST_SET_TABLE:
      if (st__settings_defaults(r->rows, obj) != 0) rc = -1;
      break;
    default: break;
    }
  }
  return rc;
}

/* See settings.h. */
void st__settings_free(const st__setting_t *rows, void *obj) {
  for (const st__setting_t *r = rows; r && r->name; r++) {
    switch (r->type) {
    case ST_SET_WORD:
    case ST_SET_STRING:
    case ST_SET_PATH:
    case ST_SET_NAME_OR_ID:
      if (r->type != ST_SET_WORD || (r->flags & ST_SET_AS_TEXT)) st__setting_set_text(r, obj, NULL);
      break;
    case ST_SET_PATHS: {
      char **v = st__setting_field(r, obj);
      int *n = st__setting_count(r, obj);
      for (int i = 0; i < *n; i++) {
        free(v[i]);
        v[i] = NULL;
      }
      *n = 0;
      break;
    }
    case ST_SET_TABLE: st__settings_free(r->rows, obj); break;
    case ST_SET_STRINGS: {
      char **v = st__setting_field(r, obj);
      int *n = st__setting_count(r, obj);
      for (int i = 0; i < *n; i++) {
        free(v[i]);
        v[i] = NULL;
      }
      *n = 0;
      break;
    }
    case ST_SET_RECORDS: st__settings_free_records(r, obj); break;
    default: break;
    }
  }
}

/* See settings.h. */
void *st__setting_record(const st__setting_t *row, void *obj, int i) {
  return (char *)st__setting_field(row, obj) + (size_t)i * row->size;
}

/* See settings.h. */
void st__settings_free_records(const st__setting_t *row, void *obj) {
  int *n = st__setting_count(row, obj);
  for (int i = 0; i < *n; i++) {
    char *e = st__setting_record(row, obj, i);
    st__settings_free(row->rows, e);
    char **name = (char **)(void *)(e + row->key_offset);
    free(*name);
    memset(e, 0, row->size);
  }
  *n = 0;
}

/* See settings.h. */
int st__setting_word(const st__setting_t *row, const char *word) {
  return row->parse ? row->parse(word) : st__choices_index(row->choices, word);
}

/* See settings.h. */
const char *st__choices_word(const char *choices, int i, size_t *len) {
  const char *p = choices;
  for (int k = 0; p && *p; k++) {
    size_t w = strcspn(p, "|");
    if (k == i) {
      *len = w;
      return p;
    }
    p += w;
    if (*p) p++;
  }
  return NULL;
}

/* The index of word among choices, or -1. */
int st__choices_index(const char *choices, const char *word) {
  size_t n = strlen(word), w;
  const char *p;
  for (int i = 0; (p = st__choices_word(choices, i, &w)); i++)
    if (w == n && memcmp(p, word, n) == 0) return i;
  return -1;
}

/* "\"a\", \"b\" or \"c\"" for messages. */
const char *st__choices_text(const char *choices, char *buf, size_t len) {
  int total = 0;
  size_t w, used = 0;
  while (st__choices_word(choices, total, &w)) total++;
  buf[0] = '\0';
  const char *p;
  for (int i = 0; (p = st__choices_word(choices, i, &w)) && used < len; i++) {
    const char *sep = i == 0 ? "" : i + 1 == total ? " or " : ", ";
    int n = snprintf(buf + used, len - used, "%s\"%.*s\"", sep, (int)w, p);
    if (n < 0) break;
    used += (size_t)n;
  }
  return buf;
}

/* See settings.h. */
char *st__settings_resolve(const char *config_path, const char *dir) {
  if (dir[0] == '/') return strdup(dir);
  const char *slash = strrchr(config_path, '/');
  if (!slash) return strdup(dir);
  char *out = NULL;
  if (asprintf(&out, "%.*s/%s", (int)(slash - config_path), config_path, dir) < 0) return NULL;
  return out;
}
