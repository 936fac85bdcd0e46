// Streaming writer of synthetic models: tensors are generated chunk by chunk in parallel (oneTBB)
// into a batch buffer, and each batch is written while the next one is generated.
#include "core/models/synth.h"

#include <tbb/blocked_range.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <future>
#include <vector>

#include "core/gguf_writer.h"
#include "core/models/synth_model.h"

namespace moe {
namespace {

using synth::Config;
using synth::Init;
using synth::TensorSpec;

// Bytes generated before a batch is handed to the writer. Two batches are alive at once (one being
// written, one being generated), so memory stays ~2x this whatever the model size.
constexpr size_t kBatchBytes = size_t{32} << 20;

// Removes the temporary file unless the write succeeded.
class RemoveOnFailure {
public:
    explicit RemoveOnFailure(std::string path) : path_(std::move(path)) {}
    ~RemoveOnFailure() {
        if (armed_) std::remove(path_.c_str());
    }
    RemoveOnFailure(const RemoveOnFailure&) = delete;
    RemoveOnFailure& operator=(const RemoveOnFailure&) = delete;
    void disarm() { armed_ = false; }

private:
    std::string path_;
    bool armed_ = true;
};

struct Progress {
    moe_progress_fn fn = nullptr;
    void* user = nullptr;
};

// The progress fields, if the caller's struct has them.
Progress progress_of(const moe_synth_params& p) {
    Progress pr;
    if (p.struct_size >= offsetof(moe_synth_params, progress) + sizeof p.progress) pr.fn = p.progress;
    if (p.struct_size >= offsetof(moe_synth_params, progress_user_data) + sizeof p.progress_user_data) {
        pr.user = p.progress_user_data;
    }
    return pr;
}

class Generator {
public:
    Generator(const Config& c, GgufWriter& w, Progress pr, uint64_t total_bytes)
        : c_(c), w_(w), pr_(pr), total_(total_bytes) {}

    ~Generator() {
        // A write in flight uses the writer and a buffer: let it end before they go.
        if (pending_.valid()) pending_.wait();
    }

    Status write_tensor(const TensorSpec& t) {
        const TypeTraits& tt = traits(t.type);
        const int64_t len = t.row_len();
        const int64_t rows = t.n_rows();
        const int64_t cr = synth::chunk_rows(t);
        const int64_t n_chunks = (rows + cr - 1) / cr;
        const uint64_t row_b = row_bytes(t.type, len);
        const int64_t chunks_per_batch =
            std::max<int64_t>(1, static_cast<int64_t>(kBatchBytes / (row_b * static_cast<uint64_t>(cr))));
        const bool routed = t.init == Init::ROUTER || t.init == Init::ROUTER_BIAS || t.init == Init::SELECTION_BIAS;
        const std::vector<int> ranks = routed ? synth::expert_ranks(c_.seed, t.layer, c_.n_expert) : std::vector<int>();

        for (int64_t c0 = 0; c0 < n_chunks; c0 += chunks_per_batch) {
            const int64_t c1 = std::min(n_chunks, c0 + chunks_per_batch);
            const int64_t row_begin = c0 * cr;
            const int64_t row_end = std::min(rows, c1 * cr);
            std::vector<uint8_t>& buf = bufs_[next_];
            buf.resize(static_cast<size_t>(row_b) * static_cast<size_t>(row_end - row_begin));
            // Each chunk is a function of (seed, tensor, chunk index) only: same bytes for any thread count.
            tbb::parallel_for(tbb::blocked_range<int64_t>(c0, c1, 1), [&](const tbb::blocked_range<int64_t>& r) {
                std::vector<float>& scratch = scratch_.local();
                for (int64_t ci = r.begin(); ci != r.end(); ++ci) {
                    const int64_t row0 = ci * cr;
                    const int64_t nr = std::min(cr, rows - row0);
                    scratch.resize(static_cast<size_t>(nr * len));
                    synth::fill_rows(c_, t, ranks, row0, nr, scratch.data());
                    tt.from_float(scratch.data(), buf.data() + static_cast<size_t>(row0 - row_begin) * row_b, nr * len);
                }
            });
            MOE_RETURN_IF_ERROR(hand_to_writer(buf));
            next_ ^= 1;
            done_ += buf.size();
            if (pr_.fn != nullptr) {
                const float f =
                    total_ > 0 ? static_cast<float>(static_cast<double>(done_) / static_cast<double>(total_)) : 1.0f;
                if (pr_.fn(f, pr_.user) == 0) {
                    return cancelled("writing a synthetic model: cancelled by the progress callback at " +
                                     std::to_string(static_cast<int>(f * 100.0f)) + "%");
                }
            }
        }
        return Status::ok();
    }

    // Waits for the last write.
    Status drain() {
        if (!pending_.valid()) return Status::ok();
        return pending_.get();
    }

private:
    // Waits for the previous batch's write (whose buffer the next batch reuses after this one),
    // then starts writing `buf` in the background.
    Status hand_to_writer(const std::vector<uint8_t>& buf) {
        MOE_RETURN_IF_ERROR(drain());
        pending_ = std::async(std::launch::async, [this, &buf] { return w_.append(buf.data(), buf.size()); });
        return Status::ok();
    }

    const Config& c_;
    GgufWriter& w_;
    Progress pr_;
    uint64_t total_;
    uint64_t done_ = 0;
    std::vector<uint8_t> bufs_[2];
    int next_ = 0;
    tbb::enumerable_thread_specific<std::vector<float>> scratch_;
    std::future<Status> pending_;  // declared last: destroyed (waited for) before the buffers
};

}  // namespace

Status synth_write(const std::string& path, const moe_synth_params& p) {
    MOE_ASSIGN_OR_RETURN(const Config c, synth::resolve_config(p));
    if (path.empty()) return invalid_argument("path: must not be empty");

    std::vector<TensorSpec> tensors = c.arch == Arch::GPT_OSS     ? synth::gpt_oss_tensors(c)
                                      : c.arch == Arch::DEEPSEEK2 ? synth::deepseek2_tensors(c)
                                      : c.arch == Arch::GLM4MOE   ? synth::glm4moe_tensors(c)
                                                                  : synth::qwen3moe_tensors(c);
    synth::apply_recipe(c, tensors);
    GgufWriter w;
    synth::common_metadata(w, c);
    if (c.arch == Arch::GPT_OSS) {
        synth::gpt_oss_metadata(w, c);
    } else if (c.arch == Arch::DEEPSEEK2) {
        synth::deepseek2_metadata(w, c);
    } else if (c.arch == Arch::GLM4MOE) {
        synth::glm4moe_metadata(w, c);
    } else {
        synth::qwen3moe_metadata(w, c);
    }
    uint64_t total = 0;  // tensor bytes, for progress fractions
    for (const TensorSpec& t : tensors) {
        w.add_tensor(t.name, t.type, t.ne);
        total += row_bytes(t.type, t.row_len()) * static_cast<uint64_t>(t.n_rows());
    }

    const std::string tmp = path + ".tmp";
    RemoveOnFailure cleanup(tmp);
    const std::string context = "writing synthetic model '" + path + "'";
    Status s = w.begin(tmp);
    {
        Generator g(c, w, progress_of(p), total);
        for (size_t i = 0; s.is_ok() && i < tensors.size(); ++i) s = g.write_tensor(tensors[i]);
        const Status last = g.drain();
        if (s.is_ok()) s = last;
    }
    if (s.is_ok()) s = w.finish();
    if (!s.is_ok()) return s.code() == MOE_STATUS_CANCELLED ? s : s.with_context(context);
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        return io_error(context + ": renaming '" + tmp + "' to '" + path + "': " + std::strerror(errno));
    }
    cleanup.disarm();
    return Status::ok();
}

}  // namespace moe
