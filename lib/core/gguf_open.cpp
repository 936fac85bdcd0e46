// Where a GgufFile's bytes come from: a read-only private mapping, a full read into memory, or a
// caller's buffer. Parsing itself is in gguf.cpp.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "core/gguf.h"

namespace moe {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

// Closes the descriptor on every return path.
class FdGuard {
public:
    explicit FdGuard(int fd) : fd_(fd) {}
    ~FdGuard() { ::close(fd_); }
    FdGuard(const FdGuard&) = delete;
    FdGuard& operator=(const FdGuard&) = delete;

private:
    int fd_;
};

// Reads exactly `size` bytes from the start of the file, retrying short reads and EINTR; progress
// (if any) between chunks of kReadChunk bytes.
Status read_all(int fd, const std::string& path, uint8_t* dst, uint64_t size,
                const std::function<Status(double)>& progress) {
    constexpr uint64_t kReadChunk = uint64_t{64} << 20;
    uint64_t done = 0;
    while (done < size) {
        if (progress) MOE_RETURN_IF_ERROR(progress(static_cast<double>(done) / static_cast<double>(size)));
        const uint64_t want = std::min(size - done, kReadChunk);
        const ssize_t n = ::pread(fd, dst + done, static_cast<size_t>(want), static_cast<off_t>(done));
        if (n < 0) {
            if (errno == EINTR) continue;
            return io_error(path + ": read failed at offset " + std::to_string(done) + ": " + errno_text(errno));
        }
        if (n == 0) {
            return io_error(path + ": file shrank while being read (got " + std::to_string(done) + " of " +
                            std::to_string(size) + " bytes)");
        }
        done += static_cast<uint64_t>(n);
    }
    return Status::ok();
}

}  // namespace

StatusOr<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path, bool use_mmap,
                                                   const std::function<Status(double)>& progress) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        const int err = errno;
        if (err == ENOENT) return not_found(path + ": " + errno_text(err));
        return io_error(path + ": cannot open: " + errno_text(err));
    }
    FdGuard guard(fd);
    struct stat st {};
    if (::fstat(fd, &st) != 0) return io_error(path + ": cannot stat: " + errno_text(errno));
    if (!S_ISREG(st.st_mode)) return io_error(path + ": not a regular file");

    std::unique_ptr<GgufFile> f(new GgufFile());
    f->size_ = static_cast<uint64_t>(st.st_size);
    if (f->size_ > 0) {  // an empty file cannot be mapped; parse() reports it as too small
        if (use_mmap) {
            void* p = ::mmap(nullptr, static_cast<size_t>(f->size_), PROT_READ, MAP_PRIVATE, fd, 0);
            if (p == MAP_FAILED) return io_error(path + ": mmap failed: " + errno_text(errno));
            f->mapping_ = p;
            f->base_ = static_cast<const uint8_t*>(p);
            // Kept for make_anonymous, which reads the mapped bytes with pread.
            f->fd_ = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
            if (f->fd_ < 0) return io_error(path + ": cannot keep the file open: " + errno_text(errno));
        } else {
            try {
                f->owned_.resize(static_cast<size_t>(f->size_));
            } catch (const std::bad_alloc&) {
                return resource_exhausted(path + ": cannot allocate " + std::to_string(f->size_) +
                                          " bytes to read the file");
            }
            MOE_RETURN_IF_ERROR(read_all(fd, path, f->owned_.data(), f->size_, progress));
            f->base_ = f->owned_.data();
        }
    }
    Status s = f->parse();
    if (!s.is_ok()) return s.with_context(path);
    return f;
}

StatusOr<std::unique_ptr<GgufFile>> GgufFile::from_memory(const void* data, size_t size) {
    if (data == nullptr && size > 0) {
        return invalid_argument("GgufFile::from_memory: data is null but size is " + std::to_string(size));
    }
    std::unique_ptr<GgufFile> f(new GgufFile());
    f->base_ = static_cast<const uint8_t*>(data);
    f->size_ = size;
    MOE_RETURN_IF_ERROR(f->parse());
    return f;
}

GgufFile::~GgufFile() {
    if (mapping_ != nullptr) ::munmap(mapping_, static_cast<size_t>(size_));
    if (fd_ >= 0) ::close(fd_);
}

}  // namespace moe
