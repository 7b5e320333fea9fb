// The chat page h2o-server serves at / (tools/server/page: one HTML page and its script, compiled
// into the program, so that it works offline and fetches nothing but the server's own endpoints).
#pragma once

#include <cstddef>
#include <string>

namespace h2o_server {

struct PageFile {
    const char *url_path;      // "/" or "/chat.js"
    const char *content_type;  // with its charset
    const unsigned char *bytes;
    size_t size;
};

// The page's file at url_path, or nullptr.
const PageFile *find_page_file(const std::string &url_path);

}  // namespace h2o_server
