// Runtime choice of the int8 kernels' instruction set (see cpu_isa.h).
//
// A level is usable when three things agree:
//   - the CPU: cpuid leaf 7 (AVX2 = EBX bit 5, AVX512F = EBX 16, AVX512BW = EBX 30,
//     AVX512VL = EBX 31, AVX512_VNNI = ECX 11, AMX-TILE = EDX 24, AMX-INT8 = EDX 25;
//     AVX512_VBMI = ECX 1 for int8_vbmi) and leaf 1 (FMA = ECX 12, F16C = ECX 29,
//     OSXSAVE = ECX 27) -- Intel SDM vol. 2, CPUID;
//   - the OS: XCR0 (xgetbv 0) has the state components the registers need: SSE and AVX
//     (bits 1, 2) for ymm; opmask, ZMM_Hi256 and Hi16_ZMM (5, 6, 7) for AVX-512; XTILECFG
//     and XTILEDATA (17, 18) for AMX -- SDM vol. 1, 13.3;
//   - for AMX, Linux 5.16+: a process must ask for the tile data state once with
//     arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) before using it, or its first
//     tile instruction faults (Documentation/arch/x86/xstate.rst).
// and this compiler could build the level's kernels (QG_INT8_HAVE_* in int8_kernels.h).
#include "cpu/cpu_isa.h"

#include <stdlib.h>
#include <string.h>

#include "cpu/int8_kernels.h"
#include "tiers.h"

#if QG_INT8_X86
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace qg {
namespace cpu {

const char* isa_name(Isa isa) {
    switch (isa) {
        case Isa::AVX2: return "avx2";
        case Isa::AVX512_VNNI: return "avx512vnni";
        case Isa::AMX: return "amx";
        default: return "scalar";
    }
}

namespace {

#if QG_INT8_X86
struct CpuId {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

CpuId cpuid(unsigned leaf, unsigned sub) {
    CpuId r;
    if (!__get_cpuid_count(leaf, sub, &r.eax, &r.ebx, &r.ecx, &r.edx)) r = CpuId{};
    return r;
}

unsigned long long xcr0() {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

bool bit(unsigned v, int b) { return (v >> b) & 1u; }

// ARCH_REQ_XCOMP_PERM and XFEATURE_XTILEDATA from <asm/prctl.h> (Linux 5.16), spelled
// out so that older headers build.
constexpr int ARCH_REQ_XCOMP_PERM = 0x1023;
constexpr int XFEATURE_XTILEDATA = 18;

bool amx_permitted(const char** why) {
#if defined(__linux__) && defined(SYS_arch_prctl)
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        *why = "arch_prctl(ARCH_REQ_XCOMP_PERM) refused (kernel before 5.16?)";
        return false;
    }
    return true;
#else
    *why = "not Linux: no arch_prctl to ask for the tile state";
    return false;
#endif
}

// The widest level this CPU, OS and compiler allow; why_not[level] says why each wider
// level is out.
Isa detect(const char* why_not[4]) {
    const CpuId l1 = cpuid(1, 0), l7 = cpuid(7, 0);
    const bool osxsave = bit(l1.ecx, 27);
    const unsigned long long x = osxsave ? xcr0() : 0;
    const bool ymm_os = (x & 0x6) == 0x6, zmm_os = (x & 0xe6) == 0xe6, tile_os = (x & 0x60000) == 0x60000;
    Isa best = Isa::SCALAR;
    if (!(bit(l7.ebx, 5) && bit(l1.ecx, 12) && bit(l1.ecx, 29))) {
        why_not[1] = "cpu lacks avx2/fma/f16c";
    } else if (!ymm_os) {
        why_not[1] = "os does not save ymm state (xcr0)";
    } else if (!QG_INT8_HAVE_AVX2) {
        why_not[1] = "not built (compiler)";
    } else {
        best = Isa::AVX2;
    }
    const bool avx512 = bit(l7.ebx, 16) && bit(l7.ebx, 30) && bit(l7.ebx, 31) && bit(l7.ecx, 11);
    if (best < Isa::AVX2) {
        why_not[2] = "needs avx2";
    } else if (!avx512) {
        why_not[2] = "cpu lacks avx512 f/bw/vl/vnni";
    } else if (!zmm_os) {
        why_not[2] = "os does not save zmm state (xcr0)";
    } else if (!QG_INT8_HAVE_AVX512) {
        why_not[2] = "not built (compiler)";
    } else {
        best = Isa::AVX512_VNNI;
    }
    const char* why = nullptr;
    if (best < Isa::AVX512_VNNI) {
        why_not[3] = "needs avx512vnni";
    } else if (!(bit(l7.edx, 24) && bit(l7.edx, 25))) {
        why_not[3] = "cpu lacks amx-tile/amx-int8";
    } else if (!tile_os) {
        why_not[3] = "os does not enable tile state (xcr0)";
    } else if (!QG_INT8_HAVE_AMX) {
        why_not[3] = "not built (compiler)";
    } else if (!amx_permitted(&why)) {
        why_not[3] = why;
    } else {
        best = Isa::AMX;
    }
    return best;
}
#else
Isa detect(const char* why_not[4]) {
    why_not[1] = why_not[2] = why_not[3] = "not an x86-64 build";
    return Isa::SCALAR;
}
#endif

// QG_CPU_ISA=<name> caps the level (never raises it); an unknown name is ignored and logged.
Isa choose() {
    const char* why_not[4] = {nullptr, nullptr, nullptr, nullptr};
    const Isa cpu = detect(why_not);
    Isa isa = cpu;
    const char* cap = getenv("QG_CPU_ISA");
    bool capped = false;
    if (cap != nullptr && *cap != '\0') {
        bool known = false;
        for (int i = 0; i <= (int)Isa::AMX; ++i) {
            if (strcmp(cap, isa_name((Isa)i)) == 0) {
                known = true;
                if ((Isa)i < isa) {
                    isa = (Isa)i;
                    capped = true;
                }
            }
        }
        if (!known) log_once("cpu int8: QG_CPU_ISA=%s is not one of scalar, avx2, avx512vnni, amx: ignored", cap);
    }
    if (log_enabled()) {
        if (capped)
            log_once("cpu int8 isa=%s (QG_CPU_ISA=%s; this cpu allows %s)", isa_name(isa), cap, isa_name(cpu));
        else
            log_once("cpu int8 isa=%s", isa_name(isa));
        for (int i = (int)cpu + 1; i <= (int)Isa::AMX; ++i)
            log_once("cpu int8: %s not used: %s", isa_name((Isa)i), why_not[i] ? why_not[i] : "?");
    }
    return isa;
}

}  // namespace

Isa int8_isa() {
    static const Isa isa = choose();  // thread-safe once (C++11 magic static)
    return isa;
}

bool int8_vbmi() {
    static const bool vbmi = [] {
#if QG_INT8_HAVE_AVX512
        // the level's checks (zmm state included) hold from AVX512_VNNI on
        const bool on = int8_isa() >= Isa::AVX512_VNNI && bit(cpuid(7, 0).ecx, 1);
#else
        const bool on = false;
#endif
        log_once("cpu int8: avx512vbmi decoders %s", on ? "used" : "not used");
        return on;
    }();
    return vbmi;
}

bool int8_rows_zmm() {
    static const bool zmm = [] {
        const char* want = getenv("QG_CPU_ROWS");
        const bool asked = want != nullptr && strcmp(want, "zmm") == 0;
        if (want != nullptr && *want != '\0' && !asked && strcmp(want, "ymm") != 0)
            log_once("cpu int8: QG_CPU_ROWS=%s is not ymm or zmm: ignored", want);
        const bool on = asked && int8_isa() >= Isa::AVX512_VNNI;
        log_once("cpu int8: rows kernel on %s%s", on ? "zmm" : "ymm",
                 asked && !on ? " (QG_CPU_ROWS=zmm needs avx512vnni)" : "");
        return on;
    }();
    return zmm;
}

}  // namespace cpu
}  // namespace qg
