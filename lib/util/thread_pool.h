// A fork-join pool for data-parallel kernels. The calling thread is worker 0, so a pool of one
// thread runs everything inline. Between jobs the workers spin briefly (a decode step issues
// hundreds of small jobs, and waking a sleeping thread costs more than the job) and then sleep.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace h2o {

class ThreadPool {
public:
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool &) = delete;
    ThreadPool &operator=(const ThreadPool &) = delete;

    int size() const { return n_threads_; }

    // Runs job(thread_index, n_threads) on every thread and returns when all have finished.
    // Not reentrant: a job must not call run() on the same pool.
    // work: an estimate of the job's size in multiply-adds. Below kMinParallelWork the calling
    // thread runs the job alone as job(0, 1): waking the other threads would cost more.
    void run(const std::function<void(int, int)> &job, int64_t work = INT64_MAX);
    static constexpr int64_t kMinParallelWork = 1 << 15;

    // The half-open range [begin, end) of n items that thread `index` of `count` should handle.
    static void split(int64_t n, int index, int count, int64_t *begin, int64_t *end) {
        *begin = n * index / count;
        *end = n * (index + 1) / count;
    }

private:
    void worker_loop(int index);

    int n_threads_;
    std::vector<std::thread> workers_;
    const std::function<void(int, int)> *job_ = nullptr;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> pending_{0};
    std::atomic<bool> stop_{false};
    std::mutex mutex_;
    std::condition_variable wake_;
    std::atomic<int> sleepers_{0};
};

}  // namespace h2o
