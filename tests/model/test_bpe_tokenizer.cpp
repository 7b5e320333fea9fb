// Byte-level BPE (tokenizer.ggml.model = "gpt2"): llama.cpp's test vectors for Llama 3
// (llama-bpe), Qwen 2 and GPT-2, vocabularies built from Hugging Face tokenizer files the way a
// GGUF conversion carries them, round trips, special tokens, the end-of-generation set, invalid
// text, hostile merges and pre-tokenizer metadata, the tokenizer.json reader, and threads.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bpe.h"
#include "chat_format.h"
#include "gguf.h"
#include "hf_tokenizer.h"
#include "pretokenizer.h"
#include "test_util.h"
#include "tokenizer.h"
#include "tokenizer_vectors.h"

using namespace h2o;
using h2o_test::ids_to_string;

namespace {

// The tokenizer a GGUF file with these metadata gives: written, parsed and read back as a model
// file would be.
Status tokenizer_from_writer(const GgufWriter &w, std::unique_ptr<Tokenizer> *tok) {
    REQUIRE_MESSAGE(w.status().ok(), w.status().message);
    const std::vector<uint8_t> bytes = w.serialize();
    std::unique_ptr<GgufFile> file;
    const Status st = GgufFile::parse(bytes.data(), bytes.size(), &file);
    REQUIRE_MESSAGE(st.ok(), st.message);
    return Tokenizer::from_gguf(*file, tok);
}

// With H2O_WRITE_VOCAB_DIR set, the vocabularies these tests build are also written there as
// vocabulary-only GGUF files, with the few hyper-parameters llama.cpp needs to open one (of a Llama
// 2 7B; they play no part in tokenizing): tests/data/tokenizer_parity/ was made from them.
void write_vocab_only_gguf(GgufWriter w, const HfVocabulary &vocab, const std::string &dir, const std::string &name) {
    w.add_string("general.architecture", "llama");
    w.add_string("general.name", name + "-vocab");
    w.add_u32("llama.vocab_size", static_cast<uint32_t>(vocab.tokens.size()));
    w.add_u32("llama.context_length", 4096);
    w.add_u32("llama.embedding_length", 4096);
    w.add_u32("llama.block_count", 32);
    w.add_u32("llama.feed_forward_length", 11008);
    w.add_u32("llama.attention.head_count", 32);
    w.add_u32("llama.attention.head_count_kv", 32);
    w.add_u32("llama.rope.dimension_count", 128);
    w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    const std::string path = dir + "/" + name + ".gguf";
    const Status st = w.write(path);
    REQUIRE_MESSAGE(st.ok(), st.message);
    std::printf("wrote %s\n", path.c_str());
}

// A real tokenizer from ../shared/vocab/NAME/ (tokenizer.json and tokenizer_config.json), read
// once per process (the files are large); null, after a skip notice, when it is absent.
const HfVocabulary *hf_vocabulary(const std::string &name) {
    static std::map<std::string, std::unique_ptr<HfVocabulary>> cache;
    if (const auto it = cache.find(name); it != cache.end()) return it->second.get();
    if (h2o_test::shared_file("vocab/" + name + "/tokenizer.json").empty()) return nullptr;
    auto vocab = std::make_unique<HfVocabulary>();
    const Status st = read_hf_tokenizer(h2o_test::shared_dir() + "/vocab/" + name, 0, vocab.get());
    REQUIRE_MESSAGE(st.ok(), st.message);
    return (cache[name] = std::move(vocab)).get();
}

// That vocabulary's tokenizer, through a GGUF as the converter writes it.
const Tokenizer *hf_tokenizer(const std::string &name) {
    static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
    if (const auto it = cache.find(name); it != cache.end()) return it->second.get();
    const HfVocabulary *vocab = hf_vocabulary(name);
    if (!vocab) return nullptr;
    GgufWriter w;
    add_hf_vocabulary(*vocab, &w);
    if (const char *dir = std::getenv("H2O_WRITE_VOCAB_DIR"); dir && *dir) write_vocab_only_gguf(w, *vocab, dir, name);
    std::unique_ptr<Tokenizer> tok;
    const Status loaded = tokenizer_from_writer(w, &tok);
    REQUIRE_MESSAGE(loaded.ok(), loaded.message);
    return (cache[name] = std::move(tok)).get();
}

#define H2O_HF_TOKENIZER_OR_SKIP(var, name)    \
    const Tokenizer *var = hf_tokenizer(name); \
    if (!var) return

std::unique_ptr<Tokenizer> gguf_tokenizer(const std::string &path) {
    std::unique_ptr<GgufFile> file;
    Status st = GgufFile::open(path, &file);
    REQUIRE_MESSAGE(st.ok(), st.message);
    std::unique_ptr<Tokenizer> tok;
    st = Tokenizer::from_gguf(*file, &tok);
    REQUIRE_MESSAGE(st.ok(), st.message);
    return tok;
}

std::vector<int32_t> encode(const Tokenizer &tok, std::string_view text, bool special = false) {
    std::vector<int32_t> ids;
    const Status st = special ? tok.encode_special(text, false, &ids) : tok.encode(text, false, &ids);
    REQUIRE_MESSAGE(st.ok(), st.message);
    return ids;
}

std::string decode(const Tokenizer &tok, const std::vector<int32_t> &ids) {
    std::string text;
    const Status st = tok.decode(ids.data(), ids.size(), &text);
    REQUIRE_MESSAGE(st.ok(), st.message);
    return text;
}

std::string render_stream(const Tokenizer &tok, const std::vector<int32_t> &ids) {
    std::string text;
    for (int32_t id : ids) tok.append_piece(id, false, &text);
    return text;
}

void check_vectors(const Tokenizer &tok, const std::string &vectors_name) {
    H2O_SHARED_FILE_OR_SKIP(inp_path, "vocab/ggml-vocab-" + vectors_name + ".gguf.inp");
    H2O_SHARED_FILE_OR_SKIP(out_path, "vocab/ggml-vocab-" + vectors_name + ".gguf.out");
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

// Text that exercises the pre-tokenizers and the byte alphabet.
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
        "\xC3\xBC \xC3\xA9 \xC3\xB1 \xC3\x9F",
        "F\xC3\xBChrer",
        "\xE4\xB8\xAD\xE6\x96\x87\xE5\xAD\x97\xE7\xAC\xA6",
        "\xF0\x9F\x98\x80 emoji \xF0\x9F\xA6\x99\xF0\x9F\xA6\x99",
        "\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 family",
        "e\xCC\x81 combining",
        "ied 4 \xC2\xBD months",
        "3.14159 33 333 4444 55555 1234567890",
        std::string("nul\0byte", 8),
        "\xF0\x9F\x98\x81",
        "tab\tin\tthe middle",
        "\r\n windows \r\n",
        "ends with newline\n",
        "a\xE2\x80\x8A"
        "b",
        "!!!!!!??????",
        "'RE you sure? 'M not, I'LL see; they'd've",
        "\xC2\x85next line\xE2\x80\xA8line sep\xE3\x80\x80ideographic",
        "x\x01y\x7Fz",
        "<|not_a_token|> <s> </s>",
        "\xE1\xA0\x8E mongolian vowel separator",
    };
}

// A small byte-level vocabulary: the 256 byte characters (ids 0..255, in byte order), then the
// given normal tokens, then the given control tokens.
VocabSpec byte_vocab(const std::vector<std::string> &normal, const std::vector<std::string> &merges,
                     const std::vector<std::string> &control = {}) {
    VocabSpec spec;
    spec.model = TokenizerModel::kByteLevelBpe;
    spec.pre = "gpt-2";
    for (int b = 0; b < 256; ++b) spec.pieces.emplace_back(byte_level_char(static_cast<uint8_t>(b)));
    for (const std::string &t : normal) spec.pieces.push_back(t);
    spec.types.assign(spec.pieces.size(), TOKEN_NORMAL);
    for (const std::string &t : control) {
        spec.pieces.push_back(t);
        spec.types.push_back(TOKEN_CONTROL);
    }
    spec.merges = merges;
    return spec;
}

Status try_vocab(const VocabSpec &spec, std::unique_ptr<Tokenizer> *tok = nullptr) {
    std::unique_ptr<Tokenizer> local;
    return Tokenizer::from_vocab(spec, tok ? tok : &local);
}

}  // namespace

TEST_CASE("bpe tokenizer: GPT-2's byte alphabet") {
    CHECK(byte_level_char(' ') == "\xC4\xA0");   // Ġ U+0120
    CHECK(byte_level_char('\n') == "\xC4\x8A");  // Ċ U+010A
    CHECK(byte_level_char('A') == "A");
    CHECK(byte_level_char(0xAD) == "\xC5\x83");  // the soft hyphen, the last one moved: U+0143
    CHECK(byte_level_char(0xE9) == "\xC3\xA9");  // é stands for itself
    std::string all_bytes, all_chars;
    for (int b = 0; b < 256; ++b) {
        all_bytes.push_back(static_cast<char>(b));
        all_chars += byte_level_char(static_cast<uint8_t>(b));
    }
    CHECK(byte_level_decode(all_chars) == all_bytes);
    CHECK(byte_level_decode("\xC4\xA0hello\xC4\x8A") == " hello\n");
    // Characters outside the alphabet (and stray bytes) are kept as they are.
    CHECK(byte_level_decode("\xE2\x82\xAC\xC5\x84") == "\xE2\x82\xAC\xC5\x84");
    CHECK(byte_level_decode("\xFF") == "\xFF");
}

TEST_CASE("bpe tokenizer: llama.cpp test vectors for Llama 3 (llama-bpe)") {
    H2O_HF_TOKENIZER_OR_SKIP(tok, "llama3");
    CHECK(tok->model() == TokenizerModel::kByteLevelBpe);
    CHECK(tok->n_vocab() == 128256);
    check_vectors(*tok, "llama-bpe");
}

TEST_CASE("bpe tokenizer: llama.cpp test vectors for Qwen 2 (from Qwen3's tokenizer)") {
    H2O_HF_TOKENIZER_OR_SKIP(tok, "qwen3");
    CHECK(tok->n_vocab() == 151669);
    check_vectors(*tok, "qwen2");
}

TEST_CASE("bpe tokenizer: llama.cpp test vectors for GPT-2") {
    H2O_SHARED_FILE_OR_SKIP(path, "vocab/ggml-vocab-gpt-2.gguf");
    const auto tok = gguf_tokenizer(path);
    CHECK(tok->n_vocab() == 50257);
    CHECK(tok->bos() == 50256);
    CHECK(tok->eos() == 50256);
    CHECK_FALSE(tok->add_bos());
    check_vectors(*tok, "gpt-2");
}

TEST_CASE("bpe tokenizer: text comes back byte for byte") {
    for (const char *name : {"llama3", "qwen3", "gpt4o"}) {
        CAPTURE(name);
        H2O_HF_TOKENIZER_OR_SKIP(tok, name);
        for (const std::string &s : tricky_strings()) {
            CAPTURE(s);
            const std::vector<int32_t> ids = encode(*tok, s);
            CHECK(s.empty() == ids.empty());
            CHECK(decode(*tok, ids) == s);
            CHECK(render_stream(*tok, ids) == s);
            for (int32_t id : ids) CHECK(tok->type(id) == TOKEN_NORMAL);
        }
    }
    H2O_SHARED_FILE_OR_SKIP(text_path, "data/tinystories_val.txt");
    H2O_HF_TOKENIZER_OR_SKIP(llama3, "llama3");
    const std::string text = h2o_test::read_text_file(text_path);
    const std::vector<int32_t> ids = encode(*llama3, text);
    CHECK(decode(*llama3, ids) == text);
    CHECK(ids.size() * 3 < text.size());  // words are whole tokens, not bytes
}

TEST_CASE("bpe tokenizer: the pre-tokenizers cut words as llama.cpp does") {
    auto words = [](const char *pre, std::string_view text) {
        std::unique_ptr<Pretokenizer> p;
        const Status st = Pretokenizer::create(pre, &p);
        REQUIRE_MESSAGE(st.ok(), st.message);
        std::vector<std::string_view> out;
        REQUIRE(p->split(text, &out).ok());
        std::string joined;
        for (std::string_view w : out) joined += "[" + std::string(w) + "]";
        return joined;
    };
    CHECK(words("gpt-2", "Hello world's  end\n\n 12345") == "[Hello][ world]['s][ ][ end][\n\n][ 12345]");
    CHECK(words("llama-bpe", "Hello world's  end\n\n 12345") == "[Hello][ world]['s][ ][ end][\n\n][ ][123][45]");
    CHECK(words("llama3", "I'LL go") == "[I]['LL][ go]");  // contractions ignore ASCII case
    CHECK(words("qwen2", "x 2024!\r\n") == "[x][ ][2][0][2][4][!\r\n]");
    CHECK(words("smollm", "abc123 def") == "[abc][1][2][3][ def]");
    // llama.cpp's default: punctuation runs, GPT-2's pattern, numbers, then groups of three digits.
    CHECK(words("default", "a,b 1234567") == "[a][,][b][ ][123][456][7]");
    // GPT-4o: a word may start with capitals; only ASCII letters have a case (llama.cpp's reading).
    CHECK(words("gpt-4o", "HelloWorld ABCdef x/y\n") == "[Hello][World][ ABCdef][ x][/y][\n]");
    CHECK(words("gpt-4o",
                "a\xC3\x89"
                "b") ==
          "[a\xC3\x89"
          "b]");
    // Whitespace is Unicode's White_Space: U+3000 is, U+180E (no longer) is not.
    CHECK(words("gpt-2",
                "a\xE3\x80\x80\xE3\x80\x80"
                "b") == "[a][\xE3\x80\x80][\xE3\x80\x80][b]");
    CHECK(words("gpt-2",
                "a \xE1\xA0\x8E"
                "b") == "[a][ \xE1\xA0\x8E][b]");

    // Long runs stay linear and within the regex engine's limits.
    for (const char *pre : {"llama-bpe", "qwen2", "gpt-4o", "gpt-2", "smollm", "default"}) {
        CAPTURE(pre);
        std::unique_ptr<Pretokenizer> p;
        REQUIRE(Pretokenizer::create(pre, &p).ok());
        for (const std::string &run : {std::string(1 << 20, 'a'), std::string(1 << 20, 'A'), std::string(1 << 20, ' '),
                                       std::string(1 << 20, '7'), std::string(1 << 20, '!'), std::string(1 << 19, '\n')}) {
            std::vector<std::string_view> out;
            const Status st = p->split(run, &out);
            REQUIRE_MESSAGE(st.ok(), st.message);
            size_t total = 0;
            for (std::string_view w : out) total += w.size();
            CHECK(total == run.size());
        }
    }
}

TEST_CASE("bpe tokenizer: merges by rank, leftmost first, and whole words for Llama 3") {
    // "a b" (rank 0), "b c" (rank 1), "ab c" (rank 2): "abc" becomes ab + c, then abc.
    VocabSpec spec = byte_vocab({"ab", "bc", "abc", "aa"}, {"a b", "b c", "ab c", "a a"});
    std::unique_ptr<Tokenizer> tok;
    REQUIRE(try_vocab(spec, &tok).ok());
    const int32_t ab = 256, bc = 257, abc = 258, aa = 259;
    CHECK(ids_to_string(encode(*tok, "abc")) == ids_to_string({abc}));
    CHECK(ids_to_string(encode(*tok, "bc")) == ids_to_string({bc}));
    CHECK(ids_to_string(encode(*tok, "aaa")) == ids_to_string({aa, 'a'}));  // leftmost pair first
    CHECK(ids_to_string(encode(*tok, "aaaa")) == ids_to_string({aa, aa}));
    CHECK(ids_to_string(encode(*tok, "cab")) == ids_to_string({'c', ab}));
    // Without "ab c", abc is a token no merge reaches; with ignore_merges (llama-bpe) a word that
    // is a token is that token.
    spec.merges = {"a b", "b c"};
    REQUIRE(try_vocab(spec, &tok).ok());
    CHECK(ids_to_string(encode(*tok, "abc")) == ids_to_string({ab, 'c'}));
    spec.pre = "llama-bpe";
    REQUIRE(try_vocab(spec, &tok).ok());
    CHECK(ids_to_string(encode(*tok, "abc")) == ids_to_string({abc}));
    CHECK(ids_to_string(encode(*tok, "abcabc")) == ids_to_string({ab, 'c', ab, 'c'}));

    // A duplicate pair keeps its first rank.
    spec = byte_vocab({"ab", "bc"}, {"b c", "a b", "b c"});
    REQUIRE(try_vocab(spec, &tok).ok());
    CHECK(ids_to_string(encode(*tok, "abc")) == ids_to_string({'a', 257}));
}

TEST_CASE("bpe tokenizer: special tokens, user-defined tokens and BOS") {
    H2O_HF_TOKENIZER_OR_SKIP(llama3, "llama3");
    const std::string chat = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>";
    const std::vector<int32_t> special = encode(*llama3, chat, true);
    REQUIRE(special.size() == 7);
    CHECK(ids_to_string({special[0], special[1], special[3], special[6]}) == ids_to_string({128000, 128006, 128007, 128009}));
    CHECK(decode(*llama3, special) == "user\n\nHi");  // control tokens render as nothing
    // Not parsed, the same text is spelled out in normal tokens.
    const std::vector<int32_t> plain = encode(*llama3, chat);
    CHECK(plain.size() > 20);
    for (int32_t id : plain) CHECK(llama3->type(id) == TOKEN_NORMAL);
    CHECK(decode(*llama3, plain) == chat);
    // BOS: this tokenizer.json's post-processor adds none and its tokenizer_config.json does not
    // say, so a converted file has no tokenizer.ggml.add_bos_token; llama.cpp's default for the
    // llama-bpe pre-tokenizer then adds BOS, and so does this tokenizer.
    CHECK(llama3->bos() == 128000);
    CHECK(llama3->eos() == 128001);
    CHECK(llama3->add_bos());
    std::vector<int32_t> with_bos;
    REQUIRE(llama3->encode_special(chat, true, &with_bos).ok());
    CHECK(with_bos == special);  // not doubled
    REQUIRE(llama3->encode("Hi", true, &with_bos).ok());
    CHECK(ids_to_string(with_bos) == ids_to_string({128000, 13347}));

    H2O_HF_TOKENIZER_OR_SKIP(qwen3, "qwen3");
    const int32_t think = 151667, end_think = 151668, im_start = 151644;
    CHECK(qwen3->type(think) == TOKEN_USER_DEFINED);
    CHECK(qwen3->type(im_start) == TOKEN_CONTROL);
    CHECK(qwen3->type(151659) == TOKEN_CONTROL);  // <|fim_prefix|> looks special
    // User-defined tokens are tokens even in plain text; control tokens only when parsed.
    const std::vector<int32_t> ids = encode(*qwen3, "<think>why</think>");
    CHECK(ids.front() == think);
    CHECK(ids.back() == end_think);
    CHECK(decode(*qwen3, ids) == "<think>why</think>");
    CHECK(encode(*qwen3, "<|im_start|>").size() > 1);
    CHECK(ids_to_string(encode(*qwen3, "<|im_start|>", true)) == ids_to_string({im_start}));
    CHECK(qwen3->bos() == -1);  // bos_token is null in tokenizer_config.json
    CHECK_FALSE(qwen3->add_bos());
    std::vector<int32_t> out;
    CHECK(qwen3->encode("x", true, &out).code == H2O_ERR_INVALID_ARGUMENT);
    // The longest token text wins where two overlap: "</think>" is not "<" + "/think>".
    CHECK(ids_to_string(encode(*qwen3, "a</think><think>", true)) == ids_to_string({64, end_think, think}));
}

TEST_CASE("bpe tokenizer: the end-of-generation set") {
    H2O_HF_TOKENIZER_OR_SKIP(llama3, "llama3");
    for (int32_t id : {128001, 128009}) CHECK(llama3->is_end_of_generation(id));  // <|end_of_text|>, <|eot_id|>
    for (int32_t id : {128000, 128006, 128007, 128008, 13347, -1, 128256}) CHECK_FALSE(llama3->is_end_of_generation(id));

    H2O_HF_TOKENIZER_OR_SKIP(qwen3, "qwen3");
    CHECK(qwen3->eos() == 151645);  // <|im_end|>
    // <|endoftext|>, <|im_end|>, and the fill-in-the-middle pad, repository and file separators.
    for (int32_t id : {151643, 151645, 151662, 151663, 151664}) CHECK(qwen3->is_end_of_generation(id));
    for (int32_t id : {151644, 151659, 151667, 151668}) CHECK_FALSE(qwen3->is_end_of_generation(id));

    // Qwen's vocabulary has </s> as a normal token: it ends generation (as in llama.cpp) but stays
    // a word that merges build and that renders as text.
    CHECK(qwen3->type(128247) == TOKEN_NORMAL);
    CHECK(qwen3->is_end_of_generation(128247));
    CHECK(decode(*qwen3, {128247}) == "</s>");

    // An eot/eom id from the metadata counts, and a turn-end token of another type becomes control.
    VocabSpec spec = byte_vocab({}, {}, {"<|im_end|>"});
    spec.types.back() = TOKEN_USER_DEFINED;
    spec.eot = 65;
    std::unique_ptr<Tokenizer> tok;
    REQUIRE(try_vocab(spec, &tok).ok());
    CHECK(tok->is_end_of_generation(65));
    CHECK(tok->is_end_of_generation(256));
    CHECK(tok->type(256) == TOKEN_CONTROL);
    CHECK_FALSE(tok->is_end_of_generation(66));
}

TEST_CASE("bpe tokenizer: invalid UTF-8 is refused with its offset, never tokenized") {
    H2O_SHARED_FILE_OR_SKIP(path, "vocab/ggml-vocab-gpt-2.gguf");
    const auto tok = gguf_tokenizer(path);
    struct Case {
        std::string text;
        size_t offset;
    };
    for (const Case &c :
         std::vector<Case>{{"ab\xFF", 2}, {"\x80", 0}, {"ok \xC3", 3}, {"a\xC0\xAF", 1}, {"ab\xED\xA0\x80", 2}, {"\xF4\x90\x80\x80", 0}}) {
        CAPTURE(c.text);
        std::vector<int32_t> out = {7};
        for (bool special : {false, true}) {
            const Status st = special ? tok->encode_special(c.text, false, &out) : tok->encode(c.text, false, &out);
            CHECK(st.code == H2O_ERR_INVALID_TEXT);
            CHECK(st.message.find("offset " + std::to_string(c.offset)) != std::string::npos);
            CHECK(ids_to_string(out) == ids_to_string({7}));
        }
    }
    // Token sequences that end inside a character decode to U+FFFD, and streaming holds the bytes.
    const std::string llama = "\xF0\x9F\xA6\x99";  // U+1F999, more than one token in GPT-2
    const std::vector<int32_t> ids = encode(*tok, llama);
    REQUIRE(ids.size() > 1);
    CHECK(decode(*tok, {ids.front()}) == "\xEF\xBF\xBD");
    std::string stream;
    tok->append_piece(ids.front(), false, &stream);
    CHECK(stream.size() < 4);
    for (size_t i = 1; i < ids.size(); ++i) tok->append_piece(ids[i], false, &stream);
    CHECK(stream == llama);
}

TEST_CASE("bpe tokenizer: a byte without a token is the unknown token, or an error") {
    VocabSpec spec = byte_vocab({}, {}, {"<unk>"});
    spec.pieces[0xFF] = "never-the-byte";  // the vocabulary has no token for 0xFF (nor for ÿ's bytes)
    spec.pieces[0xC3] = "nor-this-one";
    std::unique_ptr<Tokenizer> tok;
    REQUIRE(try_vocab(spec, &tok).ok());
    std::vector<int32_t> out;
    const Status st = tok->encode("a\xC3\xBF", false, &out);  // ÿ is C3 BF
    CHECK(st.code == H2O_ERR_TOKENIZER);
    CHECK(st.message.find("0xC3") != std::string::npos);
    spec.unk = 256;
    REQUIRE(try_vocab(spec, &tok).ok());
    CHECK(ids_to_string(encode(*tok, "a\xC3\xBF")) == ids_to_string({'a', 256, 0xBF}));
}

TEST_CASE("bpe tokenizer: hostile merges and vocabulary metadata give clear errors") {
    struct Case {
        const char *what;
        VocabSpec spec;
        h2o_status code;
        const char *message;
    };
    auto with = [](VocabSpec s, auto &&change) {
        change(s);
        return s;
    };
    const VocabSpec good = byte_vocab({"ab", "abc"}, {"a b", "ab c"}, {"<|eot|>", "xy"});
    REQUIRE(try_vocab(good).ok());
    const Case cases[] = {
        {"no space", with(good, [](VocabSpec &s) { s.merges.push_back("abc"); }), H2O_ERR_MODEL_FORMAT,
         "merge 2 ('abc') is not two tokens"},
        {"empty right part", with(good, [](VocabSpec &s) { s.merges.push_back("ab "); }), H2O_ERR_MODEL_FORMAT, "is not two tokens"},
        {"a lone space", with(good, [](VocabSpec &s) { s.merges.push_back(" "); }), H2O_ERR_MODEL_FORMAT, "is not two tokens"},
        {"unknown part", with(good, [](VocabSpec &s) { s.merges.push_back("a zz"); }), H2O_ERR_MODEL_FORMAT,
         "right part 'zz' is not a token"},
        {"result not a token", with(good, [](VocabSpec &s) { s.merges.push_back("b c"); }), H2O_ERR_MODEL_FORMAT,
         "its result 'bc' is not a token"},
        {"control part", with(good, [](VocabSpec &s) { s.merges.push_back("<|eot|> a"); }), H2O_ERR_MODEL_FORMAT,
         "left part is token 258 of type 3"},
        {"control result", with(good, [](VocabSpec &s) { s.merges.push_back("x y"); }), H2O_ERR_MODEL_FORMAT,
         "its result is token 259 of type 3"},
        {"hostile bytes in a merge", with(good, [](VocabSpec &s) { s.merges.push_back(std::string("\x01\xFF q", 4)); }),
         H2O_ERR_MODEL_FORMAT, "'\\x01\\xFF q'"},
        {"duplicate token", with(good, [](VocabSpec &s) { s.pieces[257] = "ab"; }), H2O_ERR_MODEL_FORMAT,
         "tokens 256 and 257 are both 'ab'"},
        {"empty token", with(good, [](VocabSpec &s) { s.pieces[257].clear(); }), H2O_ERR_MODEL_FORMAT, "token 257 is empty"},
        {"unknown pre-tokenizer", with(good, [](VocabSpec &s) { s.pre = "klingon"; }), H2O_ERR_UNSUPPORTED,
         "tokenizer.ggml.pre 'klingon' is not a supported pre-tokenizer (supported: llama-bpe"},
        {"type 0", with(good, [](VocabSpec &s) { s.types[3] = 0; }), H2O_ERR_MODEL_FORMAT, "token 3 has type 0"},
        {"scores of the wrong length", with(good, [](VocabSpec &s) { s.scores = {1.0f}; }), H2O_ERR_MODEL_FORMAT, "scores"},
        {"unk out of range", with(good, [](VocabSpec &s) { s.unk = 9999; }), H2O_ERR_MODEL_FORMAT, "unknown token id 9999"},
    };
    for (const Case &c : cases) {
        CAPTURE(c.what);
        const Status st = try_vocab(c.spec);
        CHECK(st.code == c.code);
        CHECK_MESSAGE(st.message.find(c.message) != std::string::npos, st.message);
    }
}

TEST_CASE("bpe tokenizer: GGUF metadata (gpt2 model, merges, pre, token types, special ids)") {
    const VocabSpec spec = byte_vocab({"ab"}, {"a b"}, {"<|endoftext|>"});
    auto writer = [&](bool with_types, bool with_pre) {
        GgufWriter w;
        w.add_string("tokenizer.ggml.model", "gpt2");
        w.add_string_array("tokenizer.ggml.tokens", spec.pieces);
        if (with_types) w.add_i32_array("tokenizer.ggml.token_type", spec.types);
        w.add_string_array("tokenizer.ggml.merges", spec.merges);
        if (with_pre) w.add_string("tokenizer.ggml.pre", "qwen2");
        return w;
    };
    std::unique_ptr<Tokenizer> tok;
    Status st = tokenizer_from_writer(writer(true, true), &tok);
    REQUIRE_MESSAGE(st.ok(), st.message);
    CHECK(tok->bos() == -1);  // no defaults for byte-level BPE
    CHECK(tok->eos() == -1);
    CHECK_FALSE(tok->add_bos());
    CHECK(tok->type(257) == TOKEN_CONTROL);
    CHECK(tok->is_end_of_generation(257));
    CHECK(ids_to_string(encode(*tok, "ab 12")) == ids_to_string({256, ' ', '1', '2'}));

    // Without token types every token is normal (<|endoftext|> still ends generation); without
    // pre, llama.cpp's "default" with a warning.
    st = tokenizer_from_writer(writer(false, false), &tok);
    REQUIRE_MESSAGE(st.ok(), st.message);
    CHECK(tok->type(256) == TOKEN_NORMAL);
    CHECK(tok->type(257) == TOKEN_NORMAL);
    CHECK(tok->is_end_of_generation(257));
    CHECK(ids_to_string(encode(*tok, "1234")) == ids_to_string({'1', '2', '3', '4'}));

    {  // No merges at all.
        GgufWriter w;
        w.add_string("tokenizer.ggml.model", "gpt2");
        w.add_string_array("tokenizer.ggml.tokens", spec.pieces);
        st = tokenizer_from_writer(w, &tok);
        CHECK(st.code == H2O_ERR_MODEL_FORMAT);
        CHECK(st.message.find("tokenizer.ggml.merges") != std::string::npos);
    }
    {  // Special ids, add_bos, add_eos, UINT32_MAX as "none".
        GgufWriter w = writer(true, true);
        w.add_u32("tokenizer.ggml.bos_token_id", 257);
        w.add_u32("tokenizer.ggml.eos_token_id", UINT32_MAX);
        w.add_bool("tokenizer.ggml.add_bos_token", true);
        w.add_bool("tokenizer.ggml.add_eos_token", false);
        st = tokenizer_from_writer(w, &tok);
        REQUIRE_MESSAGE(st.ok(), st.message);
        CHECK(tok->bos() == 257);
        CHECK(tok->eos() == -1);
        CHECK(tok->add_bos());
        CHECK_FALSE(tok->add_eos());
    }
    for (const char *pre : {"llama-bpe", "qwen2"}) {  // no add_bos_token: llama.cpp's default for the pre-tokenizer
        GgufWriter w = writer(true, false);
        w.add_string("tokenizer.ggml.pre", pre);
        w.add_u32("tokenizer.ggml.bos_token_id", 257);
        st = tokenizer_from_writer(w, &tok);
        REQUIRE_MESSAGE(st.ok(), st.message);
        CHECK(tok->add_bos() == (std::string(pre) == "llama-bpe"));
    }
    {  // A pre-tokenizer name of the wrong type, a hostile merge.
        GgufWriter w = writer(true, false);
        w.add_u32("tokenizer.ggml.pre", 3);
        st = tokenizer_from_writer(w, &tok);
        CHECK(st.code == H2O_ERR_MODEL_FORMAT);
        GgufWriter m;
        m.add_string("tokenizer.ggml.model", "gpt2");
        m.add_string_array("tokenizer.ggml.tokens", spec.pieces);
        m.add_string_array("tokenizer.ggml.merges", {"a b", "x"});
        st = tokenizer_from_writer(m, &tok);
        CHECK(st.code == H2O_ERR_MODEL_FORMAT);
        CHECK(st.message.find("merge 1 ('x')") != std::string::npos);
    }
}

TEST_CASE("bpe tokenizer: tokenizer.json reader") {
    const HfVocabulary *llama3 = hf_vocabulary("llama3");
    if (!llama3) return;
    CHECK(llama3->pre == "llama-bpe");
    CHECK(llama3->tokens.size() == 128256);
    CHECK(llama3->merges.size() == 280147);
    CHECK(llama3->merges[0] == "\xC4\xA0 \xC4\xA0");
    CHECK(llama3->bos == 128000);
    CHECK(llama3->eos == 128001);
    CHECK_FALSE(llama3->add_bos.has_value());
    CHECK(llama3->types[128000] == TOKEN_CONTROL);
    CHECK(llama3->types[1000] == TOKEN_NORMAL);
    h2o::ChatFormat format{};
    REQUIRE(h2o::chat_format_from_template(llama3->chat_template, &format).ok());
    CHECK(format == h2o::ChatFormat::Llama3);

    const HfVocabulary *qwen3 = hf_vocabulary("qwen3");
    if (!qwen3) return;
    CHECK(qwen3->pre == "qwen2");
    CHECK(qwen3->add_bos == std::optional<bool>(false));
    CHECK(qwen3->bos == -1);
    CHECK(qwen3->eos == 151645);
    CHECK(qwen3->pad == 151643);
    CHECK(qwen3->types[151667] == TOKEN_USER_DEFINED);  // <think>
    CHECK(qwen3->types[151662] == TOKEN_CONTROL);       // <|fim_pad|>, not marked special but looks so
    REQUIRE(h2o::chat_format_from_template(qwen3->chat_template, &format).ok());
    CHECK(format == h2o::ChatFormat::ChatML);

    const HfVocabulary *gpt4o = hf_vocabulary("gpt4o");
    if (!gpt4o) return;
    CHECK(gpt4o->pre == "gpt-4o");
    CHECK(gpt4o->tokens.size() == 200019);  // ids 200000..200017 are holes
    CHECK(gpt4o->tokens[200005] == "[PAD200005]");
    CHECK(gpt4o->types[200005] == TOKEN_UNUSED);
    CHECK(gpt4o->unk == 199999);
    CHECK(gpt4o->chat_template.empty());

    HfVocabulary v;
    CHECK(read_hf_tokenizer(h2o_test::temp_path("no-such-folder"), 0, &v).code == H2O_ERR_IO);
}

TEST_CASE("bpe tokenizer: tokenizer.json reader on small files") {
    const std::string tokenizer = R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": true}, {"type": "ByteLevel", "use_regex": true}]},
      "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]},
      "added_tokens": [{"id": 4, "content": "<|im_end|>", "special": true, "rstrip": true},
                       {"id": 5, "content": "<tool\u2581x>", "special": false, "lstrip": true}, {"id": 6, "content": "<s>", "special": true}],
      "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}]}})";
    HfVocabulary v;
    Status st = parse_hf_tokenizer(tokenizer, R"({"eos_token": {"content": "<|im_end|>"}, "chat_template": [
        {"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})",
                                   R"({"pad_token_id": 3})", "J", 8, &v);
    REQUIRE_MESSAGE(st.ok(), st.message);
    CHECK(v.pre == "smollm");
    CHECK(v.tokens == std::vector<std::string>{"a", "b", "ab", "[PAD3]", "<|im_end|>", "<tool x>", "<s>", "[PAD7]"});
    CHECK(v.types == std::vector<int32_t>{1, 1, 1, 5, 3, 4, 3, 5});
    CHECK(v.strip == std::vector<uint8_t>{0, 0, 0, 0, kStripRight, kStripLeft, 0, 0});
    CHECK(to_vocab_spec(v).strip == v.strip);
    CHECK(v.merges == std::vector<std::string>{"a b"});
    CHECK(v.bos == 6);  // from the post-processor's template, which also asks for it
    CHECK(v.add_bos == std::optional<bool>(true));
    CHECK(v.eos == 4);
    CHECK_FALSE(v.add_eos.has_value());
    CHECK(v.pad == 3);  // config.json's
    CHECK(v.chat_template == "D");
    // tokenizer_config.json's add_bos_token wins; chat_template.jinja when the config has none.
    REQUIRE(parse_hf_tokenizer(tokenizer, R"({"add_bos_token": false})", "", "J", 0, &v).ok());
    CHECK(v.add_bos == std::optional<bool>(false));
    CHECK(v.chat_template == "J");
    CHECK(v.tokens.size() == 7);
    st = parse_hf_tokenizer(tokenizer, "", "", "", 5, &v);
    CHECK(st.code == H2O_ERR_MODEL_FORMAT);
    CHECK(st.message.find("vocabulary size 5 is smaller than the tokenizer's 7") != std::string::npos);

    // What a GGUF written from it holds, read back by the library.
    REQUIRE(parse_hf_tokenizer(tokenizer, "", "", "", 0, &v).ok());
    v.tokens[3] = "x";  // the byte alphabet is incomplete here, which is allowed
    GgufWriter w;
    add_hf_vocabulary(v, &w);
    std::unique_ptr<Tokenizer> tok;
    st = tokenizer_from_writer(w, &tok);
    REQUIRE_MESSAGE(st.ok(), st.message);
    CHECK(tok->bos() == 6);
    CHECK(tok->add_bos());
    CHECK(tok->is_end_of_generation(4));
    CHECK(ids_to_string(encode(*tok, "ab<tool x>")) == ids_to_string({2, 5}));
}

TEST_CASE("bpe tokenizer: tokenizer.json reader refuses malformed files") {
    const std::string pre = R"("pre_tokenizer": {"type": "ByteLevel", "use_regex": true})";
    auto tokenizer = [&](const std::string &model, const std::string &extra = "") {
        return "{" + pre + R"(, "model": )" + model + extra + "}";
    };
    const std::string good_model = R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";
    HfVocabulary v;
    REQUIRE(parse_hf_tokenizer(tokenizer(good_model), "", "", "", 0, &v).ok());
    CHECK(v.pre == "gpt-2");
    CHECK(v.merges == std::vector<std::string>{"a b"});
    REQUIRE(
        parse_hf_tokenizer(tokenizer(R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]})"), "", "", "", 0, &v)
            .ok());
    CHECK(v.merges == std::vector<std::string>{"a b"});

    struct Case {
        std::string tokenizer_json, config_json;
        h2o_status code;
        const char *message;
    };
    const Case cases[] = {
        {"", "", H2O_ERR_MODEL_FORMAT, "not valid JSON"},
        {"{\"model\": ", "", H2O_ERR_MODEL_FORMAT, "not valid JSON"},
        {"[1, 2]", "", H2O_ERR_MODEL_FORMAT, "not a JSON object"},
        {std::string(100000, '[') + std::string(100000, ']'), "", H2O_ERR_MODEL_FORMAT, "nested more than"},
        {"{" + pre + "}", "", H2O_ERR_MODEL_FORMAT, "no \"model\""},
        {tokenizer(R"({"type": "Unigram"})"), "", H2O_ERR_UNSUPPORTED, "model type \"Unigram\""},
        {tokenizer(R"({"type": "BPE", "vocab": []})"), "", H2O_ERR_MODEL_FORMAT, "model.vocab"},
        {tokenizer(R"({"type": "BPE", "vocab": {"a": -1}})"), "", H2O_ERR_MODEL_FORMAT, "has id -1"},
        {tokenizer(R"({"type": "BPE", "vocab": {"a": 99999999999}})"), "", H2O_ERR_MODEL_FORMAT, "has id 99999999999"},
        {tokenizer(R"({"type": "BPE", "vocab": {"a": "zero"}})"), "", H2O_ERR_MODEL_FORMAT, "has id \"zero\""},
        {tokenizer(R"({"type": "BPE", "vocab": {"a": 0}, "merges": [7]})"), "", H2O_ERR_MODEL_FORMAT, "merge 0 is 7"},
        {tokenizer(R"({"type": "BPE", "vocab": {"a": 0}, "merges": [["a b", "c"]]})"), "", H2O_ERR_UNSUPPORTED, "space inside a part"},
        {tokenizer(good_model, R"(, "added_tokens": [{"content": 5}])"), "", H2O_ERR_MODEL_FORMAT, "without content or id"},
        {tokenizer(good_model, R"(, "added_tokens": 3)"), "", H2O_ERR_MODEL_FORMAT, "added_tokens is not an array"},
        {R"({"pre_tokenizer": {"type": "Whitespace"}, "model": )" + good_model + "}", "", H2O_ERR_UNSUPPORTED,
         "not a byte-level BPE tokenizer"},
        {R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "x+"},
             "behavior": "Isolated"}, {"type": "ByteLevel", "use_regex": false}]}, "model": )" +
             good_model + "}",
         "", H2O_ERR_UNSUPPORTED, "does not recognise"},
        {tokenizer(good_model), "[]", H2O_ERR_MODEL_FORMAT, "tokenizer_config.json: not a JSON object"},
        {tokenizer(good_model), R"({"add_bos_token": true, "bos_token": {"content": 3}})", H2O_OK, ""},
    };
    for (const Case &c : cases) {
        CAPTURE(c.tokenizer_json.substr(0, 200));
        const Status st = parse_hf_tokenizer(c.tokenizer_json, c.config_json, "", "", 0, &v);
        CHECK(st.code == c.code);
        CHECK_MESSAGE(st.message.find(c.message) != std::string::npos, st.message);
    }
}

// FNV-1a over the ids as 4 little-endian bytes each (tests/data/tokenizer_parity/make_expected.py).
uint64_t ids_hash(const std::vector<int32_t> &ids) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int32_t id : ids) {
        const auto u = static_cast<uint32_t>(id);
        for (int k = 0; k < 4; ++k) h = (h ^ ((u >> (8 * k)) & 0xFF)) * 0x100000001b3ull;
    }
    return h;
}

TEST_CASE("bpe tokenizer: read_vocabulary takes a tokenizer.json, its folder or a GGUF file's keys, and names what it refuses") {
    std::function<void(GgufWriter &)> write;
    int32_t n = 0;
    // A GGUF file without a vocabulary, a file that is not GGUF, a path of another kind.
    GgufWriter empty;
    empty.add_string("general.name", "no vocabulary");
    const std::string no_vocab = h2o_test::temp_path("no-vocabulary.gguf"), not_gguf = h2o_test::temp_path("not-gguf.gguf");
    REQUIRE(empty.write(no_vocab).ok());
    std::FILE *f = std::fopen(not_gguf.c_str(), "wb");
    REQUIRE(f != nullptr);
    std::fputs("plain text", f);
    std::fclose(f);
    Status st = read_vocabulary(no_vocab, &n, &write);
    CHECK(st.code == H2O_ERR_MODEL_FORMAT);
    CHECK(st.message.find(no_vocab + ": no vocabulary") != std::string::npos);
    CHECK(read_vocabulary(not_gguf, &n, &write).code == H2O_ERR_MODEL_FORMAT);
    CHECK(read_vocabulary(h2o_test::temp_path("vocab.txt"), &n, &write).code == H2O_ERR_INVALID_ARGUMENT);
    std::remove(no_vocab.c_str());
    std::remove(not_gguf.c_str());

    // Phi-3's vocabulary-only file: its tokenizer.* keys, copied, are the vocabulary of the model written.
    const std::string phi3 = h2o_test::shared_file("vocab/ggml-vocab-phi-3.gguf");
    if (phi3.empty()) return;
    REQUIRE(read_vocabulary(phi3, &n, &write).ok());
    CHECK(n == 32064);
    GgufWriter w;
    write(w);
    std::unique_ptr<GgufFile> copy, original;
    const std::vector<uint8_t> bytes = w.serialize();
    REQUIRE(GgufFile::parse(bytes.data(), bytes.size(), &copy).ok());
    REQUIRE(GgufFile::open(phi3, &original).ok());
    size_t tokenizer_keys = 0;
    for (const GgufKeyValue &kv : original->metadata()) {
        if (kv.key.substr(0, 10) != "tokenizer.") {
            CHECK(copy->find(kv.key) == nullptr);
            continue;
        }
        ++tokenizer_keys;
        const GgufValue *value = copy->find(kv.key);
        REQUIRE(value != nullptr);
        CHECK(value->type == kv.value.type);
        CHECK(value->array_size == kv.value.array_size);
    }
    CHECK(tokenizer_keys >= 10);
    CHECK(copy->metadata().size() == tokenizer_keys);
}

TEST_CASE("bpe tokenizer: the same ids as llama.cpp on whole texts") {
    const std::string data = std::string(H2O_TEST_DATA_DIR) + "/tokenizer_parity/";
    for (const char *vocab : {"llama3", "qwen3", "gpt4o", "gemma3"}) {
        for (const char *text_name : {"stress", "tinystories_val"}) {
            CAPTURE(vocab);
            CAPTURE(text_name);
            std::string text_path = data + "stress.txt";
            if (std::string(text_name) == "tinystories_val") {
                text_path = h2o_test::shared_file("data/tinystories_val.txt");
                if (text_path.empty()) continue;
            }
            const Tokenizer *tok = hf_tokenizer(vocab);
            if (!tok) return;
            std::istringstream expected(h2o_test::read_text_file(data + vocab + "." + text_name + ".ids"));
            std::string key;
            size_t count = 0;
            std::string hash;
            std::vector<int32_t> first;
            expected >> key >> count;
            REQUIRE(key == "count");
            expected >> key >> hash;
            REQUIRE(key == "fnv1a64");
            expected >> key;
            REQUIRE(key == "first");
            for (int32_t id; expected >> id;) first.push_back(id);
            REQUIRE(first.size() == std::min<size_t>(count, 256));

            const std::vector<int32_t> ids = encode(*tok, h2o_test::read_text_file(text_path));
            CHECK(ids.size() == count);
            const std::vector<int32_t> head(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(ids.size(), 256)));
            CHECK_MESSAGE(head == first, "got" << ids_to_string(head) << "\nexpected" << ids_to_string(first));
            char ours[17];
            std::snprintf(ours, sizeof ours, "%016llx", static_cast<unsigned long long>(ids_hash(ids)));
            CHECK(std::string(ours) == hash);
        }
    }
    // llama.cpp turns invalid bytes into U+FFFD; the library refuses the text and says where.
    H2O_HF_TOKENIZER_OR_SKIP(llama3, "llama3");
    std::vector<int32_t> ids;
    const Status st = llama3->encode("ok \xFF bad \xC3( \xED\xA0\x80 end", false, &ids);
    CHECK(st.code == H2O_ERR_INVALID_TEXT);
    CHECK(st.message.find("offset 3") != std::string::npos);
}

// Runs of whitespace and chat prompts (tokenizer_parity/README.md: whitespace.inp and
// VOCAB.special.inp), with llama.cpp's ids for every vocabulary of ../shared/vocab/: the three
// llama.cpp ships as GGUF files read as they are (Phi-3's with its name, which makes its special
// tokens strip the whitespace after them), the four tokenizer.json ones written as above.
TEST_CASE("tokenizer: whitespace runs and chat prompts give llama.cpp's ids with every vocabulary") {
    const std::string data = std::string(H2O_TEST_DATA_DIR) + "/tokenizer_parity/";
    for (const char *name : {"llama-spm", "phi-3", "gpt-2", "llama3", "qwen3", "gemma3", "gpt4o"}) {
        CAPTURE(name);
        std::unique_ptr<Tokenizer> from_file;
        const Tokenizer *tok = nullptr;
        if (std::string(name) == "llama-spm" || std::string(name) == "phi-3" || std::string(name) == "gpt-2") {
            const std::string path = h2o_test::shared_file("vocab/ggml-vocab-" + std::string(name) + ".gguf");
            if (path.empty()) continue;
            from_file = gguf_tokenizer(path);
            tok = from_file.get();
        } else {
            tok = hf_tokenizer(name);
            if (!tok) continue;
        }
        for (const bool special : {false, true}) {
            CAPTURE(special);
            const std::string inputs = special ? data + name + ".special.inp" : data + "whitespace.inp";
            const std::string expected = data + name + (special ? ".special.out" : ".whitespace.out");
            const h2o_test::TokenizerVectors vectors = h2o_test::read_tokenizer_vectors(inputs, expected);
            REQUIRE(vectors.complete);
            REQUIRE(vectors.inputs.size() == vectors.ids.size());
            CHECK(vectors.inputs.size() >= (special ? 32u : 600u));
            size_t wrong = 0;
            for (size_t i = 0; i < vectors.inputs.size(); ++i) {
                const std::vector<int32_t> ids = encode(*tok, vectors.inputs[i], special);
                if (ids == vectors.ids[i]) continue;
                if (++wrong <= 3)
                    FAIL_CHECK("case " << i << " " << h2o_test::escape_text(vectors.inputs[i]) << "\n  got" << ids_to_string(ids)
                                       << "\n  llama.cpp" << ids_to_string(vectors.ids[i]));
            }
            CHECK(wrong == 0);
        }
    }
}

TEST_CASE("bpe tokenizer: one tokenizer shared by many threads") {
    H2O_SHARED_FILE_OR_SKIP(text_path, "data/tinystories_val.txt");
    H2O_HF_TOKENIZER_OR_SKIP(tok, "qwen3");
    std::vector<std::string> lines;
    std::istringstream in(h2o_test::read_text_file(text_path));
    for (std::string line; std::getline(in, line) && lines.size() < 300;) lines.push_back(line);
    std::vector<std::vector<int32_t>> expected;
    for (const std::string &line : lines) expected.push_back(encode(*tok, line));

    constexpr int kThreads = 8;
    std::vector<int> failures(kThreads, 0);
    std::vector<std::thread> workers;
    for (int t = 0; t < kThreads; ++t) {
        workers.emplace_back([&, t] {
            for (size_t i = static_cast<size_t>(t) % 3; i < lines.size(); ++i) {
                std::vector<int32_t> ids;
                std::string text;
                if (!tok->encode(lines[i], false, &ids).ok() || ids != expected[i] || !tok->decode(ids.data(), ids.size(), &text).ok() ||
                    text != lines[i])
                    ++failures[static_cast<size_t>(t)];
            }
        });
    }
    for (std::thread &w : workers) w.join();
    for (int t = 0; t < kThreads; ++t) CHECK(failures[static_cast<size_t>(t)] == 0);
}
