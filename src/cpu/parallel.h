// parallel_for for the CPU tier: tasks [0, n_tasks) handed out one at a time from an
// atomic counter (dynamic scheduling: tiles cost the same on paper, but the host's other
// load does not) to the calling thread and to helpers from one process-wide pool of
// worker threads (parallel.cpp). The pool starts threads when a call first needs them
// and keeps them, so a call pays a wake-up, not a thread start: starting threads per
// call cost about 25 us per thread (bench/NOTES.md, "CPU tier").
#pragma once

#include <stdint.h>
#if defined(__linux__)
#include <sched.h>
#endif

#include <algorithm>
#include <thread>
#include <type_traits>

#include "tiers.h"

namespace qg {
namespace cpu {

// Worker count for a context: the cpu_threads option, or every hardware thread this
// process may run on (its CPU affinity mask on Linux, which containers restrict).
inline int thread_count(const qg_context* ctx) {
    if (ctx != nullptr && ctx->cpu_threads > 0) return (int)ctx->cpu_threads;
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
    const unsigned hw = std::thread::hardware_concurrency();
    return hw == 0 ? 1 : (int)hw;
}

using TaskFn = void (*)(void* fn, int64_t task, int worker);

// Runs fn(fn_state, task, worker) for every task with the caller and up to helpers pool
// threads; returns when every task is done. Helpers that are busy with other calls, or
// that cannot be started, leave their share to the others (at least the caller): the
// result never depends on how many helped.
void run_parallel(int64_t n_tasks, int helpers, TaskFn fn, void* fn_state);

// Calls fn(task, worker) for every task in [0, n_tasks), on at most `threads` threads;
// worker in [0, threads) is unique among the threads of this call.
template <class Fn>
void parallel_for(int64_t n_tasks, int threads, Fn&& fn) {
    if (n_tasks <= 0) return;
    const int workers = (int)std::max<int64_t>(1, std::min<int64_t>(threads, n_tasks));
    if (workers == 1) {
        for (int64_t t = 0; t < n_tasks; ++t) fn(t, 0);
        return;
    }
    using F = std::remove_reference_t<Fn>;
    run_parallel(
        n_tasks, workers - 1, [](void* f, int64_t t, int w) { (*static_cast<F*>(f))(t, w); },
        const_cast<void*>(static_cast<const void*>(&fn)));
}

}  // namespace cpu
}  // namespace qg
