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

}  // namespace cpu
}  // namespace qg
