// Writes the int8 path's results (cpu_precision = 2) for fixed pseudo-random weights of
// every format and activations at several M to the file named by argv[1]: M = 1, 2, 4
// (small-M kernels), 3, 5, 17 (panel kernels, tails of 4 and 2 rows), 32, 64, 70 (AMX
// tiles where the CPU has them, plus a VNNI tail). .ci/isa_check.sh runs it under every
// QG_CPU_ISA cap and against libraries built by GCC and clang, and requires identical
// files: every ISA level computes the same bits. Every GGUF weight runs twice, in its
// blocks and in the rows8 layout (qg_gguf_repack), which must give the blocks' bits. Inputs are finite (the non-finite
// fallback is the fp32-exact path, which is not bit-identical across ISA levels).
#include <stdio.h>
#include <string.h>

#include <random>
#include <vector>

#include "dump_file.h"
#include "quantgemm.h"

namespace {

constexpr int64_t N = 37, K = 1280;  // N off the 8- and 16-row tiles; K: 2.5 chunks of 512
const int64_t MS[] = {1, 2, 3, 4, 5, 17, 32, 64, 70};

struct Gguf {
    qg_format format;
    int block_elems, block_bytes;
    int f16[2];  // byte offsets of the fp16 scales (d, q4_K's dmin; -1: none), kept small and finite
};
const Gguf GGUF[] = {{QG_FORMAT_Q8_0, 32, 34, {0, -1}},     {QG_FORMAT_Q4_0, 32, 18, {0, -1}},
                     {QG_FORMAT_Q4_K, 256, 144, {0, 2}},    {QG_FORMAT_Q6_K, 256, 210, {208, -1}},
                     {QG_FORMAT_IQ4_XS, 256, 136, {0, -1}}, {QG_FORMAT_IQ3_XXS, 256, 98, {0, -1}}};

std::vector<uint8_t> bytes(size_t n, std::mt19937& g) {
    std::vector<uint8_t> v(n);
    for (auto& c : v) c = (uint8_t)g();
    return v;
}

// fp16 activations in [-2, 2), never zero
std::vector<uint16_t> activations(int64_t m, std::mt19937& g) {
    std::vector<uint16_t> x((size_t)(m * K));
    for (auto& h : x) h = (uint16_t)((g() & 0x8000u) | (0x3000u + g() % 0x1000u));
    return x;
}

bool check(qg_status st) {
    if (st != QG_OK) fprintf(stderr, "int8_dump: %s: %s\n", qg_status_string(st), qg_last_error());
    return st == QG_OK;
}

}  // namespace

int main(int argc, char** argv) {
    int status = 0;
    FILE* f = open_dump(argc, argv, &status);
    if (f == nullptr) return status;
    qg_context* ctx = nullptr;
    if (!check(qg_context_create(QG_BACKEND_CPU, 0, &ctx)) || !check(qg_context_set_option(ctx, "cpu_precision", 2)))
        return 1;
    std::mt19937 g(7);
    std::vector<float> y;
    bool ok = true;
    for (const Gguf& fmt : GGUF) {
        const int64_t ldw = K / fmt.block_elems * fmt.block_bytes;
        std::vector<uint8_t> w = bytes((size_t)(N * ldw), g);
        for (int64_t b = 0; b < N * K / fmt.block_elems; ++b) {  // +-[2^-10, 2^-9): exponent 5
            for (int off : fmt.f16) {
                if (off < 0) continue;
                uint8_t* d = w.data() + b * fmt.block_bytes + off;
                d[0] = (uint8_t)g();
                d[1] = (uint8_t)(0x14 | (g() & 0x3) | (g() & 0x80));
            }
        }
        // the same weight in the rows8 layout (qg_gguf_repack): its results follow the blocks'
        // and must equal them
        qg_gguf_repack_args r;
        memset(&r, 0, sizeof r);
        r.size = sizeof r;
        r.layout = QG_GGUF_LAYOUT_ROWS8, r.format = fmt.format, r.n = N, r.k = K, r.w = w.data(), r.ldw = ldw;
        size_t w8_bytes = 0, s8_bytes = 0;
        ok = ok && check(qg_gguf_repack_size(&r, &w8_bytes, &s8_bytes));
        std::vector<uint8_t> w8(w8_bytes);
        r.out_w = w8.data();
        ok = ok && check(qg_gguf_repack(ctx, &r, nullptr));
        std::vector<float> y8;
        for (int64_t m : MS) {
            std::vector<uint16_t> x = activations(m, g);
            y.assign((size_t)(m * N), 0.0f);
            y8.assign((size_t)(m * N), -1.0f);
            qg_gguf_gemm_args a;
            memset(&a, 0, sizeof a);
            a.size = sizeof a;
            a.format = fmt.format;
            a.m = m, a.n = N, a.k = K;
            a.x_dtype = QG_DTYPE_F16, a.y_dtype = QG_DTYPE_F32;
            a.x = x.data(), a.ldx = K, a.w = w.data(), a.ldw = ldw, a.y = y.data(), a.ldy = N;
            ok = ok && check(qg_gguf_gemm(ctx, &a, nullptr));
            fwrite(y.data(), sizeof(float), y.size(), f);
            a.layout = QG_GGUF_LAYOUT_ROWS8, a.w = w8.data(), a.ldw = 0, a.y = y8.data();
            ok = ok && check(qg_gguf_gemm(ctx, &a, nullptr));
            fwrite(y8.data(), sizeof(float), y8.size(), f);
            if (memcmp(y.data(), y8.data(), y.size() * sizeof(float)) != 0) {
                fprintf(stderr, "int8_dump: format %d m=%lld: the rows8 layout's bits differ from the blocks'\n",
                        (int)fmt.format, (long long)m);
                ok = false;
            }
        }
    }
    {  // MXFP4: E8M0 scales 2^-4 .. 2^3
        std::vector<uint8_t> blocks = bytes((size_t)(N * K / 2), g), scales((size_t)(N * K / 32));
        for (auto& e : scales) e = (uint8_t)(123 + g() % 8);
        for (int64_t m : MS) {
            std::vector<uint16_t> x = activations(m, g);
            y.assign((size_t)(m * N), 0.0f);
            qg_mxfp4_gemm_args a;
            memset(&a, 0, sizeof a);
            a.size = sizeof a;
            a.m = m, a.n = N, a.k = K;
            a.x_dtype = QG_DTYPE_F16, a.y_dtype = QG_DTYPE_F32;
            a.x = x.data(), a.ldx = K, a.blocks = blocks.data(), a.scales = scales.data(), a.y = y.data(), a.ldy = N;
            ok = ok && check(qg_mxfp4_gemm(ctx, &a, nullptr));
            fwrite(y.data(), sizeof(float), y.size(), f);
        }
    }
    // int4: N rounded up to the 8 rows of a zero-point word, G = 64, fp16 scales; then
    // symmetric (no qzeros), N = 56 (a last panel of 8 rows), G = 32, bf16 scales
    for (int v = 0; v < 2; ++v) {
        const bool sym = v == 1;
        const int64_t n = sym ? 56 : 40, G = sym ? 32 : 64;
        std::vector<uint8_t> qw = bytes((size_t)(n * K / 2), g), qz = bytes((size_t)(n / 8 * K / G * 4), g);
        std::vector<uint16_t> sc((size_t)(n * K / G));
        // fp16 2^-7 .. 2^-6 (exponent 8); bf16 2^-7 .. 2^-6 (exponent 120)
        for (auto& s : sc) s = sym ? (uint16_t)(0x3c00u + g() % 0x80u) : (uint16_t)(0x2000u + g() % 0x400u);
        for (int64_t m : MS) {
            std::vector<uint16_t> x = activations(m, g);
            y.assign((size_t)(m * n), 0.0f);
            qg_w4a16_gemm_args a;
            memset(&a, 0, sizeof a);
            a.size = sizeof a;
            a.m = m, a.n = n, a.k = K, a.group_size = (int)G;
            a.x_dtype = QG_DTYPE_F16, a.y_dtype = QG_DTYPE_F32, a.scale_dtype = sym ? QG_DTYPE_BF16 : QG_DTYPE_F16;
            a.zero_dtype = QG_DTYPE_U4X8;
            a.x = x.data(), a.ldx = K, a.qweight = (const int32_t*)qw.data(), a.scales = sc.data();
            a.qzeros = sym ? nullptr : (const int32_t*)qz.data(), a.y = y.data(), a.ldy = n;
            ok = ok && check(qg_w4a16_gemm(ctx, &a, nullptr));
            fwrite(y.data(), sizeof(float), y.size(), f);
        }
    }
    qg_context_destroy(ctx);
    return fclose(f) == 0 && ok ? 0 : 1;
}
