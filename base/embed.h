/* embed.h: files compiled into the binary by cmake/embed.c (the dashboard's
 * static files and the default training corpus). Each table ends with an
 * entry whose name is NULL. */
#ifndef PP_EMBED_H
#define PP_EMBED_H
#include <stddef.h>

typedef struct pp_embedded_file {
    const char *name;          /* path relative to the source root, e.g. "static/index.html" */
    const unsigned char *data; /* the bytes, followed by a NUL */
    size_t size;               /* byte count, without the NUL */
} pp_embedded_file;

extern const pp_embedded_file pp_static_files[];
extern const pp_embedded_file pp_corpus_files[];

/* Returns the entry named `name` in `table`, or NULL. */
const pp_embedded_file *pp_embed_find(const pp_embedded_file *table, const char *name);

#endif
