// What the CPU backend says about the machine it runs on (qg_context_device_name of a CPU
// context).
#include <stdio.h>
#include <string.h>

#include "tiers.h"

namespace qg {

void cpu_model_name(char* buf, size_t size) {
    snprintf(buf, size, "CPU");
    FILE* f = fopen("/proc/cpuinfo", "r");
    if (f == nullptr) return;
    char line[512];
    while (fgets(line, sizeof(line), f) != nullptr) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char* colon = strchr(line, ':');
        if (colon == nullptr) break;
        const char* v = colon + 1;
        while (*v == ' ' || *v == '\t') ++v;
        snprintf(buf, size, "%s", v);
        buf[strcspn(buf, "\r\n")] = '\0';
        break;
    }
    fclose(f);
}

}  // namespace qg
