// The checked-in corpus of malformed (and a few valid) GGUF files: each must give the status and
// message listed in tests/fuzz/corpus/expected.txt (written by tests/fuzz/make_corpus.py), whether
// parsed from memory or opened from disk with and without mmap.
#include <catch2/catch.hpp>

#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/gguf.h"

namespace {

struct Expectation {
    std::string file;
    std::string status;
    std::string substring;
};

const std::map<std::string, moe_status>& status_names() {
    static const std::map<std::string, moe_status> names = {
        {"OK", MOE_STATUS_OK},
        {"INVALID_ARGUMENT", MOE_STATUS_INVALID_ARGUMENT},
        {"NOT_FOUND", MOE_STATUS_NOT_FOUND},
        {"RESOURCE_EXHAUSTED", MOE_STATUS_RESOURCE_EXHAUSTED},
        {"UNIMPLEMENTED", MOE_STATUS_UNIMPLEMENTED},
        {"IO_ERROR", MOE_STATUS_IO_ERROR},
        {"DATA_CORRUPT", MOE_STATUS_DATA_CORRUPT},
    };
    return names;
}

std::vector<Expectation> read_expectations(const std::string& path) {
    std::ifstream in(path);
    REQUIRE(in.good());
    std::vector<Expectation> out;
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream ls(line);
        Expectation e;
        ls >> e.file >> e.status;
        std::getline(ls, e.substring);
        const size_t first = e.substring.find_first_not_of(' ');
        e.substring = first == std::string::npos ? "" : e.substring.substr(first);
        out.push_back(e);
    }
    return out;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE(in.good());
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

template <typename Result>
void check_result(const Result& r, const Expectation& e) {
    const moe_status want = status_names().at(e.status);
    CHECK(r.status().code() == want);
    if (want != MOE_STATUS_OK) {
        CHECK_THAT(r.status().message(), Catch::Contains(e.substring));
    } else if (r.is_ok()) {
        // A valid seed: every tensor's bytes lie inside the file.
        for (const auto& t : r.value()->tensors()) CHECK(t.file_offset + t.n_bytes <= r.value()->file_size());
    }
}

}  // namespace

TEST_CASE("gguf corpus: each file gives its expected status and message", "[gguf]") {
    const std::string dir = std::string(MOE_TEST_DATA_DIR) + "/fuzz/corpus/";
    const std::vector<Expectation> cases = read_expectations(dir + "expected.txt");
    REQUIRE(cases.size() >= 25);
    int n_valid = 0;
    for (const Expectation& e : cases) {
        INFO(e.file << " expects " << e.status << " '" << e.substring << "'");
        REQUIRE(status_names().count(e.status) == 1);
        if (e.status == "OK") ++n_valid;
        const std::vector<uint8_t> bytes = read_bytes(dir + e.file);
        auto mem = moe::GgufFile::from_memory(bytes.data(), bytes.size());
        INFO("from_memory: " << mem.status().message());
        check_result(mem, e);
        for (bool use_mmap : {true, false}) {
            auto f = moe::GgufFile::open(dir + e.file, use_mmap);
            INFO("open(use_mmap=" << use_mmap << "): " << f.status().message());
            check_result(f, e);
            if (!f.is_ok()) CHECK_THAT(f.status().message(), Catch::StartsWith(dir + e.file + ": "));
        }
    }
    CHECK(n_valid >= 2);
}
