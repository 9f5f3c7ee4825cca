// The tier table of a kernel family: every way this build can run one entry point, as data.
//
// A family (w4a16, gguf, mxfp4, moe_*) lists its tiers once, in src/<family>_tiers.cpp:
//   {name, option, usable, workspace, launch}
// and one policy function, `choose`, holds the family's heuristics as named booleans with
// their measured reasons. src/api.cpp routes every call through select_tier() below:
//   - a tier forced by name (qg_context_set_tier) runs if it is usable, else
//     QG_ERR_UNSUPPORTED names why;
//   - a numeric "*_tier" option (GPU contexts) takes the first usable tier of that number;
//   - otherwise `choose` picks among the usable tiers.
// qg_build_info lists the names; QG_LOG=1 prints the tier chosen and why. Tiers never
// re-check arguments: api.cpp has validated them before any tier is asked.
#pragma once

#include <stddef.h>
#include <stdio.h>

#include "quantgemm.h"
#include "tiers.h"

namespace qg {

// a == b for two NUL-terminated strings (no <string.h> in device-compiled includers).
inline bool same_text(const char* a, const char* b) {
    while (*a != 0 && *a == *b) ++a, ++b;
    return *a == *b;
}

template <class Args>
struct Tier {
    const char* name;  // "cpu", "cuda:decode_frag": qg_build_info, QG_LOG, qg_context_set_tier
    int option;        // value of the family's numeric *_tier option that selects it (0: none)
    // Whether this tier can serve `a` on `ctx`; if not, *why is a sentence naming the
    // condition (static text, or a thread-local buffer valid until the next call).
    bool (*usable)(const qg_context* ctx, const Args& a, const char** why);
    // Workspace bytes the launch needs (nullptr: none).
    size_t (*workspace)(const qg_context* ctx, const Args& a);
    qg_status (*launch)(const qg_context* ctx, const Args& a, qg_stream stream);
};

template <class Args>
struct TierTable {
    const char* family;              // "w4a16": the qg_context_set_tier family name
    const Tier<Args>* const* tiers;  // the entries, each defined next to its launcher
    int count;
    // The auto policy: a usable tier for `a` and a short reason ("m=1 <= 16: memory-bound
    // decode"); nullptr only if no tier is usable.
    const Tier<Args>* (*choose)(const qg_context* ctx, const Args& a, const char** reason);
};

// The tables (src/w4a16_tiers.cpp, src/gguf_tiers.cpp, src/mxfp4_tiers.cpp).
const TierTable<qg_w4a16_gemm_args>& w4a16_tier_table();
const TierTable<qg_gguf_gemm_args>& gguf_tier_table();
const TierTable<qg_mxfp4_gemm_args>& mxfp4_tier_table();
const TierTable<qg_moe_align_args>& moe_align_tier_table();
const TierTable<qg_moe_stage1_args>& moe_stage1_tier_table();
const TierTable<qg_moe_stage2_args>& moe_stage2_tier_table();

// The GPU entries, defined next to their launchers (src/gpu/*_launch.cpp).
#if defined(QG_HAVE_GPU)
extern const Tier<qg_w4a16_gemm_args> gpu_w4a16_simt_tier;        // portable, every layout
extern const Tier<qg_w4a16_gemm_args> gpu_w4a16_decode_mma_tier;  // mma.sync, canonical layout
extern const Tier<qg_w4a16_gemm_args> gpu_w4a16_decode_frag_tier; // mma.sync, frag layout
extern const Tier<qg_w4a16_gemm_args> gpu_w4a16_prefill_tier;     // wgmma (sm_90a), frag layout
extern const Tier<qg_gguf_gemm_args> gpu_gguf_float_tier;         // fp32 x, portable
extern const Tier<qg_gguf_gemm_args> gpu_gguf_int8_tier;          // int8 x, mma.sync
extern const Tier<qg_gguf_gemm_args> gpu_gguf_prefill_tier;       // bf16 tiles, wgmma (sm_90a)
extern const Tier<qg_gguf_gemm_args> gpu_gguf_decode_frag_tier;   // frag layout: W4A16 decode_frag
extern const Tier<qg_gguf_gemm_args> gpu_gguf_prefill_frag_tier;  // frag layout: W4A16 prefill (sm_90a)
extern const Tier<qg_mxfp4_gemm_args> gpu_mxfp4_decode_frag_tier; // mma.sync, frag layout
extern const Tier<qg_mxfp4_gemm_args> gpu_mxfp4_prefill_tier;      // wgmma (sm_90a), frag layout
extern const Tier<qg_moe_align_args> gpu_moe_align_tier;          // one block, sm_80+
extern const Tier<qg_moe_stage1_args> gpu_moe_stage1_tier;        // mma.sync, MoE frag layout
extern const Tier<qg_moe_stage2_args> gpu_moe_stage2_tier;        // mma.sync, MoE frag layout
extern const Tier<qg_moe_stage1_args> gpu_moe_stage1_wgmma_tier;  // grouped wgmma prefill, tile_m 32..256 (sm_90a)
extern const Tier<qg_moe_stage2_args> gpu_moe_stage2_wgmma_tier;  // grouped wgmma prefill, tile_m 32..256 (sm_90a)
// The frag decode kernel holds at most this many rows of x per launch (two n8 tiles of
// mma.sync); above it a decode tier loops over 16-row launches, re-reading the weights each
// time. The W4A16 and MXFP4 policies send larger M to the prefill tier.
constexpr int64_t kFragDecodeRows = 16;

// The frag-layout policy (W4A16, MXFP4 dense, GGUF frag): prefill reads the weights once per
// token tile on the matrix units where decode re-reads them per 16 rows, so above 16 rows the
// prefill tier wins wherever it runs (measured crossover: bench/NOTES.md, "W4A16 prefill");
// else the decode tier. nullptr when neither is usable (the caller may try others).
template <class Args>
const Tier<Args>* choose_frag(const qg_context* ctx, const Args& a, const Tier<Args>& prefill,
                              const Tier<Args>& decode, const char** reason) {
    const bool many_rows = a.m > kFragDecodeRows;
    if (many_rows && usable(prefill, ctx, a)) {
        *reason = "m > 16 on the frag layout: prefill on wgmma";
        return &prefill;
    }
    if (!usable(decode, ctx, a)) return nullptr;
    *reason = !many_rows ? "m <= 16: memory-bound decode" : "frag layout, no wgmma here: decode per 16 rows";
    return &decode;
}
#endif

inline bool on_gpu(const qg_context* ctx) { return ctx->backend != QG_BACKEND_CPU; }

// Backend gates shared by every table: a tier of the CPU backend serves CPU contexts, a GPU
// tier contexts of this build's GPU backend; `why` names the mismatch.
bool cpu_context_only(const qg_context* ctx, const char** why);
bool gpu_context_only(const qg_context* ctx, const char** why);

// The GGUF tiers that read the .gguf blocks refuse a frag-layout weight (qg_gguf_repack's
// planes are the decode_frag / prefill_frag tiers').
inline bool gguf_blocks_only(const qg_gguf_gemm_args& a, const char** why) {
    if (a.layout == QG_GGUF_LAYOUT_BLOCKS) return true;
    *why = "reads the .gguf blocks (a frag-layout weight runs on decode_frag / prefill_frag)";
    return false;
}

// True when `t` is usable for `a` (the policy functions ask before they pick).
template <class Args>
bool usable(const Tier<Args>& t, const qg_context* ctx, const Args& a) {
    const char* why = nullptr;
    return t.usable(ctx, a, &why);
}

// First usable tier in table order, for families whose policy is "the one that fits".
template <class Args>
const Tier<Args>* first_usable(const TierTable<Args>& t, const qg_context* ctx, const Args& a) {
    for (int i = 0; i < t.count; ++i)
        if (usable(*t.tiers[i], ctx, a)) return t.tiers[i];
    return nullptr;
}

// The entry of `t` named `name`, or nullptr.
template <class Args>
const Tier<Args>* find_tier(const TierTable<Args>& t, const char* name) {
    for (int i = 0; i < t.count; ++i)
        if (same_text(t.tiers[i]->name, name)) return t.tiers[i];
    return nullptr;
}

// The tier a call runs on (see the header comment) and why. forced: the name set by
// qg_context_set_tier or nullptr; option: the numeric *_tier option (0 = none).
template <class Args>
qg_status select_tier(const qg_context* ctx, const TierTable<Args>& t, const Args& a, const char* forced,
                      int64_t option, const Tier<Args>** out, const char** reason) {
    if (forced != nullptr) {
        const Tier<Args>* f = find_tier(t, forced);
        const char* why = "";
        if (f == nullptr)
            return set_error(QG_ERR_UNSUPPORTED, "%s tier %s (forced by qg_context_set_tier) does not serve this entry point",
                             t.family, forced);
        if (!f->usable(ctx, a, &why))
            return set_error(QG_ERR_UNSUPPORTED, "%s tier %s (forced by qg_context_set_tier) cannot serve this call: %s",
                             t.family, f->name, why);
        *out = f;
        *reason = "forced by qg_context_set_tier";
        return QG_OK;
    }
    if (option > 0 && on_gpu(ctx)) {
        const Tier<Args>* last = nullptr;
        const char* last_why = "";
        for (int i = 0; i < t.count; ++i) {
            if (t.tiers[i]->option != option) continue;
            const char* why = "";
            if (t.tiers[i]->usable(ctx, a, &why)) {
                *out = t.tiers[i];
                *reason = "forced by the numeric *_tier option";
                return QG_OK;
            }
            last = t.tiers[i];
            last_why = why;
        }
        if (last == nullptr)
            return set_error(QG_ERR_UNSUPPORTED, "%s_tier=%lld: this build has no such %s tier (qg_build_info lists them)",
                             t.family, static_cast<long long>(option), t.family);
        return set_error(QG_ERR_UNSUPPORTED, "%s_tier=%lld: tier %s cannot serve this call: %s", t.family,
                         static_cast<long long>(option), last->name, last_why);
    }
    const Tier<Args>* c = t.choose(ctx, a, reason);
    if (c == nullptr) {
        // name every tier and why it declined
        char whys[512] = "";
        size_t used = 0;
        for (int i = 0; i < t.count && used + 1 < sizeof(whys); ++i) {
            const char* why = "";
            t.tiers[i]->usable(ctx, a, &why);
            const int w = snprintf(whys + used, sizeof(whys) - used, "%s%s: %s", i ? "; " : "", t.tiers[i]->name, why);
            if (w < 0) break;
            used += static_cast<size_t>(w);
        }
        return set_error(QG_ERR_UNSUPPORTED, "%s: no %s tier in this build serves this call (%s)", t.family,
                         on_gpu(ctx) ? "GPU" : "CPU", whys);
    }
    *out = c;
    return QG_OK;
}

// Workspace a call needs: the most that any tier select_tier could pick for it needs.
template <class Args>
size_t workspace_bound(const qg_context* ctx, const TierTable<Args>& t, const Args& a, const char* forced,
                       int64_t option) {
    size_t most = 0;
    for (int i = 0; i < t.count; ++i) {
        const Tier<Args>& e = *t.tiers[i];
        if (forced != nullptr && !same_text(e.name, forced)) continue;
        if (forced == nullptr && option > 0 && on_gpu(ctx) && e.option != option) continue;
        if (e.workspace == nullptr || !usable(e, ctx, a)) continue;
        const size_t w = e.workspace(ctx, a);
        if (w > most) most = w;
    }
    return most;
}

}  // namespace qg
