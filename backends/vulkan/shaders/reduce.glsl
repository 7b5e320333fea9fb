// Workgroup-wide sum and max of one float per invocation; every invocation gets the result.
// Needs WG (the workgroup size, a power of two) defined, and must be reached by the whole
// workgroup (uniform control flow), since it contains barriers.

shared float reduce_scratch[WG];

#ifdef USE_SUBGROUPS
// One subgroup operation, then the per-subgroup partials through shared memory. gl_NumSubgroups
// is small (WG / subgroup size), so every invocation adds them up itself.
float workgroup_sum(float v) {
    v = subgroupAdd(v);
    if (subgroupElect()) reduce_scratch[gl_SubgroupID] = v;
    barrier();
    float total = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; ++i) total += reduce_scratch[i];
    barrier();  // the scratch is free for the next reduction
    return total;
}

float workgroup_max(float v) {
    v = subgroupMax(v);
    if (subgroupElect()) reduce_scratch[gl_SubgroupID] = v;
    barrier();
    float best = reduce_scratch[0];
    for (uint i = 1; i < gl_NumSubgroups; ++i) best = max(best, reduce_scratch[i]);
    barrier();
    return best;
}
#else
// Tree reduction in shared memory: log2(WG) steps.
float workgroup_sum(float v) {
    const uint i = gl_LocalInvocationIndex;
    reduce_scratch[i] = v;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (i < s) reduce_scratch[i] += reduce_scratch[i + s];
        barrier();
    }
    const float total = reduce_scratch[0];
    barrier();
    return total;
}

float workgroup_max(float v) {
    const uint i = gl_LocalInvocationIndex;
    reduce_scratch[i] = v;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (i < s) reduce_scratch[i] = max(reduce_scratch[i], reduce_scratch[i + s]);
        barrier();
    }
    const float best = reduce_scratch[0];
    barrier();
    return best;
}
#endif
