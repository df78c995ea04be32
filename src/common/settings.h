/* src/common: settings schemas. A schema is an array of rows, one per key
 * of a configuration file, each naming the field of a plain C struct that
 * holds the key's value and saying how the value is checked:
 *
 *   server/config.c     declares the server's rows (config.lua keys) and
 *                       fills st__config_t through them;
 *   lua/config_load.c   runs a Lua configuration file and reads the table
 *                       it returns into any struct by its rows
 *                       (st__settings_load, lua/st_lua.h).
 *
 * So the reader knows no struct and the struct's owner knows no Lua. An
 * array of rows ends with a row whose name is NULL. Rows are read-only
 * data; the functions below run on any thread, on a struct no other
 * thread uses.
 */
#ifndef ST_COMMON_SETTINGS_H
#define ST_COMMON_SETTINGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
  ST_SET_INT = 0,     /* an integer in [lo, hi]; a field of `size` bytes (4 or 8) */
  ST_SET_SECONDS,     /* a number in [min, max] (min excluded with ST_SET_OPEN); a double */
  ST_SET_STRING,      /* a non-empty string; an owned char * */
  ST_SET_PATH,        /* ST_SET_STRING; a relative path is taken from the config
                         file's directory (st__settings_resolve) */
  ST_SET_WORD,        /* one of `choices`: its index into an int, or with
                         ST_SET_AS_TEXT the word itself into an owned char * */
  ST_SET_MODE,        /* permission bits: octal text ("0660") or an integer in
                         0..0777; an unsigned */
  ST_SET_NAME_OR_ID,  /* a non-empty string, or an integer in [lo, hi] kept as its
                         decimal text; an owned char * */
  ST_SET_INTS,        /* an array of at most max_entries integers in [lo, hi] into
                         an array of `size`-byte elements, the count into the int
                         at count_offset (ST_SET_ONE: a bare integer too) */
  ST_SET_PATHS,       /* an array of at most max_entries directory names (taken as
                         ST_SET_PATH) into an array of owned char *, the count into
                         the int at count_offset; replaces the previous entries */
  ST_SET_TABLE,       /* a table of the sub-rows `rows` ("limits.max_inflight") */
  ST_SET_MAP,         /* a table of key -> integer in [lo, hi]: each key checked by
                         key_ok, each pair stored by put */
  ST_SET_STRINGS,     /* an array of at most max_entries non-empty strings into an
                         array of owned char *, the count into the int at
                         count_offset; replaces the previous entries */
  ST_SET_RECORDS      /* a table of name -> record: each record an element of
                         `size` bytes of the array at offset (at most max_entries,
                         the count into the int at count_offset), its name (checked
                         by key_ok when set) an owned char * at key_offset inside
                         it, its fields read by the sub-rows `rows` (offsets inside
                         the element; ST_SET_ONE: a bare string is the value of the
                         first sub-row); replaces the previous entries */
} st__setting_type_t;

/* Row flags. */
#define ST_SET_OPEN 1u        /* SECONDS: the value must be above min */
#define ST_SET_ONE 2u         /* INTS: a single integer is an array of one */
#define ST_SET_NONEMPTY 4u    /* INTS: at least one entry ("at least one <what> is needed") */
#define ST_SET_UNIQUE 8u      /* INTS: no entry twice ("<what> N is listed twice") */
#define ST_SET_AS_TEXT 8u     /* WORD: keep the word, not its index */

typedef struct st__setting {
  const char *name;                /* the key; NULL ends an array of rows */
  st__setting_type_t type;
  unsigned flags;
  size_t offset;                   /* the field (INTS, PATHS: the array) */
  size_t size;                     /* INT, INTS: bytes of the integer field or element */
  int64_t lo, hi;                  /* INT, INTS, NAME_OR_ID, MAP: the range */
  double min, max;                 /* SECONDS: the range */
  const char *choices;             /* WORD: "a|b|c"; a word's index is its value */
  int (*parse)(const char *word);  /* WORD, optional: the index of a word (accepts
                                      aliases), -1 if none; else exact choices */
  int max_entries;                 /* INTS, PATHS */
  size_t count_offset;             /* INTS, PATHS: the int that holds the count */
  const char *what;                /* INTS with ST_SET_NONEMPTY: an entry, for messages */
  const struct st__setting *rows;  /* TABLE, RECORDS */
  size_t key_offset;               /* RECORDS: the element's owned name */
  int (*key_ok)(const char *key);  /* MAP: nonzero for an acceptable key */
  const char *keys;                /* MAP: the acceptable keys, for messages */
  const char *example;             /* MAP: a table literal, for messages */
  /* MAP: stores one pair into obj; 0, or -1 with a message in err. */
  int (*put)(void *obj, const char *key, int64_t value, char *err, size_t errlen);
  int64_t def;                     /* INT, MODE, WORD (index): the default */
  double def_seconds;              /* SECONDS: the default */
  const char *def_text;            /* STRING, PATH, WORD with ST_SET_AS_TEXT: the
                                      default, NULL for none */
  const char *description;         /* one line, for people */
  const char *zero;                /* INT, optional: what 0 stands for, for people */
} st__setting_t;

/* The row named `name` among rows, or NULL. Borrowed. */
const st__setting_t *st__settings_find(const st__setting_t *rows, const char *name);

/* Stores each row's default into obj (sub-tables included): INT, MODE and
 * WORD their `def`, SECONDS def_seconds, strings a copy of def_text
 * (owned by obj; NULL when none). Array and map rows are left as they
 * are. Overwrites without freeing. 0, or -1 when out of memory. */
int st__settings_defaults(const st__setting_t *rows, void *obj);

/* Frees the strings rows own in obj (STRING, PATH, NAME_OR_ID, WORD as
 * text, PATHS entries) and sets them to NULL (PATHS: count 0). */
void st__settings_free(const st__setting_t *rows, void *obj);

/* Stores v into the integer field (INT: the row's field; INTS: element i). */
void st__setting_set_int(const st__setting_t *row, void *obj, size_t i, int64_t v);

/* Replaces the owned string of the row's field with `text` (taken; the
 * old one is freed). */
void st__setting_set_text(const st__setting_t *row, void *obj, char *text);

/* RECORDS: element i of the row's array in obj; and the frees of every
 * element's strings (the sub-rows' and the name), the count set to 0. */
void *st__setting_record(const st__setting_t *row, void *obj, int i);
void st__settings_free_records(const st__setting_t *row, void *obj);

/* The int at count_offset (INTS, PATHS, STRINGS, RECORDS). */
int *st__setting_count(const st__setting_t *row, void *obj);

/* The field itself, for the reader's own stores (SECONDS: double *, MODE:
 * unsigned *, PATHS: char **). */
void *st__setting_field(const st__setting_t *row, void *obj);

/* Writes "<prefix>: name=value name=value ...\n" to out: the INT and
 * SECONDS rows of `rows` as obj holds them, each INT that is 0 followed by
 * "(<zero>)" when its row says what 0 stands for. Nothing when no row is
 * printable. */
void st__settings_print(FILE *out, const char *prefix, const st__setting_t *rows,
                        const void *obj);

/* The index of `word` for a WORD row (its parse function, else an exact
 * match among choices), or -1. */
int st__setting_word(const st__setting_t *row, const char *word);

/* Word lists "a|b|c" (WORD rows here, ENUM endpoint options in engine/):
 * the index of a word (-1 if none); the word at index i (*len bytes, not
 * NUL-terminated; NULL past the end); and "\"a\", \"b\" or \"c\"" into buf
 * (returns buf), for messages. */
int st__choices_index(const char *choices, const char *word);
const char *st__choices_word(const char *choices, int i, size_t *len);
const char *st__choices_text(const char *choices, char *buf, size_t len);

/* `dir` taken from the directory of config_path when it is relative (as
 * is when absolute, or when config_path has no directory). Owned by the
 * caller; NULL when out of memory. */
char *st__settings_resolve(const char *config_path, const char *dir);

#endif
