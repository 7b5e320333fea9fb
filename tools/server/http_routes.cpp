#include "http_routes.h"

#include <httplib.h>
#include <malloc.h>

#include <algorithm>
#include <ctime>
#include <memory>

#include "../common.h"
#include "chat_page.h"

namespace h2o_server {

namespace {

using nlohmann::json;

void send_error(httplib::Response &res, const ApiError &error) {
    res.status = error.http_status;
    res.set_content(error_body(error), "application/json");
}

std::string completion_id() { return "chatcmpl-" + new_conversation_id().substr(2); }

// Counts requests admitted (waiting or running): above the limit, a request gets 429.
class Admission {
public:
    Admission(std::atomic<uint32_t> &count, uint32_t limit) : count_(count) { admitted_ = ++count_ <= limit; }
    ~Admission() {
        --count_;
        // A request's transient memory (its JSON, the formatted conversation) follows the
        // client's history, which grows; returning it after each request keeps the RSS flat.
        malloc_trim(0);
    }
    bool admitted() const { return admitted_; }

private:
    std::atomic<uint32_t> &count_;
    bool admitted_;
};

// Whether a request naming this model is served: any name, unless the server knows several.
bool serves_model(const Endpoints &e, const std::string &asked) {
    return e.model_names.size() < 2 || std::find(e.model_names.begin(), e.model_names.end(), asked) != e.model_names.end();
}

std::string no_such_model(const Endpoints &e, const std::string &asked) {
    std::string names;
    for (const std::string &name : e.model_names) names += (names.empty() ? "'" : ", '") + name + "'";
    return "no model '" + asked + "' here (this server answers to " + names + ")";
}

json model_json(const Endpoints &e) { return json{{"id", e.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "h2o"}}; }

void health(Endpoints &e, httplib::Response &res) {
    const StoreCounts counts = e.store->counts();
    h2o_prefix_cache_stats cache;
    cache.struct_size = sizeof cache;
    h2o_model_get_prefix_cache_stats(e.model, &cache);
    json body = {
        {"status", e.stopping ? "stopping" : "ok"},
        {"model", e.model_id},
        {"sessions",
         {{"max", e.max_sessions},
          {"live", counts.live_sessions},
          {"conversations", counts.conversations},
          {"saved", counts.saved},
          {"evictions", counts.evictions},
          {"restores", counts.restores},
          {"state_bytes", counts.state_bytes},
          {"state_removed", counts.state_removed}}},
        {"memory", to_json(e.plan)},
        {"rss_bytes", h2o_tools::current_rss_bytes()},
        {"prefix_cache", {{"entries", cache.entries}, {"bytes", cache.bytes}, {"hits", cache.hits}, {"misses", cache.misses}}},
        {"kv_evictions",
         {{"conversations_filled", e.context->evictions ? e.context->evictions->conversations_filled.load() : 0},
          {"tokens", e.context->evictions ? e.context->evictions->tokens.load() : 0}}},
        {"requests", {{"in_flight", e.in_flight.load()}, {"completed", e.completions.load()}, {"client_gone", e.client_gone.load()}}}};
    const ReuseEstimator estimates = e.store->estimates();
    json categories = json::array();
    for (size_t c = 0; c < kReuseCategories; ++c)
        categories.push_back({{"category", reuse_category_name(c)},
                              {"reuse_share", estimates.reuse_share(c)},
                              {"mean_reuse_seconds", estimates.mean_reuse_seconds(c)}});
    body["cache_policy"] = {{"name", cache_policy_name(e.store->settings().cache_policy)}, {"estimates", categories}};
    res.set_content(dump(body), "application/json");
}

json conversation_json(const ConversationInfo &c) {
    return json{{"id", c.id},
                {"object", "conversation"},
                {"title", c.title},
                {"turns", c.turns},
                {"messages", c.messages},
                {"tokens_held", c.tokens},
                {"bytes_on_disk", c.bytes_on_disk},
                {"last_used", c.last_used},
                {"live", c.live},
                {"in_use", c.in_use}};
}

// GET /v1/conversations[/{id}] and DELETE /v1/conversations/{id}: the conversations the server
// keeps, in memory or in its state directory.
void conversation_routes(httplib::Server &server, Endpoints &e) {
    server.Get("/v1/conversations", [&e](const httplib::Request &, httplib::Response &res) {
        json data = json::array();
        for (const ConversationInfo &c : e.store->list()) data.push_back(conversation_json(c));
        res.set_content(dump(json{{"object", "list"}, {"data", data}}), "application/json");
    });
    auto unknown = [](const std::string &id) {
        return ApiError{404, "not_found_error", "no conversation '" + id + "'", "conversation_id", "conversation_not_found"};
    };
    server.Get(R"(/v1/conversations/([^/]+))", [&e, unknown](const httplib::Request &req, httplib::Response &res) {
        const std::string id = req.matches[1];
        const std::optional<ConversationInfo> c = valid_conversation_id(id) ? e.store->info(id) : std::nullopt;
        if (!c) return send_error(res, unknown(id));
        res.set_content(dump(conversation_json(*c)), "application/json");
    });
    server.Get(R"(/v1/conversations/([^/]+)/messages)", [&e, unknown](const httplib::Request &req, httplib::Response &res) {
        const std::string id = req.matches[1];
        std::string transcript;
        if (!valid_conversation_id(id)) return send_error(res, unknown(id));
        if (auto error = e.store->messages(id, &transcript)) return send_error(res, *error);
        res.set_content(R"({"object":"list","conversation_id":")" + id + R"(","data":)" + transcript + "}", "application/json");
    });
    server.Delete(R"(/v1/conversations/([^/]+))", [&e, unknown](const httplib::Request &req, httplib::Response &res) {
        const std::string id = req.matches[1];
        if (!valid_conversation_id(id)) return send_error(res, unknown(id));
        if (auto error = e.store->remove(id)) return send_error(res, *error);
        res.set_content(dump(json{{"id", id}, {"object", "conversation.deleted"}, {"deleted", true}}), "application/json");
    });
}

// A streamed reply: the chunks go out as the pieces come; a failed write means the client left.
void stream_reply(Endpoints &e, std::unique_ptr<ChatTurn> turn, std::shared_ptr<Admission> admission, const CompletionHeader &header,
                  bool include_usage, httplib::Response &res) {
    struct Stream {
        std::unique_ptr<ChatTurn> turn;
        std::shared_ptr<Admission> admission;  // the request counts as in flight until its stream ends
    };
    auto stream = std::make_shared<Stream>(Stream{std::move(turn), std::move(admission)});
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", [stream, header, include_usage, &e](size_t, httplib::DataSink &sink) {
        auto send = [&sink](const json &value) {
            const std::string event = sse_event(value);
            return sink.write(event.data(), event.size());
        };
        if (!stream->turn) return false;
        bool open = send(chunk_json(header, json{{"role", "assistant"}, {"content", ""}}, nullptr));
        const TurnOutcome outcome = stream->turn->generate([&](const std::string &piece) {
            return open && (open = send(chunk_json(header, json{{"content", piece}}, nullptr)));
        });
        stream->turn.reset();  // the conversation is free for its next request
        if (!open) {
            ++e.client_gone;
            return false;
        }
        ++e.completions;
        if (outcome.error) {
            send(json::parse(error_body(*outcome.error)));
        } else if (!outcome.finish_reason.empty()) {
            // Each call in one delta of OpenAI's shape: its index, id, name and whole arguments.
            for (size_t i = 0; i < outcome.tool_calls.size(); ++i) {
                json call = outcome.tool_calls[i];
                call["index"] = i;
                send(chunk_json(header, json{{"tool_calls", json::array({call})}}, nullptr));
            }
            send(chunk_json(header, json::object(), outcome.finish_reason.c_str()));
            if (include_usage) send(chunk_json(header, json(), nullptr, &outcome.usage));
        }
        const std::string done = "data: [DONE]\n\n";
        sink.write(done.data(), done.size());
        sink.done();
        return true;
    });
}

void chat_completions(Endpoints &e, const httplib::Request &req, httplib::Response &res) {
    auto admission = std::make_shared<Admission>(e.in_flight, e.queue);
    if (e.stopping) return send_error(res, ApiError{503, "server_error", "the server is shutting down", "", "server_stopping"});
    if (!admission->admitted())
        return send_error(
            res, ApiError{429, "rate_limit_error", "more than --queue " + std::to_string(e.queue) + " requests at once; try again", "",
                          "too_many_requests"});
    ChatRequest request;
    if (auto error = parse_chat_request(req.body, e.limits, &request)) return send_error(res, *error);
    if (!serves_model(e, request.model))
        return send_error(res, ApiError{404, "not_found_error", no_such_model(e, request.model), "model", "model_not_found"});
    std::unique_ptr<ChatTurn> turn;
    if (auto error = ChatTurn::start(*e.context, request, &turn)) return send_error(res, *error);
    const CompletionHeader header{completion_id(), static_cast<int64_t>(std::time(nullptr)), e.model_id, turn->conversation_id()};
    if (request.stream) return stream_reply(e, std::move(turn), std::move(admission), header, request.include_usage, res);
    const TurnOutcome outcome = turn->generate([](const std::string &) { return true; });
    turn.reset();
    if (outcome.error) return send_error(res, *outcome.error);
    ++e.completions;
    res.set_content(dump(completion_json(header, outcome.text, outcome.finish_reason, outcome.usage, outcome.tool_calls)),
                    "application/json");
}

// The chat page's files (GET / and /chat.js). Its policy lets it run only its own script and talk
// only to this server: markup a model's output slipped past the page's escaping would still
// neither run nor load anything.
void page_routes(httplib::Server &server) {
    auto serve = [](const httplib::Request &req, httplib::Response &res) {
        const PageFile *file = find_page_file(req.path == "/index.html" ? "/" : req.path);
        res.set_header("Content-Security-Policy",
                       "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; img-src data:; "
                       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
        res.set_header("X-Content-Type-Options", "nosniff");
        res.set_header("Referrer-Policy", "no-referrer");
        res.set_header("Cache-Control", "no-cache");
        res.set_content(reinterpret_cast<const char *>(file->bytes), file->size, file->content_type);
    };
    for (const char *path : {"/", "/index.html", "/chat.js"}) server.Get(path, serve);
}

}  // namespace

void add_routes(httplib::Server &server, Endpoints &e) {
    server.set_payload_max_length(e.max_body);
    if (!e.cors_origin.empty()) {
        // A chat front-end served as a web page calls the server from the browser, which asks
        // first (a preflight OPTIONS request) and reads the reply only when the origin is allowed.
        server.set_default_headers({{"Access-Control-Allow-Origin", e.cors_origin},
                                    {"Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS"},
                                    {"Access-Control-Allow-Headers", "Content-Type, Authorization"}});
        server.Options(R"(/.*)", [](const httplib::Request &, httplib::Response &res) { res.status = 204; });
    }
    server.set_error_handler([&e](const httplib::Request &req, httplib::Response &res) {
        if (!res.body.empty()) return;
        if (res.status == 413) {
            send_error(res, ApiError{413, "invalid_request_error",
                                     "the request body is larger than --max-body " + std::to_string(e.max_body) + " bytes", "",
                                     "request_too_large"});
        } else if (res.status == 404) {
            send_error(res, ApiError{404, "not_found_error", "no such endpoint: " + req.method + " " + req.path, "", "unknown_url"});
        } else {
            send_error(res, ApiError{res.status, "invalid_request_error", "HTTP " + std::to_string(res.status), "", ""});
        }
    });
    server.set_exception_handler([](const httplib::Request &, httplib::Response &res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
            std::rethrow_exception(ep);
        } catch (const std::exception &error) {
            what = error.what();
        } catch (...) {}
        send_error(res, ApiError{500, "server_error", "internal error: " + what, "", ""});
    });
    server.Get("/health", [&e](const httplib::Request &, httplib::Response &res) { health(e, res); });
    server.Get("/v1/models", [&e](const httplib::Request &, httplib::Response &res) {
        res.set_content(dump(json{{"object", "list"}, {"data", json::array({model_json(e)})}}), "application/json");
    });
    server.Get(R"(/v1/models/(.+))", [&e](const httplib::Request &req, httplib::Response &res) {
        if (!serves_model(e, req.matches[1]))
            return send_error(res, ApiError{404, "not_found_error", no_such_model(e, req.matches[1]), "model", "model_not_found"});
        res.set_content(dump(model_json(e)), "application/json");
    });
    server.Post("/v1/chat/completions", [&e](const httplib::Request &req, httplib::Response &res) { chat_completions(e, req, res); });
    conversation_routes(server, e);
    page_routes(server);
}

}  // namespace h2o_server
