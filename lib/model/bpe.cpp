#include "bpe.h"

#include <algorithm>
#include <array>
#include <cstdio>

#include "tokenizer.h"
#include "utf8.h"

namespace h2o {
namespace {

// GPT-2's alphabet: the printable bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for
// themselves; the other 68 (controls, space, DEL, U+0080..U+00A0, the soft hyphen) take the code
// points from U+0100 on, in byte order.
struct ByteAlphabet {
    std::array<std::string, 256> utf8;     // byte -> its character
    std::array<int16_t, 0x144> byte_of{};  // code point -> byte, or -1 (the alphabet ends at U+0143)

    ByteAlphabet() {
        byte_of.fill(-1);
        uint32_t next_extra = 0x100;
        for (uint32_t b = 0; b < 256; ++b) {
            const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            const uint32_t cp = printable ? b : next_extra++;
            std::string &s = utf8[b];
            if (cp < 0x80) {
                s.push_back(static_cast<char>(cp));
            } else {
                s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
                s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
            }
            byte_of[cp] = static_cast<int16_t>(b);
        }
    }
};

const ByteAlphabet &alphabet() {
    static const ByteAlphabet kAlphabet;
    return kAlphabet;
}

// A token text or merge for a message: at most 48 bytes, controls and bytes that are not UTF-8
// written as \xNN, so that hostile metadata cannot garble the error text.
std::string quoted(std::string_view text) {
    std::string out = "'";
    size_t i = 0;
    while (i < text.size() && out.size() < 49) {
        const int n = utf8_sequence_length(text, i);
        const auto c = static_cast<unsigned char>(text[i]);
        if (n > 1 || (n == 1 && c >= 0x20 && c != 0x7F)) {
            out.append(text, i, static_cast<size_t>(n));
            i += static_cast<size_t>(n);
        } else {
            char hex[5];
            std::snprintf(hex, sizeof hex, "\\x%02X", c);
            out += hex;
            ++i;
        }
    }
    return out + (i < text.size() ? "...'" : "'");
}

}  // namespace

std::string_view byte_level_char(uint8_t byte) { return alphabet().utf8[byte]; }

std::string byte_level_decode(std::string_view text) {
    const ByteAlphabet &a = alphabet();
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
        const int n = utf8_sequence_length(text, i);
        if (n <= 0) {  // not UTF-8 at all: the byte as it is
            out.push_back(text[i++]);
            continue;
        }
        uint32_t cp = static_cast<unsigned char>(text[i]);
        if (n == 2) cp = ((cp & 0x1F) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3F);
        if (n <= 2 && cp < a.byte_of.size() && a.byte_of[cp] >= 0) {
            out.push_back(static_cast<char>(a.byte_of[cp]));
        } else {
            out.append(text, i, static_cast<size_t>(n));
        }
        i += static_cast<size_t>(n);
    }
    return out;
}

// (left token, right token) -> (rank, merged token), open addressing with linear probing: the
// lookup of the merge loop, a few times per byte of text.
class BytePairEncoder::MergeTable {
public:
    struct Slot {
        uint64_t key = kEmpty;
        int32_t rank = 0, result = 0;
    };

    explicit MergeTable(size_t n_merges) {
        size_t capacity = 16;
        while (capacity < n_merges + n_merges / 2) capacity *= 2;
        slots_.resize(capacity);
        mask_ = capacity - 1;
        while ((size_t{1} << (64 - shift_)) < capacity) --shift_;
    }

    // False when the pair is there already (the earlier rank stays).
    bool insert(int32_t left, int32_t right, int32_t rank, int32_t result) {
        const uint64_t key = make_key(left, right);
        for (size_t i = hash(key);; i = (i + 1) & mask_) {
            Slot &s = slots_[i];
            if (s.key == key) return false;
            if (s.key == kEmpty) {
                s = Slot{key, rank, result};
                return true;
            }
        }
    }

    const Slot *find(int32_t left, int32_t right) const {
        if (left < 0 || right < 0) return nullptr;
        const uint64_t key = make_key(left, right);
        for (size_t i = hash(key);; i = (i + 1) & mask_) {
            const Slot &s = slots_[i];
            if (s.key == key) return &s;
            if (s.key == kEmpty) return nullptr;
        }
    }

private:
    // Ids are below 2^31, so no pair has this key.
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    static uint64_t make_key(int32_t left, int32_t right) {
        return (uint64_t{static_cast<uint32_t>(left)} << 32) | static_cast<uint32_t>(right);
    }
    // Fibonacci hashing: the top bits of the product.
    size_t hash(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_) & mask_; }

    std::vector<Slot> slots_;
    size_t mask_ = 0;
    int shift_ = 64;
};

// Per encode() call: the symbols of the word being merged (a linked list over the word's
// bytes) and the candidate merges, smallest (rank, position) first.
struct BytePairEncoder::Scratch {
    struct Symbol {
        int32_t id;  // token, -1 for a byte without one, kMerged once joined into its left neighbour
        int32_t prev, next;
    };
    struct Candidate {
        int32_t rank, left;         // order: rank, then position
        int32_t left_id, right_id;  // the pair as it was when queued (stale if either changed)
        int32_t result;
        bool operator>(const Candidate &o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    static constexpr int32_t kMerged = -2;

    std::vector<Symbol> symbols;
    std::vector<Candidate> queue;
    std::vector<std::string_view> words;
};

BytePairEncoder::BytePairEncoder() = default;
BytePairEncoder::~BytePairEncoder() = default;

Status BytePairEncoder::create(const std::vector<std::string> &pieces, const std::vector<int32_t> &types,
                               const std::vector<std::string> &merges, std::unique_ptr<Pretokenizer> pretokenizer, int32_t unk,
                               std::unique_ptr<BytePairEncoder> *out) {
    auto bad = [](std::string message) { return make_error(H2O_ERR_MODEL_FORMAT, "vocabulary: " + std::move(message)); };
    if (!pretokenizer) return make_error(H2O_ERR_INTERNAL, "byte-level BPE needs a pre-tokenizer");
    if (types.size() != pieces.size()) return make_error(H2O_ERR_INTERNAL, "byte-level BPE: pieces and types differ in length");
    if (merges.size() > static_cast<size_t>(INT32_MAX)) return bad("too many merges (" + std::to_string(merges.size()) + ")");

    std::unique_ptr<BytePairEncoder> enc(new BytePairEncoder());
    std::unordered_map<std::string_view, int32_t> by_text;
    by_text.reserve(pieces.size());
    for (size_t i = 0; i < pieces.size(); ++i) {
        const auto id = static_cast<int32_t>(i);
        if (pieces[i].empty()) return bad("token " + std::to_string(id) + " is empty");
        const auto [it, inserted] = by_text.emplace(pieces[i], id);
        if (!inserted) return bad("tokens " + std::to_string(it->second) + " and " + std::to_string(id) + " are both " + quoted(pieces[i]));
    }
    auto normal = [&](int32_t id) { return types[static_cast<size_t>(id)] == TOKEN_NORMAL; };

    for (int b = 0; b < 256; ++b) {
        const auto it = by_text.find(byte_level_char(static_cast<uint8_t>(b)));
        enc->byte_token_[b] = it != by_text.end() && normal(it->second) ? it->second : -1;
    }

    enc->merges_ = std::make_unique<MergeTable>(merges.size());
    std::string joined;
    for (size_t rank = 0; rank < merges.size(); ++rank) {
        const std::string &merge = merges[rank];
        const std::string where = "merge " + std::to_string(rank) + " (" + quoted(merge) + ")";
        // As llama.cpp reads them: the left part ends at the first space after the first byte.
        const size_t space = merge.size() > 1 ? merge.find(' ', 1) : std::string::npos;
        if (space == std::string::npos || space + 1 >= merge.size()) return bad(where + " is not two tokens separated by a space");
        const std::string_view left = std::string_view(merge).substr(0, space), right = std::string_view(merge).substr(space + 1);
        joined.assign(left).append(right);
        int32_t ids[3];
        const std::string_view parts[3] = {left, right, joined};
        const char *roles[3] = {"left part", "right part", "result"};
        for (int k = 0; k < 3; ++k) {
            const auto it = by_text.find(parts[k]);
            if (it == by_text.end()) return bad(where + ": its " + roles[k] + " " + quoted(parts[k]) + " is not a token");
            if (!normal(it->second))
                return bad(where + ": its " + roles[k] + " is token " + std::to_string(it->second) + " of type " +
                           std::to_string(types[static_cast<size_t>(it->second)]) + ", not a normal token");
            ids[k] = it->second;
        }
        enc->merges_->insert(ids[0], ids[1], static_cast<int32_t>(rank), ids[2]);
    }
    enc->n_merges_ = merges.size();

    if (pretokenizer->ignore_merges()) {
        std::vector<std::pair<size_t, size_t>> spans(pieces.size(), {0, 0});
        for (size_t i = 0; i < pieces.size(); ++i) {
            if (!normal(static_cast<int32_t>(i))) continue;
            const std::string bytes = byte_level_decode(pieces[i]);
            spans[i] = {enc->word_bytes_.size(), bytes.size()};
            enc->word_bytes_ += bytes;
        }
        enc->token_by_bytes_.reserve(pieces.size());
        for (size_t i = 0; i < pieces.size(); ++i) {
            if (spans[i].second == 0) continue;
            enc->token_by_bytes_.emplace(std::string_view(enc->word_bytes_).substr(spans[i].first, spans[i].second),
                                         static_cast<int32_t>(i));
        }
    }
    enc->pretokenizer_ = std::move(pretokenizer);
    enc->unk_ = unk;
    *out = std::move(enc);
    return Status::Ok();
}

Status BytePairEncoder::encode(std::string_view text, std::vector<int32_t> *out) const {
    Scratch scratch;
    H2O_TRY(pretokenizer_->split(text, &scratch.words));
    for (std::string_view word : scratch.words) H2O_TRY(encode_word(word, scratch, out));
    return Status::Ok();
}

Status BytePairEncoder::encode_word(std::string_view word, Scratch &s, std::vector<int32_t> *out) const {
    auto emit = [&](int32_t id, size_t at) -> Status {
        if (id >= 0) {
            out->push_back(id);
        } else if (unk_ >= 0) {
            out->push_back(unk_);
        } else {
            char hex[8];
            std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned char>(word[at]));
            return make_error(H2O_ERR_TOKENIZER, std::string("the vocabulary has no token for the byte ") + hex + " and no unknown token");
        }
        return Status::Ok();
    };
    if (word.size() == 1) return emit(byte_token_[static_cast<unsigned char>(word[0])], 0);
    if (!token_by_bytes_.empty()) {
        const auto it = token_by_bytes_.find(word);
        if (it != token_by_bytes_.end()) {
            out->push_back(it->second);
            return Status::Ok();
        }
    }

    const auto n = static_cast<int32_t>(word.size());
    auto &symbols = s.symbols;
    auto &queue = s.queue;
    symbols.resize(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i)
        symbols[static_cast<size_t>(i)] = {byte_token_[static_cast<unsigned char>(word[static_cast<size_t>(i)])], i - 1,
                                           i + 1 < n ? i + 1 : -1};
    queue.clear();
    const auto greater = std::greater<Scratch::Candidate>();
    auto consider = [&](int32_t left) {
        const Scratch::Symbol &l = symbols[static_cast<size_t>(left)];
        if (l.next < 0) return;
        const Scratch::Symbol &r = symbols[static_cast<size_t>(l.next)];
        if (const MergeTable::Slot *m = merges_->find(l.id, r.id)) {
            queue.push_back({m->rank, left, l.id, r.id, m->result});
            std::push_heap(queue.begin(), queue.end(), greater);
        }
    };
    for (int32_t i = 0; i + 1 < n; ++i) consider(i);

    while (!queue.empty()) {
        std::pop_heap(queue.begin(), queue.end(), greater);
        const Scratch::Candidate c = queue.back();
        queue.pop_back();
        Scratch::Symbol &l = symbols[static_cast<size_t>(c.left)];
        // A merged token's text is longer than either part, so an unchanged id means an
        // unchanged symbol: the pair is current exactly when both ids still match.
        if (l.id != c.left_id || l.next < 0) continue;
        Scratch::Symbol &r = symbols[static_cast<size_t>(l.next)];
        if (r.id != c.right_id) continue;
        l.id = c.result;
        l.next = r.next;
        if (r.next >= 0) symbols[static_cast<size_t>(r.next)].prev = c.left;
        r.id = Scratch::kMerged;
        if (l.prev >= 0) consider(l.prev);
        consider(c.left);
    }
    // The first symbol is never joined into a left neighbour: the chain starts at 0.
    for (int32_t i = 0; i >= 0; i = symbols[static_cast<size_t>(i)].next)
        H2O_TRY(emit(symbols[static_cast<size_t>(i)].id, static_cast<size_t>(i)));
    return Status::Ok();
}

}  // namespace h2o
