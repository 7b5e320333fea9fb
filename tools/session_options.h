// The session options h2o-cli and h2o-bench share: threads, context and the KV cache's shape.
#pragma once

#include <string>

#include "h2o/h2o.h"
#include "options.h"

namespace h2o_tools {

// Declares -t, -c, --kv-budget, --kv-policy, --kv-recent, --kv-prompt-proxy, --kv-head-share,
// --kv-share-across-layers, --rolling, --kv-overflow and --kv-type, stored into *params (which
// must outlive parse()).
void add_session_options(CommandLine &cl, h2o_session_params *params);
// The values a research setting (h2o_experimental.h) accepts, as the library checks them.
Range experimental_range(uint32_t key);
// Their --help lines, with the defaults of `defaults` (h2o_session_params_init's).
std::string session_options_help(const h2o_session_params &defaults);
// After parse(): refuses what would be silently ignored. A cache that never evicts (--kv-overflow
// error without --kv-budget or --rolling) gives the options that shape eviction nothing to do;
// moving slots across layers moves the head share's slots, so it needs one.
void check_session_options(const CommandLine &cl, const h2o_session_params &params);

}  // namespace h2o_tools
