// The Vulkan backend's row operations other than matmul (vk_backend.h): rms_norm, rope,
// the element-wise operations and argmax.
#include "vulkan/vk_backend.h"

namespace h2o {

namespace {

constexpr uint32_t kRopeGroup = 64;

struct ArgmaxPush {
    uint32_t in_off, out_off, cols;
};

struct RmsNormPush {
    uint32_t in_off, weight_off, out_off, cols;
    float eps;
};
struct RopePush {
    uint32_t q_off, k_off, pos_off, table_off, n_head, n_head_kv, head_dim, pairs, n, q_stride, k_stride;
    uint32_t pos_head_stride;  // 0: one position per token; n: n per kv head, kv head after kv head
    uint32_t pairing;          // RotaryPairing
    float magnitude;           // RotarySpec::magnitude
};
struct ElementwisePush {
    uint32_t a_off, b_off, count;
    uint32_t b_cols;  // add_bias: b is one row of this many
    float value;      // scale, softcap
};

// Per rotary pair i, its inverse frequency (RotarySpec::inv_freq) in turns as a 64-bit
// fixed-point fraction (rotary.glsl). The frequency is computed exactly as the CPU reference
// computes it, in double precision.
std::vector<uint64_t> rope_turn_fractions(const RotarySpec &rope) {
    std::vector<uint64_t> table(static_cast<size_t>(rope.pairs()));
    const long double two_pi = 6.283185307179586476925286766559L;
    for (size_t i = 0; i < table.size(); ++i) {
        const double freq = rope.inv_freq(static_cast<int>(i));
        long double turns = static_cast<long double>(freq) / two_pi;
        turns -= std::floor(turns);
        const long double scaled = std::ldexp(turns, 64);
        table[i] = scaled >= 18446744073709551615.0L ? 0 : static_cast<uint64_t>(scaled + 0.5L);
    }
    return table;
}

}  // namespace

Status VulkanBackend::rms_norm(const Tensor &out, const Tensor &in, const Tensor &weight, int n, float eps) {
    if (failed() || n <= 0) return error_;
    const Bound w = bind(weight, false);
    // One workgroup a row, at most 65535 rows a dispatch (the per-head norms of a batch have
    // tokens x heads rows).
    constexpr int kRowsPerDispatch = 65535;
    for (int r0 = 0; r0 < n; r0 += kRowsPerDispatch) {
        const int count = std::min(kRowsPerDispatch, n - r0);
        const Bound i = bind(in.slice_rows(r0, count), false);
        const Bound o = bind(out.slice_rows(r0, count), true);
        const RmsNormPush push{i.word, w.word, o.word, static_cast<uint32_t>(in.cols), eps};
        dispatch(reduction_kernel("rms_norm"), {i, w, o}, &push, sizeof push, static_cast<uint32_t>(count));
    }
    return error_;
}

void VulkanBackend::ensure_rope_table(int slot, const RotarySpec &rope) {
    if (rope_spec_[slot] == rope) return;
    const std::vector<uint64_t> table = rope_turn_fractions(rope);
    record_upload(block(rope_table_).buffer, rope_table_.offset + slot * kRopeTablePairs * sizeof(uint64_t), table.data(),
                  table.size() * sizeof(uint64_t));
    rope_spec_[slot] = rope;
}

int VulkanBackend::rope_slot(const RotarySpec &rope) {
    int slot = rope_spec_[last_forward_slot_] == rope ? last_forward_slot_ : 2 - last_forward_slot_;
    ensure_rope_table(slot, rope);
    last_forward_slot_ = slot;
    return slot;
}

Status VulkanBackend::rope(const Tensor &q, const Tensor &k, const Tensor &positions, int n, const ModelShape &shape, bool per_kv_head) {
    const int pairs = shape.rope.pairs();
    if (failed() || n <= 0 || pairs <= 0) return error_;
    if (pairs > static_cast<int>(kRopeTablePairs)) {
        fail("rotary dimensions " + std::to_string(shape.rope.dims) + " are more than supported (" + std::to_string(2 * kRopeTablePairs) +
                 ")",
             H2O_ERR_INTERNAL);
        return error_;
    }
    const int slot = rope_slot(shape.rope);
    const Bound bq = bind(q, true);
    const Bound bk = bind(k, true);
    const Bound bp = bind(positions, false);
    const Bound bt = bind(rope_table_, false);
    const RopePush push{bq.word,
                        bk.word,
                        bp.word,
                        bt.word / 2 + static_cast<uint32_t>(slot) * kRopeTablePairs,
                        static_cast<uint32_t>(shape.n_head),
                        static_cast<uint32_t>(shape.n_head_kv),
                        static_cast<uint32_t>(shape.head_dim),
                        static_cast<uint32_t>(pairs),
                        static_cast<uint32_t>(n),
                        static_cast<uint32_t>(q.cols),
                        static_cast<uint32_t>(k.cols),
                        per_kv_head ? static_cast<uint32_t>(n) : 0u,
                        static_cast<uint32_t>(shape.rope.pairing),
                        shape.rope.magnitude};
    uint32_t gx, gy;
    grid_1d(static_cast<uint64_t>(n) * (shape.n_head + shape.n_head_kv) * pairs, kRopeGroup, &gx, &gy);
    dispatch("rope", {bq, bk, bp, bt}, &push, sizeof push, gx, gy);
    return error_;
}

Status VulkanBackend::swiglu(const Tensor &gate, const Tensor &up, int n) { return elementwise("swiglu", gate, up, n); }

Status VulkanBackend::geglu(const Tensor &gate, const Tensor &up, int n) { return elementwise("geglu", gate, up, n); }

// The one-operand operations bind x as both operands (b unread).
Status VulkanBackend::scale(const Tensor &x, float factor, int n) { return elementwise("scale", x, x, n, factor); }

Status VulkanBackend::softcap(const Tensor &x, float cap, int n) { return elementwise("softcap", x, x, n, cap); }

Status VulkanBackend::add(const Tensor &acc, const Tensor &x, int n) { return elementwise("add", acc, x, n); }

Status VulkanBackend::add_bias(const Tensor &acc, const Tensor &bias, int n) { return elementwise("add_bias", acc, bias, n); }

Status VulkanBackend::argmax(const Tensor &out, const Tensor &in, int n) {
    if (failed() || n <= 0) return error_;
    const Bound i = bind(in, false);
    const Bound o = bind(out, true);
    const ArgmaxPush push{i.word, o.word, static_cast<uint32_t>(in.cols)};
    dispatch(reduction_kernel("argmax"), {i, o}, &push, sizeof push, static_cast<uint32_t>(n));
    return error_;
}

// out[t] = op(out[t], in[t]) over the first n rows: the shaders of elementwise.comp.
Status VulkanBackend::elementwise(const char *pipeline, const Tensor &out, const Tensor &in, int n, float value) {
    if (failed() || n <= 0) return error_;
    const uint64_t count = static_cast<uint64_t>(out.cols) * n;
    const Bound a = bind(out, true);
    const Bound b = bind(in, false);
    const ElementwisePush push{a.word, b.word, static_cast<uint32_t>(count), static_cast<uint32_t>(in.cols), value};
    uint32_t gx, gy;
    grid_1d(count, kElementwiseGroup, &gx, &gy);
    dispatch(pipeline, {a, b}, &push, sizeof push, gx, gy);
    return error_;
}

}  // namespace h2o
