// Which instruction set the CPU tier's int8 kernels run with (cpu_isa.cpp), decided once
// per process: what the CPU reports (cpuid), what the OS saves on a context switch (XCR0)
// and, for AMX, what the kernel grants (arch_prctl(ARCH_REQ_XCOMP_PERM)), capped by the
// environment variable QG_CPU_ISA (scalar | avx2 | avx512vnni | amx) for tests and
// measurements. Every level computes the same bits (.ci/isa_check.sh): the choice changes
// speed only. QG_LOG=1 prints the choice and the reason for each level left out.
#pragma once

namespace qg {
namespace cpu {

// Ordered: each level may use everything below it.
enum class Isa : int {
    SCALAR = 0,      // portable C++ (any CPU, any compiler)
    AVX2 = 1,        // vpmaddubsw / vpmaddwd, 256-bit
    AVX512_VNNI = 2, // vpdpbusd, 512-bit (AVX-512 F, BW, VL and VNNI)
    AMX = 3,         // AMX-INT8 tiles (tdpbssd) for large M, AVX-512 VNNI for the rest
};

// The level the int8 kernels use in this process.
Isa int8_isa();

const char* isa_name(Isa isa);

// AVX-512 VBMI (vpermb, vpermi2b, vpmultishiftqb) at level AVX512_VNNI and up: a choice of
// decoder within the level (iq3_xxs, iq3_xxs_vbmi.h) that gives the same codes, so the same
// bits. False where the level is capped below AVX512_VNNI. QG_LOG=1 prints it once.
bool int8_vbmi();

// The int8 rows kernel (small M, int8_rows.cpp) on zmm, 16 weight rows a pass, instead of
// ymm, 8 rows a pass: at level AVX512_VNNI and up where QG_CPU_ROWS=zmm asks for it (ymm is
// the default, QG_CPU_ROWS=ymm the same). The same bits either way. On a Xeon with AMX the
// zmm copy measured slower at M = 1: 0-32 % warm on one thread, 1-20 % on the bench's cold
// 14336 x 4096 on 2 threads (bench/NOTES.md, "CPU int8 at M = 1 on a Xeon with AMX": port
// 1 takes no vector work while 512-bit instructions run, and the 16 row pointers leave
// general registers short). On a Zen 4 (bench/NOTES.md, "CPU int8 at M = 1 on a Zen 4:
// prefetch into L2") it measured no better either: cold 14336 x 4096 M = 1 on 2 threads
// 0.82-1.16 of ymm by format (q4_0 faster, int4 and q6_K slower), even warm. So it waits
// for a CPU where it measures faster (Zen 5 is not measured). QG_LOG=1 prints the choice
// once, when the rows kernel first runs.
bool int8_rows_zmm();

}  // namespace cpu
}  // namespace qg
