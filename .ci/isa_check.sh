#!/usr/bin/env bash
# The CPU tier gives the same bits at every x86-64 ISA level and with either compiler.
#   1. Decoders: tests/native/decode_dump.cpp is built against src/cpu/decode_rows.cpp and
#      src/cpu/int8_decode.cpp (the float decoders and the int8 path's portable ones)
#        - as the library builds them (ifunc clones; this machine's widest clone runs),
#        - without clones for x86-64 (SSE2) and x86-64-v3 (AVX2), the clones this CPU skips,
#        - with clang++-19 (scalar table lookups instead of GCC's vector shuffles),
#      and every dump must be byte-identical.
#   2. The int8 path end to end (quantized activations, every kernel: small-M rows,
#      panels, scalar / AVX2 / AVX-512 VNNI / AMX, and iq3_xxs's AVX-512 VBMI decoder within
#      the avx512vnni and amx levels where the CPU has VBMI): tests/native/int8_dump.cpp against the
#      library built by GCC and by clang++-19, each run under every QG_CPU_ISA cap, and
#      under the avx512vnni and amx caps once more with the small-M rows kernel on zmm
#      (QG_CPU_ROWS=zmm); every dump must be byte-identical. A cap above this CPU's level
#      changes nothing; the level and rows kernel each run used are printed.
# Usage: .ci/isa_check.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-build/isa-check}"
mkdir -p "$out"
JOBS=${JOBS:-2}
src=(tests/native/decode_dump.cpp)
flags=(-O2 -std=c++17 -ffp-contract=off -Wno-psabi -Isrc -Iinclude -I.)
# the library's generated headers (IQ tables) come from its CMake configure step
cmake -S . -B "$out/cmake" -G Ninja -DQG_GPU=off >/dev/null
flags+=(-I"$out/cmake/generated")
for f in decode_rows int8_decode; do
    sed 's/QG_CPU_CLONES //' "src/cpu/$f.cpp" > "$out/${f}_plain.cpp"
done

rm -f "$out"/*.bin
build() {  # name compiler decoder sources (2) extra flags...
    local name=$1 cxx=$2 rows=$3 int8=$4
    shift 4
    "$cxx" "${flags[@]}" "$@" "${src[@]}" "$rows" "$int8" -o "$out/dump_$name"
    "$out/dump_$name" "$out/$name.bin"
}
build clones g++ src/cpu/decode_rows.cpp src/cpu/int8_decode.cpp
build sse2 g++ "$out/decode_rows_plain.cpp" "$out/int8_decode_plain.cpp" -march=x86-64
if grep -qw avx2 /proc/cpuinfo; then
    build avx2 g++ "$out/decode_rows_plain.cpp" "$out/int8_decode_plain.cpp" -march=x86-64-v3
else
    echo "this CPU lacks AVX2: no x86-64-v3 dump"
fi
have_clang=0
if command -v clang++-19 >/dev/null; then
    have_clang=1
    build clang clang++-19 src/cpu/decode_rows.cpp src/cpu/int8_decode.cpp
else
    echo "no clang++-19: no clang dump"
fi

status=0
compare() {  # reference files...
    local ref=$1
    shift
    for f in "$@"; do
        if cmp -s "$ref" "$f"; then
            echo "same bits: $(basename "$f") ($(stat -c %s "$f") bytes)"
        else
            echo "DIFFERENT: $(basename "$f") vs $(basename "$ref"): $(cmp "$ref" "$f" | head -1)"
            status=1
        fi
    done
}
compare "$out/clones.bin" "$out"/*.bin

# ---- 2. the int8 path end to end, per library build and ISA cap
mkdir -p "$out/int8"
rm -f "$out"/int8/*.bin
libs=(gcc)
[ "$have_clang" = 1 ] && libs+=(clang)
for lib in "${libs[@]}"; do
    dir="$out/lib-$lib"
    cxx=g++
    [ "$lib" = clang ] && cxx=clang++-19
    cmake -S . -B "$dir" -G Ninja -DQG_GPU=off -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" >/dev/null
    cmake --build "$dir" -j "$JOBS" >/dev/null
    lib_dir=$(cd "$dir" && pwd)
    g++ -O2 -std=c++17 -Iinclude tests/native/int8_dump.cpp -L"$lib_dir" -lquantgemm -Wl,-rpath,"$lib_dir" \
        -o "$out/int8_dump_$lib"
    for run in scalar avx2 avx512vnni amx avx512vnni/zmm amx/zmm; do
        cap=${run%/*} rows=ymm
        [ "$run" != "$cap" ] && rows=${run#*/}
        log=$(QG_LOG=1 QG_CPU_ISA=$cap QG_CPU_ROWS=$rows "$out/int8_dump_$lib" "$out/int8/${lib}_${cap}_$rows.bin" 2>&1)
        ran=$(sed -n 's/.*cpu int8 isa=\([a-z0-9]*\).*/\1/p' <<<"$log" | head -1)
        vbmi=$(sed -n 's/.*cpu int8: avx512vbmi decoders \(.*\)$/\1/p' <<<"$log" | head -1)
        kernel=$(sed -n 's/.*cpu int8: rows kernel on \(.*\)$/\1/p' <<<"$log" | head -1)
        echo "int8 path: $lib library, QG_CPU_ISA=$cap QG_CPU_ROWS=$rows ran isa=$ran, rows kernel on ${kernel:-none (not used)}, avx512vbmi decoders ${vbmi:-not asked}"
    done
done
compare "$out/int8/gcc_scalar_ymm.bin" "$out"/int8/*.bin
exit $status
