// GGUF GPU kernels: their parameters, the facts of each format that the launchers plan
// with, the instantiation lists and the lookup functions, shared by the kernel files
// (hip/gguf.hip, hip/gguf_mma.hip, one compilation unit each) and their launchers
// (src/gpu/gguf_launch.cpp, src/gpu/gguf_mma_launch.cpp). Kernels take raw pointers and
// report nothing.
//
//   kernel                    file               tier
//   gguf_decode_kernel        hip/gguf.hip       <gpu>:float (gguf_tier 1, every GPU)
//   gguf_mma_prep_kernel      hip/gguf_mma.hip   <gpu>:int8_mma (gguf_tier 2, NVIDIA sm_80+):
//   gguf_mma_kernel                                the x prep, then the GEMM
//   gguf_prefill_kernel       hip/gguf_prefill.hip <gpu>:prefill_wgmma (gguf_tier 3, NVIDIA
//                                                  sm_90a): bf16 x, wgmma on bf16 tiles
//
// The kernels are templates instantiated in their own file; a launcher reaches an
// instantiation through its file's lookup function (the address of its host stub, for
// hipLaunchKernel and hipFuncSetAttribute), because nvcc's whole-program mode keeps
// template stubs local to the file that instantiates them.
#pragma once

#include <stdint.h>

#include "compat.h"
#include "elem.h"
#include "quantgemm.h"
#include "formats/blocks.h"

namespace qg {
namespace gguf {

// ================================================================ float decode tier (hip/gguf.hip)

// Threads per thread block, fixed on every target so that the host never needs the
// device's warp width: 8 warps on NVIDIA and RDNA, 4 wavefronts on CDNA.
constexpr int kThreads = 256;

// Rows of x handled by one launch at most; larger M loops over chunks of this size.
// The kernel is instantiated for MT = 1, 2, 4; a chunk of 3 rows runs MT = 4 with
// m_valid = 3 (the missing row of x is staged as zeros and never written). MT = 8 in
// one launch would read W once instead of twice, but this SIMT tier is already
// arithmetic bound at MT = 4 (docs/gguf-layout.md), and at 128 registers MT = 8 spills:
// two launches of 4 do the same arithmetic.
constexpr int kMaxMTile = 4;

// The instantiated M tiles of one format, smallest first (the launcher runs the smallest
// that holds its rows): X(FMT, MT).
#define QG_GGUF_DECODE_MTILES(X, FMT) X(FMT, 1) X(FMT, 2) X(FMT, 4)

// Per-MT choices (speed only; results never depend on them).
template <int MT>
struct Tune {
    // rows of W a warp streams at once: 2 lets one shared-memory read of x feed two
    // rows (x traffic from shared memory is the next bottleneck after DRAM at M = 1);
    // 1 at larger MT, where accumulators already fill the registers.
    static constexpr int kRows = MT <= 2 ? 2 : 1;
    // __launch_bounds__ occupancy floor (NVIDIA): 3 blocks of 256 threads = 24 warps per
    // SM caps registers at 80 per thread at MT = 1; 2 blocks (128 registers) above. HIP
    // reads the second argument as waves per SIMD; AMD is unmeasured, so no floor there
    // (the compiler takes the registers it needs rather than spill).
    static constexpr int kMinBlocks = !kGpuIsCuda ? 1 : MT == 1 ? 3 : 2;
};

// The cp.async kernel (ASYNC = true: double-buffered rows, NVIDIA sm_80+) exists in CUDA
// builds; HIP builds have only the synchronous one.
constexpr bool kAsyncBuild = kGpuIsCuda;

// Row-buffer sets per warp: two for the asynchronous (cp.async, double-buffered)
// kernel, one for the synchronous one.
__host__ __device__ constexpr int stages(bool async) { return async ? 2 : 1; }

// Shared-memory bytes of one row's step buffer: a step of WC blocks, up to 15 bytes
// of lead-in (a step starts at a block boundary, the wide loads at an aligned address
// before it) and room for the decoder's aligned over-read of one word past the end.
__host__ __device__ constexpr int row_buffer_bytes(int step_bytes) { return (step_bytes + 16 + 16 + 15) / 16 * 16; }

// What the launcher plans with of a format's decoder; hip/gguf.hip's Format<FMT> derives
// from it and adds the device code (its comment has the job table):
//   BE, BB          elements and bytes of a block (Geometry<FMT>: the X-macro row's)
//   kJobsPerBlock   jobs of a block (a job: a lane's unit of work, whole sub-blocks)
//   kJobsPerLane    jobs of each lane per step: a step is kJobsPerLane * warp / kJobsPerBlock blocks
// and what the generic kernel stages for the format; PlainFormatFacts holds the answers
// of a plain format:
//   kXsum           stage the sum of x over every 32 elements (Q4_K's "- dmin * m" term)
//   kGridWords      words of the codebook the jobs read from shared memory (1: none; the
//                   kernel's array keeps one placeholder word)
// Block geometry of every format, from its X-macro row (src/formats/blocks.h): BE elements
// and BB bytes (sizeof the block struct) per block.
template <int FMT>
struct Geometry;
#define QG_GGUF_GEOMETRY(NAME, BLOCK, ELEMS)                 \
    template <>                                               \
    struct Geometry<QG_FORMAT_##NAME> {                       \
        static constexpr int BE = ELEMS;                      \
        static constexpr int BB = static_cast<int>(sizeof(BLOCK)); \
    };
QG_GGUF_FORMATS(QG_GGUF_GEOMETRY)
#undef QG_GGUF_GEOMETRY

template <int FMT>
struct FormatFacts;

template <int FMT>
struct PlainFormatFacts : Geometry<FMT> {
    static constexpr bool kXsum = false;
    static constexpr int kGridWords = 1;
};

template <>
struct FormatFacts<QG_FORMAT_Q8_0> : PlainFormatFacts<QG_FORMAT_Q8_0> {
    static constexpr int kJobsPerBlock = 1, kJobsPerLane = 1;
};
template <>
struct FormatFacts<QG_FORMAT_Q4_0> : PlainFormatFacts<QG_FORMAT_Q4_0> {
    static constexpr int kJobsPerBlock = 1, kJobsPerLane = 2;
};
template <>
struct FormatFacts<QG_FORMAT_Q4_K> : PlainFormatFacts<QG_FORMAT_Q4_K> {
    static constexpr int kJobsPerBlock = 4, kJobsPerLane = 1;
    static constexpr bool kXsum = true;   // xsum: sum of x per sub-block, for dmin * m
};
template <>
struct FormatFacts<QG_FORMAT_Q6_K> : PlainFormatFacts<QG_FORMAT_Q6_K> {
    static constexpr int kJobsPerBlock = 4, kJobsPerLane = 1;
};
template <>
struct FormatFacts<QG_FORMAT_IQ4_XS> : PlainFormatFacts<QG_FORMAT_IQ4_XS> {
    static constexpr int kJobsPerBlock = 4, kJobsPerLane = 1;
};
template <>
struct FormatFacts<QG_FORMAT_IQ3_XXS> : PlainFormatFacts<QG_FORMAT_IQ3_XXS> {
    static constexpr int kJobsPerBlock = 8, kJobsPerLane = 2;
    static constexpr int kGridWords = 256;   // the grid, staged in shared memory
};

// Every format of the X-macro has its facts here (a missing one stops the build at its row).
#define QG_GGUF_CHECK_FORMAT(NAME, BLOCK, ELEMS)                                                     \
    static_assert(sizeof(FormatFacts<QG_FORMAT_##NAME>) > 0, #NAME ": no FormatFacts<> in hip/gguf_kernels.h");
QG_GGUF_FORMATS(QG_GGUF_CHECK_FORMAT)
#undef QG_GGUF_CHECK_FORMAT

// Blocks per step: kJobsPerLane jobs for every lane of the warp.
template <int FMT>
__host__ __device__ constexpr int step_blocks(int warp_size)
{
    return FormatFacts<FMT>::kJobsPerLane * warp_size / FormatFacts<FMT>::kJobsPerBlock;
}

// Static shared memory of one thread block (the host's occupancy estimate uses it).
template <int FMT, int MT, bool ASYNC>
__host__ __device__ constexpr int static_smem_bytes(int warp_size)
{
    return (kThreads / warp_size) * stages(ASYNC) * Tune<MT>::kRows *
               row_buffer_bytes(step_blocks<FMT>(warp_size) * FormatFacts<FMT>::BB) +
           FormatFacts<FMT>::kGridWords * 4 + 16;
}

// Dynamic shared memory: x[MT][kx] fp32, then (Q4_K) xsum[MT][kx / 32].
template <int FMT, int MT>
__host__ __device__ constexpr int dynamic_smem_bytes(int kx)
{
    return MT * kx * 4 + (FormatFacts<FMT>::kXsum ? MT * (kx / 32) * 4 : 0);
}

struct DecodeParams {
    const uint8_t* w;     // N rows; row n at w + n * ldw bytes = K / BE blocks of BB bytes
    int64_t ldw;          // bytes between rows; w and ldw are multiples of load_bytes
    const void* x;        // [m_valid, K] x_dtype, row stride ldx elements (this M chunk)
    int64_t ldx;
    void* y;              // [m_valid, N] y_dtype, row stride ldy elements (this M chunk)
    int64_t ldy;
    float* partial;       // [split_k, MT, N] fp32 partial sums (split_k > 1 only)
    uint32_t* counters;   // [gridDim.x] arrival counters, zero before and after a launch (split_k > 1)
    int n;                // N
    int nb;               // K / BE: blocks per row
    int m_valid;          // rows of x in this launch, <= MT (rows beyond are staged as 0)
    int x_dtype;          // qg_dtype: F32, F16, BF16
    int y_dtype;          // qg_dtype: F32, F16, BF16
    int load_bytes;       // 16, 8, 4 or 2: global load width for W
    int split_k;          // == gridDim.y
    int kxb;              // blocks of K staged per x chunk (>= blocks of a split: one chunk)
    BiasRef bias;         // [N], added to each output once (after the split sum)
};

// gguf_decode_kernel<FMT, MT, ASYNC>(DecodeParams): every format of QG_GGUF_FORMATS x
// QG_GGUF_DECODE_MTILES, synchronous and (kAsyncBuild) cp.async; nullptr for any other
// combination.
const void* decode_kernel(int format, int mt, bool async);

}  // namespace gguf

namespace gguf_mma {

// ================================================================ int8 mma decode tier (hip/gguf_mma.hip)

constexpr int kWarps = 4;             // warps of a thread block (64 rows)
constexpr int kThreads = 32 * kWarps; // NVIDIA only (mma.sync)
constexpr int kTileRows = 16;         // rows of W per warp (the mma M)
constexpr int kCols = 8;              // rows of x per launch (the mma N)

// The instantiated widths of the prepared x of one format (MP: the launch's rows of x
// rounded up): X(FMT, MP).
#define QG_GGUF_MMA_MPS(X, FMT) X(FMT, 2) X(FMT, 4) X(FMT, 8)

// ------------------------------------------------------------------ prepared x
// One 32-element slice j of K for the MP rows of x a launch serves (MP = 2, 4 or 8: the
// rows rounded up, so that small M moves few bytes), Slice<MP>::kBytes at j * kBytes:
//   xq    [MP][32 bytes]   row m's int8 codes in B-fragment order: lane (g, t) of the mma
//                          reads 8 bytes at g * 32 + t * 8 = codes of k = 4t..4t+3, then
//                          k = 16+4t..16+4t+3 (the two b registers)
//   cinit [2][MP] int32    the mma's C input, -b * sum(xq): [0] over the slice (k32
//                          formats); q6_K: [0] over k 0..15, [1] over k 16..31
//   dx    [MP] float       row m's scale (NaN when the slice of x is not finite)
//   sx    [MP] float       sum of x over the slice (fp32, q4_K's min term)
// Rows m_valid <= m < MP are zeros.
template <int MP>
struct Slice {
    static constexpr int kXq = 0, kCinit = 32 * MP, kDx = 40 * MP, kSx = 44 * MP, kBytes = 48 * MP;
};

struct PrepParams {
    const void* x;     // [m_valid, K] x_dtype, row stride ldx elements
    int64_t ldx;
    uint8_t* xp;       // [K / 32][48 * mp]
    int nslices;       // K / 32
    int m_valid;       // <= mp
    int mp;            // 2, 4 or 8
    int x_dtype;
    int bias;          // b: 8 (q4_0), 32 (q6_K), 0 otherwise
    int unit16;        // q6_K: cinit per 16 elements
};

// The x prep: grid ceil(nslices / kWarps) blocks of kThreads (hip/gguf_mma.hip).
__global__ void gguf_mma_prep_kernel(const PrepParams p);

// What the launcher plans with of a format's decoder; hip/gguf_mma.hip's Block<FMT>
// derives from it and adds the device code:
//   BE, BB       elements and bytes of a block (Geometry<FMT>: the X-macro row's)
//   WC           blocks per step
//   kBias        code bias b of the x prep (w = scale * (code - b))
// and what the generic kernel and the x prep do for the format; PlainBlockFacts holds
// the answers of a plain format:
//   kUnit16      the x prep writes cinit per 16 elements (q6_K's k16 mma), not per 32
//   kGridWords   words of the codebook run reads from shared memory (1: none; the
//                kernel's array keeps one placeholder word)
template <int FMT>
struct BlockFacts;

template <int FMT>
struct PlainBlockFacts : gguf::Geometry<FMT> {
    static constexpr bool kUnit16 = false;
    static constexpr int kGridWords = 1;
};

template <>
struct BlockFacts<QG_FORMAT_Q8_0> : PlainBlockFacts<QG_FORMAT_Q8_0> {
    static constexpr int WC = 4, kBias = 0;
};
template <>
struct BlockFacts<QG_FORMAT_Q4_0> : PlainBlockFacts<QG_FORMAT_Q4_0> {
    static constexpr int WC = 8, kBias = 8;
};
template <>
struct BlockFacts<QG_FORMAT_Q4_K> : PlainBlockFacts<QG_FORMAT_Q4_K> {
    static constexpr int WC = 1, kBias = 0;
};
template <>
struct BlockFacts<QG_FORMAT_Q6_K> : PlainBlockFacts<QG_FORMAT_Q6_K> {
    static constexpr int WC = 1, kBias = 32;
    static constexpr bool kUnit16 = true;   // one scale per 16 elements: a k16 mma each
};
template <>
struct BlockFacts<QG_FORMAT_IQ4_XS> : PlainBlockFacts<QG_FORMAT_IQ4_XS> {
    static constexpr int WC = 1, kBias = 0;
};
template <>
struct BlockFacts<QG_FORMAT_IQ3_XXS> : PlainBlockFacts<QG_FORMAT_IQ3_XXS> {
    static constexpr int WC = 2, kBias = 0;
    static constexpr int kGridWords = 256;   // the grid, staged in shared memory
};

// Every format of the X-macro has its facts here (a missing one stops the build at its row).
#define QG_GGUF_MMA_CHECK_BLOCK(NAME, BLOCK, ELEMS)                                                  \
    static_assert(sizeof(BlockFacts<QG_FORMAT_##NAME>) > 0, #NAME ": no BlockFacts<> in hip/gguf_kernels.h");
QG_GGUF_FORMATS(QG_GGUF_MMA_CHECK_BLOCK)
#undef QG_GGUF_MMA_CHECK_BLOCK

// Shared-memory bytes of one row's step buffer: WC blocks, up to 14 bytes of lead-in
// (a step starts at a block boundary, the 16-byte copies at the aligned address before
// it), one word of over-read for word_at; padded so that the buffer stride is 16 mod 32
// bytes: rows g = 0..7 at word offsets g * (4 mod 8) and lanes t = 0..3 reading
// consecutive words hit 32 different banks.
__host__ __device__ constexpr int units_per_row(int step_bytes) { return (step_bytes + 14 + 15) / 16; }
__host__ __device__ constexpr int row_stride(int step_bytes) { return (units_per_row(step_bytes) * 16 + 16 + 31) / 32 * 32 + 16; }

// A thread block: kWarps warps, warp w streams rows [16w, 16w + 16) of the block's 64.
// One ring stage holds every warp's 16 row buffers, then the step's slices of x.
template <int FMT>
struct Shape {
    typedef BlockFacts<FMT> B;
    static constexpr int STEP = B::WC * B::BB;
    static constexpr int UPR = units_per_row(STEP);
    static constexpr int ROW = row_stride(STEP);
    static constexpr int ROWS = kWarps * kTileRows;             // rows of W per block
    static constexpr int W_STAGE = ROWS * ROW;                  // weight bytes of a stage
    static constexpr int SLICES = B::WC * B::BE / 32;           // x slices per step
    static __host__ __device__ constexpr int stage_bytes(int mp) { return W_STAGE + SLICES * 48 * mp; }
    static __host__ __device__ constexpr int smem_bytes(int mp) { return 2 * stage_bytes(mp); }   // two stages
};

struct MmaParams {
    const uint8_t* w;       // N rows of ldw bytes; w and ldw multiples of 16
    int64_t ldw;
    uint8_t* xp;            // prepared x [K / 32][48 * MP] (zeroed by the kernel)
    void* y;                // [m_valid, N] y_dtype, row stride ldy
    int64_t ldy;
    float* partial;         // [split_k][MP][N] (split_k > 1)
    uint32_t* tile_count;   // [gridDim.x] arrival counters (split_k > 1)
    uint32_t* split_count;  // [split_k] finished blocks per split (prepared-x zeroing)
    int n, nb, m_valid, y_dtype, split_k;
    BiasRef bias;           // [N], added to each output once (after the split sum)
};

// gguf_mma_kernel<FMT, MP>(MmaParams): every format of QG_GGUF_FORMATS x QG_GGUF_MMA_MPS;
// nullptr for any other combination.
const void* mma_kernel(int format, int mp);

}  // namespace gguf_mma
namespace gguf_prefill {

// ---------------------------------------------------------------- prefill_wgmma (sm_90a)
// One block owns 128 weight rows x BN tokens (BN = 128 or 256). Its two warpgroups each own
// 64 of the rows: a warpgroup copies the raw blocks of its rows (256 elements of K per row at
// a time, two chunk buffers, 16-byte cp.async, coalesced along each row) into shared memory,
// dequantizes them 64 k at a time into a bf16 tile (128-byte swizzle, two stages) and runs
// wgmma m64nBNk16 with A fragments loaded from that tile by ldmatrix; x tiles [BN tokens x
// 64 k] come by TMA into a ring of XRing<BN>::kStages, shared by both warpgroups.
// docs/gguf-prefill.md has the spec.
constexpr int kThreads = 256;
constexpr int kRows = 128;       // weight rows per block (2 warpgroups x 64)
constexpr int kAStages = 2;      // bf16 weight tiles: one being read by wgmma, one being written
constexpr int kATileBytes = kRows * 64 * 2;  // one [128 rows x 64 k] bf16 tile of A
constexpr int kChunk = 256;      // elements of K per raw chunk

// The token tiles (the wgmma N) with their x ring depth: what fits 227 KB beside the A tiles
// and the largest raw chunks (q8_0).
#define QG_GGUF_PREFILL_BNS(X, FMT) X(FMT, 128) X(FMT, 256)
template <int BN>
struct XRing {
    static constexpr int kStages = BN == 256 ? 3 : 4;
    static constexpr int kTileBytes = BN * 64 * 2;  // one [BN tokens x 64 k] bf16 tile of x
};

// The raw chunk of one row: RB bytes (256 elements) starting anywhere 2-byte aligned, copied
// as the NU 16-byte units that cover it from the one holding its first byte (up to 14
// bytes before it); SR words of row stride in shared memory: NU units and one more, which
// the decoders' funnel-shift reads may touch past the last unit (NU + 1 is odd: rows of
// 16-byte units fall on different bank groups).
template <int FMT>
struct ChunkGeo {
    static constexpr int RB = kChunk / gguf::Geometry<FMT>::BE * gguf::Geometry<FMT>::BB;
    static constexpr int NU = (RB + 14 + 15) / 16;
    static constexpr int SR = 4 * ((NU + 1) | 1);
    static constexpr int RAW_BYTES = 2 * 2 * 64 * SR * 4;  // 2 warpgroups x 2 chunk buffers
};

// Shared memory of gguf_prefill_kernel<FMT, BN>: A tiles, x tiles, raw chunks, the codebook
// (256 words), the mbarriers; + 1024: alignment slack.
template <int FMT, int BN>
constexpr int prefill_smem_bytes()
{
    return 1024 + kAStages * kATileBytes + XRing<BN>::kStages * XRing<BN>::kTileBytes + ChunkGeo<FMT>::RAW_BYTES +
           1024 + 2 * XRing<BN>::kStages * 8;
}

struct PrefillParams {
    const uint8_t* w;      // N rows of blocks, row stride ldw bytes (even)
    const uint8_t* w_end;  // one past the last block of row N-1: copies stay in [w, w_end)
    int64_t ldw;
    int64_t row_bytes;     // K / BE * BB
    void* y;               // [M, N], row stride ldy elements, type y_type
    int64_t ldy;
    int m, n, k;
    int k_steps;           // ceil(K / 64)
    int chunks;            // ceil(K / 256)
    int y_type;            // ELEM_BF16 or ELEM_F32
    BiasRef bias;          // [N]
};

// gguf_prefill_kernel<FMT, BN>(tmap_x, params): every format of QG_GGUF_FORMATS x
// QG_GGUF_PREFILL_BNS; tmap_x: x [M, K] as a 2-D tensor map, box [BN tokens, 64 k],
// 128-byte swizzle. nullptr for any other combination (and in builds without sm_90a
// tensor maps).
const void* prefill_kernel(int format, int bn);

}  // namespace gguf_prefill

}  // namespace qg
