#!/usr/bin/env bash
# The CPU tier under AddressSanitizer + UndefinedBehaviorSanitizer (called by .ci/run).
#
#   .ci/sanitize.sh [extra pytest arguments]
#
# A separate CMake build (build-asan, QG_GPU=off) compiled with
#   -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
# then every CPU test (pytest -m "not gpu") against it: the interpreter is not
# instrumented, so libasan is LD_PRELOADed ahead of everything and PYQUANT_LIB points
# pyquant at the sanitized library. Any ASan report or UB finding aborts the process
# (tests that fork report the child's abort as a failure) and fails this script;
# --capture=sys leaves file descriptor 2 alone so that the report reaches the log.
#
# ASAN_OPTIONS: detect_leaks=0 because CPython does not free everything at exit by
# design; allocator_may_return_null=1 because the tests ask for impossible allocations
# (qg_malloc of 2^62 bytes) and expect QG_ERR_OUT_OF_MEMORY, not an ASan abort.
#
# Environment: QG_ASAN_BUILD (build directory, default build-asan), JOBS (default 2),
# QG_FUZZ_SCALE (hypothesis budget of tests/test_fuzz_*.py, default 1: about 7,800
# cases). On CI's 2 cores the build is the long part (src/cpu/int8_rows.cpp), then the tests
# about 3 minutes.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${QG_ASAN_BUILD:-build-asan}
JOBS=${JOBS:-2}
PY=${PY:-python3}
fail() { printf '\nSANITIZE FAILED: %s\n' "$*" >&2; exit 1; }

# Every UBSan check is on; QG_UBSAN_EXCLUDE=check1,check2 turns some off for a local look.
# (The enums of quantgemm.h have int as their fixed underlying type in C++, so the
# out-of-range values the fuzz passes on purpose are valid objects, refused by api.cpp.)
exclude=${QG_UBSAN_EXCLUDE-}
flags="-fsanitize=address,undefined${exclude:+ -fno-sanitize=$exclude} -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
echo "==== sanitized CPU build in $BUILD"
# -O1 (QG_HOST_OPT): what ASan's documentation suggests, and at -O3 the instrumented
# src/cpu/int8_rows.cpp (three ISA copies of the row kernels) compiled for 11 minutes in CI
cmake -S . -B "$BUILD" -G Ninja -DQG_GPU=off -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQG_HOST_OPT=-O1 \
      -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$BUILD" -j "$JOBS"
lib="$PWD/$BUILD/libquantgemm.so"
[ -f "$lib" ] || fail "$lib was not built"
# grep reads all of ldd's output: with -q it may exit first, and under pipefail the
# SIGPIPE of ldd failed this check now and then
ldd "$lib" | grep libasan >/dev/null || fail "$lib is not linked against libasan"

# the ASan runtime of the compiler that built the library
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
libasan=$("${cxx:-g++}" -print-file-name=libasan.so)
[ -f "$libasan" ] || fail "no libasan.so for ${cxx:-g++} (got '$libasan')"

export PYQUANT_LIB="$lib"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:abort_on_error=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
export QG_FUZZ_SCALE="${QG_FUZZ_SCALE:-1}"
export PYQUANT_BACKEND=cpu   # conftest: GPU tests skip

echo "==== CPU tests under ASan+UBSan ($libasan)"
LD_PRELOAD="$libasan${LD_PRELOAD:+:$LD_PRELOAD}" \
    "$PY" -m pytest -q -p no:cacheprovider --capture=sys -m "not gpu" tests "$@" \
    || fail "tests failed under ASan/UBSan (reports above)"
echo "==== sanitizers: clean"
