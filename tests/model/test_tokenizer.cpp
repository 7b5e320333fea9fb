// Tokenizer: llama.cpp's test vectors for the Llama sentencepiece vocabulary, agreement between a
// .model file and the same vocabulary inside a GGUF, round trips, streaming rendering, malformed
// vocabularies and concurrent use.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gguf.h"
#include "test_util.h"
#include "tokenizer.h"
#include "tokenizer_vectors.h"
#include "utf8.h"

using namespace h2o;
using h2o_test::ids_to_string;

namespace {

std::string read_file(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE_MESSAGE(in.good(), "cannot open " << path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_file(const std::string &path, std::string_view bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    REQUIRE(out.good());
}

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::string &path) {
    std::unique_ptr<GgufFile> file;
    Status st = GgufFile::open(path, &file);
    REQUIRE_MESSAGE(st.ok(), st.message);
    std::unique_ptr<Tokenizer> tok;
    st = Tokenizer::from_gguf(*file, &tok);
    REQUIRE_MESSAGE(st.ok(), st.message);
    return tok;  // the tokenizer copies what it needs; the file may go
}

std::unique_ptr<Tokenizer> load_model_file(const std::string &path) {
    std::unique_ptr<Tokenizer> tok;
    const Status st = Tokenizer::from_model_file(path, &tok);
    REQUIRE_MESSAGE(st.ok(), st.message);
    return tok;
}

std::vector<int32_t> encode(const Tokenizer &tok, std::string_view text, bool add_bos = false) {
    std::vector<int32_t> ids;
    const Status st = tok.encode(text, add_bos, &ids);
    REQUIRE_MESSAGE(st.ok(), st.message);
    return ids;
}

std::string decode(const Tokenizer &tok, const std::vector<int32_t> &ids) {
    std::string text;
    const Status st = tok.decode(ids.data(), ids.size(), &text);
    REQUIRE_MESSAGE(st.ok(), st.message);
    return text;
}

// Renders ids the way a streaming caller does: after_bos until the first token that is not control.
std::string render_stream(const Tokenizer &tok, const std::vector<int32_t> &ids) {
    std::string text;
    bool after_bos = true;
    for (int32_t id : ids) {
        tok.append_piece(id, after_bos, &text);
        if (!tok.is_control(id)) after_bos = false;
    }
    return text;
}

// Strings that exercise the edges: nothing, only whitespace, newlines, tabs, runs of spaces,
// characters outside a small vocabulary (byte fallback), emoji, combining marks, a NUL byte.
std::vector<std::string> tricky_strings() {
    return {
        "",
        " ",
        "  ",
        "   ",
        "\n",
        "\n\n",
        " \n ",
        "\t",
        "\t\n",
        "a",
        " a",
        "a ",
        "a  b",
        "  leading",
        "trailing  ",
        "Hello world",
        " Hello World!",
        "Once upon a time, there was a little girl.",
        "Lily said, \"Look!\"\nTom said:  \"Wow...\"",
        "ü é ñ ß",
        "Führer",
        "中文字符",
        "日本語のテキスト",
        "😀 emoji 🦙🦙",
        "👩‍👩‍👧 family",
        "e\xCC\x81 combining",
        "ied 4 ½ months",
        "3.14159 33 333",
        std::string("nul\0byte", 8),
        "\xF0\x9F\x98\x81",
        "tab\tin\tthe middle",
        "\r\n windows \r\n",
        "ends with newline\n",
        "a\xE2\x80\x8A"
        "b",
        "!!!!!!??????",
        "'RE you sure? 'M not",
    };
}

// A tiny vocabulary built by hand: <unk>, <s>, </s>, optionally the 256 byte tokens, then pieces.
VocabSpec small_vocab(bool with_bytes, const std::vector<std::pair<std::string, float>> &pieces) {
    VocabSpec spec;
    auto add = [&](std::string piece, float score, int32_t type) {
        spec.pieces.push_back(std::move(piece));
        spec.scores.push_back(score);
        spec.types.push_back(type);
    };
    add("<unk>", 0, TOKEN_UNKNOWN);
    add("<s>", 0, TOKEN_CONTROL);
    add("</s>", 0, TOKEN_CONTROL);
    if (with_bytes) {
        static const char hex[] = "0123456789ABCDEF";
        for (int b = 0; b < 256; ++b) add(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">", 0, TOKEN_BYTE);
    }
    for (const auto &[piece, score] : pieces) add(piece, score, TOKEN_NORMAL);
    spec.unk = 0, spec.bos = 1, spec.eos = 2;
    return spec;
}

// After the bytes: "▁" (259), "▁hi" (260) and "hi" (261), from which BPE builds "▁hi".
const std::vector<std::pair<std::string, float>> kHiPieces = {{"\xE2\x96\x81", -1}, {"\xE2\x96\x81hi", -2}, {"hi", -3}};

Status try_vocab(const VocabSpec &spec) {
    std::unique_ptr<Tokenizer> tok;
    return Tokenizer::from_vocab(spec, &tok);
}

// The tokenizer.ggml.* keys of a GGUF holding spec.
GgufWriter vocab_writer(const VocabSpec &spec) {
    GgufWriter w;
    w.add_string("general.architecture", "llama");
    w.add_string("tokenizer.ggml.model", "llama");
    w.add_string_array("tokenizer.ggml.tokens", spec.pieces);
    w.add_f32_array("tokenizer.ggml.scores", spec.scores);
    w.add_i32_array("tokenizer.ggml.token_type", spec.types);
    w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(spec.bos));
    w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(spec.eos));
    w.add_u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(spec.unk));
    return w;
}

Status try_gguf(const GgufWriter &w, std::unique_ptr<Tokenizer> *tok) {
    REQUIRE_MESSAGE(w.status().ok(), w.status().message);
    const std::vector<uint8_t> bytes = w.serialize();
    std::unique_ptr<GgufFile> file;
    const Status st = GgufFile::parse(bytes.data(), bytes.size(), &file);
    REQUIRE_MESSAGE(st.ok(), st.message);
    return Tokenizer::from_gguf(*file, tok);
}

}  // namespace

// Checks every llama.cpp vector of a vocabulary: the ids, and the text back through decode and
// through streaming.
void check_llama_cpp_vectors(const Tokenizer &tok, const std::string &inp_path, const std::string &out_path) {
    const h2o_test::TokenizerVectors vectors = h2o_test::read_tokenizer_vectors(inp_path, out_path);
    CHECK(vectors.complete);
    REQUIRE(vectors.inputs.size() == 46);
    REQUIRE(vectors.ids.size() == vectors.inputs.size());
    for (size_t i = 0; i < vectors.inputs.size(); ++i) {
        const std::string &input = vectors.inputs[i];
        CAPTURE(i);
        CAPTURE(input);
        const std::vector<int32_t> ids = encode(tok, input);
        CHECK_MESSAGE(ids == vectors.ids[i], "got" << ids_to_string(ids) << "\nexpected" << ids_to_string(vectors.ids[i]));
        CHECK(decode(tok, ids) == input);
        CHECK(render_stream(tok, ids) == input);
    }
}

TEST_CASE("tokenizer: llama.cpp test vectors for the Llama sentencepiece vocabulary") {
    H2O_SHARED_FILE_OR_SKIP(vocab_path, "vocab/ggml-vocab-llama-spm.gguf");
    H2O_SHARED_FILE_OR_SKIP(inp_path, "vocab/ggml-vocab-llama-spm.gguf.inp");
    H2O_SHARED_FILE_OR_SKIP(out_path, "vocab/ggml-vocab-llama-spm.gguf.out");
    const auto tok = load_gguf_tokenizer(vocab_path);
    CHECK(tok->n_vocab() == 32000);
    CHECK(tok->bos() == 1);
    CHECK(tok->eos() == 2);
    CHECK(tok->unk() == 0);
    CHECK(tok->add_bos());
    CHECK_FALSE(tok->add_eos());
    check_llama_cpp_vectors(*tok, inp_path, out_path);

    // Control-token text in the input is plain text, not a control token.
    const std::vector<int32_t> ids = encode(*tok, "<s> and </s>");
    for (int32_t id : ids) CHECK(!tok->is_control(id));
}

TEST_CASE("tokenizer: llama.cpp test vectors for Phi-3's sentencepiece vocabulary") {
    H2O_SHARED_FILE_OR_SKIP(vocab_path, "vocab/ggml-vocab-phi-3.gguf");
    H2O_SHARED_FILE_OR_SKIP(inp_path, "vocab/ggml-vocab-phi-3.gguf.inp");
    H2O_SHARED_FILE_OR_SKIP(out_path, "vocab/ggml-vocab-phi-3.gguf.out");
    // Phi-3's <unk> is a control token and its 53 padding tokens have the unknown type; </s> is
    // user-defined in the file, and an end of generation (a control token) as llama.cpp reads it.
    const auto tok = load_gguf_tokenizer(vocab_path);
    CHECK(tok->n_vocab() == 32064);
    CHECK(tok->unk() == 0);
    CHECK(tok->type(0) == TOKEN_CONTROL);
    CHECK(tok->type(32011) == TOKEN_UNKNOWN);
    CHECK(tok->type(2) == TOKEN_CONTROL);
    check_llama_cpp_vectors(*tok, inp_path, out_path);

    CHECK(tok->eos() == 32000);                                                 // <|endoftext|>
    for (int32_t id : {2, 32000, 32007}) CHECK(tok->is_end_of_generation(id));  // </s>, <|endoftext|>, <|end|>
    for (int32_t id : {0, 1, 32001, 32006}) CHECK_FALSE(tok->is_end_of_generation(id));
    std::vector<int32_t> ids;
    REQUIRE(tok->encode_special("<|user|>\nHi<|end|>\n<|assistant|>", true, &ids).ok());
    CHECK(ids.front() == 1);
    CHECK(std::count(ids.begin(), ids.end(), 32007) == 1);
}

TEST_CASE("tokenizer: tok512.model tokenizes exactly like the vocabulary inside stories260K.gguf") {
    H2O_SHARED_FILE_OR_SKIP(model_path, "models/tok512.model");
    H2O_SHARED_FILE_OR_SKIP(gguf_path, "models/stories260K.gguf");
    H2O_SHARED_FILE_OR_SKIP(text_path, "data/tinystories_val.txt");
    const auto from_model = load_model_file(model_path);
    const auto from_gguf = load_gguf_tokenizer(gguf_path);

    REQUIRE(from_model->n_vocab() == 512);
    REQUIRE(from_gguf->n_vocab() == 512);
    CHECK(from_model->bos() == from_gguf->bos());
    CHECK(from_model->eos() == from_gguf->eos());
    CHECK(from_model->unk() == from_gguf->unk());
    for (int32_t id = 0; id < 512; ++id) {
        CHECK(from_model->piece(id) == from_gguf->piece(id));
        CHECK(from_model->type(id) == from_gguf->type(id));
    }

    const std::string text = read_file(text_path);
    // The whole file at once (it has runs of spaces, which sentencepiece's own settings in this
    // .model would collapse; llama.cpp, and therefore both loaders here, keep them).
    const std::vector<int32_t> whole = encode(*from_gguf, text);
    CHECK(encode(*from_model, text) == whole);
    CHECK(decode(*from_gguf, whole) == text);

    // Line by line, including the empty lines between stories.
    std::istringstream lines(text);
    size_t n_lines = 0;
    for (std::string line; std::getline(lines, line); ++n_lines) {
        CAPTURE(line);
        const std::vector<int32_t> ids = encode(*from_gguf, line);
        CHECK(encode(*from_model, line) == ids);
        CHECK(decode(*from_gguf, ids) == line);
        CHECK(render_stream(*from_gguf, ids) == line);
    }
    CHECK(n_lines > 300);

    for (const std::string &s : tricky_strings()) {
        CAPTURE(s);
        const std::vector<int32_t> ids = encode(*from_gguf, s);
        CHECK(encode(*from_model, s) == ids);
        CHECK(decode(*from_gguf, ids) == s);
        CHECK(decode(*from_model, ids) == s);
        CHECK(render_stream(*from_gguf, ids) == s);
        CHECK(s.empty() == ids.empty());
    }

    // A character outside this 512-token vocabulary falls back to its UTF-8 bytes.
    const std::vector<int32_t> emoji = encode(*from_gguf, "\xF0\x9F\x98\x80");  // U+1F600
    REQUIRE(emoji.size() == 5);
    CHECK(from_gguf->piece(emoji[0]) == "\xE2\x96\x81");  // the dummy prefix
    const char *bytes[] = {"<0xF0>", "<0x9F>", "<0x98>", "<0x80>"};
    for (int i = 0; i < 4; ++i) {
        CHECK(from_gguf->type(emoji[static_cast<size_t>(i) + 1]) == TOKEN_BYTE);
        CHECK(from_gguf->piece(emoji[static_cast<size_t>(i) + 1]) == bytes[i]);
    }
}

TEST_CASE("tokenizer: BOS and the leading space on the stories model") {
    H2O_SHARED_FILE_OR_SKIP(gguf_path, "models/stories260K.gguf");
    const auto tok = load_gguf_tokenizer(gguf_path);
    const std::vector<int32_t> with_bos = encode(*tok, "Once upon a time", true);
    const std::vector<int32_t> without = encode(*tok, "Once upon a time");
    REQUIRE(with_bos.size() == without.size() + 1);
    CHECK(with_bos[0] == 1);
    CHECK(std::vector<int32_t>(with_bos.begin() + 1, with_bos.end()) == without);
    CHECK(tok->piece(without[0]) == "\xE2\x96\x81Once");  // the text gets a leading space
    CHECK(decode(*tok, with_bos) == "Once upon a time");
    CHECK(render_stream(*tok, with_bos) == "Once upon a time");

    CHECK(encode(*tok, "").empty());
    CHECK(ids_to_string(encode(*tok, "", true)) == ids_to_string({1}));
    CHECK(decode(*tok, {}).empty());
}

TEST_CASE("tokenizer: append_piece renders bytes, spaces, control and unknown tokens") {
    std::unique_ptr<Tokenizer> tok;
    const Status st = Tokenizer::from_vocab(small_vocab(true, kHiPieces), &tok);
    REQUIRE_MESSAGE(st.ok(), st.message);
    const int32_t space = 3 + 256, space_hi = space + 1, hi = space + 2;
    auto piece = [&](int32_t id, bool after_bos) {
        std::string out = "[";
        tok->append_piece(id, after_bos, &out);
        return out + "]";
    };
    CHECK(piece(space_hi, false) == "[ hi]");
    CHECK(piece(space_hi, true) == "[hi]");  // the dummy-prefix space after BOS
    CHECK(piece(space, false) == "[ ]");
    CHECK(piece(space, true) == "[]");
    CHECK(piece(hi, true) == "[hi]");
    CHECK(piece(1, false) == "[]");  // control tokens render as nothing
    CHECK(piece(2, true) == "[]");
    CHECK(piece(0, false) == "[ \xE2\x81\x87 ]");  // unknown, as sentencepiece prints it
    CHECK(piece(0, true) == "[ \xE2\x81\x87 ]");   // sentencepiece keeps its spaces even first
    CHECK(piece(3 + 'A', false) == "[A]");
    CHECK(piece(3 + ' ', true) == "[ ]");       // a byte token is a real character, never the prefix
    CHECK(piece(3 + 0xE2, false) == "[\xE2]");  // a raw byte, part of a multi-byte character
    CHECK(piece(-1, false) == "[]");
    CHECK(piece(tok->n_vocab(), false) == "[]");
    CHECK(tok->is_control(1));
    CHECK(!tok->is_control(0));
    CHECK(!tok->is_control(-1));
    CHECK(!tok->is_control(tok->n_vocab()));

    // A character split over byte tokens comes back whole once all its bytes are appended.
    std::vector<int32_t> ids = encode(*tok, "\xC3\xBC");  // ü, not in this vocabulary
    CHECK(ids_to_string(ids) == ids_to_string({space, 3 + 0xC3, 3 + 0xBC}));
    CHECK(render_stream(*tok, ids) == "\xC3\xBC");
    CHECK(decode(*tok, ids) == "\xC3\xBC");
}

TEST_CASE("tokenizer: decode follows sentencepiece") {
    std::unique_ptr<Tokenizer> tok;
    REQUIRE(Tokenizer::from_vocab(small_vocab(true, kHiPieces), &tok).ok());
    const int32_t space = 3 + 256, space_hi = space + 1;
    // Only the first piece loses its dummy-prefix space; control tokens do not count as first.
    CHECK(decode(*tok, {1, space, space_hi}) == " hi");
    CHECK(decode(*tok, {space_hi, space_hi}) == "hi hi");
    CHECK(decode(*tok, {3 + 'A', space_hi}) == "A hi");
    CHECK(decode(*tok, {0, space_hi}) == " \xE2\x81\x87  hi");
    CHECK(decode(*tok, {1, 2}).empty());
    // Byte tokens that do not form valid UTF-8 become U+FFFD, one per byte.
    CHECK(decode(*tok, {3 + 0xF0, 3 + 0x9F}) == "\xEF\xBF\xBD\xEF\xBF\xBD");

    std::string text = "unchanged";
    const int32_t bad[] = {1, tok->n_vocab()};
    Status st = tok->decode(bad, 2, &text);
    CHECK(st.code == H2O_ERR_INVALID_ARGUMENT);
    CHECK(st.message.find("position 1") != std::string::npos);
    CHECK(text == "unchanged");
    const int32_t negative[] = {-5};
    CHECK(tok->decode(negative, 1, &text).code == H2O_ERR_INVALID_ARGUMENT);
}

TEST_CASE("tokenizer: vocabulary settings (no byte fallback, no space prefix, user-defined pieces)") {
    // Without byte tokens, characters outside the vocabulary become the unknown token.
    VocabSpec spec = small_vocab(false, {{"\xE2\x96\x81", -1},
                                         {"a", -2},
                                         {"\xE2\x96\x81"
                                          "a",
                                          -3}});
    std::unique_ptr<Tokenizer> tok;
    Status st = Tokenizer::from_vocab(spec, &tok);
    REQUIRE_MESSAGE(st.ok(), st.message);
    CHECK(ids_to_string(encode(*tok, "a")) == ids_to_string({5}));
    CHECK(ids_to_string(encode(*tok,
                               "a\xC3\xBC"
                               "a")) == ids_to_string({5, 0, 4}));

    spec.add_space_prefix = false;
    REQUIRE(Tokenizer::from_vocab(spec, &tok).ok());
    CHECK(ids_to_string(encode(*tok, "a")) == ids_to_string({4}));
    CHECK(ids_to_string(encode(*tok, " a")) == ids_to_string({5}));
    CHECK(decode(*tok, {4, 5}) == "a a");
    // Without a dummy prefix there is nothing to strip: a leading space is the text's own.
    CHECK(decode(*tok, {5, 4}) == " aa");
    CHECK(render_stream(*tok, {1, 5, 4}) == " aa");

    // A user-defined piece is always one token, even where no merge could build it, and the text
    // after it begins anew with its own dummy prefix, as llama.cpp tokenizes it.
    spec = small_vocab(true, {{"\xE2\x96\x81", -1}, {"<tool>", 0}});
    spec.types.back() = TOKEN_USER_DEFINED;
    REQUIRE(Tokenizer::from_vocab(spec, &tok).ok());
    const int32_t tool = tok->n_vocab() - 1;
    CHECK(tok->type(tool) == TOKEN_USER_DEFINED);
    const std::vector<int32_t> ids = encode(*tok, "x<tool>y");
    CHECK(ids_to_string(ids) == ids_to_string({tool - 1, 3 + 'x', tool, tool - 1, 3 + 'y'}));
    CHECK(decode(*tok, ids) == "x<tool> y");

    // encode replaces the output; BOS needs a BOS token.
    std::vector<int32_t> out = {42, 43};
    REQUIRE(tok->encode("y", false, &out).ok());
    CHECK(ids_to_string(out) == ids_to_string({tool - 1, 3 + 'y'}));
    spec.bos = -1;
    REQUIRE(Tokenizer::from_vocab(spec, &tok).ok());
    CHECK(tok->bos() == -1);
    CHECK(tok->encode("y", true, &out).code == H2O_ERR_INVALID_ARGUMENT);
}

TEST_CASE("tokenizer: special tokens strip whitespace by their attributes and by llama.cpp's Phi-3 rule") {
    // 259 "▁", 260 "▁hi", 261 "hi", then the control token <|u|> (262) and the user-defined <t> (263).
    VocabSpec spec = small_vocab(true, kHiPieces);
    spec.add_space_prefix = false;
    for (const char *piece : {"<|u|>", "<t>"}) {
        spec.pieces.push_back(piece);
        spec.scores.push_back(0);
        spec.types.push_back(std::string(piece) == "<t>" ? TOKEN_USER_DEFINED : TOKEN_CONTROL);
    }
    const int32_t u = 262, t = 263;
    auto ids_of = [](const VocabSpec &vocab, std::string_view text, bool special) {
        std::unique_ptr<Tokenizer> tok;
        const Status st = Tokenizer::from_vocab(vocab, &tok);
        REQUIRE_MESSAGE(st.ok(), st.message);
        std::vector<int32_t> ids;
        REQUIRE((special ? tok->encode_special(text, false, &ids) : tok->encode(text, false, &ids)).ok());
        return ids_to_string(ids);
    };
    const int32_t space = 259, newline = 3 + '\n', tab = 3 + '\t';
    // No attributes: the whitespace beside a token is text.
    CHECK(ids_of(spec, "<|u|>\n hi <t>\t", true) == ids_to_string({u, newline, 260, space, t, tab}));
    // rstrip on the control token, lstrip on the user-defined one (found in plain text too); only
    // ASCII whitespace goes, and only next to the token.
    spec.strip.assign(spec.pieces.size(), 0);
    spec.strip[u] = kStripRight;
    spec.strip[t] = kStripLeft;
    CHECK(ids_of(spec, "<|u|>\n hi <t>\t", true) == ids_to_string({u, 261, t, tab}));
    CHECK(ids_of(spec, "hi \r\n<t>", false) == ids_to_string({261, t}));
    CHECK(ids_of(spec, "<|u|>\xC2\xA0hi", true) == ids_to_string({u, 3 + 0xC2, 3 + 0xA0, 261}));  // NBSP stays
    CHECK(ids_of(spec, "<|u|>   ", true) == ids_to_string({u}));
    CHECK(ids_of(spec, "<|u|><|u|>  <|u|>", true) == ids_to_string({u, u, u}));
    // A strip attribute per token or none at all.
    spec.strip.pop_back();
    CHECK(try_vocab(spec).code == H2O_ERR_MODEL_FORMAT);
    CHECK(try_vocab(spec).message.find("strip attributes") != std::string::npos);

    // A model named Phi-3 (general.name, any case): every control, user-defined and unknown token
    // strips on its right, but <unk>, <s> and <|endoftext|>; </s> does (here a control token).
    spec.strip.clear();
    spec.model_name = "Microsoft PHI3 mini";
    CHECK(ids_of(spec, "<|u|>\n hi <t>\t", true) == ids_to_string({u, 261, space, t}));
    CHECK(ids_of(spec, "<s> hi</s> hi", true) == ids_to_string({1, 260, 2, 261}));
    spec.model_name = "Phi 3.5 mini";  // llama.cpp's rule does not match this spelling
    CHECK(ids_of(spec, "<|u|>\n hi", true) == ids_to_string({u, newline, 260}));

    // Read from a GGUF file as llama.cpp reads it: by general.name.
    const std::string phi3 = h2o_test::shared_file("vocab/ggml-vocab-phi-3.gguf");
    if (phi3.empty()) return;
    const std::unique_ptr<Tokenizer> tok = load_gguf_tokenizer(phi3);
    std::vector<int32_t> ids;
    REQUIRE(tok->encode_special("<|user|>\nHi<|end|>\n<|assistant|>\n", false, &ids).ok());
    CHECK(ids_to_string(ids) == ids_to_string({32010, 6324, 32007, 32001}));
}

TEST_CASE("tokenizer: invalid UTF-8 is rejected with its byte offset") {
    std::unique_ptr<Tokenizer> tok;
    REQUIRE(Tokenizer::from_vocab(small_vocab(true, {{"\xE2\x96\x81", -1}}), &tok).ok());
    struct Case {
        std::string text;
        size_t offset;
    };
    const Case cases[] = {
        {"ab\xFF", 2},                // never valid
        {"\x80", 0},                  // continuation without a lead byte
        {"ok \xC3", 3},               // truncated 2-byte sequence
        {"\xE2\x96", 0},              // truncated 3-byte sequence
        {"\xE2\x96x", 0},             // bad continuation
        {"a\xC0\xAF", 1},             // overlong '/'
        {"\xE0\x80\xAF", 0},          // overlong, 3 bytes
        {"\xF0\x80\x80\xAF", 0},      // overlong, 4 bytes
        {"ab\xED\xA0\x80", 2},        // UTF-16 surrogate
        {"\xF4\x90\x80\x80", 0},      // above U+10FFFF
        {"\xF8\x88\x80\x80\x80", 0},  // 5-byte form
        {"fine \xF0\x9F\x98\x80 \xC3(", 10},
    };
    for (const Case &c : cases) {
        CAPTURE(c.text);
        size_t bad = 0;
        CHECK_FALSE(is_valid_utf8(c.text, &bad));
        CHECK(bad == c.offset);
        std::vector<int32_t> out = {7};
        const Status st = tok->encode(c.text, true, &out);
        CHECK(st.code == H2O_ERR_INVALID_TEXT);
        CHECK(st.message.find("offset " + std::to_string(c.offset)) != std::string::npos);
        CHECK(ids_to_string(out) == ids_to_string({7}));  // untouched on failure
    }
    for (const std::string &ok : {std::string(), std::string("\xC2\x80\xDF\xBF\xE0\xA0\x80\xEF\xBF\xBF"),
                                  std::string("\xF0\x90\x80\x80\xF4\x8F\xBF\xBF"), std::string("\0", 1)})
        CHECK(is_valid_utf8(ok));
}

TEST_CASE("tokenizer: malformed vocabularies give clear errors") {
    const VocabSpec good = small_vocab(true, {{"\xE2\x96\x81", -1}});
    REQUIRE(try_vocab(good).ok());
    struct Case {
        const char *what;
        void (*mutate)(VocabSpec &);
        h2o_status code;
        const char *message;
    };
    const Case cases[] = {
        {"no tokens", [](VocabSpec &s) { s = VocabSpec(); }, H2O_ERR_MODEL_FORMAT, "no tokens"},
        {"scores too short", [](VocabSpec &s) { s.scores.pop_back(); }, H2O_ERR_MODEL_FORMAT, "scores"},
        {"types too long", [](VocabSpec &s) { s.types.push_back(1); }, H2O_ERR_MODEL_FORMAT, "token types"},
        {"bos out of range", [](VocabSpec &s) { s.bos = static_cast<int32_t>(s.pieces.size()); }, H2O_ERR_MODEL_FORMAT, "BOS token id 260"},
        {"eos negative", [](VocabSpec &s) { s.eos = -2; }, H2O_ERR_MODEL_FORMAT, "EOS token id -2"},
        {"no unk id", [](VocabSpec &s) { s.unk = -1; }, H2O_ERR_MODEL_FORMAT, "unknown token id -1"},
        {"type 0", [](VocabSpec &s) { s.types[5] = 0; }, H2O_ERR_MODEL_FORMAT, "token 5 has type 0"},
        {"type 7", [](VocabSpec &s) { s.types[5] = 7; }, H2O_ERR_MODEL_FORMAT, "token 5 has type 7"},
        {"unk is a normal token", [](VocabSpec &s) { s.unk = 259; }, H2O_ERR_MODEL_FORMAT,
         "unknown token id 259 has type 1 (an unknown or control token is required)"},
        {"unk is a byte token", [](VocabSpec &s) { s.unk = 3; }, H2O_ERR_MODEL_FORMAT, "unknown token id 3 has type 6"},
        {"eot out of range", [](VocabSpec &s) { s.eot = 260; }, H2O_ERR_MODEL_FORMAT, "end-of-turn token id 260"},
        {"add_bos without BOS", [](VocabSpec &s) { s.bos = -1, s.add_bos = true; }, H2O_ERR_MODEL_FORMAT, "add_bos_token is true"},
        {"add_eos without EOS", [](VocabSpec &s) { s.eos = -1, s.add_eos = true; }, H2O_ERR_MODEL_FORMAT, "add_eos_token is true"},
        {"merges for sentencepiece", [](VocabSpec &s) { s.merges = {"a b"}; }, H2O_ERR_MODEL_FORMAT, "merges"},
        {"bad byte piece", [](VocabSpec &s) { s.pieces[3] = "<0xZZ>"; }, H2O_ERR_MODEL_FORMAT, "<0xNN>"},
        {"missing byte token", [](VocabSpec &s) { s.types[10] = TOKEN_NORMAL; }, H2O_ERR_TOKENIZER, "256 byte pieces"},
        {"duplicate piece",
         [](VocabSpec &s) {
             s.pieces.push_back("\xE2\x96\x81");
             s.scores.push_back(0);
             s.types.push_back(1);
         },
         H2O_ERR_TOKENIZER, "already defined"},
        {"empty piece", [](VocabSpec &s) { s.pieces.back().clear(); }, H2O_ERR_TOKENIZER, "empty"},
    };
    for (const Case &c : cases) {
        CAPTURE(c.what);
        VocabSpec spec = good;
        c.mutate(spec);
        const Status st = try_vocab(spec);
        CHECK(st.code == c.code);
        CHECK_MESSAGE(st.message.find(c.message) != std::string::npos, st.message);
    }
}

TEST_CASE("tokenizer: vocabularies read from GGUF metadata") {
    const VocabSpec spec = small_vocab(true, kHiPieces);
    std::unique_ptr<Tokenizer> tok;
    Status st = try_gguf(vocab_writer(spec), &tok);
    REQUIRE_MESSAGE(st.ok(), st.message);
    CHECK(tok->n_vocab() == static_cast<int32_t>(spec.pieces.size()));
    CHECK(ids_to_string(encode(*tok, "hi", true)) == ids_to_string({1, 260}));

    {  // Another tokenizer family.
        GgufWriter other;
        other.add_string("tokenizer.ggml.model", "bert");
        other.add_string_array("tokenizer.ggml.tokens", spec.pieces);
        st = try_gguf(other, &tok);
        CHECK(st.code == H2O_ERR_UNSUPPORTED);
        CHECK(st.message.find("'bert'") != std::string::npos);
    }
    {  // No tokenizer at all.
        GgufWriter w;
        w.add_string("general.architecture", "llama");
        st = try_gguf(w, &tok);
        CHECK(st.code == H2O_ERR_MODEL_FORMAT);
        CHECK(st.message.find("tokenizer.ggml.model") != std::string::npos);
    }
    {  // Arrays of different lengths.
        VocabSpec bad = spec;
        bad.scores.pop_back();
        st = try_gguf(vocab_writer(bad), &tok);
        CHECK(st.code == H2O_ERR_MODEL_FORMAT);
        CHECK(st.message.find("scores") != std::string::npos);
    }
    {  // BOS outside the vocabulary.
        VocabSpec bad = spec;
        bad.bos = 5000;
        st = try_gguf(vocab_writer(bad), &tok);
        CHECK(st.code == H2O_ERR_MODEL_FORMAT);
        CHECK(st.message.find("5000") != std::string::npos);
    }
    {  // A token type outside 1..6.
        VocabSpec bad = spec;
        bad.types[7] = 9;
        st = try_gguf(vocab_writer(bad), &tok);
        CHECK(st.code == H2O_ERR_MODEL_FORMAT);
        CHECK(st.message.find("type 9") != std::string::npos);
    }
    {  // "No such token" is stored as UINT32_MAX; add_space_prefix is honoured.
        GgufWriter w;
        w.add_string("tokenizer.ggml.model", "llama");
        w.add_string_array("tokenizer.ggml.tokens", spec.pieces);
        w.add_f32_array("tokenizer.ggml.scores", spec.scores);
        w.add_i32_array("tokenizer.ggml.token_type", spec.types);
        w.add_u32("tokenizer.ggml.bos_token_id", UINT32_MAX);
        w.add_bool("tokenizer.ggml.add_space_prefix", false);
        st = try_gguf(w, &tok);
        REQUIRE_MESSAGE(st.ok(), st.message);
        CHECK(tok->bos() == -1);
        CHECK(tok->eos() == 2);  // llama.cpp's default
        CHECK(ids_to_string(encode(*tok, " hi")) == ids_to_string({260}));
        CHECK(ids_to_string(encode(*tok, "hi")) == ids_to_string({261}));
    }
}

TEST_CASE("tokenizer: .model files that cannot be used") {
    std::unique_ptr<Tokenizer> tok;
    Status st = Tokenizer::from_model_file(h2o_test::temp_path("does-not-exist.model"), &tok);
    CHECK(st.code == H2O_ERR_IO);
    CHECK(st.message.find("does-not-exist.model") != std::string::npos);

    const std::string garbage = h2o_test::temp_path("garbage.model");
    write_file(garbage, "\x0A\xFF\xFF\xFF\xFF\x0F");  // a piece claiming a 4 GB length
    st = Tokenizer::from_model_file(garbage, &tok);
    CHECK(st.code == H2O_ERR_TOKENIZER);
    CHECK(st.message.find("malformed") != std::string::npos);

    H2O_SHARED_FILE_OR_SKIP(model_path, "models/tok512.model");
    const std::string good = read_file(model_path);
    // The TrainerSpec (which says BPE) follows the pieces, so a cut anywhere leaves either a
    // malformed field or a model without its type.
    const std::string truncated = h2o_test::temp_path("truncated.model");
    for (size_t len : {size_t{1}, size_t{7}, good.size() / 2, good.size() - 3}) {
        CAPTURE(len);
        write_file(truncated, std::string_view(good).substr(0, len));
        st = Tokenizer::from_model_file(truncated, &tok);
        CHECK(!st.ok());
    }
    // A protobuf parser merges a repeated message: this appended TrainerSpec sets model_type to
    // UNIGRAM, which the Llama tokenizer is not.
    const std::string unigram = h2o_test::temp_path("unigram.model");
    write_file(unigram, good + std::string("\x12\x02\x18\x01", 4));
    st = Tokenizer::from_model_file(unigram, &tok);
    CHECK(st.code == H2O_ERR_UNSUPPORTED);
    CHECK(st.message.find("model type 1") != std::string::npos);
}

TEST_CASE("tokenizer: one tokenizer shared by many threads") {
    H2O_SHARED_FILE_OR_SKIP(gguf_path, "models/stories260K.gguf");
    H2O_SHARED_FILE_OR_SKIP(text_path, "data/tinystories_val.txt");
    const auto tok = load_gguf_tokenizer(gguf_path);
    std::vector<std::string> lines;
    std::istringstream in(read_file(text_path));
    for (std::string line; std::getline(in, line) && lines.size() < 400;) lines.push_back(line);
    std::vector<std::vector<int32_t>> expected;
    for (const std::string &line : lines) expected.push_back(encode(*tok, line));

    // doctest assertions stay on this thread: workers only count mismatches.
    constexpr int kThreads = 8;
    std::vector<int> failures(kThreads, 0);
    std::vector<std::thread> workers;
    for (int t = 0; t < kThreads; ++t) {
        workers.emplace_back([&, t] {
            for (int round = 0; round < 3; ++round) {
                for (size_t i = static_cast<size_t>(t) % 5; i < lines.size(); ++i) {
                    std::vector<int32_t> ids;
                    std::string text;
                    if (!tok->encode(lines[i], false, &ids).ok() || ids != expected[i] ||
                        !tok->decode(ids.data(), ids.size(), &text).ok() || text != lines[i])
                        ++failures[static_cast<size_t>(t)];
                }
            }
        });
    }
    for (std::thread &w : workers) w.join();
    for (int t = 0; t < kThreads; ++t) CHECK(failures[static_cast<size_t>(t)] == 0);
}
