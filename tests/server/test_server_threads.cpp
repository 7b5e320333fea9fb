// h2o-server's conversation store under concurrent requests: four threads run conversations of
// their own through a store of two sessions (so that sessions are evicted to disk and restored
// while other threads compute), with two compute slots, and every reply must equal that of the
// same conversation run alone. CI also runs this file under ThreadSanitizer (scripts/ci-matrix.sh).
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "server_test_util.h"
#include "test_util.h"

namespace {

using namespace h2o_server;

// Runs one conversation's turns; false (with *error) when a turn fails.
bool converse(h2o_test::TestStore &store, const std::string &id, const std::vector<std::string> &users, std::vector<std::string> *replies,
              std::string *error) {
    std::vector<Message> history{{"system", "You tell stories."}};
    for (const std::string &user : users) {
        if (!store.turn(history, user, id, nullptr, error)) return false;
        replies->push_back(history.back().content);
    }
    return true;
}

}  // namespace

TEST_CASE("server threads: concurrent conversations on two sessions reply as each would alone") {
    H2O_SHARED_FILE_OR_SKIP(model_path, "models/stories260K.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(model_path.c_str(), nullptr, &model) == H2O_OK);
    constexpr int kThreads = 4, kPerThread = 3;
    auto users_of = [](int c) { return std::vector<std::string>{"Story " + std::to_string(c) + ".", "What next?", "The end."}; };
    std::vector<std::vector<std::string>> expected(kThreads * kPerThread);
    {
        h2o_test::TestStore alone(model, 1, 1, "", 32, 6);
        for (int c = 0; c < kThreads * kPerThread; ++c) {
            std::string error;
            REQUIRE_MESSAGE(converse(alone, "c" + std::to_string(c), users_of(c), &expected[c], &error), error);
        }
    }
    const std::filesystem::path dir = std::filesystem::temp_directory_path() / "h2o-server-threads-test";
    std::filesystem::remove_all(dir);
    std::vector<std::vector<std::string>> got(kThreads * kPerThread);
    std::vector<std::string> errors(kThreads);
    {
        h2o_test::TestStore shared(model, 2, 2, dir.string(), 32, 6);
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t) {
            threads.emplace_back([&, t] {
                for (int k = 0; k < kPerThread && errors[t].empty(); ++k) {
                    const int c = t * kPerThread + k;
                    converse(shared, "c" + std::to_string(c), users_of(c), &got[c], &errors[t]);
                }
            });
        }
        for (std::thread &thread : threads) thread.join();
        for (const std::string &error : errors) CHECK_MESSAGE(error.empty(), error);
        const StoreCounts counts = shared.store->counts();
        CHECK(counts.live_sessions <= 2);
        CHECK(counts.conversations == kThreads * kPerThread);
        CHECK(counts.evictions > 0);
    }
    CHECK(got == expected);
    std::filesystem::remove_all(dir);
    h2o_model_free(model);
}
