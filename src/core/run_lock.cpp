// core/run_lock.cpp — see run_lock.h.
#include "core/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"

namespace dflash {

namespace {

std::string host_name() {
  char b[256] = {};
  if (gethostname(b, sizeof b - 1) != 0) return "?";
  return b;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

// The whole content of an open file (from offset 0).
std::string read_fd(int fd) {
  std::string s;
  char b[4096];
  for (off_t off = 0;;) {
    const ssize_t r = pread(fd, b, sizeof b, off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    s.append(b, static_cast<size_t>(r));
    off += r;
  }
  return s;
}

// Replaces the file's content by `s` (pwrite at 0, then cut to its length). Error names `path`.
void write_fd(int fd, const std::string& path, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t w = pwrite(fd, s.data() + done, s.size() - done, static_cast<off_t>(done));
    if (w < 0 && errno == EINTR) continue;
    DFLASH_CHECK(w > 0, path, ": cannot write the lock record: ", std::strerror(errno));
    done += static_cast<size_t>(w);
  }
  DFLASH_CHECK(ftruncate(fd, static_cast<off_t>(s.size())) == 0, path, ": cannot write the lock record: ",
               std::strerror(errno));
}

LockHolder parse_holder(const std::string& text) {
  LockHolder h;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string k = line.substr(0, eq), v = line.substr(eq + 1);
    if (k == "host") h.host = v;
    else if (k == "pid") h.pid = std::atoll(v.c_str());
    else if (k == "started") h.started = v;
    else if (k == "command") h.command = v;
  }
  return h;
}

}  // namespace

std::string LockHolder::describe() const {
  if (pid == 0 && host.empty()) return "an unknown process (it has not recorded itself yet)";
  return cat(command.empty() ? "a process" : command, ", pid ", pid, " on host ", host.empty() ? "?" : host,
             ", started ", started.empty() ? "?" : started);
}

LockHolder read_lock_holder(const std::string& dir) {
  const std::string p = path_join(dir, kRunLockFile);
  return file_exists(p) ? parse_holder(read_file(p)) : LockHolder{};
}

RunLock RunLock::acquire(const std::string& dir, const std::string& command) {
  std::error_code ec;
  DFLASH_CHECK(!std::filesystem::exists(dir, ec) || dir_exists(dir), command, ": ", dir,
               " exists and is not a directory");
  make_dirs(dir);
  RunLock l;
  l.path_ = path_join(dir, kRunLockFile);
  l.fd_ = ::open(l.path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  DFLASH_CHECK(l.fd_ >= 0, l.path_, ": cannot open the lock file: ", std::strerror(errno));
  int rc;
  do rc = flock(l.fd_, LOCK_EX | LOCK_NB);
  while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int e = errno;
    const std::string record = read_fd(l.fd_);
    ::close(l.fd_);
    l.fd_ = -1;
    if (e == ENOLCK || e == ENOSYS || e == EOPNOTSUPP) {
      log_warn(command, ": the file system of ", dir, " does not support locks (", std::strerror(e),
               "): another process on this directory is not detected, and temporaries of an interrupted write are "
               "kept (core/run_lock.h)");
      return l;
    }
    DFLASH_CHECK(e == EWOULDBLOCK, l.path_, ": cannot lock: ", std::strerror(e));
    DFLASH_FAIL(command, ": ", dir, " is in use by another process (", parse_holder(record).describe(),
                "). A directory is held by one job at a time: wait for that one to end, or stop it (a stopped or "
                "killed holder releases it at once), or give another directory");
  }
  l.previous_ = read_fd(l.fd_);
  write_fd(l.fd_, l.path_, cat("host=", host_name(), "\npid=", getpid(), "\nstarted=", utc_now(),
                               "\ncommand=", command, "\n"));
  return l;
}

RunLock::RunLock(RunLock&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)), previous_(std::move(o.previous_)) {
  o.fd_ = -1;
}

RunLock& RunLock::operator=(RunLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    previous_ = std::move(o.previous_);
    o.fd_ = -1;
  }
  return *this;
}

RunLock::~RunLock() { release(); }

void RunLock::restore_and_release() {
  if (fd_ >= 0) {
    try {
      write_fd(fd_, path_, previous_);
    } catch (const Error& e) {
      log_warn(e.what());
    }
  }
  release();
}

void RunLock::release() {
  if (fd_ >= 0) ::close(fd_);  // closing the only descriptor drops the flock
  fd_ = -1;
}

}  // namespace dflash
