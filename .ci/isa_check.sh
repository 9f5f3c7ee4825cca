#!/usr/bin/env bash
# The CPU tier's decoders give the same bits at every x86-64 ISA level and with either
# compiler: tests/native/decode_dump.cpp is built against src/cpu/decode_rows.cpp
#   - as the library builds it (ifunc clones; this machine's widest clone runs),
#   - without clones for x86-64 (SSE2) and x86-64-v3 (AVX2), the clones this CPU skips,
#   - with clang++-19 (scalar table lookups instead of GCC's vector shuffles),
# and every dump must be byte-identical. Usage: .ci/isa_check.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-build/isa-check}"
mkdir -p "$out"
src=(tests/native/decode_dump.cpp)
flags=(-O2 -std=c++17 -ffp-contract=off -Wno-psabi -Isrc -Iinclude -I.)
# the library's generated headers (IQ tables) come from its CMake configure step
cmake -S . -B "$out/cmake" -G Ninja -DQG_GPU=off >/dev/null
flags+=(-I"$out/cmake/generated")
sed 's/QG_CPU_CLONES //' src/cpu/decode_rows.cpp > "$out/decode_rows_plain.cpp"

rm -f "$out"/*.bin
build() {  # name compiler decode_rows.cpp extra flags...
    local name=$1 cxx=$2 rows=$3
    shift 3
    "$cxx" "${flags[@]}" "$@" "${src[@]}" "$rows" -o "$out/dump_$name"
    "$out/dump_$name" "$out/$name.bin"
}
build clones g++ src/cpu/decode_rows.cpp
build sse2 g++ "$out/decode_rows_plain.cpp" -march=x86-64
if grep -qw avx2 /proc/cpuinfo; then
    build avx2 g++ "$out/decode_rows_plain.cpp" -march=x86-64-v3
else
    echo "this CPU lacks AVX2: no x86-64-v3 dump"
fi
if command -v clang++-19 >/dev/null; then
    build clang clang++-19 src/cpu/decode_rows.cpp
else
    echo "no clang++-19: no clang dump"
fi

ref="$out/clones.bin"
status=0
for f in "$out"/*.bin; do
    if cmp -s "$ref" "$f"; then
        echo "same bits: $(basename "$f") ($(stat -c %s "$f") bytes)"
    else
        echo "DIFFERENT: $(basename "$f") vs clones.bin: $(cmp "$ref" "$f" | head -1)"
        status=1
    fi
done
exit $status
