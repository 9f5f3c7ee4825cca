// A small parallel_for for the CPU tier: tasks [0, n_tasks) handed out one at a time
// from an atomic counter to std::threads (dynamic scheduling: tiles cost the same on
// paper, but the host's other load does not). The calling thread works too.
#pragma once

#include <stdint.h>
#if defined(__linux__)
#include <sched.h>
#endif

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

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

// Calls fn(task, worker) for every task in [0, n_tasks); worker in [0, threads) names
// the thread so that fn can use per-worker scratch. Returns when all tasks are done.
// If a thread cannot be started the remaining workers (at least the caller) finish
// the tasks: the result never depends on the thread count.
template <class Fn>
void parallel_for(int64_t n_tasks, int threads, Fn&& fn) {
    if (n_tasks <= 0) return;
    const int workers = (int)std::max<int64_t>(1, std::min<int64_t>(threads, n_tasks));
    if (workers == 1) {
        for (int64_t t = 0; t < n_tasks; ++t) fn(t, 0);
        return;
    }
    std::atomic<int64_t> next{0};
    auto work = [&](int worker) {
        for (int64_t t = next.fetch_add(1, std::memory_order_relaxed); t < n_tasks;
             t = next.fetch_add(1, std::memory_order_relaxed)) {
            fn(t, worker);
        }
    };
    std::vector<std::thread> pool;
    pool.reserve(workers - 1);
    for (int w = 1; w < workers; ++w) {
        try {
            pool.emplace_back(work, w);
        } catch (...) {
            break;  // fewer threads; the ones running (and the caller) take the rest
        }
    }
    work(0);
    for (auto& t : pool) t.join();
}

}  // namespace cpu
}  // namespace qg
