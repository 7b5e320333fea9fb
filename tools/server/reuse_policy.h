// The server's side of the cache policy (lib/util/cache_policy.h): which idle conversation gives
// up its session (or, past the state directory's bounds, its file) when the server needs room,
// by the categories a server tells conversations apart by.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cache_policy.h"

namespace h2o_server {

using h2o::cache_policy_name;
using h2o::CacheCandidate;
using h2o::CachePolicy;
using h2o::give_up_order;
using h2o::parse_cache_policy;

// What an idle conversation's reuse depends on, as the server sees it: whether its client names
// it (the conversation_id extension: a client that files conversations comes back to them, a
// one-shot request does not) and how many replies it has had (1, 2-3, 4 or more).
constexpr size_t kReuseCategories = 6;
size_t reuse_category(bool named, uint32_t turns);
const char *reuse_category_name(size_t category);

// The estimate of conversations' reuse, over those categories.
class ReuseEstimator : public h2o::ReuseEstimator {
public:
    ReuseEstimator() : h2o::ReuseEstimator(kReuseCategories) {}
};

}  // namespace h2o_server
