// The backend table and choosing a backend: what the table holds, what each backend says it runs
// (before anything is made), and how auto picks a device and explains the ones it passed over.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "backend_registry.h"
#include "model.h"
#include "session.h"
#include "synthetic_model.h"
#include "test_util.h"
#ifdef H2O_HAVE_VULKAN
#include "vulkan/vulkan_backend.h"
#endif

using namespace h2o;

namespace {

// A one-layer random model whose matrices are all of `type` (head_dim 64). Test cases run as
// processes side by side, so each names its files with its own tag.
std::string synthetic_model_path(TensorType type, const std::string &tag) {
    SyntheticModelSpec spec;
    spec.n_embd = 256;  // a multiple of the K-quants' 256-element blocks
    spec.n_layer = 1;
    spec.n_head = 4;
    spec.n_head_kv = 2;
    spec.n_ff = 256;
    spec.n_vocab = 300;
    spec.n_ctx = 64;
    spec.type = type;
    const std::string path = h2o_test::temp_path("registry_" + tag + "_" + type_name(type) + ".gguf");
    REQUIRE(write_synthetic_model(spec, path).ok());
    return path;
}

// A one-layer F32 model with one attention head of 512: the CPU runs it, while the Vulkan
// attention kernel holds heads of at most 256 (every weight type runs there, so heads are what
// the Vulkan backend refuses).
std::string wide_head_model_path(const std::string &tag) {
    SyntheticModelSpec spec;
    spec.n_embd = 512;
    spec.n_layer = 1;
    spec.n_head = 1;
    spec.n_head_kv = 1;
    spec.n_ff = 256;
    spec.n_vocab = 300;
    spec.n_ctx = 64;
    spec.type = TensorType::F32;
    const std::string path = h2o_test::temp_path("registry_" + tag + "_wide_head.gguf");
    REQUIRE(write_synthetic_model(spec, path).ok());
    return path;
}

// What a small auto session of the model at `path` needs.
BackendRequirements requirements_of_model(const std::string &path) {
    std::unique_ptr<Model> model;
    const Status st = Model::load(path, "", &model);
    REQUIRE_MESSAGE(st.ok(), st.message);
    SessionSettings settings;
    settings.n_ctx = settings.kv_budget = 64;
    settings.n_batch = 16;
    return Session::requirements(*model, settings);
}

// The same for a synthetic model whose matrices are all of weight_type.
BackendRequirements requirements_of(TensorType weight_type, const std::string &tag) {
    return requirements_of_model(synthetic_model_path(weight_type, tag));
}

bool contains(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

// Why AUTO passes over a backend without listing its devices; Ok when it lists them.
Status auto_screen_of(const BackendEntry &backend) { return backend.auto_screen ? backend.auto_screen() : Status::Ok(); }

// The devices AUTO weighs: those of the backends its screens do not rule out.
size_t devices_auto_lists() {
    size_t n = 0;
    for (const BackendEntry *backend : registered_backends()) {
        std::vector<BackendDevice> devices;
        if (auto_screen_of(*backend).ok() && backend->devices(&devices).ok()) n += devices.size();
    }
    return n;
}

// Collects the library's log messages while it lives.
struct LogCapture {
    std::vector<std::string> messages;
    LogCapture() { REQUIRE(h2o_set_log_callback(collect, this, H2O_LOG_DEBUG) == H2O_OK); }
    ~LogCapture() { h2o_set_log_callback(nullptr, nullptr, H2O_LOG_WARN); }
    static void collect(h2o_log_level, const char *message, void *user_data) {
        static_cast<LogCapture *>(user_data)->messages.emplace_back(message);
    }
    std::string find(const std::string &part) const {
        for (const std::string &m : messages) {
            if (contains(m, part)) return m;
        }
        return "";
    }
};

}  // namespace

TEST_CASE("backend registry: the table lists the backends of this build, the CPU first") {
    const auto table = registered_backends();
    REQUIRE(!table.empty());
    CHECK(table[0]->kind == H2O_BACKEND_CPU);
    size_t devices = 0;
    for (size_t i = 0; i < table.size(); ++i) {
        const BackendEntry &entry = *table[i];
        CAPTURE(backend_kind_title(entry.kind));
        CHECK(backend_kind_title(entry.kind) != nullptr);
        CHECK((entry.devices && entry.supports && entry.create));
        for (size_t j = 0; j < i; ++j) CHECK(table[j]->kind != entry.kind);
        CHECK(find_backend(entry.kind) == &entry);
        std::vector<BackendDevice> listed;
        if (entry.devices(&listed).ok()) devices += listed.size();
        for (const BackendDevice &d : listed) CHECK(d.kind == entry.kind);
    }
    size_t expected = 1;
#ifdef H2O_HAVE_VULKAN
    ++expected;
    CHECK(find_backend(H2O_BACKEND_VULKAN) != nullptr);
#else
    CHECK(find_backend(H2O_BACKEND_VULKAN) == nullptr);
#endif
#ifdef H2O_HAVE_CUDA
    ++expected;
    CHECK(find_backend(H2O_BACKEND_CUDA) != nullptr);
#else
    CHECK(find_backend(H2O_BACKEND_CUDA) == nullptr);
#endif
    CHECK(table.size() == expected);
    CHECK(find_backend(H2O_BACKEND_AUTO) == nullptr);

    // The public device list is the table's devices, the CPU first.
    const std::vector<BackendDevice> all = list_backend_devices();
    REQUIRE(!all.empty());
    CHECK(all[0].kind == H2O_BACKEND_CPU);
    CHECK(all.size() == devices);
    size_t count = 0;
    REQUIRE(h2o_backend_count(&count) == H2O_OK);
    CHECK(count == devices);
}

TEST_CASE("backend registry: a kind or device this build lacks is refused before anything is made") {
    const BackendRequirements needs = requirements_of(TensorType::F32, "refused");
    std::vector<BackendCandidate> plan;
#ifndef H2O_HAVE_CUDA
    Status st = plan_backends(H2O_BACKEND_CUDA, -1, needs, &plan);
    CHECK(st.code == H2O_ERR_BACKEND_UNAVAILABLE);
    CHECK(st.message == "this build of h2o has no CUDA backend");
#else
    Status st;
#endif
    st = plan_backends(H2O_BACKEND_CPU, 1, needs, &plan);
    CHECK(st.code == H2O_ERR_BACKEND_UNAVAILABLE);
    CHECK(contains(st.message, "no device 1"));
    CHECK(plan_backends(H2O_BACKEND_AUTO, 0, needs, &plan).code == H2O_ERR_INVALID_ARGUMENT);
    CHECK(plan_backends(42, -1, needs, &plan).code == H2O_ERR_INVALID_ARGUMENT);

    for (int index : {-1, 0}) {
        REQUIRE(plan_backends(H2O_BACKEND_CPU, index, needs, &plan).ok());
        REQUIRE(plan.size() == 1);
        CHECK(plan[0].backend->kind == H2O_BACKEND_CPU);
        CHECK(plan[0].verdict.ok());
    }
}

TEST_CASE("backend registry: the CPU backend supports every weight type, and refuses Q4 KV rows for odd heads") {
    const BackendEntry *cpu = find_backend(H2O_BACKEND_CPU);
    REQUIRE(cpu);
    std::vector<BackendDevice> devices;
    REQUIRE(cpu->devices(&devices).ok());
    REQUIRE(devices.size() == 1);
    BackendRequirements needs;
    needs.kv.head_dim = 8;
    for (TensorType type : kWeightTypes) {
        CAPTURE(type_name(type));
        needs.weight_types = {type};
        CHECK(cpu->supports(needs, devices[0]).ok());
    }
    needs.weight_types.assign(std::begin(kWeightTypes), std::end(kWeightTypes));
    CHECK(cpu->supports(needs, devices[0]).ok());
    needs.weight_types = {TensorType::I32};  // never a weight
    CHECK(cpu->supports(needs, devices[0]).code == H2O_ERR_UNSUPPORTED);

    needs.weight_types = {TensorType::F32};
    needs.kv.head_dim = 7;
    for (KvType type : {KvType::F32, KvType::F16, KvType::Q8}) {
        needs.kv.type = type;
        CHECK(cpu->supports(needs, devices[0]).ok());
    }
    for (KvType type : {KvType::Q4, KvType::K8V4}) {
        needs.kv.type = type;
        const Status st = cpu->supports(needs, devices[0]);
        CHECK(st.code == H2O_ERR_UNSUPPORTED);
        CHECK(contains(st.message, "even head size"));
    }
}

TEST_CASE("backend registry: auto passes over devices that cannot run the model and names why, without making them") {
    // A head of 512: the CPU runs it, the Vulkan attention kernel does not.
    const BackendRequirements needs = requirements_of_model(wide_head_model_path("auto"));
    std::vector<BackendCandidate> plan;
    REQUIRE(plan_backends(H2O_BACKEND_AUTO, -1, needs, &plan).ok());
    REQUIRE(!plan.empty());
    // Every device, and once each backend that has none or that its screen rules out (refused,
    // saying why).
    size_t without_devices = 0;
    for (const BackendCandidate &c : plan) {
        if (c.device.device_index >= 0) continue;
        ++without_devices;
        CHECK(c.verdict.code == H2O_ERR_BACKEND_UNAVAILABLE);
        CHECK(candidate_label(c) == std::string("the ") + backend_kind_title(c.backend->kind) + " backend");
    }
    CHECK(plan.size() == devices_auto_lists() + without_devices);
    // The CPU comes last, and is the first device that can run the model.
    CHECK(plan.back().backend->kind == H2O_BACKEND_CPU);
    size_t chosen = 0;
    while (chosen < plan.size() && !plan[chosen].verdict.ok()) ++chosen;
    REQUIRE(chosen == plan.size() - 1);
    const std::string why = explain_auto_choice(plan, chosen);
    CAPTURE(why);
    CHECK(why.rfind("auto: chose the CPU backend", 0) == 0);
    for (size_t i = 0; i < chosen; ++i) {
        CHECK(contains(why, candidate_label(plan[i]) + ": " + plan[i].verdict.message));
        // CUDA without a device: tests/backends/test_cuda.cpp; Vulkan ruled out by its screen: below.
        if (plan[i].backend->kind != H2O_BACKEND_VULKAN || plan[i].device.device_index < 0) continue;
        CHECK(plan[i].verdict.code == H2O_ERR_UNSUPPORTED);
        CHECK(contains(plan[i].verdict.message, "head_dim 512"));
    }

    // Q4_0 weights: a Vulkan device may run them, but one that is a CPU implementation is skipped.
    REQUIRE(plan_backends(H2O_BACKEND_AUTO, -1, requirements_of(TensorType::Q4_0, "auto"), &plan).ok());
    for (const BackendCandidate &c : plan) {
        if (c.backend->kind != H2O_BACKEND_CPU && c.device.type == "cpu") CHECK(contains(c.verdict.message, "a CPU implementation"));
    }
}

TEST_CASE("backend registry: an auto session logs the choice and the reasons, and no device failed to start") {
    const std::string path = wide_head_model_path("auto_session");
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.n_ctx = 64;
    LogCapture log;
    h2o_test::ApiSession m;
    REQUIRE_MESSAGE(m.open(path, sp), h2o_last_error());
    h2o_backend_info chosen;
    chosen.struct_size = sizeof(chosen);
    REQUIRE(h2o_session_get_backend(m.session, &chosen) == H2O_OK);
    CHECK(chosen.kind == H2O_BACKEND_CPU);
    const std::string line = log.find("session backend:");
    CAPTURE(line);
    CHECK(contains(line, "auto: chose the CPU backend"));
    for (const BackendDevice &d : list_backend_devices()) {
        if (d.kind == H2O_BACKEND_CPU) continue;
        const Status screen = auto_screen_of(*find_backend(d.kind));
        if (screen.ok()) {
            CHECK(contains(line, d.name + " (" + d.type + "): head_dim 512"));
        } else {
            CHECK(contains(line, std::string("the ") + backend_kind_title(d.kind) + " backend: " + screen.message));
        }
    }
    // A device is made only once its backend has said it runs the session.
    CHECK(log.find("failed").empty());
}

#ifdef H2O_HAVE_VULKAN

namespace {

// CI sets H2O_REQUIRE_VULKAN=1: there a missing device fails the tests instead of skipping them.
bool vulkan_required() {
    const char *v = std::getenv("H2O_REQUIRE_VULKAN");
    return v && std::string(v) == "1";
}

}  // namespace

TEST_CASE("backend registry: Vulkan supports() accepts every weight type and refuses what its kernels cannot run") {
    const BackendEntry *vulkan = find_backend(H2O_BACKEND_VULKAN);
    REQUIRE(vulkan);
    // The answer comes from the model and the backend's own rules, not from a device: a made-up
    // one with a gigabyte of memory does.
    BackendDevice device;
    device.kind = H2O_BACKEND_VULKAN;
    device.name = "made-up GPU";
    device.type = "discrete";
    device.memory_bytes = uint64_t{1} << 30;

    for (TensorType type : kWeightTypes) {
        CAPTURE(type_name(type));
        const Status st = vulkan->supports(requirements_of(type, "vulkan"), device);
        CHECK_MESSAGE(st.ok(), st.message);
    }

    // Too little device memory for the weights, KV cache and activations.
    BackendRequirements needs = requirements_of(TensorType::Q4_0, "vulkan");
    device.memory_bytes = needs.weight_bytes + needs.session_bytes - 1;
    CHECK(vulkan->supports(needs, device).code == H2O_ERR_OUT_OF_MEMORY);
    device.memory_bytes = uint64_t{1} << 30;
    // Heads larger than the attention kernel holds.
    needs.kv.head_dim = 512;
    const Status head = vulkan->supports(needs, device);
    CHECK(head.code == H2O_ERR_UNSUPPORTED);
    CHECK(contains(head.message, "head_dim 512"));
}

TEST_CASE("backend registry: Vulkan supports() and adopt_weight agree on every weight type") {
    std::unique_ptr<Backend> backend;
    const Status made = make_vulkan_backend(-1, 8, &backend);
    if (made.code == H2O_ERR_BACKEND_UNAVAILABLE && !vulkan_required()) {
        std::printf("H2O-SKIP: no usable Vulkan device: %s\n", made.message.c_str());
        return;
    }
    REQUIRE_MESSAGE(made.ok(), made.message);
    const BackendEntry *vulkan = find_backend(H2O_BACKEND_VULKAN);
    REQUIRE(vulkan);
    std::vector<BackendDevice> devices;
    REQUIRE(vulkan->devices(&devices).ok());
    REQUIRE(!devices.empty());
    BackendRequirements needs;
    needs.kv.n_layer = needs.kv.n_head_kv = 1;
    needs.kv.head_dim = 64;
    needs.kv.n_slots = 16;
    const int64_t cols = 256;
    std::vector<std::vector<uint8_t>> weights;  // adopted bytes stay valid while the backend lives
    for (TensorType type : kWeightTypes) {
        CAPTURE(type_name(type));
        needs.weight_types = {type};
        weights.emplace_back(row_bytes(type, cols), 0);
        Tensor t;
        const Status adopted = backend->adopt_weight(type, cols, 1, weights.back().data(), &t);
        const Status answer = vulkan->supports(needs, devices[0]);
        CHECK(adopted.ok() == answer.ok());
        CHECK(adopted.message == answer.message);
    }
    REQUIRE(backend->synchronize().ok());
}

// Whether the Vulkan loader or a driver (libvulkan.so.1, libvulkan_lvp.so, ...) is in this process.
bool vulkan_library_mapped() {
    std::ifstream maps("/proc/self/maps");
    REQUIRE(maps.good());
    std::string line;
    while (std::getline(maps, line)) {
        if (contains(line, "libvulkan") || contains(line, "libvk_swiftshader")) return true;
    }
    return false;
}

TEST_CASE("backend registry: an auto session loads no Vulkan library where no installed driver offers a GPU") {
    const Status screen = auto_screen_of(kVulkanBackendEntry);
    if (screen.ok()) {
        std::printf("H2O-SKIP: an installed Vulkan driver may offer a GPU here, so auto loads the drivers\n");
        return;
    }
    if (vulkan_library_mapped()) {
        std::printf("H2O-SKIP: a Vulkan library was loaded earlier in this process (run this test case alone)\n");
        return;
    }
    CHECK(screen.code == H2O_ERR_BACKEND_UNAVAILABLE);
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.n_ctx = 64;
    LogCapture log;
    h2o_test::ApiSession m;
    REQUIRE_MESSAGE(m.open(synthetic_model_path(TensorType::F32, "unloaded"), sp), h2o_last_error());
    h2o_backend_info chosen;
    chosen.struct_size = sizeof(chosen);
    REQUIRE(h2o_session_get_backend(m.session, &chosen) == H2O_OK);
    CHECK(chosen.kind == H2O_BACKEND_CPU);
    const std::string line = log.find("session backend:");
    CAPTURE(line);
    CHECK(contains(line, "auto: chose the CPU backend; the Vulkan backend: " + screen.message));
    CHECK_FALSE(vulkan_library_mapped());
}

TEST_CASE("backend registry: an explicit Vulkan session the backend cannot run is refused with the backend's reason") {
    const BackendEntry *vulkan = find_backend(H2O_BACKEND_VULKAN);
    REQUIRE(vulkan);
    std::vector<BackendDevice> devices;
    if (!vulkan->devices(&devices).ok() || devices.empty()) {
        if (vulkan_required()) FAIL("H2O_REQUIRE_VULKAN=1 but no Vulkan device is listed");
        std::printf("H2O-SKIP: no Vulkan device\n");
        return;
    }
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.n_ctx = 64;
    sp.backend = H2O_BACKEND_VULKAN;
    h2o_test::ApiSession m;
    CHECK_FALSE(m.open(wide_head_model_path("explicit"), sp));
    CHECK(m.session == nullptr);
    CHECK(std::string(h2o_last_error()) == "head_dim 512 is larger than the Vulkan backend supports (256)");
    CHECK(h2o_session_create(m.model, &sp, &m.session) == H2O_ERR_UNSUPPORTED);
}

#endif  // H2O_HAVE_VULKAN
