// Writes the CPU tier's decode of fixed pseudo-random blocks of every format (all byte
// patterns, so NaN, Inf and subnormal scales too) to the file named by argv[1]: the float
// decoders (dequant.h) and the int8 path's portable ones (int8_decode.h: codes, scales,
// finite flags). .ci/isa_check.sh builds it for several ISA levels and compilers and
// requires byte-identical files: the decoders must round the same at every vector width.
#include <stdio.h>

#include <random>
#include <vector>

#include "cpu/dequant.h"
#include "cpu/int8_decode.h"
#include "dump_file.h"

using namespace qg;
using namespace qg::cpu;

namespace {

std::vector<uint8_t> random_bytes(size_t n, unsigned seed) {
    std::mt19937 g(seed);
    std::vector<uint8_t> v(n);
    for (auto& c : v) c = (uint8_t)g();
    return v;
}

// The int8 decode of one row: codes, then scales (sw, mw, sub at the panel's stride: only
// entry 0 of each stride is written), then the finite flag.
struct Int8Dump {
    std::vector<int8_t> codes;
    std::vector<float> sw, mw;
    std::vector<int32_t> sub;
    explicit Int8Dump(int64_t elems)
        : codes(elems), sw(elems / Q8_BLOCK * PANEL_ROWS), mw(sw.size()), sub(2 * sw.size()) {}
    Int8Out out() { return Int8Out{codes.data(), sw.data(), mw.data(), sub.data()}; }
    void write(FILE* f, bool ok) {
        fwrite(codes.data(), 1, codes.size(), f);
        fwrite(sw.data(), sizeof(float), sw.size(), f);
        fwrite(mw.data(), sizeof(float), mw.size(), f);
        fwrite(sub.data(), sizeof(int32_t), sub.size(), f);
        const uint8_t b = ok ? 1 : 0;
        fwrite(&b, 1, 1, f);
    }
};

template <class Block>
void dump_gguf(FILE* f, int64_t nb, unsigned seed) {
    const std::vector<uint8_t> raw = random_bytes(sizeof(Block) * nb, seed);
    std::vector<float> out(Decoder<Block>::elems * nb);
    decode_row_blocks<Block>(raw.data(), 0, nb, out.data());
    fwrite(out.data(), sizeof(float), out.size(), f);
    Int8Dump d(Decoder<Block>::elems * nb);
    d.write(f, decode_int8_row<Block>(raw.data(), 0, nb, d.out()));
}

}  // namespace

int main(int argc, char** argv) {
    int status = 0;
    FILE* f = open_dump(argc, argv, &status);
    if (f == nullptr) return status;
    unsigned seed = 1;
#define QG_X(NAME, BLOCK, ELEMS) dump_gguf<BLOCK>(f, 4096 * 32 / ELEMS, seed++);
    QG_GGUF_FORMATS(QG_X)
#undef QG_X
    const int64_t nblk = 4096;  // MXFP4: one row of 4096 blocks, every E8M0 scale byte
    const std::vector<uint8_t> blocks = random_bytes(nblk * MXFP4_BLOCK_BYTES, seed++);
    const std::vector<uint8_t> scales = random_bytes(nblk, seed++);
    std::vector<float> out(nblk * MXFP4_BLOCK);
    decode_mxfp4_row(blocks.data(), scales.data(), 0, nblk, out.data());
    fwrite(out.data(), sizeof(float), out.size(), f);
    Int8Dump dm(nblk * MXFP4_BLOCK);
    dm.write(f, decode_int8_mxfp4_row(blocks.data(), scales.data(), 0, nblk, dm.out()));
    // int4: rows 0..7 of a K = 8192, G = 128 weight with fp16 scales (random bits) and zeros
    const int64_t K = 8192, G = 128, groups = K / G;
    const std::vector<uint8_t> qw = random_bytes(K / 2 * 8, seed++);
    const std::vector<uint8_t> sc = random_bytes(groups * 2 * 8, seed++);
    const std::vector<uint8_t> qz = random_bytes(groups * 4, seed++);
    std::vector<float> o4(K);
    for (int64_t n = 0; n < 8; ++n) {
        decode_int4_row((const int32_t*)qw.data() + n * K / 8, sc.data() + n * groups * 2, QG_DTYPE_F16,
                        (const int32_t*)qz.data(), n, groups, (int)G, 0, K, o4.data());
        fwrite(o4.data(), sizeof(float), o4.size(), f);
        Int8Dump d4(K);
        d4.write(f, decode_int8_int4_row((const int32_t*)qw.data() + n * K / 8, sc.data() + n * groups * 2,
                                         QG_DTYPE_F16, (const int32_t*)qz.data(), n, groups, (int)G, 0, K, d4.out()));
    }
    return fclose(f) == 0 ? 0 : 1;
}
