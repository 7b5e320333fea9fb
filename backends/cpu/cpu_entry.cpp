// The CPU backend's entry in the backend table (backend_registry.h).
#include "backend_registry.h"
#include "cpu/cpu_backend.h"
#include "cpu/kernels.h"

namespace h2o {

namespace {

// The one CPU device; n_threads > 0: a session's thread count, which its name then shows.
BackendDevice cpu_device(int n_threads) {
    BackendDevice d;
    d.kind = H2O_BACKEND_CPU;
    d.name = std::string("cpu (") + cpu::kernel_isa_name(cpu::current_kernel_isa()) + " kernels" +
             (n_threads > 0 ? ", " + std::to_string(n_threads) + " threads" : "") + ")";
    d.type = "cpu";
    return d;
}

Status cpu_devices(std::vector<BackendDevice> *out) {
    *out = {cpu_device(0)};
    return Status::Ok();
}

// The reference runs every weight type a model may have, and every KV format whose rows fit the
// heads (KvCache::init refuses the rest). Its memory is the host's, which the session's
// max_memory_bytes caps.
Status cpu_supports(const BackendRequirements &needs, const BackendDevice &) {
    for (TensorType type : needs.weight_types) {
        if (!is_weight_type(type)) {
            return make_error(H2O_ERR_UNSUPPORTED, std::string("the CPU backend does not support ") + type_name(type) + " weights");
        }
    }
    return kv_type_fits_head_dim(needs.kv.type, needs.kv.head_dim);
}

Status cpu_create(const BackendDevice &, const BackendOptions &options, std::unique_ptr<Backend> *out, BackendDevice *running) {
    *out = make_cpu_backend(options.n_threads, options.max_batch);
    *running = cpu_device(options.n_threads);
    return Status::Ok();
}

}  // namespace

const BackendEntry kCpuBackendEntry = {H2O_BACKEND_CPU, cpu_devices, cpu_supports, cpu_create, nullptr};

}  // namespace h2o
