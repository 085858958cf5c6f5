// Logging to stderr. Level from KAON_LOG (debug|info|warn|error; default info).
#ifndef KAON_UTIL_LOG_H
#define KAON_UTIL_LOG_H

#include "util/err.h"

enum kaon_log_level { KAON_LOG_DEBUG = 0, KAON_LOG_INFO, KAON_LOG_WARN, KAON_LOG_ERROR };

void kaon_log(enum kaon_log_level level, const char *fmt, ...) KAON_PRINTF(2, 3);
void kaon_log_set_level(enum kaon_log_level level);
int kaon_log_enabled(enum kaon_log_level level);
// Lines of process rank > 0 of a multi-node job read "kaon[rank] info: ...".
void kaon_log_set_process(int rank);

#define KAON_DEBUG(...) kaon_log(KAON_LOG_DEBUG, __VA_ARGS__)
#define KAON_INFO(...) kaon_log(KAON_LOG_INFO, __VA_ARGS__)
#define KAON_WARN(...) kaon_log(KAON_LOG_WARN, __VA_ARGS__)

#endif
