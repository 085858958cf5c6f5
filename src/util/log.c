#include "util/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int current_level = -1;
static int process_tag = -1;  // a follower process of a multi-node job tags its lines

void kaon_log_set_process(int rank) { process_tag = rank; }

static int level_from_env(void) {
    const char *s = getenv("KAON_LOG");
    if (!s) return KAON_LOG_INFO;
    if (!strcmp(s, "debug")) return KAON_LOG_DEBUG;
    if (!strcmp(s, "warn")) return KAON_LOG_WARN;
    if (!strcmp(s, "error")) return KAON_LOG_ERROR;
    return KAON_LOG_INFO;
}

void kaon_log_set_level(enum kaon_log_level level) { current_level = (int)level; }

int kaon_log_enabled(enum kaon_log_level level) {
    if (current_level < 0) current_level = level_from_env();
    return (int)level >= current_level;
}

void kaon_log(enum kaon_log_level level, const char *fmt, ...) {
    static const char *names[] = {"debug", "info", "warn", "error"};
    if (!kaon_log_enabled(level)) return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (process_tag > 0) fprintf(stderr, "kaon[%d] %s: %s\n", process_tag, names[level], line);
    else fprintf(stderr, "kaon %s: %s\n", names[level], line);
}
