// GgufFile::make_anonymous: mapped file pages replaced in place by anonymous memory (what a device
// context does before page-locking host-resident weights). Checked against the bytes the test wrote
// and against the kernel's own view of the mappings (/proc/self/maps: a file page's line names the
// file, an anonymous one names nothing).
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/gguf.h"
#include "core/gguf_writer.h"
#include "core/host_registry.h"
#include "core/types.h"

namespace {

using moe::GgufFile;

struct Written {
    std::string path;
    std::vector<std::vector<uint8_t>> data;  // per tensor
};

// A file of n_tensors F32 tensors of random bytes, each a few pages long.
Written write_file(const std::string& name, int n_tensors, std::mt19937_64& rng) {
    Written out;
    out.path = std::string(MOE_TEST_TMP_DIR) + "/anonymous_" + name + ".gguf";
    moe::GgufWriter w;
    for (int t = 0; t < n_tensors; ++t) {
        const int64_t cols = 1024, rows = 1 + static_cast<int64_t>(rng() % 200);
        w.add_tensor(std::string("t").append(std::to_string(t)), moe::Type::F32, {cols, rows});  // (GCC 12 false -Wrestrict)
        out.data.emplace_back(static_cast<size_t>(cols * rows * 4));
        for (uint8_t& b : out.data.back()) b = static_cast<uint8_t>(rng());
    }
    REQUIRE(w.begin(out.path).is_ok());
    for (const auto& d : out.data) REQUIRE(w.append(d.data(), d.size()).is_ok());
    REQUIRE(w.finish().is_ok());
    return out;
}

// The pathname /proc/self/maps gives the mapping holding address a ("" for anonymous memory).
std::string mapping_name(uintptr_t a) {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
        std::istringstream in(line);
        std::string range, perms, offset, dev, inode, path;
        in >> range >> perms >> offset >> dev >> inode;
        std::getline(in, path);
        const size_t dash = range.find('-');
        const uintptr_t lo = std::stoull(range.substr(0, dash), nullptr, 16);
        const uintptr_t hi = std::stoull(range.substr(dash + 1), nullptr, 16);
        if (a >= lo && a < hi) return path.erase(0, path.find_first_not_of(' '));
    }
    return "<unmapped>";
}

bool bytes_match(const GgufFile& f, const Written& w) {
    for (size_t t = 0; t < w.data.size(); ++t) {
        const uint8_t* p = f.tensor_data(f.tensors()[t]);
        if (std::memcmp(p, w.data[t].data(), w.data[t].size()) != 0) return false;
    }
    return true;
}

}  // namespace

TEST_CASE("make_anonymous replaces file pages in place, same bytes, ranges merged", "[gguf][anonymous]") {
    std::mt19937_64 rng(Catch::rngSeed());
    const Written w = write_file("basic", 6, rng);
    auto opened = GgufFile::open(w.path, /*use_mmap=*/true);
    REQUIRE(opened.is_ok());
    GgufFile& f = **opened;
    REQUIRE(f.is_mapped());

    const size_t t = rng() % w.data.size();
    const uint8_t* p = f.tensor_data(f.tensors()[t]);
    uintptr_t b = 0, e = 0;
    moe::page_align(p, w.data[t].size(), &b, &e);
    CHECK(mapping_name(b).find("anonymous_basic.gguf") != std::string::npos);

    REQUIRE(f.make_anonymous(b, e).is_ok());
    CHECK(mapping_name(b).empty());
    CHECK(mapping_name(e - 1).empty());
    CHECK(bytes_match(f, w));
    // Again, and a larger range around it: the replaced part is skipped, the rest replaced.
    REQUIRE(f.make_anonymous(b, e).is_ok());
    const auto map_begin = reinterpret_cast<uintptr_t>(f.tensor_data(f.tensors()[0])) / moe::host_page_size() *
                           moe::host_page_size();
    uintptr_t all_b = 0, all_e = 0;
    const uint8_t* last = f.tensor_data(f.tensors().back());
    moe::page_align(last, w.data.back().size(), &all_b, &all_e);
    REQUIRE(f.make_anonymous(map_begin, all_e).is_ok());
    for (uintptr_t a = map_begin; a < all_e; a += moe::host_page_size()) {
        INFO("page at offset " << (a - map_begin));
        REQUIRE(mapping_name(a).empty());
    }
    CHECK(bytes_match(f, w));
    std::remove(w.path.c_str());
}

TEST_CASE("make_anonymous refuses ranges that are not page-aligned parts of the mapping", "[gguf][anonymous]") {
    std::mt19937_64 rng(Catch::rngSeed());
    const Written w = write_file("bad", 2, rng);
    auto opened = GgufFile::open(w.path, true);
    REQUIRE(opened.is_ok());
    GgufFile& f = **opened;
    const size_t page = moe::host_page_size();
    uintptr_t b = 0, e = 0;
    moe::page_align(f.tensor_data(f.tensors()[0]), w.data[0].size(), &b, &e);
    moe::Status s = f.make_anonymous(b + 1, e);
    CHECK(s.code() == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(s.message().find("page-aligned") != std::string::npos);
    CHECK(f.make_anonymous(b - 64 * page, e).code() == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(f.make_anonymous(b, e + (size_t{1} << 30)).code() == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(f.make_anonymous(e, b).is_ok());  // empty: nothing to do
    CHECK(mapping_name(b).find("anonymous_bad.gguf") != std::string::npos);
    CHECK(bytes_match(f, w));

    // A file read into memory is memory of our own already.
    auto read = GgufFile::open(w.path, false);
    REQUIRE(read.is_ok());
    uintptr_t rb = 0, re = 0;
    moe::page_align((*read)->tensor_data((*read)->tensors()[0]), w.data[0].size(), &rb, &re);
    CHECK((*read)->make_anonymous(rb, re).is_ok());
    CHECK(bytes_match(**read, w));
    std::remove(w.path.c_str());
}

TEST_CASE("make_anonymous from several threads while others read the bytes", "[gguf][anonymous]") {
    std::mt19937_64 rng(Catch::rngSeed());
    const Written w = write_file("threads", 8, rng);
    auto opened = GgufFile::open(w.path, true);
    REQUIRE(opened.is_ok());
    GgufFile& f = **opened;
    std::atomic<bool> done{false};
    std::atomic<int> mismatches{0};
    std::thread reader([&] {
        while (!done.load()) {
            if (!bytes_match(f, w)) mismatches.fetch_add(1);
        }
    });
    std::vector<std::thread> writers;
    std::atomic<int> failures{0};
    for (int k = 0; k < 4; ++k) {
        writers.emplace_back([&, k] {
            // Overlapping runs of adjacent tensors, in a different order per thread, each call on 1 + k threads.
            for (size_t i = 0; i < w.data.size(); ++i) {
                const size_t t = (i * 3 + static_cast<size_t>(k)) % w.data.size();
                const size_t u = std::min(w.data.size() - 1, t + 1);
                uintptr_t b = 0, e = 0, b2 = 0, e2 = 0;
                moe::page_align(f.tensor_data(f.tensors()[t]), w.data[t].size(), &b, &e);
                moe::page_align(f.tensor_data(f.tensors()[u]), w.data[u].size(), &b2, &e2);
                if (!f.make_anonymous(b, std::max(e, e2), 1 + k).is_ok()) failures.fetch_add(1);
            }
        });
    }
    for (std::thread& t : writers) t.join();
    done = true;
    reader.join();
    CHECK(failures.load() == 0);
    CHECK(mismatches.load() == 0);
    CHECK(bytes_match(f, w));
    for (size_t t = 0; t < w.data.size(); ++t) {
        CHECK(mapping_name(reinterpret_cast<uintptr_t>(f.tensor_data(f.tensors()[t]))).empty());
    }
    std::remove(w.path.c_str());
}

TEST_CASE("make_anonymous on several threads: same bytes, every byte counted once, up to the mapping's end",
          "[gguf][anonymous]") {
    std::mt19937_64 rng(Catch::rngSeed());
    // ~16 MB of tensors: pieces of 1% of the file per thread, dozens of them for the threads to share.
    const Written w = write_file("pieces", 40, rng);
    auto opened = GgufFile::open(w.path, true);
    REQUIRE(opened.is_ok());
    GgufFile& f = **opened;
    const size_t page = moe::host_page_size();
    const uintptr_t map_begin = reinterpret_cast<uintptr_t>(f.tensor_data(f.tensors()[0])) / page * page;
    const uintptr_t map_end = map_begin + (f.file_size() + page - 1) / page * page;  // past EOF when unaligned
    const int n_threads = 2 + static_cast<int>(rng() % 6);
    INFO("threads " << n_threads << ", file " << f.file_size() << " bytes");

    // A middle part first, then everything: the second call reads only the gaps around it.
    const uintptr_t mid_b = map_begin + (map_end - map_begin) / 3 / page * page;
    const uintptr_t mid_e = mid_b + (map_end - mid_b) / 2 / page * page;
    std::atomic<uint64_t> copied{0};
    REQUIRE(f.make_anonymous(mid_b, mid_e, n_threads, &copied).is_ok());
    CHECK(copied.load() == mid_e - mid_b);
    REQUIRE(f.make_anonymous(map_begin, map_end, n_threads, &copied).is_ok());
    CHECK(copied.load() == map_end - map_begin);
    REQUIRE(f.make_anonymous(map_begin, map_end, n_threads, &copied).is_ok());  // nothing left to read
    CHECK(copied.load() == map_end - map_begin);
    for (uintptr_t a = map_begin; a < map_end; a += page) {
        INFO("page at offset " << (a - map_begin));
        REQUIRE(mapping_name(a).empty());
    }
    CHECK(bytes_match(f, w));
    // The bytes past the end of the file read as the mapping gave them: zero.
    const auto* tail = reinterpret_cast<const uint8_t*>(map_begin);
    for (uint64_t i = f.file_size(); i < map_end - map_begin; ++i) REQUIRE(tail[i] == 0);
    CHECK(f.make_anonymous(map_begin, map_end, 0).code() == MOE_STATUS_INVALID_ARGUMENT);
    std::remove(w.path.c_str());
}
