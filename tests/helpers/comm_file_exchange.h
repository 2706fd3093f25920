/* comm_file_exchange.h: a comm_exchange (runner/comm/comm.h) backed by files
 * in a directory, for tests and benchmarks that fork ranks: put writes a
 * temporary file and renames it into place (readers never see half a
 * value), get polls for the file until its timeout. */
#ifndef PP_COMM_FILE_EXCHANGE_H
#define PP_COMM_FILE_EXCHANGE_H
#include "runner/comm/comm.h"

/* dir must exist; the returned exchange keeps the pointer (caller owns dir). */
comm_exchange fx_exchange(const char *dir);
int fx_put(void *dir, const char *key, const void *value, size_t len, pp_err *err);
int fx_get(void *dir, const char *key, void *value, size_t cap, size_t *len, int timeout_ms, pp_err *err);

#endif
