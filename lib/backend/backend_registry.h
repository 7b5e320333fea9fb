// Which compute backends and devices exist, what each can run, and choosing one for a session.
//
// Each backend describes itself in a BackendEntry; the table of the backends compiled into this
// build is backends/registry_table.cpp, the one place that knows which those are. lib/ reaches a
// backend only through its entry, and asks it what it runs before making anything, so AUTO picks
// a device from the answers and can say why it passed over the others.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend.h"
#include "h2o/h2o.h"

namespace h2o {

struct BackendDevice {
    h2o_backend_kind kind = H2O_BACKEND_CPU;
    int device_index = 0;
    std::string name;
    std::string type;  // "cpu", "discrete", "integrated", "virtual", "other"
    uint64_t memory_bytes = 0;
};

// What a session needs of a backend, known from the model and the session's settings alone.
struct BackendRequirements {
    std::vector<TensorType> weight_types;  // the distinct types of the model's weight tensors
    KvConfig kv;                           // the session's KV cache
    uint64_t weight_bytes = 0;             // the weights, as stored in the model file
    uint64_t session_bytes = 0;            // the KV cache and activations (Session::planned_bytes)
};

// How a backend is made.
struct BackendOptions {
    int n_threads = 0;  // host threads (the CPU backend); 0: its default
    int max_batch = 0;  // the most tokens one operation sees
};

struct BackendEntry {
    h2o_backend_kind kind;
    // The backend's devices on this machine, in the order of their device_index. An error (no
    // driver, no loader) means there are none, and says why.
    Status (*devices)(std::vector<BackendDevice> *out);
    // Whether `device` runs a session that needs `needs`: Ok, or the error making that session
    // there would give (H2O_ERR_UNSUPPORTED, H2O_ERR_OUT_OF_MEMORY), saying what is missing.
    // Answers from the facts the backend itself enforces; makes nothing.
    Status (*supports)(const BackendRequirements &needs, const BackendDevice &device);
    // Makes the backend on `device`, one of its devices. *running: the device as the session
    // reports it (the CPU backend adds its thread count to the name).
    Status (*create)(const BackendDevice &device, const BackendOptions &options, std::unique_ptr<Backend> *out, BackendDevice *running);
    // Asked by AUTO before `devices`, when not null: whether the backend may have a device AUTO
    // would use, told without loading a driver (listing devices may load drivers that cost far
    // more memory than the model). An error passes the backend over, with that reason.
    Status (*auto_screen)();
};

// For a device backend whose memory holds the weights (at about their size in the file), the KV
// cache and the activations: Ok, or H2O_ERR_OUT_OF_MEMORY saying how much is needed and what the
// device has (a device that reports no size is not checked).
Status check_device_memory(const BackendRequirements &needs, const BackendDevice &device);

// The backends compiled into this build, the CPU backend first (backends/registry_table.cpp).
std::span<const BackendEntry *const> registered_backends();

// The entry of a kind, or nullptr when this build has no such backend.
const BackendEntry *find_backend(h2o_backend_kind kind);

// "CPU", "Vulkan", "CUDA": how messages name a backend kind; nullptr for a value that is none.
const char *backend_kind_title(uint32_t kind);

// Every device of every registered backend: the CPU first, then each backend's in table order.
// A backend whose devices cannot be listed simply has none here.
std::vector<BackendDevice> list_backend_devices();

// A device a session may run on, with its backend's answer.
struct BackendCandidate {
    const BackendEntry *backend = nullptr;
    BackendDevice device;
    Status verdict;  // Ok: it can run the session; otherwise why not
};

// The devices a session may run on, in the order to try them, each with its verdict; makes no
// backend. An explicit kind gives the one device asked for (device_index, or for -1 the best:
// discrete, integrated, virtual, then CPU implementations), and an error when this build lacks
// the kind or the kind lacks the device. AUTO gives every device of every backend: the device
// backends' by that preference, then the CPU backend; a device backend's CPU implementation is
// refused, being slower than the CPU backend. A backend whose devices cannot be listed (no
// driver, no device), or that its auto_screen rules out, is in AUTO's plan once, refused with
// that error, its device_index -1. `kind` is the caller's value as given (an h2o_backend_kind
// only once it is checked to name one): an unknown one is refused.
Status plan_backends(uint32_t kind, int device_index, const BackendRequirements &needs, std::vector<BackendCandidate> *out);

// Names a candidate in messages: "the CPU backend", "Vulkan <device name> (<type>)", or for a
// backend without devices "the CUDA backend".
std::string candidate_label(const BackendCandidate &candidate);

// Why AUTO chose plan[chosen]: "auto: chose <label>; <label>: <reason>; ..." for each candidate
// before it (refused, or failed when made).
std::string explain_auto_choice(const std::vector<BackendCandidate> &plan, size_t chosen);

}  // namespace h2o
