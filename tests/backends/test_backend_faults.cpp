// A backend that fails while running: the failing call returns H2O_ERR_BACKEND_FAILED naming the
// error, no logits come out of it, the session refuses every later call until it is reset, and
// the reset session (on a new backend) generates exactly what it generated before the fault.
// Each backend present is tested with a fault injected where its real errors arise: any CPU
// operation, and a Vulkan queue submission (as a lost device reports it).
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "model.h"
#include "session.h"
#include "session_util.h"
#include "test_util.h"
#ifdef H2O_HAVE_VULKAN
#include "vulkan/vulkan_backend.h"
#endif

using namespace h2o;

namespace {

using h2o_test::greedy;

bool append_piece(const char *text, size_t length, void *user_data) {
    static_cast<std::string *>(user_data)->append(text, length);
    return false;
}

// Runs the scenario on a session of `kind`; `inject` arms the fault on the session's backend.
void check_fault_is_reported(h2o_backend_kind kind, const std::function<bool(Backend &)> &inject) {
    const std::string path = h2o_test::shared_file("models/stories260K.gguf");
    std::unique_ptr<Model> model;
    REQUIRE(Model::load(path, "", &model).ok());
    SessionSettings settings;
    settings.n_ctx = 256;
    settings.kv_budget = 64;
    settings.policy.policy = KvPolicy::Scissorhands;
    settings.policy.recent = 32;
    settings.n_threads = 1;
    settings.n_batch = 16;
    settings.backend = kind;
    const std::unique_ptr<Session> session = h2o_test::session_or_skip(*model, settings);
    if (!session) return;
    REQUIRE(session->device().kind == kind);

    const char *prompt = "Once upon a time, there was a little girl who";
    std::string before;
    REQUIRE(session->generate(prompt, greedy(24), append_piece, &before).ok());
    REQUIRE(session->reset().ok());

    REQUIRE(inject(session->backend()));
    std::string during;
    const Status failed = session->generate(prompt, greedy(24), append_piece, &during);
    CHECK(failed.code == H2O_ERR_BACKEND_FAILED);
    CHECK(failed.message.find("injected") != std::string::npos);
    CHECK(during.empty());
    CHECK_FALSE(session->has_logits());

    // Refused until reset, each call naming the first error.
    const int32_t token = 1;
    Status refused = session->decode(&token, 1);
    CHECK(refused.code == H2O_ERR_BACKEND_FAILED);
    CHECK(refused.message.find("h2o_session_reset") != std::string::npos);
    CHECK(refused.message.find("injected") != std::string::npos);
    CHECK(session->add_text("more", false).code == H2O_ERR_BACKEND_FAILED);
    std::vector<uint8_t> state;
    CHECK(session->save_state(&state).code == H2O_ERR_BACKEND_FAILED);
    CHECK(session->fetch_logits().code == H2O_ERR_BACKEND_FAILED);

    REQUIRE(session->reset().ok());
    std::string after;
    REQUIRE(session->generate(prompt, greedy(24), append_piece, &after).ok());
    CHECK(after == before);
    CHECK(session->has_logits());
}

}  // namespace

TEST_CASE("backend faults: a failing CPU operation is reported, refused until reset, and reset recovers") {
    for (int after : {0, 7, 40}) {  // the first upload, an operation of the first layer, a later layer
        INFO("the fault comes " << after << " operations after arming");
        check_fault_is_reported(H2O_BACKEND_CPU, [after](Backend &b) { return cpu_inject_fault(b, after); });
    }
}

TEST_CASE("backend faults: a lost Vulkan device is reported, refused until reset, and reset recovers") {
#ifdef H2O_HAVE_VULKAN
    check_fault_is_reported(H2O_BACKEND_VULKAN, [](Backend &b) { return vulkan_fail_next_submission(b); });
#else
    std::printf("H2O-SKIP: built without the Vulkan backend (H2O_VULKAN=OFF)\n");
#endif
}
