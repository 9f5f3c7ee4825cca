// QG_CPU_CLONES: compile a CPU-tier hot loop once per x86-64 ISA level (AVX-512, AVX2,
// baseline) and pick the clone when the library is loaded (GNU ifunc). The library stays
// portable; the loops the compiler vectorises get the machine's widest vectors. Elsewhere
// (other OSes, other CPUs, other compilers) the function is compiled once, plainly.
#pragma once

// -DQG_CPU_NO_CLONES builds one plain copy: ThreadSanitizer crashes in ifunc resolvers,
// which run before its runtime is up.
#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(QG_CPU_NO_CLONES)
#define QG_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define QG_CPU_CLONES
#endif
