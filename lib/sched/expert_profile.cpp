#include "sched/expert_profile.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace moe::sched {
namespace {

constexpr const char* kMagic = "moeinfer-expert-profile";

// Reads one line as a key and its fields; DATA_CORRUPT naming the line when it is missing or its key
// is not `key`.
class Lines {
public:
    Lines(std::istream& in, const std::string& path) : in_(in), path_(path) {}

    StatusOr<std::vector<std::string>> next(const std::string& key) {
        std::string line;
        ++number_;
        if (!std::getline(in_, line)) return corrupt("expected '" + key + "', found the end of the file");
        std::vector<std::string> fields;
        std::istringstream ss(line);
        for (std::string f; ss >> f;) fields.push_back(f);
        if (fields.empty() || fields[0] != key) {
            return corrupt("expected '" + key + "', found '" + line.substr(0, 60) + "'");
        }
        return fields;
    }

    // An error in the line read last.
    Status corrupt(const std::string& what) const {
        return data_corrupt("expert profile '" + path_ + "' line " + std::to_string(number_) + ": " + what);
    }

    StatusOr<uint64_t> number(const std::string& field, const std::string& name) const {
        if (field.empty() || field.size() > 19 || field.find_first_not_of("0123456789") != std::string::npos) {
            return corrupt(name + " '" + field + "' is not a decimal count");
        }
        return std::stoull(field);
    }

    // "KEY VALUE" with VALUE a count.
    StatusOr<uint64_t> value(const std::string& key) {
        MOE_ASSIGN_OR_RETURN(const std::vector<std::string> f, next(key));
        if (f.size() != 2) return corrupt("expected '" + key + " VALUE'");
        return number(f[1], key);
    }

private:
    std::istream& in_;
    std::string path_;
    int number_ = 0;  // the line read last, from 1
};

Status check_shape(const std::string& path, const char* field, uint64_t got, uint64_t want) {
    if (got == want) return Status::ok();
    return invalid_argument("expert profile '" + path + "' was written for another model: its " + field + " is " +
                            std::to_string(got) + ", this model's is " + std::to_string(want));
}

}  // namespace

Status write_expert_profile(const std::string& path, const ExpertProfile& p) {
    if (p.n_layer < 0 || p.n_expert < 0 ||
        p.counts.size() != static_cast<size_t>(p.n_layer) * static_cast<size_t>(p.n_expert)) {
        return invalid_argument("expert profile: " + std::to_string(p.counts.size()) + " counts for n_layer " +
                                std::to_string(p.n_layer) + " x n_expert " + std::to_string(p.n_expert));
    }
    std::ofstream out(path, std::ios::trunc);
    if (!out) return io_error("cannot write the expert profile '" + path + "': " + std::strerror(errno));
    out << kMagic << ' ' << kExpertProfileVersion << '\n'
        << "arch " << p.arch << '\n'
        << "n_layer " << p.n_layer << '\n'
        << "n_expert " << p.n_expert << '\n'
        << "n_expert_used " << p.n_expert_used << '\n';
    for (int il = 0; il < p.n_layer; ++il) {
        out << "layer " << il;
        for (int e = 0; e < p.n_expert; ++e) out << ' ' << p.counts[static_cast<size_t>(il) * p.n_expert + e];
        out << '\n';
    }
    out << "end\n";
    out.flush();
    if (!out) return io_error("writing the expert profile '" + path + "' failed");
    return Status::ok();
}

StatusOr<ExpertProfile> read_expert_profile(const std::string& path, const ExpertProfile& expected) {
    std::ifstream in(path);
    if (!in) {
        if (errno == ENOENT) return not_found("expert profile '" + path + "' does not exist");
        return io_error("cannot read the expert profile '" + path + "': " + std::strerror(errno));
    }
    Lines lines(in, path);
    {
        StatusOr<std::vector<std::string>> head = lines.next(kMagic);
        if (!head.is_ok()) {
            return data_corrupt("'" + path + "' is not an expert profile (it does not start with '" + kMagic + " " +
                                std::to_string(kExpertProfileVersion) + "')");
        }
        if (head->size() != 2) return lines.corrupt("expected '" + std::string(kMagic) + " VERSION'");
        MOE_ASSIGN_OR_RETURN(const uint64_t version, lines.number((*head)[1], "version"));
        if (version != kExpertProfileVersion) {
            return unimplemented("expert profile '" + path + "' has format version " + std::to_string(version) +
                                 "; this build reads version " + std::to_string(kExpertProfileVersion));
        }
    }
    ExpertProfile p;
    MOE_ASSIGN_OR_RETURN(const std::vector<std::string> arch, lines.next("arch"));
    if (arch.size() != 2) return lines.corrupt("expected 'arch NAME'");
    p.arch = arch[1];
    if (p.arch != expected.arch) {
        return invalid_argument("expert profile '" + path + "' was written for another model: its arch is '" +
                                p.arch + "', this model's is '" + expected.arch + "'");
    }
    MOE_ASSIGN_OR_RETURN(const uint64_t n_layer, lines.value("n_layer"));
    MOE_RETURN_IF_ERROR(check_shape(path, "n_layer", n_layer, static_cast<uint64_t>(expected.n_layer)));
    MOE_ASSIGN_OR_RETURN(const uint64_t n_expert, lines.value("n_expert"));
    MOE_RETURN_IF_ERROR(check_shape(path, "n_expert", n_expert, static_cast<uint64_t>(expected.n_expert)));
    MOE_ASSIGN_OR_RETURN(const uint64_t n_used, lines.value("n_expert_used"));
    MOE_RETURN_IF_ERROR(check_shape(path, "n_expert_used", n_used, static_cast<uint64_t>(expected.n_expert_used)));
    p.n_layer = expected.n_layer;
    p.n_expert = expected.n_expert;
    p.n_expert_used = expected.n_expert_used;
    p.counts.reserve(static_cast<size_t>(p.n_layer) * static_cast<size_t>(p.n_expert));
    for (int il = 0; il < p.n_layer; ++il) {
        MOE_ASSIGN_OR_RETURN(const std::vector<std::string> f, lines.next("layer"));
        if (f.size() != static_cast<size_t>(p.n_expert) + 2) {
            return lines.corrupt("expected 'layer " + std::to_string(il) + "' and " + std::to_string(p.n_expert) +
                                 " counts, found " + std::to_string(f.size() < 2 ? 0 : f.size() - 2) + " counts");
        }
        MOE_ASSIGN_OR_RETURN(const uint64_t index, lines.number(f[1], "layer index"));
        if (index != static_cast<uint64_t>(il)) {
            return lines.corrupt("expected layer " + std::to_string(il) + ", found layer " + f[1]);
        }
        for (size_t e = 2; e < f.size(); ++e) {
            MOE_ASSIGN_OR_RETURN(const uint64_t c, lines.number(f[e], "count"));
            p.counts.push_back(c);
        }
    }
    MOE_ASSIGN_OR_RETURN(const std::vector<std::string> end, lines.next("end"));
    if (end.size() != 1) return lines.corrupt("expected 'end'");
    return p;
}

}  // namespace moe::sched
