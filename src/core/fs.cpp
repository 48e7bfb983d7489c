// core/fs.cpp — see fs.h.
#include "core/fs.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace dflash {

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DFLASH_CHECK(fd >= 0, path, ": cannot open: ", std::strerror(errno));
  struct stat st{};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    DFLASH_FAIL(path, ": cannot stat: ", std::strerror(e));
  }
  std::shared_ptr<MappedFile> m(new MappedFile());
  m->path_ = path;
  m->size_ = static_cast<size_t>(st.st_size);
  if (m->size_ > 0) {
    void* p = mmap(nullptr, m->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    ::close(fd);
    DFLASH_CHECK(p != MAP_FAILED, path, ": mmap failed: ", std::strerror(e));
    m->data_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
  return m;
}

MappedFile::~MappedFile() {
  if (data_) munmap(const_cast<uint8_t*>(data_), size_);
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  tmp_ = path_ + ".tmp." + std::to_string(getpid());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DFLASH_CHECK(fd_ >= 0, tmp_, ": cannot create: ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  DFLASH_CHECK(fd_ >= 0 && !committed_, path_, ": write after commit");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    DFLASH_CHECK(w > 0, tmp_, ": write failed: ", std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  DFLASH_CHECK(fd_ >= 0 && !committed_, path_, ": commit twice");
  DFLASH_CHECK(::fsync(fd_) == 0, tmp_, ": fsync failed: ", std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  DFLASH_CHECK(::rename(tmp_.c_str(), path_.c_str()) == 0, path_, ": rename failed: ", std::strerror(errno));
  committed_ = true;
  std::filesystem::path dir = std::filesystem::path(path_).parent_path();
  fsync_dir(dir.empty() ? "." : dir.string());
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  AtomicFile f(path);
  f.write(bytes);
  f.commit();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DFLASH_CHECK(in.good(), path, ": cannot open for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  DFLASH_CHECK(!in.bad(), path, ": read failed");
  return ss.str();
}

bool file_exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool dir_exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void make_dirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  DFLASH_CHECK(!ec && dir_exists(path), path, ": cannot create directory: ", ec.message());
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

int64_t free_bytes(const std::string& path) {
  struct statvfs s{};
  if (::statvfs(path.c_str(), &s) != 0) return -1;
  return static_cast<int64_t>(s.f_bavail) * static_cast<int64_t>(s.f_frsize);
}

int64_t tree_size(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(path, ec);
  if (ec || !fs::exists(st)) return 0;
  if (fs::is_regular_file(st)) {
    const auto n = fs::file_size(path, ec);
    return ec ? 0 : static_cast<int64_t>(n);
  }
  if (!fs::is_directory(st)) return 0;
  int64_t total = 0;
  for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e2;
    if (it->is_regular_file(e2) && !it->is_symlink(e2)) {
      const auto n = it->file_size(e2);
      if (!e2) total += static_cast<int64_t>(n);
    }
  }
  return total;
}

std::string format_bytes(int64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (std::abs(v) >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char b[48];
  if (u == 0) std::snprintf(b, sizeof b, "%lld B", static_cast<long long>(n));
  else std::snprintf(b, sizeof b, "%.*f %s", std::abs(v) < 10 ? 2 : (std::abs(v) < 100 ? 1 : 0), v, units[u]);
  return b;
}

std::string path_join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

}  // namespace dflash
