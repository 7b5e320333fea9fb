#include "reuse_policy.h"

namespace h2o_server {

size_t reuse_category(bool named, uint32_t turns) {
    const size_t by_turns = turns <= 1 ? 0 : turns <= 3 ? 1 : 2;
    return (named ? 3 : 0) + by_turns;
}

const char *reuse_category_name(size_t category) {
    static const char *const kNames[kReuseCategories] = {"unnamed, 1 turn",  "unnamed, 2-3 turns", "unnamed, 4+ turns",
                                                         "named, 1 turn",    "named, 2-3 turns",   "named, 4+ turns"};
    return category < kReuseCategories ? kNames[category] : "?";
}

}  // namespace h2o_server
