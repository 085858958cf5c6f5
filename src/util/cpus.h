// How many CPUs this process has, for thread counts.
#ifndef KAON_UTIL_CPUS_H
#define KAON_UTIL_CPUS_H

// CPUs this process may run on (its affinity mask), at least 1.
int kaon_usable_cpus(void);

// Threads worth using by default: the physical cores (distinct package and core ids in sysfs)
// among the usable CPUs; the usable CPUs when sysfs says nothing. Hyperthreads of one core
// share its vector units, so a second kernel thread on them mostly adds synchronisation.
int kaon_default_threads(void);

#endif
