// h2o-server's code below HTTP (tools/server/): the request parser and its refusals, the history
// digest (SHA-256 against FIPS 180-4's examples), conversation files, and turns run on a store of
// sessions in process: continued, evicted to disk and restored, and the same text as a store
// that kept every session live.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "cache_trace.h"
#include "chat_request.h"
#include "chat_turn.h"
#include "conversation_file.h"
#include "conversation_store.h"
#include "history_digest.h"
#include "server_test_util.h"
#include "test_util.h"

namespace {

using namespace h2o_server;

std::optional<ApiError> parse(const std::string &body, ChatRequest *out = nullptr) {
    ChatRequest request;
    return parse_chat_request(body, RequestLimits{}, out ? out : &request);
}

}  // namespace

TEST_CASE("server: SHA-256 gives FIPS 180-4's digests, and the history chain separates role and content") {
    CHECK(to_hex(sha256("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK(to_hex(sha256("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    CHECK(to_hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    CHECK(to_hex(sha256(std::string(1000000, 'a'))) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    const Digest empty = empty_history();
    CHECK(extend_history(empty, "user", "ab") != extend_history(empty, "usera", "b"));
    CHECK(extend_history(extend_history(empty, "user", "a"), "user", "b") != extend_history(empty, "user", "ab"));
    Digest back{};
    CHECK(from_hex(to_hex(empty), &back));
    CHECK(back == empty);
    CHECK_FALSE(from_hex("xyz", &back));
    CHECK_FALSE(from_hex(std::string(63, '0') + "g", &back));
}

TEST_CASE("server: a chat request is read field by field") {
    ChatRequest r;
    REQUIRE_FALSE(parse(R"({"model":"m","messages":[{"role":"developer","content":"Be brief."},
        {"role":"user","content":[{"type":"text","text":"Hel"},{"type":"text","text":"lo"}]}],
        "max_tokens":12,"temperature":0.5,"top_p":0.9,"seed":-1,"stop":"END","stream":true,
        "stream_options":{"include_usage":true},"conversation_id":"a-b_C","user":"x","n":1,"frequency_penalty":0})",
                        &r));
    CHECK(r.model == "m");
    REQUIRE(r.messages.size() == 2);
    CHECK(r.messages[0].role == "system");  // developer is the system's new name
    CHECK(r.messages[1].content == "Hello");
    CHECK(r.max_tokens == 12);
    CHECK(*r.temperature == doctest::Approx(0.5));
    CHECK(*r.top_p == doctest::Approx(0.9));
    CHECK(*r.seed == UINT64_MAX);
    CHECK(r.stop == std::vector<std::string>{"END"});
    CHECK(r.stream);
    CHECK(r.include_usage);
    CHECK(r.conversation_id == "a-b_C");
    CHECK(r.json_schema.empty());
    // response_format and logit_bias: the schema as text for the library, -100 as a ban.
    REQUIRE_FALSE(parse(R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"17":-100,"3":2.5},
        "response_format":{"type":"json_schema","json_schema":{"name":"c","strict":true,"schema":{"type":"object"}}}})",
                        &r));
    CHECK(r.json_schema == R"({"type":"object"})");
    REQUIRE(r.logit_bias.size() == 2);
    const auto bias = std::map<int32_t, float>(r.logit_bias.begin(), r.logit_bias.end());
    CHECK(std::isinf(bias.at(17)));
    CHECK(bias.at(17) < 0);
    CHECK(bias.at(3) == doctest::Approx(2.5));
    ChatRequest object;
    REQUIRE_FALSE(parse(R"({"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}})", &object));
    CHECK(object.json_schema.find("\"object\"") != std::string::npos);
    ChatRequest text;
    REQUIRE_FALSE(parse(R"({"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"text"}})", &text));
    CHECK(text.json_schema.empty());
}

TEST_CASE("server: bad requests are refused with the field at fault") {
    struct Case {
        const char *body;
        int status;
        const char *param;
    };
    const Case cases[] = {
        {"", 400, ""},
        {"[1]", 400, ""},
        {R"({"messages":[{"role":"user","content":"x"}]})", 400, "model"},
        {R"({"model":"m"})", 400, "messages"},
        {R"({"model":"m","messages":[]})", 400, "messages"},
        {R"({"model":"m","messages":[1]})", 400, "messages[0]"},
        {R"({"model":"m","messages":[{"content":"x"}]})", 400, "messages[0].role"},
        {R"({"model":"m","messages":[{"role":"robot","content":"x"}]})", 400, "messages[0].role"},
        {R"({"model":"m","messages":[{"role":"tool","content":"x"}]})", 400, "messages[0].tool_call_id"},
        {R"({"model":"m","messages":[{"role":"tool","content":"x","tool_call_id":""}]})", 400, "messages[0].tool_call_id"},
        {R"({"model":"m","messages":[{"role":"user","content":"x","tool_calls":[]}]})", 400, "messages[0].tool_calls"},
        {R"({"model":"m","messages":[{"role":"assistant","tool_calls":3},{"role":"user","content":"x"}]})", 400, "messages[0].tool_calls"},
        {R"({"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"a","function":{"name":"f"}}]},{"role":"user","content":"x"}]})",
         400, "messages[0].tool_calls[0].function"},
        {R"({"model":"m","messages":[{"role":"user"}]})", 400, "messages[0].content"},
        {R"({"model":"m","messages":[{"role":"user","content":5}]})", 400, "messages[0].content"},
        {R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]})", 400, "messages[0].content[0]"},
        {R"({"model":"m","messages":[{"role":"assistant","content":"x"}]})", 400, "messages"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":0})", 400, "max_tokens"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1.5})", 400, "max_tokens"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":99999})", 400, "max_completion_tokens"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"temperature":-1})", 400, "temperature"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"temperature":"hot"})", 400, "temperature"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_p":0})", 400, "top_p"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"seed":1.5})", 400, "seed"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":["a",""]})", 400, "stop"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":7})", 400, "stop"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"})", 400, "stream"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"n":2})", 400, "n"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":{"f":1}})", 400, "tools"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"functions":[{"name":"f"}]})", 400, "functions"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"auto"})", 400, "tool_choice"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{}],"tool_choice":"sometimes"})", 400, "tool_choice"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{}],"parallel_tool_calls":"yes"})", 400,
         "parallel_tool_calls"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{}],"response_format":{"type":"json_object"}})", 400,
         "response_format"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"presence_penalty":1})", 400, "presence_penalty"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"response_format":"json"})", 400, "response_format"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"yaml"}})", 400, "response_format.type"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema"}})", 400,
         "response_format.json_schema"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"schema":3}}})",
         400, "response_format.json_schema.schema"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":[1]})", 400, "logit_bias"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"-1":1}})", 400, "logit_bias"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"1":-101}})", 400, "logit_bias"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"1":"x"}})", 400, "logit_bias"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"conversation_id":"a/b"})", 400, "conversation_id"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"conversation_id":""})", 400, "conversation_id"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xC3\x28\"}]}", 400, ""},  // not UTF-8
    };
    for (const Case &c : cases) {
        CAPTURE(c.body);
        const std::optional<ApiError> error = parse(c.body);
        REQUIRE(error);
        CHECK(error->http_status == c.status);
        CHECK(error->param == c.param);
        CHECK(!error->message.empty());
        // The error body is the protocol's shape, also for a message quoting invalid bytes.
        const nlohmann::json body = nlohmann::json::parse(error_body(*error));
        CHECK(body["error"]["message"].is_string());
    }
    RequestLimits limits;
    limits.max_messages = 2;
    ChatRequest r;
    const auto too_many = parse_chat_request(R"({"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},
        {"role":"user","content":"c"}]})",
                                             limits, &r);
    REQUIRE(too_many);
    CHECK(too_many->http_status == 413);
}

TEST_CASE("server: nesting is measured before parsing, brackets inside strings aside") {
    CHECK_FALSE(nests_deeper_than(R"({"a":[[1]]})", 3));
    CHECK(nests_deeper_than(R"({"a":[[[1]]]})", 3));
    CHECK_FALSE(nests_deeper_than(R"({"a":"[[[[[[\"]]]]"})", 1));
    CHECK(nests_deeper_than(std::string(100000, '['), 32));
    const auto error = parse("{\"model\":" + std::string(64, '[') + std::string(64, ']') + "}");
    REQUIRE(error);
    CHECK(error->message.find("nests") != std::string::npos);
}

TEST_CASE("server: conversation files: the head reads back, and foreign or broken heads are refused") {
    HistoryRecord record;
    record.history = extend_history(empty_history(), "user", "hi");
    record.n_messages = 1;
    record.title = "hi \xC3\xA9";
    record.n_turns = 3;
    record.n_tokens = 77;
    record.last_used = 1796233414;
    const std::string transcript = R"([{"role":"user","content":"hi"}])";
    const std::string head = conversation_header("c-12", record, transcript.size());
    std::string id;
    HistoryRecord back;
    ConversationFileLayout layout;
    REQUIRE(parse_conversation_header(head + transcript + "SNAPSHOT", &id, &back, &layout));
    CHECK(id == "c-12");
    CHECK(back.history == record.history);
    CHECK(back.n_messages == 1);
    CHECK(back.title == record.title);
    CHECK(back.n_turns == 3);
    CHECK(back.n_tokens == 77);
    CHECK(back.last_used == record.last_used);
    CHECK(layout.transcript_offset == head.size());
    CHECK(layout.transcript_bytes == transcript.size());
    CHECK(layout.snapshot_offset == head.size() + transcript.size());
    // The head an earlier server wrote: no title, turns, tokens, time nor transcript.
    const std::string earlier =
        "h2o-server conversation 1\n{\"history\":\"" + to_hex(record.history) + "\",\"id\":\"c-12\",\"messages\":1}\n";
    REQUIRE(parse_conversation_header(earlier, &id, &back, &layout));
    CHECK(back.title.empty());
    CHECK(back.n_turns == 0);
    CHECK(back.last_used == 0);
    CHECK(layout.transcript_bytes == 0);
    CHECK(layout.snapshot_offset == earlier.size());
    for (const std::string &bad :
         {std::string(""), std::string("h2o-server conversation 2\n{}\n"), head.substr(0, head.size() - 1),
          std::string("h2o-server conversation 1\n{\"id\":\"../x\",\"history\":\"") + to_hex(record.history) + "\",\"messages\":1}\n",
          std::string("h2o-server conversation 1\n{\"id\":\"a\",\"history\":\"00\",\"messages\":1}\n"),
          std::string("h2o-server conversation 1\n{\"id\":\"a\",\"history\":\"") + to_hex(record.history) + "\",\"messages\":-1}\n",
          std::string("h2o-server conversation 1\n") + std::string(5000, ' ') + "\n",
          earlier.substr(0, earlier.size() - 2) + ",\"title\":7}\n", earlier.substr(0, earlier.size() - 2) + ",\"turns\":-2}\n",
          earlier.substr(0, earlier.size() - 2) + ",\"tokens\":\"x\"}\n",
          earlier.substr(0, earlier.size() - 2) + ",\"last_used\":1.5}\n",
          earlier.substr(0, earlier.size() - 2) + ",\"transcript_bytes\":-1}\n",
          earlier.substr(0, earlier.size() - 2) + ",\"transcript_bytes\":" + std::to_string(kMaxTranscriptBytes + 1) + "}\n"}) {
        CAPTURE(bad);
        CHECK_FALSE(parse_conversation_header(bad, &id, &back, &layout));
    }
}

TEST_CASE("server: a conversation's title is its first user message's beginning, on one line, cut at a character") {
    CHECK(conversation_title("Hello") == "Hello");
    CHECK(conversation_title("  Two\nlines\t ") == "Two lines");
    CHECK(conversation_title("").empty());
    const std::string long_text = std::string(63, 'a') + "\xC3\xA9" + "tail";  // the é would end at byte 65
    CHECK(conversation_title(long_text) == std::string(63, 'a'));
    CHECK(conversation_title(std::string(100, 'b')).size() == 64);
}

TEST_CASE("server: files are replaced whole, and a write that cannot happen leaves nothing") {
    const std::filesystem::path dir = std::filesystem::temp_directory_path() / "h2o-server-file-test";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "a.conv").string();
    std::string error, read;
    REQUIRE(write_file_atomically(path, "head\n", "[]", "first", &error));
    REQUIRE(write_file_atomically(path, "head\n", "", "second", &error));
    REQUIRE(read_file_prefix(path, 1 << 20, &read));
    CHECK(read == "head\nsecond");
    CHECK(read_file_prefix(path, 4, &read));
    CHECK(read == "head");
    CHECK_FALSE(write_file_atomically((dir / "missing" / "b.conv").string(), "h", "", "b", &error));
    CHECK(error.find("missing") != std::string::npos);
    CHECK(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()) == 1);
    std::filesystem::remove_all(dir);
}

namespace {

// stories260K and a store on it (budget 48, replies of 10 tokens).
struct Server {
    h2o_model *model = nullptr;
    std::unique_ptr<h2o_test::TestStore> test_store;

    Server(const std::string &model_path, uint32_t sessions, const std::string &state_dir, CachePolicy policy = CachePolicy::kReuse) {
        REQUIRE(h2o_model_load(model_path.c_str(), nullptr, &model) == H2O_OK);
        test_store = std::make_unique<h2o_test::TestStore>(model, sessions, 1, state_dir, 48, 10, policy);
    }
    ~Server() {
        test_store.reset();
        h2o_model_free(model);
    }
    ConversationStore &store() { return *test_store->store; }
    TurnContext &context() { return test_store->context; }

    // One turn: the reply and its usage.
    std::pair<std::string, Usage> turn(std::vector<Message> &history, const std::string &user, const std::string &id = "") {
        Usage usage;
        std::string error;
        REQUIRE_MESSAGE(test_store->turn(history, user, id, &usage, &error), error);
        return {history.back().content, usage};
    }
};

}  // namespace

TEST_CASE("server: conversations continue, give their session up, come back from disk, and say the same") {
    H2O_SHARED_FILE_OR_SKIP(model_path, "models/stories260K.gguf");
    const std::vector<std::vector<std::string>> users = {{"Tom had a dog.", "Where did it go?", "And then?"},
                                                         {"Sue saw a bird.", "What colour?", "Why?"}};
    // Reference: every session stays live.
    std::vector<std::vector<std::string>> expected(users.size());
    {
        Server live(model_path, 4, "");
        for (size_t c = 0; c < users.size(); ++c) {
            std::vector<Message> history{{"system", "You tell stories."}};
            for (const std::string &user : users[c]) expected[c].push_back(live.turn(history, user).first);
        }
    }
    const std::filesystem::path dir = std::filesystem::temp_directory_path() / "h2o-server-store-test";
    std::filesystem::remove_all(dir);
    std::vector<std::vector<Message>> histories(users.size(), std::vector<Message>{{"system", "You tell stories."}});
    std::vector<std::vector<std::string>> replies(users.size());
    {
        // One session for two conversations taking turns: each turn evicts the other to disk.
        Server one(model_path, 1, dir.string());
        for (size_t t = 0; t < 2; ++t) {
            for (size_t c = 0; c < users.size(); ++c) {
                auto [reply, usage] = one.turn(histories[c], users[c][t]);
                replies[c].push_back(reply);
                if (t > 0) CHECK(usage.cached_tokens > 0);
            }
        }
        const StoreCounts counts = one.store().counts();
        CHECK(counts.live_sessions == 1);
        CHECK(counts.evictions >= 3);
        CHECK(counts.restores >= 1);
        one.store().save_all();
    }
    {
        // A new store on the same directory (a restart) continues both.
        Server restarted(model_path, 1, dir.string());
        CHECK(restarted.store().counts().conversations == 2);
        for (size_t c = 0; c < users.size(); ++c) {
            auto [reply, usage] = restarted.turn(histories[c], users[c][2]);
            replies[c].push_back(reply);
            CHECK(usage.cached_tokens > 0);
        }
    }
    CHECK(replies == expected);
    std::filesystem::remove_all(dir);
}

// The lines of a trace file, read back.
std::vector<TraceRequest> read_trace_file(const std::string &path) {
    std::vector<TraceRequest> out;
    std::ifstream in(path);
    std::string line, error;
    while (std::getline(in, line)) {
        TraceRequest r;
        REQUIRE_MESSAGE(parse_trace_request(line, &r, &error), std::string(line + ": " + error));
        out.push_back(r);
    }
    return out;
}

TEST_CASE("server: a request trace's lines read back, its names hide the text, and the recorder appends in time order") {
    TraceRequest r;
    r.t = 1764770000.125;
    r.conversation = trace_name("my-chat");
    r.named = true;
    r.system = trace_name("You tell stories.");
    r.system_tokens = 12;
    r.history_tokens = 300;
    r.new_tokens = 9;
    r.reply_tokens = 40;
    TraceRequest back;
    std::string error;
    REQUIRE(parse_trace_request(trace_line(r), &back, &error));
    CHECK(back.t == r.t);
    CHECK(back.conversation == r.conversation);
    CHECK(back.named);
    CHECK(back.system == r.system);
    CHECK(back.system_tokens + back.history_tokens + back.new_tokens + back.reply_tokens == 361);
    CHECK(trace_line(r).find('\n') == std::string::npos);
    CHECK(r.conversation.size() == 16);
    CHECK(r.conversation != trace_name("my-chat2"));
    CHECK(trace_line(r).find("stories") == std::string::npos);

    const std::string path = h2o_test::temp_path("trace.jsonl");
    std::filesystem::remove(path);
    {
        std::unique_ptr<TraceRecorder> recorder;
        REQUIRE(TraceRecorder::open(path, &recorder, &error));
        recorder->record(r);
        r.t -= 5;  // the clock stepped back: the line keeps the order
        recorder->record(r);
    }
    {
        std::unique_ptr<TraceRecorder> again;  // a restart appends
        REQUIRE(TraceRecorder::open(path, &again, &error));
        r.t += 10;
        again->record(r);
    }
    const std::vector<TraceRequest> lines = read_trace_file(path);
    REQUIRE(lines.size() == 3);
    CHECK(lines[0].t == lines[1].t);
    CHECK(lines[2].t == r.t);
    std::filesystem::remove(path);
    std::unique_ptr<TraceRecorder> none;
    CHECK_FALSE(TraceRecorder::open("/nonexistent-dir/trace.jsonl", &none, &error));
    CHECK(error.find("/nonexistent-dir/trace.jsonl") != std::string::npos);
    CHECK(none == nullptr);
}

TEST_CASE("server: turns recorded in the request trace count the system message, the history, the new message and the reply") {
    H2O_SHARED_FILE_OR_SKIP(model_path, "models/stories260K.gguf");
    const std::string path = h2o_test::temp_path("turns-trace.jsonl");
    std::filesystem::remove(path);
    std::unique_ptr<TraceRecorder> recorder;
    std::string error;
    REQUIRE(TraceRecorder::open(path, &recorder, &error));
    std::vector<Usage> usages;
    {
        Server server(model_path, 2, "");
        server.context().trace = recorder.get();
        std::vector<Message> named{{"system", "You tell stories."}}, one_shot{{"system", "You tell stories."}};
        usages.push_back(server.turn(named, "Tom had a dog.", "tom").second);
        usages.push_back(server.turn(named, "Where did it go?", "tom").second);
        usages.push_back(server.turn(one_shot, "Sue saw a bird.").second);
    }
    const std::vector<TraceRequest> lines = read_trace_file(path);
    REQUIRE(lines.size() == 3);
    CHECK(lines[0].conversation == lines[1].conversation);
    CHECK(lines[0].conversation == trace_name("tom"));
    CHECK(lines[2].conversation != lines[0].conversation);
    CHECK(lines[0].named);
    CHECK_FALSE(lines[2].named);
    CHECK(lines[0].system == lines[2].system);
    CHECK(lines[0].system_tokens > 0);
    CHECK(lines[0].system_tokens == lines[1].system_tokens);
    CHECK(lines[0].history_tokens == 0);
    // The second turn's history is the first turn's conversation: its messages and its reply.
    CHECK(lines[1].history_tokens >= lines[0].new_tokens + lines[0].reply_tokens);
    for (size_t i = 0; i < lines.size(); ++i) {
        CAPTURE(i);
        CHECK(lines[i].new_tokens > 0);
        CHECK(lines[i].reply_tokens == usages[i].completion_tokens);
        // The whole prompt as the session counted it, within what tokenizing the parts apart changes.
        const double counted = static_cast<double>(lines[i].system_tokens + lines[i].history_tokens + lines[i].new_tokens);
        CHECK(counted == doctest::Approx(static_cast<double>(usages[i].prompt_tokens)).epsilon(0.1));
    }
    CHECK(lines[0].t <= lines[1].t);
    CHECK(lines[1].t <= lines[2].t);
    std::filesystem::remove(path);
}

TEST_CASE("server: the reuse estimator starts even, learns each category's share and reuse time, and follows a change") {
    ReuseEstimator estimator;
    const size_t chat = reuse_category(true, 5), one_shot = reuse_category(false, 1);
    CHECK(reuse_category(false, 0) == reuse_category(false, 1));
    CHECK(reuse_category(true, 2) == reuse_category(true, 3));
    CHECK(reuse_category(true, 3) != reuse_category(true, 4));
    CHECK(reuse_category(true, 1) != one_shot);
    CHECK(estimator.probability(chat, 0) == doctest::Approx(0.5));
    CHECK(estimator.mean_reuse_seconds(chat) == doctest::Approx(600));
    CHECK(estimator.probability(chat, 600) < estimator.probability(chat, 60));
    for (int i = 0; i < 200; ++i) {
        estimator.reused(chat, 30);
        estimator.ended(one_shot);
    }
    CHECK(estimator.reuse_share(chat) > 0.99);
    CHECK(estimator.mean_reuse_seconds(chat) == doctest::Approx(30).epsilon(0.15));
    CHECK(estimator.reuse_share(one_shot) < 0.01);
    CHECK(estimator.probability(chat, 10) > 0.95);
    CHECK(estimator.probability(one_shot, 10) < 0.01);
    // Long idle: past a few mean reuse times even a chat is unlikely to come back.
    CHECK(estimator.probability(chat, 600) < 0.05);
    CHECK(estimator.horizon_seconds(chat) == 3600);
    // Counts fade: after a few thousand reuses the one-shots are thought to come back.
    for (int i = 0; i < 5000; ++i) estimator.reused(one_shot, 5);
    CHECK(estimator.reuse_share(one_shot) > 0.9);
    for (const char *name : {"lru", "reuse"}) {
        CachePolicy policy;
        REQUIRE(parse_cache_policy(name, &policy));
        CHECK(std::string(cache_policy_name(policy)) == name);
    }
    CachePolicy policy;
    CHECK_FALSE(parse_cache_policy("lfu", &policy));
}

TEST_CASE("server: the give-up order: LRU by release, reuse by expected saving per byte freed") {
    ReuseEstimator estimator;
    for (int i = 0; i < 100; ++i) {
        estimator.reused(reuse_category(true, 5), 60);
        estimator.ended(reuse_category(false, 1));
    }
    // 0: a long named conversation, released first; 1: a one-shot request, released later;
    // 2: a named one idle for a day; 3: like 0, with half its tokens.
    std::vector<CacheCandidate> candidates(4);
    candidates[0] = {1, 120, reuse_category(true, 6), 400, 1};
    candidates[1] = {2, 5, reuse_category(false, 1), 300, 1};
    candidates[2] = {3, 86400, reuse_category(true, 6), 400, 1};
    candidates[3] = {4, 120, reuse_category(true, 6), 200, 1};
    CHECK(give_up_order(CachePolicy::kLru, estimator, candidates) == std::vector<size_t>{0, 1, 2, 3});
    CHECK(give_up_order(CachePolicy::kReuse, estimator, candidates) == std::vector<size_t>{2, 1, 3, 0});
    // Per byte freed: a file twice the size with the same expected saving goes first.
    candidates[3].tokens = 400;
    candidates[0].bytes = 2;
    candidates[3].bytes = 1;
    const std::vector<size_t> by_bytes = give_up_order(CachePolicy::kReuse, estimator, candidates);
    CHECK(std::find(by_bytes.begin(), by_bytes.end(), size_t{0}) < std::find(by_bytes.begin(), by_bytes.end(), size_t{3}));
}

TEST_CASE("server: with the reuse policy a long conversation keeps its session through one-shot requests, where LRU gives it up") {
    H2O_SHARED_FILE_OR_SKIP(model_path, "models/stories260K.gguf");
    for (const CachePolicy policy : {CachePolicy::kLru, CachePolicy::kReuse}) {
        const std::string name = cache_policy_name(policy);
        CAPTURE(name);
        Server server(model_path, 2, "", policy);
        std::vector<Message> chat{{"system", "You tell stories."}};
        for (const char *user : {"Tom had a dog.", "Where did it go?", "And then?"}) server.turn(chat, user, "chat");
        // Two one-shot requests: the second needs a session, and one of the idle two goes.
        for (const char *user : {"Hi", "Hello"}) {
            std::vector<Message> one;
            server.turn(one, user);
        }
        const auto [reply, usage] = server.turn(chat, "The end.", "chat");
        // Without a state directory a conversation that lost its session starts again from its
        // messages (and takes a session from another once more).
        if (policy == CachePolicy::kLru) {
            CHECK(usage.cached_tokens == 0);
            CHECK(server.store().counts().evictions == 2);
        } else {
            CHECK(usage.cached_tokens > 0);
            CHECK(server.store().counts().evictions == 1);
        }
    }
}

TEST_CASE("server: a client that leaves mid-reply leaves the conversation consistent") {
    H2O_SHARED_FILE_OR_SKIP(model_path, "models/stories260K.gguf");
    Server server(model_path, 2, "");
    std::vector<Message> history{{"user", "Once upon a time"}};
    ChatRequest request;
    request.model = "m";
    request.messages = history;
    request.conversation_id = "leaves";
    std::unique_ptr<ChatTurn> turn;
    REQUIRE_FALSE(ChatTurn::start(server.context(), request, &turn));
    int pieces = 0;
    const TurnOutcome outcome = turn->generate([&](const std::string &) { return ++pieces < 3; });
    turn.reset();
    CHECK(outcome.finish_reason.empty());
    CHECK(pieces == 3);
    // The turn was closed with what was delivered: the client's next request continues it.
    history.push_back(Message{"assistant", outcome.text});
    auto [reply, usage] = server.turn(history, "Go on.", "leaves");
    CHECK(usage.cached_tokens > 0);
    // A request that does not follow (an edited history) starts the conversation again.
    std::vector<Message> edited{{"user", "Something else"}};
    auto [other, edited_usage] = server.turn(edited, "Hi", "leaves");
    CHECK(edited_usage.cached_tokens == 0);
}
