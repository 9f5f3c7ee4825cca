// y[M, N] = x[M, K] @ W[N, K]^T on the CPU tier's int8 path (arithmetic: int8_kernels.h):
// x quantized once per pass of M_BLOCK rows (q8_act.h); weight rows in parallel panels of
// PANEL_ROWS, each K chunk decoded to int8 (int8_decode.h), interleaved and multiplied
// with every activation row of the pass (int8_dot.cpp).
//
// Rows of x holding NaN or inf, and weight rows with a non-finite scale, are computed
// again by the fp32-exact path (dense_gemm.h) afterwards, so that non-finite values
// propagate as the float reference says (docs/guarantees.md); those outputs are the
// fp32-exact path's.
#pragma once

#include <stdint.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "cpu/cpu_isa.h"
#include "cpu/dense_gemm.h"
#include "cpu/int8_decode.h"
#include "cpu/int8_kernels.h"
#include "cpu/int8_rows.h"
#include "cpu/q8_act.h"
#include "tiers.h"

namespace qg {
namespace cpu {

// cpu_precision (qg_context_set_option): 0 auto, 1 fp32-exact, 2 int8.
constexpr int64_t CPU_PRECISION_FP32 = 1;
constexpr int64_t CPU_PRECISION_INT8 = 2;

// Auto takes the int8 path: it measured faster than the fp32-exact path for every format
// at every M in bench/NOTES.md ("CPU tier: the int8 path"; one machine, AVX2), and its
// numpy model is what the int8 tests compare with.
inline bool use_int8(const qg_context* ctx) { return ctx == nullptr || ctx->cpu_precision != CPU_PRECISION_FP32; }

// K elements decoded per panel pass: the panel (16 rows) takes 8 KiB of L1 beside the
// activations (not tuned: chosen to fit, like the fp32 path's TILE_K).
constexpr int64_t INT8_TILE_K = 512;
static_assert(INT8_TILE_K / Q8_BLOCK <= AMX_MAX_NB, "the AMX kernels' buffers hold a chunk");

// How the panels are shared out. The panel kernels (M > rows_max_m()): one panel a task,
// handed out in turn (they decode into a panel first, and their M rows of work hide the
// rows' latency). The small-M kernel prefetches the rows of its next passes, past a panel's
// end the next panel's, so a thread wants consecutive panels: PanelRanges gives each thread
// (task) a contiguous range, which it takes from the front one panel at a time, and then the
// panels left at the back of the other ranges, so that a thread slowed by other load (or a
// helper that came late) leaves the tail of its range to the others. A range's front (high
// 32 bits) and back (low 32, exclusive) are one word, claimed by compare and swap.
// Measured against the tasks of consecutive panels it replaces (about 8 a thread, handed
// out in turn): 0.90-0.97 of the time cold at M = 1 on 2 threads, as fast as one fixed range
// a thread (bench/NOTES.md, "CPU int8 at M = 1 on the AMX Xeon"); 8 tasks a thread had been
// 1.3x faster than one panel a task on a Xeon, a fixed range a thread up to 2x slower when
// other load stalled a thread.
class PanelRanges {
  public:
    PanelRanges(int64_t n_panels, int ranges) : ranges_(ranges) {
        for (int t = 0; t < ranges; ++t) {
            const uint64_t f = (uint64_t)(n_panels * t / ranges), b = (uint64_t)(n_panels * (t + 1) / ranges);
            ranges_[t].fb.store(f << 32 | b, std::memory_order_relaxed);
        }
    }
    int count() const { return (int)ranges_.size(); }
    // fn(panel) for every panel of range t that no other task took, then for those left
    // at the back of the other ranges
    template <class Fn>
    void run(int t, Fn&& fn) {
        const int n = count();
        for (int64_t p; (p = claim(t, true)) >= 0;) fn(p);
        for (int i = 1; i < n; ++i)
            for (int64_t p; (p = claim((t + i) % n, false)) >= 0;) fn(p);
    }

  private:
    struct alignas(64) Range {
        std::atomic<uint64_t> fb{0};
    };
    // a panel of range r from its front (or back); -1 when none is left
    int64_t claim(int r, bool front) {
        std::atomic<uint64_t>& a = ranges_[r].fb;
        uint64_t v = a.load(std::memory_order_relaxed);
        for (;;) {
            const uint64_t f = v >> 32, b = v & 0xffffffffu;
            if (f >= b) return -1;
            const uint64_t w = front ? ((f + 1) << 32 | b) : (f << 32 | (b - 1));
            if (a.compare_exchange_weak(v, w, std::memory_order_relaxed)) return (int64_t)(front ? f : b - 1);
        }
    }
    std::vector<Range> ranges_;
};

// Per-thread buffers of one panel.
struct PanelScratch {
    std::vector<int8_t> rows, codes;  // [PANEL_ROWS][INT8_TILE_K], [INT8_TILE_K / 32][512]
    std::vector<float> sw, mw;        // [INT8_TILE_K / 32][PANEL_ROWS]
    std::vector<int32_t> sub;         // [INT8_TILE_K / 32][2][PANEL_ROWS]
    PanelScratch()
        : rows(PANEL_ROWS * INT8_TILE_K),
          codes(PANEL_ROWS * INT8_TILE_K),
          sw(INT8_TILE_K / Q8_BLOCK * PANEL_ROWS),
          mw(INT8_TILE_K / Q8_BLOCK * PANEL_ROWS),
          sub(2 * INT8_TILE_K / Q8_BLOCK * PANEL_ROWS) {}
};

inline void log_int8(const char* family, const char* format, int64_t M, int64_t N, int64_t K) {
    log_once("cpu %s format=%s path=int8 isa=%s m=%lld n=%lld k=%lld", family, format, isa_name(int8_isa()),
             (long long)M, (long long)N, (long long)K);
}

// Row n0 + r of a panel of count rows: rows past count repeat the last one (computed,
// never stored).
inline int64_t panel_row(int64_t n0, int count, int r) { return n0 + (r < count ? r : count - 1); }
// Row r < SRC_ROWS of a source (int8_rows.h) of the panel at n0 of count rows, N in all:
// panel_row, then the next panel's rows, the last row of the weight past its end.
inline int64_t src_row(int64_t n0, int count, int64_t N, int r) {
    return r < PANEL_ROWS ? panel_row(n0, count, r) : std::min<int64_t>(n0 + r, N - 1);
}

// source(n0, count): the int8_rows.h source (GgufSrc, Mxfp4Src, Int4Src) of the panel of
// weight rows n0 .. n0 + count - 1, read by the AVX2 decoders. decode(n, k0, kc, out): the
// portable decoder of weight row n, k in [k0, k0 + kc), as int8 (Int8Out); false when a
// scale is not finite. fdecode(n, k0, kc, dst): the same elements as floats (the
// fp32-exact path's decoder). store(m, n, v): writes the fp32 result of y[m, n].
template <class Source, class Decode, class FloatDecode, class Store>
void int8_gemm(const qg_context* ctx, Int8Kind kind, int64_t M, int64_t N, int64_t K, qg_dtype x_dtype,
               const void* x, int64_t ldx, Source&& source, Decode&& decode, FloatDecode&& fdecode, Store&& store) {
    const int threads = gemm_threads(ctx, M, N, K);
    const bool avx2 = rows_available();          // the AVX2 decoders of int8_rows.h
    const bool small_m = avx2 && M <= rows_max_m();  // ... multiplying at once, no panel
    const int64_t n_panels = (N + PANEL_ROWS - 1) / PANEL_ROWS;
    const int esize = dtype_bytes(x_dtype);
    std::vector<uint8_t> bad_row((size_t)N, 0);  // weight rows with a non-finite scale
    Q8Act act;
    for (int64_t m0 = 0; m0 < M; m0 += M_BLOCK) {
        const int64_t mb = std::min(M_BLOCK, M - m0);
        quantize_activations(x_dtype, (const char*)x + m0 * ldx * esize, ldx, mb, K, threads, &act);
        const auto panel = [&](int64_t t) {
            thread_local PanelScratch s;
            const int64_t n0 = t * PANEL_ROWS;
            const int R = (int)std::min<int64_t>(PANEL_ROWS, N - n0);
            float* acc = scratch_floats((size_t)(mb * PANEL_ROWS), 0);
            std::fill(acc, acc + mb * PANEL_ROWS, 0.0f);
            bool ok[PANEL_ROWS];
            std::fill(ok, ok + PANEL_ROWS, true);
            // y's lines of this panel, asked for while the panel computes: the store loop below
            // found them cold (q6_K 14336 x 4096, M = 256: the stores took ~10 of 60 ms)
            for (int64_t i = 0; !small_m && i < mb; ++i) store.prefetch(m0 + i, n0);
            const auto src = avx2 ? source(n0, R) : decltype(source(n0, R)){};
            if (small_m) {
                const Q8Rows xr{act.q.data(), act.dx.data(), act.dS.data(), act.S.data(), act.S16.data(),
                                K,            K / Q8_BLOCK,  mb};
                rows_kernel(src, R, K, xr, acc, ok);
            }
            for (int64_t k0 = 0; !small_m && k0 < K; k0 += INT8_TILE_K) {
                const int64_t kc = std::min(INT8_TILE_K, K - k0), nb = kc / Q8_BLOCK;
                if (avx2) {
                    panel_fill(src, k0, kc, PanelOut{s.codes.data(), s.sw.data(), s.mw.data(), s.sub.data()}, ok);
                } else {
                    for (int r = 0; r < PANEL_ROWS; ++r)  // rows past R repeat the last (never stored)
                        ok[r] &= decode(panel_row(n0, R, r), k0, kc,
                                        Int8Out{s.rows.data() + r * INT8_TILE_K, s.sw.data() + r, s.mw.data() + r,
                                                s.sub.data() + r});
                    panel_interleave(s.rows.data(), INT8_TILE_K, nb, s.codes.data());
                }
                const int64_t b0 = k0 / Q8_BLOCK;
                const Panel p{s.codes.data(), s.sw.data(), kind.mw ? s.mw.data() : nullptr,
                              kind.sub ? s.sub.data() : nullptr, nb};
                const Q8Rows xr{act.q.data() + k0,       act.dx.data() + b0, act.dS.data() + b0,
                                act.S.data() + b0,       act.S16.data() + 2 * b0,
                                K,                       K / Q8_BLOCK,       mb};
                panel_dot(kind, p, xr, acc);
            }
            for (int r = 0; r < R; ++r) bad_row[n0 + r] = ok[r] ? 0 : 1;
            const bool all_ok = std::all_of(ok, ok + R, [](bool v) { return v; });
            for (int64_t i = 0; i < mb; ++i) {
                if (!act.finite[i]) continue;
                if (all_ok) {
                    store.row(m0 + i, n0, acc + i * PANEL_ROWS, R);
                    continue;
                }
                for (int r = 0; r < R; ++r)
                    if (ok[r]) store(m0 + i, n0 + r, acc[i * PANEL_ROWS + r]);
            }
        };
        if (small_m) {
            PanelRanges ranges(n_panels, (int)std::min<int64_t>(threads, n_panels));
            parallel_for(ranges.count(), threads, [&](int64_t task, int) { ranges.run((int)task, panel); });
        } else {
            parallel_for(n_panels, threads, [&](int64_t t, int) { panel(t); });
        }
        // the fp32-exact path for rows of x holding NaN or inf: all of their outputs
        if (!act.all_finite) {
            for (int64_t i = 0; i < mb; ++i) {
                if (act.finite[i]) continue;
                dense_gemm(ctx, 1, N, K, x_dtype, (const char*)x + (m0 + i) * ldx * esize, ldx, fdecode,
                           [&](int64_t, int64_t n, float v) { store(m0 + i, n, v); });
            }
        }
    }
    // ... and for weight rows with a non-finite scale: their column of y
    for (int64_t n = 0; n < N; ++n) {
        if (!bad_row[n]) continue;
        dense_gemm(
            ctx, M, 1, K, x_dtype, x, ldx, [&](int64_t, int64_t k0, int64_t kc, float* dst) { fdecode(n, k0, kc, dst); },
            [&](int64_t m, int64_t, float v) { store(m, n, v); });
    }
}

}  // namespace cpu
}  // namespace qg
