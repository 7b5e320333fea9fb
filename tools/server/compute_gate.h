// Admits a fixed number of holders at a time, first come first served. The server holds it
// around each step that computes (a prompt, one generated piece), so that concurrent
// conversations take turns token by token instead of oversubscribing the cores, and none waits
// behind another's whole reply.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace h2o_server {

class ComputeGate {
public:
    explicit ComputeGate(uint32_t slots) : admitted_(slots) {}

    void acquire() {
        std::unique_lock<std::mutex> lock(mutex_);
        const uint64_t ticket = next_ticket_++;
        changed_.wait(lock, [&] { return ticket < admitted_; });
    }
    void release() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            ++admitted_;
        }
        changed_.notify_all();
    }

    // Holds the gate for a scope.
    class Hold {
    public:
        explicit Hold(ComputeGate &gate) : gate_(gate) { gate_.acquire(); }
        ~Hold() { gate_.release(); }
        Hold(const Hold &) = delete;
        Hold &operator=(const Hold &) = delete;

    private:
        ComputeGate &gate_;
    };

private:
    std::mutex mutex_;
    std::condition_variable changed_;
    uint64_t next_ticket_ = 0;  // the ticket the next caller draws
    uint64_t admitted_;         // tickets below this may hold the gate
};

}  // namespace h2o_server
