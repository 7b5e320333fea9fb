// A conversation store as h2o-server sets one up, for the tests of tools/server/: stories260K's
// sessions (budget 32 or as given, rolling, one thread), the zephyr format, greedy replies.
#pragma once

#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "chat_turn.h"
#include "conversation_store.h"

namespace h2o_test {

struct TestStore {
    std::unique_ptr<h2o_server::ConversationStore> store;
    std::unique_ptr<h2o_server::ComputeGate> gate;
    h2o_server::TurnContext context;

    // model: the caller's, alive as long as the store.
    TestStore(h2o_model *model, uint32_t sessions, uint32_t compute_slots, const std::string &state_dir, uint32_t kv_budget,
              uint32_t max_tokens, h2o_server::CachePolicy policy = h2o_server::CachePolicy::kReuse)
        : gate(new h2o_server::ComputeGate(compute_slots)) {
        h2o_server::StoreSettings settings;
        settings.model = model;
        h2o_session_params_init(&settings.session_params, sizeof settings.session_params);
        settings.session_params.n_threads = 1;
        settings.session_params.kv_budget = kv_budget;
        settings.session_params.position_rolling = 1;
        settings.max_sessions = sessions;
        settings.state_dir = state_dir;
        settings.session_wait = std::chrono::seconds(120);
        settings.cache_policy = policy;
        store = std::make_unique<h2o_server::ConversationStore>(settings);
        std::string error;
        REQUIRE_MESSAGE(store->open_state_dir(&error), error);
        context.model = model;
        context.chat_format = "zephyr";
        context.store = store.get();
        context.gate = gate.get();
        h2o_generate_params_init(&context.defaults, sizeof context.defaults);
        context.defaults.temperature = 0.0f;
        context.defaults.max_tokens = max_tokens;
    }

    // One turn of the conversation `id` ("": found by its messages): appends the user's message
    // and the reply to history. false (with *error) when the turn fails.
    bool turn(std::vector<h2o_server::Message> &history, const std::string &user, const std::string &id, h2o_server::Usage *usage,
              std::string *error) {
        history.push_back(h2o_server::Message{"user", user});
        h2o_server::ChatRequest request;
        request.model = "m";
        request.messages = history;
        request.conversation_id = id;
        std::unique_ptr<h2o_server::ChatTurn> turn;
        if (auto e = h2o_server::ChatTurn::start(context, request, &turn)) {
            *error = e->message;
            return false;
        }
        const h2o_server::TurnOutcome outcome = turn->generate([](const std::string &) { return true; });
        if (outcome.error) {
            *error = outcome.error->message;
            return false;
        }
        if (usage) *usage = outcome.usage;
        history.push_back(h2o_server::Message{"assistant", outcome.text});
        return true;
    }
};

}  // namespace h2o_test
