#!/usr/bin/env bash
# The CPU tier's worker pool and its int8 and fp32-exact GEMMs under ThreadSanitizer (called
# by .ci/run): a TSan build of the library (QG_GPU=off, one plain copy of the ISA-cloned
# loops: TSan crashes in ifunc resolvers; the int8 kernels pick their level at run time,
# without ifunc) and tests/native/pool_race.cpp, 16 user threads calling it at once. Any
# race report aborts (halt_on_error=1). Python is not run under TSan (CPython crashes there).
#   .ci/tsan_check.sh [BUILD_DIR]        (default build/tsan)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-build/tsan}"
cmake -S . -B "$out" -G Ninja -DQG_GPU=off -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS="-fsanitize=thread -DQG_CPU_NO_CLONES" \
      -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" >/dev/null
cmake --build "$out" -j "${JOBS:-2}"
lib_dir=$(cd "$out" && pwd)
g++ -O1 -g -std=c++17 -fsanitize=thread -Iinclude tests/native/pool_race.cpp \
    -L"$lib_dir" -lquantgemm -Wl,-rpath,"$lib_dir" -o "$out/pool_race"
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" "$out/pool_race"
