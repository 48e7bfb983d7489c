// core/fs.h — files: read-only memory maps, crash-safe writes, small helpers.
// defines: MappedFile, AtomicFile, write_file_atomic, read_file, file_exists, make_dirs, free_bytes,
//          tree_size, format_bytes
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace dflash {

// A read-only mapping of a whole file. Movable, not copyable; unmaps on destruction. Share it through
// std::shared_ptr when tensors point into it. Throws Error naming the path if the file cannot be opened.
class MappedFile {
 public:
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Crash-safe file writing: bytes go to "<path>.tmp.<pid>", commit() fsyncs it, renames it over <path> and
// fsyncs the directory, so a reader sees either the old file or the whole new one. Destroying an
// uncommitted AtomicFile removes the temp file.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  void commit();
  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

void write_file_atomic(const std::string& path, std::string_view bytes);
std::string read_file(const std::string& path);  // whole file; Error naming the path on failure
bool file_exists(const std::string& path);
bool dir_exists(const std::string& path);
void make_dirs(const std::string& path);  // mkdir -p
// Flushes a directory entry (after rename) to disk.
void fsync_dir(const std::string& dir);
// "dir/name" with exactly one separator.
std::string path_join(const std::string& dir, const std::string& name);
// Bytes an unprivileged writer may still write on the file system that holds `path` (statvfs: f_bavail x
// f_frsize); -1 when it cannot be known (path absent, statvfs failed).
int64_t free_bytes(const std::string& path);
// The size of a regular file, or the sum of the sizes of the regular files under a directory (recursively; links
// are not followed); 0 when path is absent. Never throws (an entry that vanishes meanwhile counts 0).
int64_t tree_size(const std::string& path);
// A size for people: "812 B", "15.3 KiB", "1.27 GiB".
std::string format_bytes(int64_t n);

}  // namespace dflash
