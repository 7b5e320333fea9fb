// The internal compute-backend interface. The model graph (model.cpp) is written once against it;
// each backend (CPU reference, Vulkan, CUDA) implements the operations on memory it owns.
//
// Tensors are descriptors of backend memory, never host pointers, so a GPU backend can keep
// weights, activations, the KV cache and its eviction statistics resident on the device. Only
// upload() and download() move data between the host and the backend.
//
// A backend may execute operations as they are issued (CPU) or record them and execute at
// synchronize() (GPU). Operations issued on one backend execute in order.
//
// Every operation returns a status. A device error (allocation, submission, a lost device, a
// kernel launch) is H2O_ERR_BACKEND_FAILED with a message naming it, returned by the operation
// that meets it (for a recording backend: the one that submits, such as download) and by every
// later one: a failed backend stays failed, and the session that owns it refuses work until it
// is reset, which builds a new backend. No operation ever reports success with output it did not
// compute (a failed download leaves the destination's contents unspecified and says so).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "byte_io.h"
#include "kv_config.h"
#include "kv_store.h"
#include "kv_format.h"
#include "kv_policy.h"
#include "model_shape.h"
#include "status.h"
#include "tensor_types.h"

namespace h2o {

// A region of backend memory holding a matrix of `rows` rows of `cols` elements of `type`,
// rows contiguous. `buffer` is the backend's own handle (the CPU backend: a host address).
struct Tensor {
    uintptr_t buffer = 0;
    size_t offset = 0;
    TensorType type = TensorType::F32;
    int64_t cols = 0;
    int64_t rows = 0;

    size_t bytes() const { return row_bytes(type, cols) * static_cast<size_t>(rows); }
    // The rows [first, first + count) of this tensor.
    Tensor slice_rows(int64_t first, int64_t count) const {
        Tensor t = *this;
        t.offset += row_bytes(type, cols) * static_cast<size_t>(first);
        t.rows = count;
        return t;
    }
    // The same memory seen as rows of `new_cols` elements (an F32 or I32 tensor whose rows split
    // evenly into them): [n tokens x n_head * head_dim] as [n * n_head heads x head_dim].
    Tensor with_cols(int64_t new_cols) const {
        Tensor t = *this;
        t.rows = rows * cols / new_cols;
        t.cols = new_cols;
        return t;
    }
};

// The tokens of one batch are consecutive in the stream: token t has stream index
// first_index + t and rotary position positions[t] (its rank in the cache when rolling), or in
// kv head h's cell positions[h * n_tokens + t] when positions_per_kv_head.
struct AttentionBatch {
    int n_tokens = 0;
    int64_t first_index = 0;
    Tensor positions;  // I32, one per token, or n_tokens per kv head
    uint8_t tag = 0;   // the batch's tokens' retention tag (kv_make_tag): pinned, retention span
    bool positions_per_kv_head = false;
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual const char *name() const = 0;

    // ---- memory -------------------------------------------------------------------------
    // Allocates a tensor of rows × cols elements. Errors: H2O_ERR_OUT_OF_MEMORY.
    virtual Status alloc(TensorType type, int64_t cols, int64_t rows, Tensor *out) = 0;
    // Makes a weight tensor available to the backend. `host_data` stays valid and unchanged for
    // the backend's lifetime (it points into the mapped model file), so a host backend may use it
    // in place, and copies made from it may be shared by every backend adopting the same bytes.
    virtual Status adopt_weight(TensorType type, int64_t cols, int64_t rows, const void *host_data, Tensor *out) = 0;
    // Whether the backend keeps its own copy of an adopted weight and never reads its host_data
    // again, so the model may let the OS drop those pages of the mapped file.
    virtual bool weight_is_copy(const Tensor &weight) const { return false; }
    virtual Status upload(const Tensor &dst, const void *src, size_t bytes) = 0;
    virtual Status download(const Tensor &src, void *dst, size_t bytes) = 0;
    // Waits until every issued operation has finished.
    virtual Status synchronize() = 0;
    // Bytes the backend has allocated (weights adopted in place are not counted).
    virtual size_t allocated_bytes() const = 0;

    // Data moved between the host and a device backend since creation. A host backend moves
    // nothing and reports zeros.
    struct Traffic {
        uint64_t bytes_to_device = 0, bytes_to_host = 0, submissions = 0, device_memory_bytes = 0;
    };
    virtual Traffic traffic() const { return {}; }

    // ---- operations (all tensors F32 unless stated) -------------------------------------------
    // out[t] = row ids[t] of `table` (any weight type), dequantized. ids: I32.
    virtual Status get_rows(const Tensor &out, const Tensor &table, const Tensor &ids, int n) = 0;
    // out[t] = in[t] / rms(in[t]) * weight, for the first n rows.
    virtual Status rms_norm(const Tensor &out, const Tensor &in, const Tensor &weight, int n, float eps) = 0;
    // out[t] = W · in[t] for the first n rows of in; W is a weight tensor [rows_out × cols].
    virtual Status matmul(const Tensor &out, const Tensor &weight, const Tensor &in, int n) = 0;
    // outs[i] = weights[i] · in for i < count (at most kMaxMatmulsOfOneInput): products of one
    // input (a layer's q, k and v; its gate and up) that a backend may run together. Each out has
    // what matmul gives it. By default, one after the other.
    static constexpr int kMaxMatmulsOfOneInput = 3;
    virtual Status matmuls(const Tensor *outs, const Tensor *weights, int count, const Tensor &in, int n) {
        for (int i = 0; i < count; ++i) H2O_TRY(matmul(outs[i], weights[i], in, n));
        return Status::Ok();
    }
    // Rotates the first shape.rope.dims of each head of q (n_head heads) and k (n_head_kv heads)
    // in place, for the first n rows, by `positions` (I32): n of them, or with per_kv_head n per kv
    // head, kv head after kv head (a query head takes its kv head's). Pairs and frequencies as
    // shape.rope says (rotary_spec.h).
    virtual Status rope(const Tensor &q, const Tensor &k, const Tensor &positions, int n, const ModelShape &shape, bool per_kv_head) = 0;
    // gate[t] = silu(gate[t]) * up[t].
    virtual Status swiglu(const Tensor &gate, const Tensor &up, int n) = 0;
    // Gemma's operations: gate[t] = gelu(gate[t]) * up[t] (GELU's tanh approximation,
    // activation.h); x[t] *= factor; x[t] = soft_cap(x[t], cap). For the first n rows.
    virtual Status geglu(const Tensor &gate, const Tensor &up, int n) = 0;
    virtual Status scale(const Tensor &x, float factor, int n) = 0;
    virtual Status softcap(const Tensor &x, float cap, int n) = 0;
    // acc[t] += x[t].
    virtual Status add(const Tensor &acc, const Tensor &x, int n) = 0;
    // acc[t] += bias (one row of acc.cols, F32), for the first n rows: a projection's bias.
    virtual Status add_bias(const Tensor &acc, const Tensor &bias, int n) = 0;
    // out[t] (I32) = greedy_index (sampler.h) of in[t]: the first of its largest elements, NaNs
    // passed over (a row of NaNs: 0), for the first n rows: greedy sampling where the logits are.
    virtual Status argmax(const Tensor &out, const Tensor &in, int n) = 0;

    // ---- KV cache and attention ---------------------------------------------------------------
    // The backend's KV cache (kv_store.h), in the memory the backend owns.
    virtual KvStore &kv_store() = 0;
    // For each kv head of `layer`: if fewer than n slots are free, evicts victims by the policy
    // (kv_policy.h) until n are; stores the batch's k and v in free slots; then computes causal
    // attention of q over the occupied slots (a slot is visible to a query when its stream index
    // is not after the query's, and in a local layer, shape.is_local, less than
    // shape.sliding_window before it), the scores q·k times shape.attention_scale (0: head_dim^-1/2)
    // and soft-capped by shape.attention_softcap, writing out [n × n_head*head_dim], and updates
    // the visible slots' statistics. The caller guarantees that n slots can be freed (pinned tokens and span
    // minimums excepted).
    virtual Status attention(const Tensor &out, const Tensor &q, const Tensor &k, const Tensor &v, int layer, const AttentionBatch &batch,
                             const ModelShape &shape) = 0;
};

}  // namespace h2o
