/*
 * quantgemm.h - the whole public C ABI of libquantgemm.
 *
 * Fused dequantize + GEMM kernels for low-bit LLM weights:
 *   - W4A16 int4 group-quantized GEMM (AWQ / GPTQ / compressed-tensors, canonical layout),
 *   - GGUF block formats (Q8_0, Q4_0, Q4_K, Q6_K, IQ4_XS, IQ3_XXS),
 *   - MXFP4 dense GEMM and MXFP4 mixture-of-experts (GPT-OSS).
 *
 * Conventions (see DESIGN.md):
 *   - every function returns qg_status; qg_last_error() gives a thread-local sentence
 *     naming the exact failed condition of the last failing call on this thread;
 *   - every argument is checked before anything is launched; on error nothing is written;
 *   - an empty problem (m == 0 or num_tokens == 0) returns QG_OK at once;
 *   - argument structs start with `size_t size` (set it to sizeof(struct)) and only grow;
 *   - enums only grow, numbers are never reused;
 *   - workspace, where a call needs one, is caller memory of at least the size that the
 *     matching *_workspace_size query returns for the same context and arguments; it must be
 *     zero-filled before its first use, and every call leaves it zero-filled again (split-K
 *     counters re-arm, partial sums are cleared once read), so one zeroed buffer serves any
 *     number of calls of any shape on one stream; concurrent streams need one each;
 *   - a context fixes where pointers live (host memory for QG_BACKEND_CPU, device memory
 *     of one device for QG_BACKEND_CUDA / QG_BACKEND_HIP); every launch takes a stream,
 *     NULL = the default stream (ignored by the CPU backend, which runs synchronously);
 *   - no exit(), no exceptions across the ABI, no printing unless QG_LOG=1 is set in
 *     the environment (then the chosen tier and config are printed once per shape).
 *
 * Matrices are row-major with a leading dimension (row stride) counted in elements,
 * except GGUF weight rows whose stride is counted in bytes. y = x @ W^T: x is [M, K],
 * the weight is [N, K] (row n = output feature), y is [M, N].
 */
#ifndef QUANTGEMM_H
#define QUANTGEMM_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#  if defined(QG_BUILDING_LIBRARY)
#    define QG_API __declspec(dllexport)
#  else
#    define QG_API __declspec(dllimport)
#  endif
#else
#  define QG_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* In C++ every enum gets int as its fixed underlying type, so that any int a caller passes
 * (an unknown value included) is a valid object the library can check and refuse. */
#ifdef __cplusplus
#define QG_ENUM_BASE : int
#else
#define QG_ENUM_BASE
#endif

#define QG_VERSION_MAJOR 0
#define QG_VERSION_MINOR 1
#define QG_VERSION_PATCH 0
/* Bumped whenever a packed weight layout accepted or produced by the library changes
 * (2: the W4A16 frag layout of qg_w4a16_repack; 3: the MXFP4 frag layout of qg_mxfp4_repack;
 * 4: the MoE frag layout of qg_moe_repack; 5: the GGUF frag layout of qg_gguf_repack;
 * 6: Q4_K and IQ4_XS in that layout; 7: Q8_0 in that layout, a byte plane; 8: Q6_K in that
 * layout, its codes less 32 in the byte plane; 9: IQ3_XXS in that layout, a codebook's 4-bit
 * codes; 10: IQ4_XS's and IQ3_XXS's nibbles in that layout placed by A register, byte p of a word
 * register p's two codes; 11: the GGUF rows8 layout of qg_gguf_repack on a CPU context). */
#define QG_FORMAT_VERSION 11

/* ------------------------------------------------------------------ status */

typedef enum qg_status QG_ENUM_BASE {
    QG_OK = 0,
    QG_ERR_INVALID_ARGUMENT = 1, /* bad shape, pointer, enum, dtype, alignment */
    QG_ERR_UNSUPPORTED = 2,      /* valid request this build or device cannot serve */
    QG_ERR_DEVICE = 3,           /* the GPU runtime reported an error */
    QG_ERR_OUT_OF_MEMORY = 4,
    QG_ERR_INTERNAL = 5
} qg_status;

/* Static name of a status ("QG_ERR_INVALID_ARGUMENT"); "unknown status" otherwise. */
QG_API const char* qg_status_string(qg_status status);
/* Thread-local sentence describing the last failed call on this thread ("" if none).
 * The pointer stays valid until the next qg_* call on the same thread. */
QG_API const char* qg_last_error(void);

/* ------------------------------------------------------------------ build */

/* major * 10000 + minor * 100 + patch */
QG_API int qg_version(void);
/* QG_FORMAT_VERSION of the compiled library. */
QG_API int qg_format_version(void);
/* Static one-line text naming the backends and tiers compiled into this build, e.g.
 * "quantgemm 0.1.0 format 1; backends: cpu cuda(sm_90a); tiers: w4a16=cpu,cuda gguf=cpu,cuda ..." */
QG_API const char* qg_build_info(void);

/* ------------------------------------------------------------------ enums */

typedef enum qg_backend QG_ENUM_BASE {
    QG_BACKEND_CPU = 0,
    QG_BACKEND_CUDA = 1,
    QG_BACKEND_HIP = 2
} qg_backend;

typedef enum qg_dtype QG_ENUM_BASE {
    QG_DTYPE_F32 = 0,
    QG_DTYPE_F16 = 1,
    QG_DTYPE_BF16 = 2,
    QG_DTYPE_I32 = 3,
    QG_DTYPE_U8 = 4,
    QG_DTYPE_U4X8 = 5 /* int32 words each holding 8 unsigned 4-bit values, nibble i = bits 4i..4i+3 */
} qg_dtype;

typedef enum qg_format QG_ENUM_BASE {
    QG_FORMAT_INT4 = 0,   /* W4A16 group-quantized, canonical layout below */
    QG_FORMAT_Q8_0 = 1,   /* GGUF, 32 per block, 34 bytes  */
    QG_FORMAT_Q4_0 = 2,   /* GGUF, 32 per block, 18 bytes  */
    QG_FORMAT_Q4_K = 3,   /* GGUF, 256 per block, 144 bytes */
    QG_FORMAT_Q6_K = 4,   /* GGUF, 256 per block, 210 bytes */
    QG_FORMAT_IQ4_XS = 5, /* GGUF, 256 per block, 136 bytes */
    QG_FORMAT_IQ3_XXS = 6,/* GGUF, 256 per block, 98 bytes  */
    QG_FORMAT_MXFP4 = 7   /* OCP MX: 32 E2M1 per block as 16 bytes + one E8M0 scale byte */
} qg_format;

/* Elements per block and bytes per block of a format (int4: 8 and 4, one packed word). */
QG_API qg_status qg_format_block(qg_format format, int32_t* block_elems, int32_t* block_bytes);

typedef enum qg_activation QG_ENUM_BASE {
    QG_ACT_SILU_GLU = 0,   /* silu(gate) * up */
    QG_ACT_SWIGLU_OAI = 1  /* GPT-OSS: g = min(gate, limit), u = clamp(up, -limit, limit),
                              g * sigmoid(alpha * g) * (u + 1) */
} qg_activation;

typedef enum qg_gate_up_layout QG_ENUM_BASE {
    QG_GATE_UP_CONCAT = 0,     /* rows 0..I-1 are gate, rows I..2I-1 are up */
    QG_GATE_UP_INTERLEAVED = 1 /* row 2i is gate i, row 2i+1 is up i (GPT-OSS checkpoints) */
} qg_gate_up_layout;

typedef enum qg_copy_kind QG_ENUM_BASE {
    QG_COPY_HOST_TO_HOST = 0,
    QG_COPY_HOST_TO_DEVICE = 1,
    QG_COPY_DEVICE_TO_HOST = 2,
    QG_COPY_DEVICE_TO_DEVICE = 3
} qg_copy_kind;

/* ------------------------------------------------------------------ context */

typedef struct qg_context qg_context;
typedef void* qg_stream; /* cudaStream_t / hipStream_t; NULL = default stream */
typedef struct qg_event qg_event;

/* Number of devices of a GPU backend; 0 (and QG_OK) when the build lacks the backend,
 * or when there is no driver or no device. Always 1 for QG_BACKEND_CPU. */
QG_API qg_status qg_device_count(qg_backend backend, int* count);
QG_API qg_status qg_context_create(qg_backend backend, int device, qg_context** ctx);
QG_API qg_status qg_context_destroy(qg_context* ctx);
QG_API qg_status qg_context_backend(const qg_context* ctx, qg_backend* backend);
/* Device name ("NVIDIA H200", or the CPU model for the CPU backend). */
QG_API qg_status qg_context_device_name(const qg_context* ctx, char* buf, size_t buf_size);
/* Tuning and testing knobs; they never change results beyond the documented tolerance.
 *   "cpu_threads"  : worker threads of the CPU backend (0 = automatic: up to all hardware
 *                    threads, fewer for a GEMM too small to share)
 *   "w4a16_tier"   : 0 auto, 1 portable SIMT tier, 2 decode on the matrix units (mma.sync; the
 *                    canonical or the frag layout), 3 prefill (wgmma, NVIDIA sm_90a, frag layout);
 *                    a forced tier that cannot serve a call returns QG_ERR_UNSUPPORTED
 *   "gguf_tier"    : 0 auto, 1 float decode (x kept in fp32; portable), 2 int8 decode (x quantized
 *                    to int8 per 32 elements as ggml's q8_1, integer mma; NVIDIA sm_80+, w and
 *                    ldw multiples of 16), 3 prefill (bf16 x only: each weight rounded to
 *                    bf16, wgmma; NVIDIA sm_90a); on the frag layout (qg_gguf_repack)
 *                    4 decode_frag and 5 prefill_frag, the W4A16 frag kernels. Auto takes
 *                    3 above 8 rows of bf16 x (16 where its grid is under one wave, q8_0
 *                    excepted), else 2 where it can; on the frag layout 5 above 16 rows, else 4.
 *                    The numeric tier options apply to GPU contexts; qg_context_set_tier
 *                    names a tier of either backend.
 *   "split_k"      : 0 auto, else the split-K factor forced on the decode tiers and on the MoE
 *                    mma.sync tiles (which split only when asked so far); on the W4A16 and MXFP4
 *                    prefill, each tile's K shared by about that many blocks (stream-K)
 *   "prefill_tile" : 0 auto, else the token tile (32, 64, 128 or 256) of the frag prefill (W4A16,
 *                    MXFP4, the GGUF frag codes; 256 only where the kernel folds the scale into
 *                    A: bf16 x and bf16 scales, or a GGUF code, 128 otherwise; 32 with bf16 x or a
 *                    GGUF code, 64 otherwise). Speed only, like split_k: results never depend on it
 *   "cpu_precision": CPU backend GEMMs (W4A16, GGUF, MXFP4): 0 auto (= 2), 1 fp32-exact (x and the
 *                    decoded weight in fp32), 2 int8 (x quantized to int8 per 32 elements, integer
 *                    dot products; rows holding NaN or inf take the fp32-exact path)
 * An unknown name or an out-of-range value is QG_ERR_INVALID_ARGUMENT. */
QG_API qg_status qg_context_set_option(qg_context* ctx, const char* name, int64_t value);
/* Forces one tier of a kernel family by name, or "auto" to let the library choose again.
 * family: "w4a16", "gguf", "mxfp4" or "moe"; tier: a name that qg_build_info lists for that
 * family ("cpu", "cuda:decode_frag", ...). Unknown names are QG_ERR_INVALID_ARGUMENT; a call
 * that the forced tier cannot serve returns QG_ERR_UNSUPPORTED naming why. Setting the
 * family's numeric "*_tier" option replaces a forced name, and the other way round. The "moe"
 * family has three entry points: a forced name applies to those that have a tier of that name
 * ("cuda:moe_mma": both stages; "cuda:moe_align": align), the others choose as under "auto". */
QG_API qg_status qg_context_set_tier(qg_context* ctx, const char* family, const char* tier);

/* ------------------------------------------------------------------ memory, streams, events */

/* For a CPU context these act on host memory (64-byte aligned) and run synchronously. */
QG_API qg_status qg_malloc(qg_context* ctx, size_t bytes, void** ptr);
QG_API qg_status qg_free(qg_context* ctx, void* ptr);
QG_API qg_status qg_memcpy(qg_context* ctx, void* dst, const void* src, size_t bytes,
                           qg_copy_kind kind, qg_stream stream);
QG_API qg_status qg_memset(qg_context* ctx, void* dst, int value, size_t bytes, qg_stream stream);
QG_API qg_status qg_stream_create(qg_context* ctx, qg_stream* stream);
QG_API qg_status qg_stream_destroy(qg_context* ctx, qg_stream stream);
QG_API qg_status qg_stream_synchronize(qg_context* ctx, qg_stream stream);
QG_API qg_status qg_event_create(qg_context* ctx, qg_event** event);
QG_API qg_status qg_event_destroy(qg_context* ctx, qg_event* event);
QG_API qg_status qg_event_record(qg_context* ctx, qg_event* event, qg_stream stream);
QG_API qg_status qg_event_synchronize(qg_context* ctx, qg_event* event);
/* Milliseconds between two recorded events (host clock on the CPU backend). */
QG_API qg_status qg_event_elapsed_ms(qg_context* ctx, qg_event* start, qg_event* stop, float* ms);

/* ------------------------------------------------------------------ W4A16 */

/* Weight layout of a W4A16 call (qg_w4a16_gemm_args.layout). */
typedef enum qg_w4a16_layout QG_ENUM_BASE {
    QG_W4A16_LAYOUT_CANONICAL = 0, /* qweight [N, K/8], scales [N, K/G], qzeros [N/8, K/G] below */
    QG_W4A16_LAYOUT_FRAG = 1       /* qg_w4a16_repack's planes: each lane's 16-byte load is its
                                      tensor-core A fragment (docs/w4a16-layout.md); read by the
                                      GPU decode and prefill tiers, accepted by every tier */
} qg_w4a16_layout;

/*
 * y[M, N] = x[M, K] @ dequant(W)[N, K]^T (+ bias[N]), dequant(W)[n, k] = (q[n, k] - z[n, k/G]) * s[n, k/G].
 * Canonical layout (what AWQ / GPTQ / compressed-tensors checkpoints become on import):
 *   qweight [N, K/8] int32, nibble i of word j of row n holds q[n, 8j + i], unsigned 0..15;
 *   scales  [N, K/G] fp16 or bf16;
 *   qzeros  [N/8, K/G] int32 (QG_DTYPE_U4X8), packed along N: row n -> word n/8, bits
 *           4*(n%8); NULL for symmetric weights (zero = 8). Zero-points stay 4-bit.
 * G in {32, 64, 128}; K % G == 0; N % 8 == 0. x and y fp16 or bf16 (y may be fp32).
 * With layout = QG_W4A16_LAYOUT_FRAG, qweight, scales and qzeros point at the three planes
 * written by qg_w4a16_repack for the same n, k, group_size (qzeros NULL = symmetric).
 * bias, when given, is added to each output's float32 sum (after any split-K reduction) before
 * its one rounding to y_dtype, on every tier.
 */
typedef struct qg_w4a16_gemm_args {
    size_t size;            /* sizeof(qg_w4a16_gemm_args) */
    int64_t m, n, k;
    int32_t group_size;     /* G */
    qg_dtype x_dtype;       /* F16 or BF16 */
    qg_dtype y_dtype;       /* x_dtype or F32 */
    qg_dtype scale_dtype;   /* F16 or BF16 */
    qg_dtype zero_dtype;    /* U4X8 when qzeros != NULL (ignored when NULL) */
    const void* x;          /* [M, K], row stride ldx elements */
    int64_t ldx;
    const int32_t* qweight; /* [N, K/8] */
    const void* scales;     /* [N, K/G] */
    const int32_t* qzeros;  /* [N/8, K/G] or NULL */
    void* y;                /* [M, N], row stride ldy elements */
    int64_t ldy;
    void* workspace;        /* qg_w4a16_gemm_workspace_size bytes, or NULL when that is 0 */
    size_t workspace_bytes;
    qg_w4a16_layout layout; /* of qweight/scales/qzeros; CANONICAL when args->size predates it */
    const void* bias;       /* [N] in bias_dtype, or NULL (also when args->size predates it) */
    qg_dtype bias_dtype;    /* F32, F16 or BF16 (ignored when bias is NULL) */
} qg_w4a16_gemm_args;

QG_API qg_status qg_w4a16_gemm_workspace_size(qg_context* ctx, const qg_w4a16_gemm_args* args,
                                              size_t* bytes);
QG_API qg_status qg_w4a16_gemm(qg_context* ctx, const qg_w4a16_gemm_args* args, qg_stream stream);

/*
 * One-time repack of a canonical W4A16 weight into `layout` (QG_W4A16_LAYOUT_FRAG), in the
 * memory of ctx (host for a CPU context, device for a GPU one; the GPU repack is a kernel on
 * `stream`). N is padded to a multiple of 16 and K to a multiple of 128 with q = 0, zero 0
 * and scale 0, which add exactly nothing. The three outputs must not overlap the inputs.
 */
typedef struct qg_w4a16_repack_args {
    size_t size;             /* sizeof(qg_w4a16_repack_args) */
    qg_w4a16_layout layout;  /* target: QG_W4A16_LAYOUT_FRAG */
    int64_t n, k;
    int32_t group_size;
    qg_dtype scale_dtype;    /* F16 or BF16 (copied bit for bit) */
    const int32_t* qweight;  /* canonical [N, K/8] */
    const void* scales;      /* canonical [N, K/G] */
    const int32_t* qzeros;   /* canonical [N/8, K/G], or NULL (symmetric) */
    void* out_qweight;       /* qweight_bytes (qg_w4a16_repack_size) */
    void* out_scales;        /* scales_bytes */
    void* out_qzeros;        /* qzeros_bytes; NULL exactly when qzeros is NULL */
} qg_w4a16_repack_args;

/* Bytes of each output plane for args' layout, n, k, group_size (pointers are not read). */
QG_API qg_status qg_w4a16_repack_size(const qg_w4a16_repack_args* args, size_t* qweight_bytes,
                                      size_t* scales_bytes, size_t* qzeros_bytes);
QG_API qg_status qg_w4a16_repack(qg_context* ctx, const qg_w4a16_repack_args* args, qg_stream stream);

/* ------------------------------------------------------------------ GGUF */

/*
 * y[M, N] = x[M, K] @ dequant(W)[N, K]^T (+ bias[N]) for a GGUF block format.
 * w holds N rows; row n starts at byte n * ldw and holds K / block_elems blocks exactly as
 * a .gguf file stores them (ldw >= (K / block_elems) * block_bytes, ldw even and w 2-byte
 * aligned: the blocks hold fp16 scales). K % block_elems == 0.
 * x fp32, fp16 or bf16; y x_dtype or fp32. Any N >= 1.
 * bias, when given, is added to each output's float32 sum (after any split-K reduction) before
 * its one rounding to y_dtype, on every tier.
 * With layout = QG_GGUF_LAYOUT_FRAG, w and w_scales point at the two planes written by
 * qg_gguf_repack for the same format, n, k (ldw is not read). The GPU tiers of that layout
 * take F16 or BF16 x (fp32 x: keep the block layout); every tier accepts both layouts.
 * With layout = QG_GGUF_LAYOUT_ROWS8, w points at the plane qg_gguf_repack writes for that
 * layout (ldw and w_scales are not read); the CPU tier only, with the block layout's bits.
 */
typedef enum qg_gguf_layout QG_ENUM_BASE {
    QG_GGUF_LAYOUT_BLOCKS = 0, /* the .gguf blocks, N rows of stride ldw, above */
    QG_GGUF_LAYOUT_FRAG = 1,   /* qg_gguf_repack's planes (every GGUF format): the W4A16 frag planes of
                                  G = 32 (docs/gguf-layout.md, "The frag layout"), read by the
                                  W4A16 frag decode and prefill kernels */
    QG_GGUF_LAYOUT_ROWS8 = 2   /* qg_gguf_repack's CPU layout (every GGUF format): the .gguf blocks of
                                  each 8 consecutive rows side by side, block b of row n at block
                                  index (n / 8 * (K / block_elems) + b) * 8 + n % 8 of w, N padded
                                  to a multiple of 8 with zero blocks; one plane (w_scales and ldw
                                  are not read). Read by the CPU tier only (8 rows a pass: one
                                  stream where the rows are 8) */
} qg_gguf_layout;

typedef struct qg_gguf_gemm_args {
    size_t size;         /* sizeof(qg_gguf_gemm_args) */
    qg_format format;    /* QG_FORMAT_Q8_0 .. QG_FORMAT_IQ3_XXS */
    int64_t m, n, k;
    qg_dtype x_dtype;    /* F32, F16 or BF16 */
    qg_dtype y_dtype;    /* x_dtype or F32 */
    const void* x;       /* [M, K], row stride ldx elements */
    int64_t ldx;
    const void* w;       /* N rows of blocks, row stride ldw bytes */
    int64_t ldw;
    void* y;             /* [M, N], row stride ldy elements */
    int64_t ldy;
    void* workspace;
    size_t workspace_bytes;
    const void* bias;    /* [N] in bias_dtype, or NULL (also when args->size predates it) */
    qg_dtype bias_dtype; /* F32, F16 or BF16 (ignored when bias is NULL) */
    const void* w_scales;  /* QG_GGUF_LAYOUT_FRAG: the scales plane (w: the weights plane) */
    qg_gguf_layout layout; /* of w (and w_scales); BLOCKS when args->size predates it */
} qg_gguf_gemm_args;

QG_API qg_status qg_gguf_gemm_workspace_size(qg_context* ctx, const qg_gguf_gemm_args* args,
                                             size_t* bytes);
QG_API qg_status qg_gguf_gemm(qg_context* ctx, const qg_gguf_gemm_args* args, qg_stream stream);

/*
 * One-time repack of a GGUF weight (the .gguf blocks) into `layout` (QG_GGUF_LAYOUT_FRAG), in
 * the memory of ctx (host for a CPU context, device for a GPU one: a kernel on `stream`).
 * Every GGUF format; both planes keep every bit of the blocks (docs/gguf-layout.md):
 *   out_w:      the W4A16 frag qweight plane of the 4-bit codes q; Q8_0: its byte plane of the
 *               int8 codes (twice that size: per 16 rows x 32 k, each lane's 16 bytes are its
 *               mma.m16n8k16 A registers of two k16 steps); Q6_K: that byte plane of q - 32;
 *   out_scales: Q4_0, Q8_0: the W4A16 frag scales plane of G = 32, each block's fp16 d bit for
 *               bit (Q4_0's weight d * (q - 8) is a W4A16 weight of G = 32, symmetric);
 *               Q4_K: that plane holding each 32-element sub-block's record sc | m << 8 (the
 *               6-bit integers as uint16), then the fp16 bits of each super-block's d and dmin;
 *               IQ4_XS: the same with the record ls and the fields d and 0 (its codes are the
 *               codebook indices); Q6_K: the same with the record sc[2j] | sc[2j + 1] << 8
 *               (the int8 scales of the sub-block's two 16-element halves) and d and 0;
 *               IQ3_XXS: IQ4_XS's planes, each code the element's grid magnitude index
 *               ((grid - 4) / 8: 4, 12, .., 52, 62 -> 0..7) | its sign << 3, the record ls.
 * N is padded to a multiple of 16 and K to a multiple of 128 with q = 0 and scale 0, which add
 * exactly nothing. The outputs must not overlap the input.
 * QG_GGUF_LAYOUT_ROWS8 (CPU contexts only): out_w the blocks moved whole as that enum value
 * says, the padding rows' blocks all zero (scale 0: they add exactly nothing); out_scales is
 * not written (scales_bytes 0; it may be NULL). Every GGUF format.
 */
typedef struct qg_gguf_repack_args {
    size_t size;            /* sizeof(qg_gguf_repack_args) */
    qg_gguf_layout layout;  /* target: QG_GGUF_LAYOUT_FRAG, or QG_GGUF_LAYOUT_ROWS8 on a CPU context */
    qg_format format;       /* QG_FORMAT_Q8_0 .. QG_FORMAT_IQ3_XXS */
    int64_t n, k;           /* K % 32 == 0 */
    const void* w;          /* N rows of blocks, row stride ldw bytes (even) */
    int64_t ldw;
    void* out_w;            /* w_bytes (qg_gguf_repack_size) */
    void* out_scales;       /* scales_bytes */
} qg_gguf_repack_args;

/* Bytes of each output plane for args' layout, format, n, k (pointers are not read). */
QG_API qg_status qg_gguf_repack_size(const qg_gguf_repack_args* args, size_t* w_bytes, size_t* scales_bytes);
QG_API qg_status qg_gguf_repack(qg_context* ctx, const qg_gguf_repack_args* args, qg_stream stream);

/* ------------------------------------------------------------------ MXFP4 dense */

/*
 * y[M, N] = x[M, K] @ dequant(W)[N, K]^T (+ bias[N]), OCP MXFP4 layout as GPT-OSS ships it:
 *   blocks [N, K/32, 16] uint8, byte j of a block holds element 2j (low nibble) and 2j+1
 *          (high nibble) as E2M1 codes {0, .5, 1, 1.5, 2, 3, 4, 6} with sign bit 3;
 *   scales [N, K/32] uint8 E8M0, value 2^(e - 127) (e = 255 is NaN).
 * GGUF's own mxfp4 block is converted to this layout by pyquant.from_gguf.
 * With layout = QG_MXFP4_LAYOUT_FRAG, blocks and scales point at the two planes written by
 * qg_mxfp4_repack for the same n, k (what the GPU tiers read; every tier accepts both). The GPU
 * tiers take F16 or BF16 x; they apply each scale to the float32 sum of its 32 products.
 */
typedef enum qg_mxfp4_layout QG_ENUM_BASE {
    QG_MXFP4_LAYOUT_CANONICAL = 0, /* blocks [N, K/32, 16], scales [N, K/32] above */
    QG_MXFP4_LAYOUT_FRAG = 1       /* qg_mxfp4_repack's planes: the W4A16 frag planes of G = 32
                                      (docs/w4a16-layout.md, "MXFP4"), E2M1 codes for the nibbles
                                      (bits placed for the decode), each E8M0 scale as the bf16
                                      value 2^(e - 127) */
} qg_mxfp4_layout;

typedef struct qg_mxfp4_gemm_args {
    size_t size;             /* sizeof(qg_mxfp4_gemm_args) */
    int64_t m, n, k;         /* K % 32 == 0 */
    qg_dtype x_dtype;        /* F32, F16 or BF16 */
    qg_dtype y_dtype;        /* x_dtype or F32 */
    const void* x;           /* [M, K], row stride ldx elements */
    int64_t ldx;
    const uint8_t* blocks;   /* [N, K/32, 16] */
    const uint8_t* scales;   /* [N, K/32] */
    const void* bias;        /* [N] in bias_dtype, or NULL */
    qg_dtype bias_dtype;     /* F32, F16 or BF16 (ignored when bias is NULL) */
    void* y;                 /* [M, N], row stride ldy elements */
    int64_t ldy;
    void* workspace;
    size_t workspace_bytes;
    qg_mxfp4_layout layout;  /* of blocks/scales; CANONICAL when args->size predates it */
} qg_mxfp4_gemm_args;

QG_API qg_status qg_mxfp4_gemm_workspace_size(qg_context* ctx, const qg_mxfp4_gemm_args* args,
                                              size_t* bytes);
QG_API qg_status qg_mxfp4_gemm(qg_context* ctx, const qg_mxfp4_gemm_args* args, qg_stream stream);

/*
 * One-time repack of a canonical MXFP4 weight into `layout` (QG_MXFP4_LAYOUT_FRAG), in the
 * memory of ctx (host for a CPU context, device for a GPU one: a kernel on `stream`):
 *   out_blocks: the W4A16 frag qweight plane of the E2M1 codes (the same words as
 *               qg_w4a16_repack gives the int4 q of a [N, K] weight), each word's 32 bits
 *               then placed for the GPU decode (docs/w4a16-layout.md, "MXFP4");
 *   out_scales: the W4A16 frag scales plane of G = 32, each E8M0 e as the bf16 bits of
 *               2^(e - 127) (exact: 0x0040 for e = 0, 0x7fc0 NaN for e = 255).
 * N is padded to a multiple of 16 and K to a multiple of 128 with code 0 and scale 0, which
 * add exactly nothing. The outputs must not overlap the inputs.
 */
typedef struct qg_mxfp4_repack_args {
    size_t size;             /* sizeof(qg_mxfp4_repack_args) */
    qg_mxfp4_layout layout;  /* target: QG_MXFP4_LAYOUT_FRAG */
    int64_t n, k;            /* K % 32 == 0 */
    const uint8_t* blocks;   /* canonical [N, K/32, 16] */
    const uint8_t* scales;   /* canonical [N, K/32] */
    void* out_blocks;        /* blocks_bytes (qg_mxfp4_repack_size) */
    void* out_scales;        /* scales_bytes */
} qg_mxfp4_repack_args;

/* Bytes of each output plane for args' layout, n, k (pointers are not read). */
QG_API qg_status qg_mxfp4_repack_size(const qg_mxfp4_repack_args* args, size_t* blocks_bytes,
                                      size_t* scales_bytes);
QG_API qg_status qg_mxfp4_repack(qg_context* ctx, const qg_mxfp4_repack_args* args, qg_stream stream);

/* ------------------------------------------------------------------ MXFP4 MoE */

/*
 * Mixture of experts in three launches, pairs p = t * top_k + j (token t, its j-th expert):
 *   align : sort the pairs by expert into tiles of tile_m rows, each tile one expert;
 *   stage1: act[p, :] = activation(x[t] @ w13[e]^T + b13[e])       act [T*top_k, I]
 *   stage2: y[t, :]   = sum_j topk_weights[t, j] * (act[p] @ w2[e]^T + b2[e])
 * Sizes of the align outputs: max_sorted = T*top_k + E*(tile_m - 1) rounded up to a
 * multiple of tile_m, max_tiles = max_sorted / tile_m (qg_moe_align_sizes).
 */
typedef struct qg_moe_align_args {
    size_t size;              /* sizeof(qg_moe_align_args) */
    int64_t num_tokens;       /* T */
    int32_t top_k;
    int32_t num_experts;      /* E */
    int32_t tile_m;           /* 16, 32, 64, 80, 96, 128 or 256 */
    const int32_t* topk_ids;  /* [T, top_k], each in [0, E) */
    int32_t* sorted_ids;      /* [max_sorted] out: pair index, or T*top_k for padding */
    int32_t* tile_experts;    /* [max_tiles]  out: expert of each tile, -1 past the end */
    int32_t* num_sorted;      /* [1]          out: used length of sorted_ids (multiple of tile_m) */
} qg_moe_align_args;

QG_API qg_status qg_moe_align_sizes(int64_t num_tokens, int32_t top_k, int32_t num_experts,
                                    int32_t tile_m, int64_t* max_sorted, int64_t* max_tiles);
QG_API qg_status qg_moe_align(qg_context* ctx, const qg_moe_align_args* args, qg_stream stream);

typedef struct qg_moe_stage1_args {
    size_t size;                 /* sizeof(qg_moe_stage1_args) */
    int64_t num_tokens;          /* T */
    int32_t top_k;
    int32_t num_experts;         /* E */
    int32_t tile_m;
    int64_t hidden;              /* H = K of stage 1, multiple of 32 */
    int64_t intermediate;        /* I; w13 has 2*I rows */
    qg_dtype x_dtype;            /* F32, F16 or BF16; act is written in this dtype */
    const void* x;               /* [T, H], row stride ldx elements */
    int64_t ldx;
    const int32_t* sorted_ids;   /* from qg_moe_align */
    const int32_t* tile_experts;
    const int32_t* num_sorted;
    const uint8_t* w13_blocks;   /* [E, 2I, H/32, 16] */
    const uint8_t* w13_scales;   /* [E, 2I, H/32] */
    const void* w13_bias;        /* [E, 2I] in bias_dtype, or NULL */
    qg_dtype bias_dtype;
    qg_activation activation;
    qg_gate_up_layout gate_up_layout;
    float swiglu_alpha;          /* 1.702 for GPT-OSS (QG_ACT_SWIGLU_OAI only) */
    float swiglu_limit;          /* 7.0 for GPT-OSS (QG_ACT_SWIGLU_OAI only) */
    void* act;                   /* [T*top_k, I] out, row = pair index, dense rows */
    /* format 4: */
    qg_mxfp4_layout layout;      /* of w13: canonical (CPU) or the MoE frag layout of qg_moe_repack (GPU) */
    void* workspace;             /* qg_moe_stage1_workspace_size bytes, or NULL when that is 0 */
    size_t workspace_bytes;
} qg_moe_stage1_args;

QG_API qg_status qg_moe_stage1_workspace_size(qg_context* ctx, const qg_moe_stage1_args* args, size_t* bytes);
QG_API qg_status qg_moe_stage1(qg_context* ctx, const qg_moe_stage1_args* args, qg_stream stream);

typedef struct qg_moe_stage2_args {
    size_t size;                 /* sizeof(qg_moe_stage2_args) */
    int64_t num_tokens;          /* T */
    int32_t top_k;
    int32_t num_experts;         /* E */
    int32_t tile_m;
    int64_t hidden;              /* H = N of stage 2 */
    int64_t intermediate;        /* I = K of stage 2, multiple of 32 */
    qg_dtype act_dtype;          /* F32, F16 or BF16 */
    const void* act;             /* [T*top_k, I] from stage 1 */
    const int32_t* sorted_ids;
    const int32_t* tile_experts;
    const int32_t* num_sorted;
    const uint8_t* w2_blocks;    /* [E, H, I/32, 16] */
    const uint8_t* w2_scales;    /* [E, H, I/32] */
    const void* w2_bias;         /* [E, H] in bias_dtype, or NULL */
    qg_dtype bias_dtype;
    const float* topk_weights;   /* [T, top_k] */
    qg_dtype y_dtype;            /* F32, F16 or BF16 */
    void* y;                     /* [T, H] out, row stride ldy elements */
    int64_t ldy;
    /* format 4: */
    qg_mxfp4_layout layout;      /* of w2: canonical (CPU) or the MoE frag layout of qg_moe_repack (GPU) */
    void* workspace;             /* qg_moe_stage2_workspace_size bytes, or NULL when that is 0 */
    size_t workspace_bytes;
} qg_moe_stage2_args;

QG_API qg_status qg_moe_stage2_workspace_size(qg_context* ctx, const qg_moe_stage2_args* args, size_t* bytes);
QG_API qg_status qg_moe_stage2(qg_context* ctx, const qg_moe_stage2_args* args, qg_stream stream);

/*
 * The MoE frag layout (format 4; the GPU MoE tiers read it, the CPU tier reads canonical
 * weights): each expert's rows split into `parts` matrices of n / parts rows (w13: parts = 2,
 * gate then up, taken from the canonical rows as gate_up_layout says; w2: parts = 1), each
 * written as qg_mxfp4_repack writes a dense weight, all stacked in expert-major order: part h
 * of expert e starts at (e * parts + h) times the blocks_bytes / scales_bytes of one part
 * (docs/w4a16-layout.md, "MXFP4 experts"). Stage 1 still reads w13_bias in the canonical row
 * order of gate_up_layout.
 */
typedef struct qg_moe_repack_args {
    size_t size;                        /* sizeof(qg_moe_repack_args) */
    qg_mxfp4_layout layout;             /* target: QG_MXFP4_LAYOUT_FRAG */
    int32_t num_experts;                /* E */
    int32_t parts;                      /* 2 for w13 (gate, up), 1 for w2 */
    qg_gate_up_layout gate_up_layout;   /* parts = 2: where gate and up rows sit in blocks */
    int64_t n, k;                       /* rows per expert (2I or H), K (multiple of 32) */
    const uint8_t* blocks;              /* canonical [E, n, K/32, 16] */
    const uint8_t* scales;              /* canonical [E, n, K/32] */
    void* out_blocks;                   /* blocks_bytes (qg_moe_repack_size) */
    void* out_scales;                   /* scales_bytes */
} qg_moe_repack_args;

/* Bytes of each output plane for args' layout, experts, parts, n, k (pointers are not read). */
QG_API qg_status qg_moe_repack_size(const qg_moe_repack_args* args, size_t* blocks_bytes, size_t* scales_bytes);
QG_API qg_status qg_moe_repack(qg_context* ctx, const qg_moe_repack_args* args, qg_stream stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* QUANTGEMM_H */
