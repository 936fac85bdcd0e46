// Host-resident weights of a device context, used in place from the model's bytes (the file mapping,
// or the file read into memory) instead of a pinned copy: a 100-400 GB model then needs its file's
// size in RAM, not twice that. The ranges the weights cover are page-locked with the device
// (Backend::register_host) in runs of adjacent tensors, so that uploads from them are as fast as from
// pinned memory; a run the device cannot lock stays pageable (its uploads are staged: slower, same
// results).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/gguf.h"

namespace moe {

struct HostRange {
    const void* data = nullptr;
    size_t n = 0;
};

class HostWeights {
public:
    // Page-locks the pages under `ranges` with `device`: the ranges, widened to whole pages, are
    // merged where they touch or overlap and each run is registered once. When the bytes are `file`'s
    // mapping, each run's file pages are first replaced by anonymous memory in place
    // (GgufFile::make_anonymous: the driver locks a file mapping far too slowly), on
    // convert_threads(n_threads) threads, the next run while this thread locks the one before.
    // progress(bytes) is called on this thread only: as a run's bytes are read, and when it is locked;
    // an error from it stops and is returned. A run that cannot be replaced or that the device refuses
    // is left pageable (first_refusal() says why).
    static StatusOr<HostWeights> register_ranges(Backend& device, std::span<const HostRange> ranges, GgufFile& file,
                                                 int n_threads, const std::function<Status(uint64_t)>& progress);
    // Threads that read the weights into anonymous memory for a context of n_threads (0 = all cores):
    // at most 8, where reading from the page cache into fresh pages is bound by memory bandwidth rather
    // than by cores, and which leaves cores for the page-locking that runs beside it.
    static int convert_threads(int n_threads);

    // The registration holding [p, p + n), or nullptr where those bytes are pageable.
    Buffer* buffer_of(const void* p, size_t n) const;
    // Bytes of the ranges that are page-locked (each range counted once, without page padding).
    uint64_t locked_bytes() const { return locked_bytes_; }
    // Page-aligned bytes the runs cover, locked or not (what registration has to fault in).
    static uint64_t run_bytes(std::span<const HostRange> ranges);
    // Why the first refused run was refused ("" when none was).
    const std::string& first_refusal() const { return first_refusal_; }

private:
    std::vector<std::unique_ptr<Buffer>> runs_;  // registrations, by address
    uint64_t locked_bytes_ = 0;
    std::string first_refusal_;
};

}  // namespace moe
