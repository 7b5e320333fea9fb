// A batch's partial attention statistics as the CPU kernels take them (kernels.h's
// add_query_stats): plain data that the portable and the SIMD kernel files share.
#pragma once

namespace h2o::cpu {

// kv_policy_spec.h's SlotStats, field by field: n slots each.
struct QueryStats {
    float *accumulated, *squared, *steps, *last, *persistence;
};

}  // namespace h2o::cpu
