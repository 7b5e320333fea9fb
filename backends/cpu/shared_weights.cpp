#include "cpu/shared_weights.h"

#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "cpu/kernels.h"
#include "tensor_types.h"

namespace h2o::cpu {

namespace {

using Key = std::tuple<const void *, TensorType, int64_t, int64_t>;  // the file's bytes, type, rows, cols

struct Registry {
    std::mutex mutex;
    std::map<Key, std::weak_ptr<const uint8_t>> copies;
};

Registry &registry() {
    static Registry r;
    return r;
}

}  // namespace

Status shared_interleaved(TensorType type, const void *file_data, int64_t rows, int64_t cols, std::shared_ptr<const uint8_t> *out) {
    Registry &r = registry();
    // Held while copying, so that two sessions created at once make one copy between them.
    std::lock_guard<std::mutex> lock(r.mutex);
    const Key key{file_data, type, rows, cols};
    auto found = r.copies.find(key);
    if (found != r.copies.end()) {
        if (std::shared_ptr<const uint8_t> existing = found->second.lock()) {
            *out = std::move(existing);
            return Status::Ok();
        }
    }
    // Forget the copies of models no session uses any more, so that a process loading many models
    // over its life does not collect their keys.
    for (auto it = r.copies.begin(); it != r.copies.end();) it = it->second.expired() ? r.copies.erase(it) : std::next(it);
    const size_t bytes = interleaved_bytes(type, rows, cols);
    auto *copy = static_cast<uint8_t *>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
    if (!copy) return make_error(H2O_ERR_OUT_OF_MEMORY, "cannot allocate " + std::to_string(bytes) + " bytes of weights");
    interleave_rows(type, file_data, copy, rows, cols);
    std::shared_ptr<const uint8_t> shared(copy, [](const uint8_t *p) { std::free(const_cast<uint8_t *>(p)); });
    r.copies[key] = shared;
    *out = std::move(shared);
    return Status::Ok();
}

}  // namespace h2o::cpu
