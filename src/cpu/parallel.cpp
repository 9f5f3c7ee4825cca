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
// Threads are detached and never end: the pool is allocated once and never freed, so
// process exit does not wait for them. After fork() the child gets a fresh, empty pool
// (the parent's threads do not exist there, and its lock may have been held).
#include "cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <vector>
#if defined(__unix__)
#include <pthread.h>
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
    int active = 0;
    std::exception_ptr error;  // the first exception a helper's task threw
};

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
    int threads = 0;                  // threads started

    void close(Job* job) {  // with mu held
        auto it = std::find(open.begin(), open.end(), job);
        if (it != open.end()) open.erase(it);
    }

    void thread_main() {
        std::unique_lock<std::mutex> lk(mu);
        for (;;) {
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
            if (--job->active == 0) done_cv.notify_all();
        }
    }

    void run(Job& job, int helpers) {
        {
            std::lock_guard<std::mutex> lk(mu);
            job.helpers_wanted = helpers;
            open.push_back(&job);
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
        std::unique_lock<std::mutex> lk(mu);
        close(&job);
        done_cv.wait(lk, [&] { return job.active == 0; });
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
