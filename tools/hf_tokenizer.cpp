#include "hf_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

namespace h2o {
namespace {

using nlohmann::json;

// Twice the largest vocabulary released (Gemma's 262 144): an id past it is corrupt, and padding
// the vocabulary up to it would cost a lot of memory for nothing.
constexpr int64_t kMaxVocab = 1 << 19;
// tokenizer.json nests a few levels deep; far deeper input is hostile.
constexpr int kMaxDepth = 64;

Status bad(std::string message) { return make_error(H2O_ERR_MODEL_FORMAT, std::move(message)); }

// Rejects JSON nested deeper than kMaxDepth before the parser sees it.
Status check_depth(std::string_view text, const char *file) {
    int depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\')
                ++i;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > kMaxDepth) return bad(std::string(file) + ": nested more than " + std::to_string(kMaxDepth) + " levels deep");
        } else if (c == ']' || c == '}') {
            --depth;
        }
    }
    return Status::Ok();
}

Status parse_json(std::string_view text, const char *file, json *out) {
    H2O_TRY(check_depth(text, file));
    *out = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
    if (out->is_discarded()) return bad(std::string(file) + ": not valid JSON");
    if (!out->is_object()) return bad(std::string(file) + ": not a JSON object");
    return Status::Ok();
}

// The pre-tokenizer regexes of tokenizer.json files, as llama.cpp names them.
const std::map<std::string, std::string> &known_split_patterns() {
    static const std::map<std::string, std::string> kPatterns = {
        {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
         "\\s+(?!\\S)|\\s+",
         "llama-bpe"},
        {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
         "\\s+(?!\\S)|\\s+",
         "qwen2"},
        {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
         "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
         "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
         "gpt-4o"},
    };
    return kPatterns;
}

// obj[key] when obj is an object holding it, else null (no copy of large values).
const json &field(const json &obj, const char *key) {
    static const json kNull;
    if (!obj.is_object()) return kNull;
    const auto it = obj.find(key);
    return it != obj.end() ? *it : kNull;
}

std::string string_field(const json &obj, const char *key) {
    const json &v = field(obj, key);
    return v.is_string() ? v.get<std::string>() : std::string();
}

bool bool_field(const json &obj, const char *key, bool fallback) {
    const json &v = field(obj, key);
    return v.is_boolean() ? v.get<bool>() : fallback;
}

std::string describe(const json &j) {
    std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
    return s.size() > 160 ? s.substr(0, 160) + "..." : s;
}

// The name llama.cpp gives the pre-tokenizer of tokenizer.json.
Status pre_tokenizer_name(const json &tokenizer, std::string *name) {
    const json &pre = field(tokenizer, "pre_tokenizer");
    std::vector<const json *> steps;
    if (string_field(pre, "type") == "Sequence" && field(pre, "pretokenizers").is_array()) {
        for (const json &step : field(pre, "pretokenizers")) steps.push_back(&step);
    } else if (pre.is_object()) {
        steps.push_back(&pre);
    }
    auto type_of = [&](size_t i) { return string_field(*steps[i], "type"); };
    const bool byte_level = !steps.empty() && type_of(steps.size() - 1) == "ByteLevel";
    if (!byte_level) {
        return make_error(H2O_ERR_UNSUPPORTED, "tokenizer.json: not a byte-level BPE tokenizer (its pre-tokenizer is " + describe(pre) +
                                                   "); only byte-level vocabularies are read");
    }
    const bool byte_level_regex = bool_field(*steps.back(), "use_regex", true);
    if (steps.size() == 1 && byte_level_regex) {
        *name = "gpt-2";
        return Status::Ok();
    }
    if (steps.size() == 2 && byte_level_regex && type_of(0) == "Digits" && bool_field(*steps[0], "individual_digits", false)) {
        *name = "smollm";
        return Status::Ok();
    }
    if (steps.size() == 2 && !byte_level_regex && type_of(0) == "Split") {
        const json &split = *steps[0];
        const json &regex = field(field(split, "pattern"), "Regex");
        // "Isolated", or "Removed" with invert (GPT-4o's form): the matches are the words.
        const std::string behavior = string_field(split, "behavior");
        const bool words = behavior == "Isolated" || (behavior == "Removed" && bool_field(split, "invert", false));
        if (words && regex.is_string()) {
            const auto it = known_split_patterns().find(regex.get<std::string>());
            if (it != known_split_patterns().end()) {
                *name = it->second;
                return Status::Ok();
            }
        }
    }
    return make_error(H2O_ERR_UNSUPPORTED, "tokenizer.json: a pre-tokenizer this reader does not recognise: " + describe(pre));
}

// The normalizer's steps (a Sequence's, or the one normalizer).
std::vector<const json *> normalizer_steps(const json &tokenizer) {
    const json &norm = field(tokenizer, "normalizer");
    std::vector<const json *> steps;
    if (string_field(norm, "type") == "Sequence" && field(norm, "normalizers").is_array()) {
        for (const json &step : field(norm, "normalizers")) steps.push_back(&step);
    } else if (norm.is_object()) {
        steps.push_back(&norm);
    }
    return steps;
}

// Whether the tokenizer is a sentencepiece BPE model written as tokenizer.json (Gemma, Llama 2's
// Hugging Face conversions): byte fallback, and spaces replaced by U+2581 before the merges.
bool is_sentencepiece_bpe(const json &tokenizer, const json &model, bool *add_space_prefix) {
    if (!bool_field(model, "byte_fallback", false)) return false;
    bool replaces_spaces = false;
    *add_space_prefix = false;
    for (const json *step : normalizer_steps(tokenizer)) {
        const std::string type = string_field(*step, "type");
        if (type == "Replace" && string_field(field(*step, "pattern"), "String") == " " && string_field(*step, "content") == "\xE2\x96\x81")
            replaces_spaces = true;
        if (type == "Prepend" && string_field(*step, "prepend") == "\xE2\x96\x81") *add_space_prefix = true;
    }
    return replaces_spaces;
}

// A byte-fallback token: "<0xXX>".
bool is_byte_token(std::string_view text) {
    auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F'); };
    return text.size() == 6 && text.starts_with("<0x") && text.back() == '>' && hex(text[3]) && hex(text[4]);
}

// What llama.cpp's converter treats as a control token although tokenizer.json does not mark it
// special (some models leave their <|...|> tokens unmarked).
bool looks_special(std::string_view text) {
    auto wrapped = [&](std::string_view open, std::string_view close) {
        return text.size() >= open.size() + close.size() && text.starts_with(open) && text.ends_with(close);
    };
    return text == "<pad>" || text == "<mask>" || text == "<2mass>" || text == "[@BOS@]" || wrapped("<|", "|>") ||
           wrapped("<\xEF\xBD\x9C", "\xEF\xBD\x9C>") || wrapped("<unused", ">");
}

// A special token entry of tokenizer_config.json: a string or {"content": string}.
std::optional<std::string> token_content(const json &config, const char *key) {
    const json &v = field(config, key);
    if (v.is_string()) return v.get<std::string>();
    const json &content = field(v, "content");
    if (content.is_string()) return content.get<std::string>();
    return std::nullopt;
}

Status parse_checked(std::string_view tokenizer_json, std::string_view config_json, std::string_view model_config_json,
                     std::string_view chat_template, int32_t n_vocab, HfVocabulary *out) {
    json tokenizer, config = json::object(), model_config = json::object();
    H2O_TRY(parse_json(tokenizer_json, "tokenizer.json", &tokenizer));
    if (!config_json.empty()) H2O_TRY(parse_json(config_json, "tokenizer_config.json", &config));
    if (!model_config_json.empty()) H2O_TRY(parse_json(model_config_json, "config.json", &model_config));

    const json &model = field(tokenizer, "model");
    if (!model.is_object()) return bad("tokenizer.json: no \"model\" object");
    if (string_field(model, "type") != "BPE")
        return make_error(H2O_ERR_UNSUPPORTED, "tokenizer.json: model type " + describe(field(model, "type")) + " (only BPE is read)");
    HfVocabulary v;
    v.sentencepiece = is_sentencepiece_bpe(tokenizer, model, &v.add_space_prefix);
    if (!v.sentencepiece) H2O_TRY(pre_tokenizer_name(tokenizer, &v.pre));

    // id -> text, the model's vocabulary first, then the added tokens over it.
    const json &vocab = field(model, "vocab");
    if (!vocab.is_object() || vocab.empty()) return bad("tokenizer.json: model.vocab is not a non-empty object");
    struct Token {
        std::string text;
        int32_t type = TOKEN_NORMAL;
        bool added = false;
        uint8_t strip = 0;  // TokenStrip bits
    };
    std::map<int64_t, Token> by_id;
    auto check_id = [&](const json &id, const std::string &text) -> Status {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxVocab)
            return bad("tokenizer.json: token " + describe(json(text)) + " has id " + describe(id) + " (ids are 0.." +
                       std::to_string(kMaxVocab - 1) + ")");
        return Status::Ok();
    };
    for (const auto &[text, id] : vocab.items()) {
        H2O_TRY(check_id(id, text));
        by_id[id.get<int64_t>()] = {text, v.sentencepiece && is_byte_token(text) ? TOKEN_BYTE : TOKEN_NORMAL, false, 0};
    }
    const json &added = field(tokenizer, "added_tokens");
    if (!added.is_array() && !added.is_null()) return bad("tokenizer.json: added_tokens is not an array");
    std::map<std::string, int64_t> added_ids;  // content -> the first id, for the special tokens
    for (const json &a : added.is_array() ? added : json::array()) {
        if (!field(a, "content").is_string() || field(a, "id").is_null())
            return bad("tokenizer.json: an added token without content or id: " + describe(a));
        std::string text = a["content"].get<std::string>();
        H2O_TRY(check_id(a["id"], text));
        const bool special = bool_field(a, "special", false);
        int32_t type = TOKEN_CONTROL;
        if (!special && !looks_special(text)) {
            type = TOKEN_USER_DEFINED;
            // As the converter: a sentencepiece space in a user-defined token is a space, so that
            // Gemma's runs of spaces are found in the raw text as llama.cpp reads a converted file.
            for (size_t at; (at = text.find("\xE2\x96\x81")) != std::string::npos;) text.replace(at, 3, " ");
        }
        const uint8_t strip =
            static_cast<uint8_t>((bool_field(a, "lstrip", false) ? kStripLeft : 0) | (bool_field(a, "rstrip", false) ? kStripRight : 0));
        added_ids.emplace(a["content"].get<std::string>(), a["id"].get<int64_t>());
        by_id[a["id"].get<int64_t>()] = {text, type, true, strip};
    }

    const int64_t needed = by_id.rbegin()->first + 1;
    if (n_vocab != 0 && n_vocab < needed)
        return bad("the vocabulary size " + std::to_string(n_vocab) + " is smaller than the tokenizer's " + std::to_string(needed));
    if (n_vocab < 0 || n_vocab > kMaxVocab) return bad("vocabulary size " + std::to_string(n_vocab) + " is out of range");
    const int64_t size = n_vocab != 0 ? n_vocab : needed;
    v.tokens.resize(static_cast<size_t>(size));
    v.types.assign(static_cast<size_t>(size), TOKEN_UNUSED);
    v.strip.assign(static_cast<size_t>(size), 0);
    std::vector<bool> added_token(static_cast<size_t>(size), false);
    for (int64_t id = 0; id < size; ++id) {
        const auto it = by_id.find(id);
        if (it == by_id.end()) {
            v.tokens[static_cast<size_t>(id)] = "[PAD" + std::to_string(id) + "]";
        } else {
            v.tokens[static_cast<size_t>(id)] = it->second.text;
            v.types[static_cast<size_t>(id)] = it->second.type;
            v.strip[static_cast<size_t>(id)] = it->second.strip;
            added_token[static_cast<size_t>(id)] = it->second.added;
        }
    }
    if (std::none_of(v.strip.begin(), v.strip.end(), [](uint8_t s) { return s != 0; })) v.strip.clear();

    const json &merges = field(model, "merges");
    if (!merges.is_array() && !merges.is_null()) return bad("tokenizer.json: model.merges is not an array");
    for (const json &m : merges.is_array() ? merges : json::array()) {
        if (m.is_string()) {
            v.merges.push_back(m.get<std::string>());
        } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
            // The newer form, a pair. Its parts may hold spaces, which "left right" cannot.
            const std::string left = m[0].get<std::string>(), right = m[1].get<std::string>();
            if (left.find(' ') != std::string::npos || right.find(' ') != std::string::npos)
                return make_error(H2O_ERR_UNSUPPORTED, "tokenizer.json: merge " + describe(m) + " has a space inside a part");
            v.merges.push_back(left + " " + right);
        } else {
            return bad("tokenizer.json: merge " + std::to_string(v.merges.size()) + " is " + describe(m) +
                       " (a string or a pair of strings is expected)");
        }
    }

    if (v.sentencepiece) {
        // Sentencepiece ranks a merge by the merged piece's score: a piece scores minus the rank of
        // the first merge that makes it, so the earlier merges go first as tokenizer.json orders
        // them. Pieces no merge makes (characters, bytes) score 0, added tokens -1000 as the
        // converter writes them; the merges themselves are not written.
        std::map<std::string, int64_t> piece_id;
        for (int64_t id = 0; id < size; ++id) piece_id.emplace(v.tokens[static_cast<size_t>(id)], id);
        v.scores.assign(static_cast<size_t>(size), 0.0f);
        std::vector<bool> scored(static_cast<size_t>(size), false);
        for (size_t rank = 0; rank < v.merges.size(); ++rank) {
            const std::string &m = v.merges[rank];
            const size_t space = m.find(' ');
            const auto it = piece_id.find(m.substr(0, space) + m.substr(space + 1));
            if (it == piece_id.end() || scored[static_cast<size_t>(it->second)]) continue;
            v.scores[static_cast<size_t>(it->second)] = -static_cast<float>(rank + 1);
            scored[static_cast<size_t>(it->second)] = true;
        }
        for (int64_t id = 0; id < size; ++id)
            if (added_token[static_cast<size_t>(id)]) v.scores[static_cast<size_t>(id)] = -1000.0f;
        v.merges.clear();
    }

    // Special tokens: tokenizer_config.json's, found among the added tokens.
    auto special_id = [&](const char *key) -> int32_t {
        const std::optional<std::string> content = token_content(config, key);
        if (!content) return -1;
        const auto it = added_ids.find(*content);
        return it != added_ids.end() && it->second < size ? static_cast<int32_t>(it->second) : -1;
    };
    v.bos = special_id("bos_token");
    v.eos = special_id("eos_token");
    v.unk = special_id("unk_token");
    v.pad = special_id("pad_token");
    auto id_of_text = [&](const std::string &text) -> int32_t {
        for (int64_t id = 0; id < size; ++id)
            if (v.tokens[static_cast<size_t>(id)] == text) return static_cast<int32_t>(id);
        return -1;
    };
    // The post-processor's template: a special token before the text means "add BOS", one
    // after it "add EOS".
    const json &post = field(tokenizer, "post_processor");
    std::vector<const json *> processors;
    if (field(post, "processors").is_array()) {
        for (const json &p : field(post, "processors")) processors.push_back(&p);
    } else if (post.is_object()) {
        processors.push_back(&post);
    }
    for (const json *p : processors) {
        if (string_field(*p, "type") != "TemplateProcessing") continue;
        const json &single = field(*p, "single");
        if (!single.is_array() || single.size() < 2) continue;
        auto special_in = [](const json &item) -> std::optional<std::string> {
            const json &id = field(field(item, "SpecialToken"), "id");
            return id.is_string() ? std::optional<std::string>(id.get<std::string>()) : std::nullopt;
        };
        if (const auto first = special_in(single.front())) {
            if (v.bos < 0) v.bos = id_of_text(*first);
            v.add_bos = v.bos >= 0 && v.tokens[static_cast<size_t>(v.bos)] == *first;
        }
        if (const auto last = special_in(single.back())) {
            if (v.eos < 0) v.eos = id_of_text(*last);
            v.add_eos = v.eos >= 0 && v.tokens[static_cast<size_t>(v.eos)] == *last;
        }
    }
    if (v.sentencepiece && v.unk >= 0) v.types[static_cast<size_t>(v.unk)] = TOKEN_UNKNOWN;
    if (field(config, "add_bos_token").is_boolean()) v.add_bos = config["add_bos_token"].get<bool>();
    if (field(config, "add_eos_token").is_boolean()) v.add_eos = config["add_eos_token"].get<bool>();
    // config.json's ids fill in what is still unknown.
    for (auto [key, target] :
         {std::pair<const char *, int32_t *>{"bos_token_id", &v.bos}, {"eos_token_id", &v.eos}, {"pad_token_id", &v.pad}}) {
        const json &id = field(model_config, key);
        if (*target >= 0 || !id.is_number_integer()) continue;
        if (id.get<int64_t>() >= 0 && id.get<int64_t>() < size) *target = static_cast<int32_t>(id.get<int64_t>());
    }

    // The chat template: tokenizer_config.json's (a string, or a list whose "default" entry is
    // taken), else chat_template.jinja's.
    if (const json &t = field(config, "chat_template"); !t.is_null()) {
        if (t.is_string()) {
            v.chat_template = t.get<std::string>();
        } else if (t.is_array()) {
            for (const json &entry : t) {
                if (string_field(entry, "name") == "default") v.chat_template = string_field(entry, "template");
            }
        }
    } else {
        v.chat_template = std::string(chat_template);
    }
    *out = std::move(v);
    return Status::Ok();
}

Status read_text(const std::filesystem::path &path, bool required, std::string *out) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
        if (required) return make_error(H2O_ERR_IO, "cannot open " + path.string() + ": no such file");
        out->clear();
        return Status::Ok();
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) return make_error(H2O_ERR_IO, "cannot open " + path.string());
    out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (in.bad()) return make_error(H2O_ERR_IO, "cannot read " + path.string());
    return Status::Ok();
}

}  // namespace

Status parse_hf_tokenizer(std::string_view tokenizer_json, std::string_view config_json, std::string_view model_config_json,
                          std::string_view chat_template, int32_t n_vocab, HfVocabulary *out) {
    // nlohmann::json reports wrong types and the like by exceptions; all of them are the input's fault.
    try {
        return parse_checked(tokenizer_json, config_json, model_config_json, chat_template, n_vocab, out);
    } catch (const json::exception &e) {
        return bad(std::string("tokenizer files: ") + e.what());
    } catch (const std::bad_alloc &) {
        return make_error(H2O_ERR_OUT_OF_MEMORY, "tokenizer files: out of memory");
    }
}

Status read_hf_tokenizer(const std::string &dir, int32_t n_vocab, HfVocabulary *out) {
    const std::filesystem::path folder(dir);
    std::string tokenizer, config, model_config, chat_template;
    H2O_TRY(read_text(folder / "tokenizer.json", true, &tokenizer));
    H2O_TRY(read_text(folder / "tokenizer_config.json", false, &config));
    H2O_TRY(read_text(folder / "config.json", false, &model_config));
    H2O_TRY(read_text(folder / "chat_template.jinja", false, &chat_template));
    Status st = parse_hf_tokenizer(tokenizer, config, model_config, chat_template, n_vocab, out);
    if (!st.ok()) st.message = dir + ": " + st.message;
    return st;
}

Status read_vocabulary(const std::string &path, int32_t *n_tokens, std::function<void(GgufWriter &)> *write) {
    const std::filesystem::path file(path);
    if (file.extension() == ".gguf") {
        std::unique_ptr<GgufFile> opened;
        H2O_TRY(GgufFile::open(path, &opened));
        std::vector<std::string_view> tokens;
        Status st = opened->get_string_array("tokenizer.ggml.tokens", &tokens);
        if (!st.ok()) return make_error(H2O_ERR_MODEL_FORMAT, path + ": no vocabulary: " + st.message);
        *n_tokens = static_cast<int32_t>(tokens.size());
        std::shared_ptr<const GgufFile> gguf(std::move(opened));  // its keys point into its mapping
        *write = [gguf](GgufWriter &w) {
            for (const GgufKeyValue &kv : gguf->metadata()) {
                if (kv.key.substr(0, 10) == "tokenizer.") w.add_copy(kv);
            }
        };
        return Status::Ok();
    }
    const std::string dir = std::filesystem::is_directory(file) ? path : file.parent_path().string();
    if (!std::filesystem::is_directory(file) && file.filename() != "tokenizer.json") {
        return make_error(H2O_ERR_INVALID_ARGUMENT, "'" + path + "' is not a tokenizer.json, its folder or a GGUF file");
    }
    auto vocab = std::make_shared<HfVocabulary>();
    H2O_TRY(read_hf_tokenizer(dir.empty() ? "." : dir, 0, vocab.get()));
    *n_tokens = static_cast<int32_t>(vocab->tokens.size());
    *write = [vocab](GgufWriter &w) { add_hf_vocabulary(*vocab, &w); };
    return Status::Ok();
}

void add_hf_vocabulary(const HfVocabulary &vocab, GgufWriter *w) {
    if (vocab.sentencepiece) {
        w->add_string("tokenizer.ggml.model", "llama");
        w->add_string_array("tokenizer.ggml.tokens", vocab.tokens);
        w->add_f32_array("tokenizer.ggml.scores", vocab.scores);
        w->add_i32_array("tokenizer.ggml.token_type", vocab.types);
        w->add_bool("tokenizer.ggml.add_space_prefix", vocab.add_space_prefix);
    } else {
        w->add_string("tokenizer.ggml.model", "gpt2");
        w->add_string("tokenizer.ggml.pre", vocab.pre);
        w->add_string_array("tokenizer.ggml.tokens", vocab.tokens);
        w->add_i32_array("tokenizer.ggml.token_type", vocab.types);
        w->add_string_array("tokenizer.ggml.merges", vocab.merges);
    }
    if (vocab.bos >= 0) w->add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(vocab.bos));
    if (vocab.eos >= 0) w->add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(vocab.eos));
    if (vocab.unk >= 0) w->add_u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(vocab.unk));
    if (vocab.pad >= 0) w->add_u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(vocab.pad));
    if (vocab.add_bos) w->add_bool("tokenizer.ggml.add_bos_token", *vocab.add_bos);
    if (vocab.add_eos) w->add_bool("tokenizer.ggml.add_eos_token", *vocab.add_eos);
    if (!vocab.chat_template.empty()) w->add_string("tokenizer.chat_template", vocab.chat_template);
}

VocabSpec to_vocab_spec(const HfVocabulary &vocab) {
    VocabSpec spec;
    spec.model = vocab.sentencepiece ? TokenizerModel::kSentencePiece : TokenizerModel::kByteLevelBpe;
    spec.pieces = vocab.tokens;
    spec.scores = vocab.scores;
    spec.types = vocab.types;
    spec.merges = vocab.merges;
    spec.add_space_prefix = vocab.sentencepiece && vocab.add_space_prefix;
    spec.pre = vocab.pre;
    spec.bos = vocab.bos;
    spec.eos = vocab.eos;
    spec.unk = vocab.unk;
    spec.add_bos = vocab.add_bos;
    spec.add_eos = vocab.add_eos;
    spec.strip = vocab.strip;
    return spec;
}

}  // namespace h2o
