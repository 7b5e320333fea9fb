// h2o-server's HTTP side: the endpoints (/v1/chat/completions, /v1/models, /v1/conversations, the chat page at /,
// /health) and the protocol's error shape for what HTTP itself refuses (404, 413), on a cpp-httplib server.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "chat_turn.h"
#include "memory_plan.h"

namespace httplib {
class Server;
}

namespace h2o_server {

// What the handlers share: set up by main before the server listens.
struct Endpoints {
    h2o_model *model = nullptr;
    std::string model_id;  // the model's name in the protocol
    // The names requests may give (--alias, repeatable). With fewer than two the server answers
    // to any name, as a single-model server should for clients configured with a fixed one.
    std::vector<std::string> model_names;
    const TurnContext *context = nullptr;
    ConversationStore *store = nullptr;
    MemoryPlan plan;
    uint32_t max_sessions = 0;
    uint32_t queue = 0;       // requests admitted at once; more get 429
    uint64_t max_body = 0;    // larger bodies get 413 (httplib refuses them)
    std::string cors_origin;  // web pages of this origin may call the server ("": none)
    RequestLimits limits;
    std::atomic<bool> stopping{false};                     // SIGTERM came: new requests get 503
    std::atomic<uint32_t> in_flight{0};                    // requests admitted and not finished
    std::atomic<uint64_t> completions{0}, client_gone{0};  // replies finished; streams whose client left
};

void add_routes(httplib::Server &server, Endpoints &endpoints);

}  // namespace h2o_server
