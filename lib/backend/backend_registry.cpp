#include "backend_registry.h"

#include <algorithm>

namespace h2o {

namespace {

// Preference among a backend's devices when none is named: discrete, integrated, virtual, CPU
// implementations, anything else.
int preference(const BackendDevice &d) {
    if (d.type == "discrete") return 4;
    if (d.type == "integrated") return 3;
    if (d.type == "virtual") return 2;
    if (d.type == "cpu") return 1;
    return 0;
}

// The devices of one backend; an error when it has none.
Status backend_devices(const BackendEntry &backend, std::vector<BackendDevice> *out) {
    H2O_TRY(backend.devices(out));
    if (out->empty()) {
        return make_error(H2O_ERR_BACKEND_UNAVAILABLE, std::string("no ") + backend_kind_title(backend.kind) + " device is present");
    }
    return Status::Ok();
}

Status plan_explicit(const BackendEntry &backend, int device_index, const BackendRequirements &needs, std::vector<BackendCandidate> *out) {
    std::vector<BackendDevice> devices;
    H2O_TRY(backend_devices(backend, &devices));
    const BackendDevice *device = nullptr;
    if (device_index < 0) {
        device = &*std::max_element(devices.begin(), devices.end(),
                                    [](const BackendDevice &a, const BackendDevice &b) { return preference(a) < preference(b); });
    } else {
        for (const BackendDevice &d : devices) {
            if (d.device_index == device_index) device = &d;
        }
    }
    if (!device) {
        return make_error(H2O_ERR_BACKEND_UNAVAILABLE, std::string("the ") + backend_kind_title(backend.kind) + " backend has no device " +
                                                           std::to_string(device_index) + " (h2o_backend_get_info lists them)");
    }
    out->push_back({&backend, *device, backend.supports(needs, *device)});
    return Status::Ok();
}

void plan_auto(const BackendRequirements &needs, std::vector<BackendCandidate> *out) {
    for (const BackendEntry *backend : registered_backends()) {
        std::vector<BackendDevice> devices;
        Status listed = backend->auto_screen ? backend->auto_screen() : Status::Ok();
        if (listed.ok()) listed = backend->devices(&devices);
        if (!listed.ok()) {
            // A backend without a driver or devices, or ruled out by its screen, has nothing to
            // weigh; it stays in the plan, refused, so that the choice can say why it was passed
            // over.
            BackendDevice none;
            none.kind = backend->kind;
            none.device_index = -1;
            none.type = "none";
            out->push_back({backend, std::move(none), std::move(listed)});
            continue;
        }
        for (const BackendDevice &d : devices) {
            BackendCandidate c{backend, d, backend->supports(needs, d)};
            if (c.verdict.ok() && backend->kind != H2O_BACKEND_CPU && d.type == "cpu") {
                c.verdict = make_error(H2O_ERR_UNSUPPORTED, "skipped, a CPU implementation (slower than the CPU backend)");
            }
            out->push_back(std::move(c));
        }
    }
    // The CPU backend runs everything the model loader accepts, so it comes last, after every
    // device that may be faster.
    std::stable_sort(out->begin(), out->end(), [](const BackendCandidate &a, const BackendCandidate &b) {
        const bool a_cpu = a.backend->kind == H2O_BACKEND_CPU, b_cpu = b.backend->kind == H2O_BACKEND_CPU;
        if (a_cpu != b_cpu) return b_cpu;
        return preference(a.device) > preference(b.device);
    });
}

}  // namespace

Status check_device_memory(const BackendRequirements &needs, const BackendDevice &device) {
    const uint64_t needed = needs.weight_bytes + needs.session_bytes;
    if (device.memory_bytes == 0 || needed <= device.memory_bytes) return Status::Ok();
    return make_error(H2O_ERR_OUT_OF_MEMORY, "the session needs " + std::to_string(needed >> 20) +
                                                 " MiB of device memory for its weights, KV cache and activations; the device has " +
                                                 std::to_string(device.memory_bytes >> 20) + " MiB");
}

const BackendEntry *find_backend(h2o_backend_kind kind) {
    for (const BackendEntry *backend : registered_backends()) {
        if (backend->kind == kind) return backend;
    }
    return nullptr;
}

const char *backend_kind_title(uint32_t kind) {
    switch (kind) {
        case H2O_BACKEND_AUTO:
            return "auto";
        case H2O_BACKEND_CPU:
            return "CPU";
        case H2O_BACKEND_VULKAN:
            return "Vulkan";
        case H2O_BACKEND_CUDA:
            return "CUDA";
    }
    return nullptr;
}

std::vector<BackendDevice> list_backend_devices() {
    std::vector<BackendDevice> all;
    for (const BackendEntry *backend : registered_backends()) {
        std::vector<BackendDevice> devices;
        if (backend->devices(&devices).ok()) all.insert(all.end(), devices.begin(), devices.end());
    }
    return all;
}

Status plan_backends(uint32_t kind_value, int device_index, const BackendRequirements &needs, std::vector<BackendCandidate> *out) {
    out->clear();
    const char *title = backend_kind_title(kind_value);
    if (!title) return make_error(H2O_ERR_INVALID_ARGUMENT, "unknown backend kind " + std::to_string(kind_value));
    const auto kind = static_cast<h2o_backend_kind>(kind_value);
    if (kind == H2O_BACKEND_AUTO) {
        if (device_index >= 0) {
            return make_error(H2O_ERR_INVALID_ARGUMENT,
                              "device_index " + std::to_string(device_index) + " needs an explicit backend, not auto");
        }
        plan_auto(needs, out);
        return Status::Ok();
    }
    const BackendEntry *backend = find_backend(kind);
    if (!backend) return make_error(H2O_ERR_BACKEND_UNAVAILABLE, std::string("this build of h2o has no ") + title + " backend");
    return plan_explicit(*backend, device_index, needs, out);
}

std::string candidate_label(const BackendCandidate &candidate) {
    if (candidate.backend->kind == H2O_BACKEND_CPU) return "the CPU backend";
    if (candidate.device.device_index < 0) return std::string("the ") + backend_kind_title(candidate.backend->kind) + " backend";
    return std::string(backend_kind_title(candidate.backend->kind)) + " " + candidate.device.name + " (" + candidate.device.type + ")";
}

std::string explain_auto_choice(const std::vector<BackendCandidate> &plan, size_t chosen) {
    std::string why = "auto: chose " + candidate_label(plan[chosen]);
    for (size_t i = 0; i < chosen; ++i) why += "; " + candidate_label(plan[i]) + ": " + plan[i].verdict.message;
    return why;
}

}  // namespace h2o
