// llama.cpp's tokenizer test vectors (../shared/vocab/ggml-vocab-*.gguf.inp / .out).
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace h2o_test {

struct TokenizerVectors {
    std::vector<std::string> inputs;
    std::vector<std::vector<int32_t>> ids;  // without BOS, special tokens not parsed
    bool complete = false;                  // the .inp file ends right after its last separator
};

// Every input is written followed by "\n__ggml_vocab_test__\n": the newline before the marker
// belongs to the separator, so an input may itself be empty or end in newlines. The .out file has
// one line of space-separated ids per input.
inline TokenizerVectors read_tokenizer_vectors(const std::string &inp_path, const std::string &out_path) {
    TokenizerVectors v;
    const std::string inp = read_text_file(inp_path);
    const std::string separator = "\n__ggml_vocab_test__\n";
    size_t pos = 0;
    for (size_t next; (next = inp.find(separator, pos)) != std::string::npos; pos = next + separator.size())
        v.inputs.push_back(inp.substr(pos, next - pos));
    v.complete = pos == inp.size();
    std::istringstream out(read_text_file(out_path));
    for (std::string line; std::getline(out, line);) {
        std::istringstream ids(line);
        v.ids.emplace_back();
        for (int32_t id; ids >> id;) v.ids.back().push_back(id);
    }
    return v;
}

// A test input as a quoted line: newlines, tabs, carriage returns, quotes and backslashes escaped.
inline std::string escape_text(const std::string &text) {
    std::string s = "\"";
    for (char c : text) {
        if (c == '\n')
            s += "\\n";
        else if (c == '\t')
            s += "\\t";
        else if (c == '\r')
            s += "\\r";
        else if (c == '"' || c == '\\')
            s += std::string("\\") + c;
        else
            s += c;
    }
    return s + "\"";
}

inline std::string ids_to_string(const std::vector<int32_t> &ids) {
    std::string s;
    for (int32_t id : ids) s += " " + std::to_string(id);
    return s;
}

}  // namespace h2o_test
