#include "util/cpus.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int kaon_usable_cpus(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        const int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static int read_topology(int cpu, const char *what) {
    char path[128];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/%s", cpu, what);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int v = -1;
    if (fscanf(f, "%d", &v) != 1) v = -1;
    fclose(f);
    return v;
}

int kaon_default_threads(void) {
    const int usable = kaon_usable_cpus();
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return usable;
    // (package, core) pairs seen so far; at most one per usable CPU.
    int(*seen)[2] = malloc(sizeof *seen * (size_t)CPU_SETSIZE);
    if (!seen) return usable;
    int n = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &set)) continue;
        const int pkg = read_topology(c, "physical_package_id"), core = read_topology(c, "core_id");
        if (pkg < 0 || core < 0) {
            n = -1;  // no topology: count CPUs instead
            break;
        }
        int dup = 0;
        for (int i = 0; i < n && !dup; i++) dup = seen[i][0] == pkg && seen[i][1] == core;
        if (!dup) {
            seen[n][0] = pkg;
            seen[n][1] = core;
            n++;
        }
    }
    free(seen);
    return n > 0 ? n : usable;
}
