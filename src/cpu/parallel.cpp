// The CPU tier's worker pool (see parallel.h).
//
// A call posts its job on a list of open jobs and works on it itself. Pool threads take
// the oldest open job, join it (each gets a worker index), run its tasks until the counter
// runs out, and leave. A job is closed (taken off the list) once it has all the helpers it
// asked for, or when its caller has run out of tasks; the caller then waits until every
// helper that joined has left, so the job (on the caller's stack) outlives its helpers.
// Several calls from different user threads share the pool; none waits for a helper to
// start, only for helpers already working on its own tasks.
//
// An exception thrown by a task (std::bad_alloc, say) stops the job: no more tasks are
// handed out, and the caller rethrows it once every helper has left, whichever thread
// threw; the entry point turns it into an error status (api.cpp).
//
// Waking a sleeping thread costs tens of microseconds on a VM (a futex wake and, where the
// vCPU halted, an interrupt to it: 2 threads ran q4_0 1024 x 1024 M = 1 in 50 us against 36
// us on one, bench/NOTES.md, session 48), as much as a small GEMM's whole work. So a pool
// thread that finds no open job spins on an atomic count for kSpin before it sleeps, and a
// caller whose helpers are still on their last task spins as long before it sleeps: calls
// that follow each other (a model's layers, the bench) find their helpers awake.
//
// Threads are detached and never end: the pool is allocated once and never freed, so
// process exit does not wait for them. After fork() the child gets a fresh, empty pool
// (the parent's threads do not exist there, and its lock may have been held).
#include "cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <vector>
#if defined(__unix__)
#include <pthread.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace qg {
namespace cpu {

namespace {

struct Job {
    TaskFn fn;
    void* state;
    int64_t n_tasks;
    std::atomic<int64_t> next{0};
    int helpers_wanted = 0;  // the fields below are guarded by Pool::mu
    int joined = 0;
    // helpers working on it: changed under Pool::mu, read without it by the caller's spin
    // (a helper's last access to the job is its release decrement)
    std::atomic<int> active{0};
    std::exception_ptr error;  // the first exception a helper's task threw
};

constexpr std::chrono::microseconds kSpin{100};

// Polls ready() (pause between polls) for at most kSpin; true once it held.
template <class Ready>
bool spin_until(Ready&& ready) {
    const auto end = std::chrono::steady_clock::now() + kSpin;
    for (;;) {
        for (int i = 0; i < 64; ++i) {
            if (ready()) return true;
#if defined(__x86_64__) || defined(__i386__)
            _mm_pause();
#else
            std::this_thread::yield();
#endif
        }
        if (std::chrono::steady_clock::now() >= end) return ready();
    }
}

void stop(Job& job) { job.next.store(job.n_tasks, std::memory_order_relaxed); }  // no more tasks handed out

void execute(Job& job, int worker) {
    for (int64_t t = job.next.fetch_add(1, std::memory_order_relaxed); t < job.n_tasks;
         t = job.next.fetch_add(1, std::memory_order_relaxed)) {
        job.fn(job.state, t, worker);
    }
}

struct Pool {
    std::mutex mu;
    std::condition_variable work_cv;  // pool threads wait here for an open job
    std::condition_variable done_cv;  // callers wait here for their helpers to leave
    std::vector<Job*> open;           // jobs that still take helpers, oldest first
    std::atomic<size_t> n_open{0};    // open.size(), written under mu, read by spinning threads
    int threads = 0;                  // threads started

    void close(Job* job) {  // with mu held
        auto it = std::find(open.begin(), open.end(), job);
        if (it != open.end()) open.erase(it);
        n_open.store(open.size(), std::memory_order_relaxed);
    }

    void thread_main() {
        std::unique_lock<std::mutex> lk(mu);
        for (;;) {
            if (open.empty()) {
                lk.unlock();
                spin_until([&] { return n_open.load(std::memory_order_relaxed) > 0; });
                lk.lock();
            }
            work_cv.wait(lk, [&] { return !open.empty(); });
            Job* job = open.front();
            const int worker = ++job->joined;
            ++job->active;
            if (job->joined == job->helpers_wanted) close(job);
            lk.unlock();
            std::exception_ptr error;
            try {
                execute(*job, worker);
            } catch (...) {  // handed to the caller, which rethrows it (api.cpp reports it)
                error = std::current_exception();
                stop(*job);
            }
            lk.lock();
            if (error && !job->error) job->error = error;
            if (job->active.fetch_sub(1, std::memory_order_release) == 1) done_cv.notify_all();
        }
    }

    void run(Job& job, int helpers) {
        {
            std::lock_guard<std::mutex> lk(mu);
            job.helpers_wanted = helpers;
            open.push_back(&job);
            n_open.store(open.size(), std::memory_order_relaxed);
            while (threads < helpers) {
                try {
                    std::thread(&Pool::thread_main, this).detach();
                } catch (...) {
                    break;  // fewer helpers: the caller and the running threads take the rest
                }
                ++threads;
            }
        }
        work_cv.notify_all();
        try {
            execute(job, 0);
        } catch (...) {
            stop(job);
            finish(job);
            throw;
        }
        finish(job);
        if (job.error) std::rethrow_exception(job.error);  // read after every helper left
    }

    void finish(Job& job) {
        {
            std::lock_guard<std::mutex> lk(mu);
            close(&job);  // no helper joins it from here on
        }
        if (spin_until([&] { return job.active.load(std::memory_order_acquire) == 0; })) return;
        std::unique_lock<std::mutex> lk(mu);
        done_cv.wait(lk, [&] { return job.active.load(std::memory_order_relaxed) == 0; });
    }
};

std::atomic<Pool*> g_pool{nullptr};

#if defined(__unix__)
void reset_after_fork() { g_pool.store(new Pool, std::memory_order_release); }  // the old one leaks
#endif

Pool& pool() {
    static Pool* const first = [] {
        Pool* p = new Pool;  // never freed: detached threads may still wait on it at exit
        g_pool.store(p, std::memory_order_release);
#if defined(__unix__)
        pthread_atfork(nullptr, nullptr, reset_after_fork);
#endif
        return p;
    }();
    (void)first;
    return *g_pool.load(std::memory_order_acquire);
}

}  // namespace

void run_parallel(int64_t n_tasks, int helpers, TaskFn fn, void* fn_state) {
    Job job;
    job.fn = fn;
    job.state = fn_state;
    job.n_tasks = n_tasks;
    pool().run(job, helpers);
}

}  // namespace cpu
}  // namespace qg
