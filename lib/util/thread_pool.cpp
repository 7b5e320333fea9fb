#include "thread_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define H2O_CPU_RELAX() _mm_pause()
#else
#define H2O_CPU_RELAX() ((void)0)
#endif

namespace h2o {

namespace {
// Tens of microseconds of spinning before a worker sleeps: enough to bridge the gaps between the
// jobs of one decode step, short enough not to steal a busy machine's cores for long.
constexpr int kSpinIterations = 2048;
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
    workers_.reserve(n_threads_ - 1);
    for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_.store(true);
        generation_.fetch_add(1);
    }
    wake_.notify_all();
    for (auto &w : workers_) w.join();
}

void ThreadPool::run(const std::function<void(int, int)> &job, int64_t work) {
    if (n_threads_ == 1 || work < kMinParallelWork) {
        job(0, 1);
        return;
    }
    job_ = &job;
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    {
        // Publishing under the mutex pairs with the sleepers' predicate check, so no wake-up is lost.
        std::lock_guard<std::mutex> lock(mutex_);
        generation_.fetch_add(1, std::memory_order_release);
    }
    if (sleepers_.load(std::memory_order_acquire) > 0) wake_.notify_all();
    job(0, n_threads_);
    // Spin while the workers finish; yield the core now and then in case a worker was preempted
    // (an oversubscribed machine), so that it can run.
    for (int spin = 1; pending_.load(std::memory_order_acquire) != 0; ++spin) {
        if (spin % 256 == 0)
            std::this_thread::yield();
        else
            H2O_CPU_RELAX();
    }
    job_ = nullptr;
}

void ThreadPool::worker_loop(int index) {
    uint64_t seen = 0;
    for (;;) {
        uint64_t current = generation_.load(std::memory_order_acquire);
        for (int spin = 1; current == seen && spin < kSpinIterations; ++spin) {
            if (spin % 256 == 0)
                std::this_thread::yield();
            else
                H2O_CPU_RELAX();
            current = generation_.load(std::memory_order_acquire);
        }
        if (current == seen) {
            std::unique_lock<std::mutex> lock(mutex_);
            sleepers_.fetch_add(1);
            wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
            sleepers_.fetch_sub(1);
            current = generation_.load(std::memory_order_acquire);
        }
        seen = current;
        if (stop_.load()) return;
        (*job_)(index, n_threads_);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
}

}  // namespace h2o
