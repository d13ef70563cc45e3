#include "run/shared_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include <utility>

#include <fmt/format.h>

#include "core/error.h"

namespace kforge {
namespace {

std::byte* map_fd(int fd, size_t bytes, const std::string& name) {
  void* p = mmap(nullptr, std::max<size_t>(bytes, 1), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    throw Error(fmt::format("mmap {} ({} bytes): {}", name, bytes, std::strerror(errno)));
  }
  return static_cast<std::byte*>(p);
}

}  // namespace

SharedRegion SharedRegion::create(size_t bytes) {
  static std::atomic<unsigned> counter{0};
  // A process killed mid-run leaves its regions behind, and PIDs are reused: the name carries
  // a random part, and a name already taken is simply drawn again.
  static thread_local std::mt19937_64 rng(std::random_device{}());
  SharedRegion r;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    r.name_ = fmt::format("/kforge-{}-{}-{:08x}", getpid(), counter++, rng() & 0xffffffffu);
    fd = shm_open(r.name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && (errno != EEXIST || attempt >= 8)) {
      throw Error(fmt::format("shm_open {}: {}", r.name_, std::strerror(errno)));
    }
  }
  r.owner_ = true;
  if (ftruncate(fd, static_cast<off_t>(std::max<size_t>(bytes, 1))) != 0) {
    const int err = errno;
    ::close(fd);
    shm_unlink(r.name_.c_str());
    throw Error(
        fmt::format("cannot size shared memory to {} bytes: {}", bytes, std::strerror(err)));
  }
  r.data_ = map_fd(fd, bytes, r.name_);
  ::close(fd);
  r.size_ = bytes;
  return r;
}

SharedRegion SharedRegion::open(const std::string& name, size_t bytes) {
  SharedRegion r;
  r.name_ = name;
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) throw Error(fmt::format("shm_open {}: {}", name, std::strerror(errno)));
  r.data_ = map_fd(fd, bytes, name);
  ::close(fd);
  r.size_ = bytes;
  return r;
}

void SharedRegion::remove_stale() {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = entry.path().filename().string();
    int pid = 0;
    if (std::sscanf(name.c_str(), "kforge-%d-", &pid) != 1 || pid <= 0) continue;
    if (::kill(pid, 0) != 0 && errno == ESRCH) shm_unlink(("/" + name).c_str());
  }
}

SharedRegion::~SharedRegion() {
  reset();
}

SharedRegion::SharedRegion(SharedRegion&& other) noexcept {
  *this = std::move(other);
}

SharedRegion& SharedRegion::operator=(SharedRegion&& other) noexcept {
  if (this != &other) {
    reset();
    name_ = std::move(other.name_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    owner_ = std::exchange(other.owner_, false);
  }
  return *this;
}

void SharedRegion::reset() noexcept {
  if (data_) munmap(data_, std::max<size_t>(size_, 1));
  if (owner_) shm_unlink(name_.c_str());
  data_ = nullptr;
  owner_ = false;
}

}  // namespace kforge
