// core/run_lock.h — one job at a time on an output directory (train's run directory, demo's --out): a lock that the
// operating system releases when its holder exits or dies, so a second process fails at once naming the holder and a
// killed run never blocks its own resume. It is also what tells a starting run that no other process of the run can
// still be writing in the directory (train removes the temporaries of an interrupted write only while it holds it).
// defines: LockHolder, RunLock, kRunLockFile, read_lock_holder
//
// How it works: the holder opens <dir>/dflash.lock (created when absent and never removed: removing a lock file lets
// two processes lock two different files) and takes flock(LOCK_EX | LOCK_NB) on it, then writes who it is into it
// (host, pid, start time, command). Another process's flock fails with EWOULDBLOCK: it reads that record and fails
// naming the holder. The kernel drops the lock when the holder's last descriptor of it closes — at exit, on SIGKILL,
// on a crash — so only the lock decides whether the directory is held; the record outlives its holder and is
// harmless (the next holder overwrites it). The descriptor is close-on-exec: a child the holder execs never holds it.
//
// Across hosts (the run directory on a shared file system; in a job of several processes only process 0 takes the
// lock, and only process 0 writes in the run directory): Linux NFS clients implement flock with NFS byte-range locks
// (NLM for NFSv3, in-protocol for NFSv4), so a process on another host is refused as well. Caveats: a mount with
// `nolock` or `local_lock=flock|all` keeps locks local to each host, and two hosts are then not kept apart; when a
// whole host dies (rather than the process), its lock lasts until the server lets it go (NFSv4: the lease, 90 s by
// default; NFSv3: when that host comes back and its statd reports the reboot); Lustre needs the `flock` mount option.
// A file system that does not support locks at all (flock fails with ENOLCK, ENOSYS or EOPNOTSUPP) gives a RunLock
// that holds nothing (held() false) and a warning: the run goes on unprotected.
#pragma once
#include <cstdint>
#include <string>

namespace dflash {

inline constexpr const char* kRunLockFile = "dflash.lock";

// Who holds (or last held) a directory's lock, as its record says.
struct LockHolder {
  std::string host;     // gethostname()
  int64_t pid = 0;
  std::string started;  // when the lock was taken, ISO 8601 UTC ("2026-12-04T10:11:12Z")
  std::string command;  // "dflash train", "dflash demo"
  // "dflash train, pid 4242 on host node7, started 2026-12-04T10:11:12Z"; "an unknown process" for an empty record.
  std::string describe() const;
};

// The record of <dir>/dflash.lock; empty fields when the file is absent or holds no record.
LockHolder read_lock_holder(const std::string& dir);

class RunLock {
 public:
  RunLock() = default;  // holds nothing
  // Takes the lock of `dir` for `command` and records the holder. Creates dir (mkdir -p) when absent. Errors (Error):
  // dir exists and is not a directory; the lock file cannot be opened or written (names the path); another process
  // holds the lock: "<command>: <dir> is in use by another process (<holder>). ...", naming the holder from its
  // record. A file system without lock support: a warning naming dir, and a RunLock with held() false.
  static RunLock acquire(const std::string& dir, const std::string& command);
  RunLock(RunLock&& o) noexcept;
  RunLock& operator=(RunLock&& o) noexcept;
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  ~RunLock();  // release()

  bool held() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  // Puts back the record the file held before acquire() (for a start that was refused after taking the lock and
  // must leave the directory byte for byte as it was), then releases the lock.
  void restore_and_release();
  void release();

 private:
  int fd_ = -1;
  std::string path_, previous_;
};

}  // namespace dflash
