// Thread-local last-error sentence (qg_last_error) and the QG_LOG=1 log.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>
#include <set>
#include <string>

#include "tiers.h"

namespace qg {

// One sentence per thread; 512 bytes hold the longest message with its numbers.
static thread_local char t_last_error[512] = {0};

qg_status set_error(qg_status status, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_last_error, sizeof(t_last_error), fmt, ap);
    va_end(ap);
    return status;
}

// The sentence of the last failed call on this thread (qg_last_error), "" if none.
const char* last_error() { return t_last_error; }

bool log_enabled() {
    // Read once: the environment of a running process is not expected to change.
    static const bool enabled = [] {
        const char* v = getenv("QG_LOG");
        return v != nullptr && strcmp(v, "0") != 0 && v[0] != '\0';
    }();
    return enabled;
}

void log_once(const char* fmt, ...) {
    if (!log_enabled()) return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);

    static std::mutex mutex;
    static std::set<std::string> seen;
    std::lock_guard<std::mutex> lock(mutex);
    if (!seen.insert(line).second) return;
    fprintf(stderr, "[quantgemm] %s\n", line);
    fflush(stderr);
}

}  // namespace qg
