// io/dataset.cpp — see dataset.h for the on-disk format.
#include "io/dataset.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/output_dir.h"
#include "core/sha256.h"

namespace dflash {

static_assert(std::endian::native == std::endian::little, "the data format is little-endian");

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string shard_name(size_t k, const char* ext) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard-%05zu.%s", k, ext);
  return buf;
}

// A buffered output file that hashes what it writes (SHA-256).
class HashedOut {
 public:
  explicit HashedOut(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    DFLASH_CHECK(fd_ >= 0, path_, ": cannot create: ", std::strerror(errno));
    buf_.reserve(kBuf);
  }
  ~HashedOut() {
    if (fd_ >= 0) ::close(fd_);
  }
  HashedOut(const HashedOut&) = delete;
  HashedOut& operator=(const HashedOut&) = delete;

  void write(const void* p, size_t n) {
    sha_.update(p, n);
    bytes_ += n;
    const char* c = static_cast<const char*>(p);
    if (buf_.size() + n > kBuf) flush();
    if (n >= kBuf) {
      raw_write(c, n);
    } else {
      buf_.insert(buf_.end(), c, c + n);
    }
  }
  // Flushes, fsyncs and closes; returns the SHA-256 hex digest.
  std::string close() {
    flush();
    DFLASH_CHECK(::fsync(fd_) == 0, path_, ": fsync failed: ", std::strerror(errno));
    ::close(fd_);
    fd_ = -1;
    return sha_.hex_digest();
  }
  uint64_t bytes() const { return bytes_; }

 private:
  static constexpr size_t kBuf = 1 << 20;
  void flush() {
    if (!buf_.empty()) raw_write(buf_.data(), buf_.size());
    buf_.clear();
  }
  void raw_write(const char* p, size_t n) {
    while (n > 0) {
      ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      DFLASH_CHECK(w > 0, path_, ": write failed: ", std::strerror(errno));
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  std::string path_;
  int fd_ = -1;
  Sha256 sha_;
  std::vector<char> buf_;
  uint64_t bytes_ = 0;
};

bool pid_alive(long pid) { return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }

// "<x>.tmp-<digits>" -> pid, else -1.
long tmp_suffix_pid(const std::string& name, const std::string& base) {
  const std::string pre = base + ".tmp-";
  if (name.size() <= pre.size() || name.compare(0, pre.size(), pre) != 0) return -1;
  std::string digits = name.substr(pre.size());
  if (digits.empty() || digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stol(digits);
}

bool looks_unfinished(const std::string& dir) {
  std::string name = fs::path(dir).lexically_normal().filename().string();
  if (name.empty()) name = fs::path(dir).lexically_normal().parent_path().filename().string();
  size_t p = name.rfind(".tmp-");
  if (p == std::string::npos) return false;
  std::string digits = name.substr(p + 5);
  return !digits.empty() && std::all_of(digits.begin(), digits.end(), ::isdigit);
}

std::string strip_slash(std::string d) {
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return d;
}

}  // namespace

// ---- Dataset -----------------------------------------------------------------------------------------------

struct Dataset::Impl {
  struct Shard {
    std::shared_ptr<MappedFile> tokens, mask, index;
    size_t samples = 0;
    const int32_t* tok = nullptr;
    const uint8_t* msk = nullptr;
    const uint64_t* idx = nullptr;
    json sha;  // {"tokens", "mask", "index"}
  };
  std::string dir;
  json manifest;
  std::vector<Shard> shards;
  std::vector<size_t> first;  // first global sample of each shard, plus the total at the end
  int64_t total_tokens = 0, supervised = 0;
};

Dataset::Dataset() : impl_(std::make_unique<Impl>()) {}
Dataset::Dataset(Dataset&&) noexcept = default;
Dataset& Dataset::operator=(Dataset&&) noexcept = default;
Dataset::~Dataset() = default;

Dataset Dataset::open(const std::string& dir_in) {
  const std::string dir = strip_slash(dir_in);
  DFLASH_CHECK(!looks_unfinished(dir), dir, ": this is the temporary directory of an unfinished (interrupted or "
               "running) `dflash prepare`, not a data directory; run prepare again");
  DFLASH_CHECK(dir_exists(dir), dir, ": no such data directory");
  const std::string mpath = path_join(dir, "manifest.json");
  DFLASH_CHECK(file_exists(mpath), dir, ": not a dflash data directory (no manifest.json)");
  Dataset ds;
  Impl& d = *ds.impl_;
  d.dir = dir;
  try {
    d.manifest = json::parse(read_file(mpath));
  } catch (const json::exception& e) {
    DFLASH_FAIL(mpath, ": invalid JSON: ", e.what());
  }
  const json& m = d.manifest;
  auto field = [&](const json& obj, const char* key, const std::string& where) -> const json& {
    DFLASH_CHECK(obj.is_object() && obj.contains(key), mpath, ": missing field ", where, key);
    return obj.at(key);
  };
  auto get_int = [&](const json& obj, const char* key, const std::string& where) -> int64_t {
    const json& v = field(obj, key, where);
    DFLASH_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0, mpath, ": field ", where, key,
                 " is not a non-negative integer");
    return v.get<int64_t>();
  };
  DFLASH_CHECK(m.is_object(), mpath, ": not a JSON object");
  DFLASH_CHECK(field(m, "format", "") == kDatasetFormat, mpath, ": \"format\" is not \"", kDatasetFormat, "\"");
  const int64_t version = get_int(m, "version", "");
  DFLASH_CHECK(version == kDatasetVersion, mpath, ": format version ", version, " is not supported (this build reads ",
               kDatasetVersion, ")");
  const json& shards = field(m, "shards", "");
  DFLASH_CHECK(shards.is_array(), mpath, ": \"shards\" is not an array");
  const json& counts = field(m, "counts", "");
  size_t total = 0;
  d.first.push_back(0);
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string where = cat("shards[", k, "].");
    const json& s = shards[k];
    Impl::Shard sh;
    auto map_file = [&](const char* key, size_t elem, int64_t count) {
      const json& v = field(s, key, where);
      DFLASH_CHECK(v.is_string(), mpath, ": field ", where, key, " is not a string");
      const std::string name = v.get<std::string>();
      DFLASH_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "." && name != "..", mpath,
                   ": field ", where, key, " is not a plain file name");
      const std::string path = path_join(dir, name);
      DFLASH_CHECK(file_exists(path), path, ": missing (listed in ", mpath, ")");
      auto f = MappedFile::open(path);
      const uint64_t want = static_cast<uint64_t>(count) * elem;
      DFLASH_CHECK(f->size() == want, path, ": size ", f->size(), " bytes, the manifest says ", count, " x ", elem,
                   " = ", want, " bytes (truncated or not from this data set)");
      return f;
    };
    const int64_t n = get_int(s, "samples", where);
    const int64_t t = get_int(s, "num_tokens", where);
    DFLASH_CHECK(n >= 1 && t >= n, mpath, ": ", where, "samples / num_tokens inconsistent (", n, " / ", t, ")");
    sh.samples = static_cast<size_t>(n);
    sh.tokens = map_file("tokens", 4, t);
    sh.mask = map_file("mask", 1, t);
    sh.index = map_file("index", 8, n + 1);
    sh.tok = reinterpret_cast<const int32_t*>(sh.tokens->data());
    sh.msk = sh.mask->data();
    sh.idx = reinterpret_cast<const uint64_t*>(sh.index->data());
    DFLASH_CHECK(sh.idx[0] == 0, sh.index->path(), ": first offset is ", sh.idx[0], ", not 0");
    for (int64_t j = 0; j < n; ++j) {
      DFLASH_CHECK(sh.idx[j + 1] > sh.idx[j], sh.index->path(), ": offsets not strictly increasing at sample ", j,
                   " (", sh.idx[j], " then ", sh.idx[j + 1], ")");
    }
    DFLASH_CHECK(sh.idx[n] == static_cast<uint64_t>(t), sh.index->path(), ": last offset ", sh.idx[n],
                 " is not the shard's token count ", t);
    if (s.contains("sha256")) sh.sha = s["sha256"];
    total += sh.samples;
    d.total_tokens += t;
    d.first.push_back(total);
    d.shards.push_back(std::move(sh));
  }
  DFLASH_CHECK(total > 0, mpath, ": the data set has no samples");
  const int64_t n_written = get_int(counts, "samples_written", "counts.");
  DFLASH_CHECK(static_cast<size_t>(n_written) == total, mpath, ": counts.samples_written ", n_written,
               " but the shards hold ", total);
  const int64_t n_tokens = get_int(counts, "tokens", "counts.");
  DFLASH_CHECK(n_tokens == d.total_tokens, mpath, ": counts.tokens ", n_tokens, " but the shards hold ",
               d.total_tokens);
  d.supervised = get_int(counts, "supervised_tokens", "counts.");
  return ds;
}

size_t Dataset::size() const { return impl_->first.back(); }

SampleView Dataset::get(size_t i) const {
  const Impl& d = *impl_;
  DFLASH_CHECK(i < size(), d.dir, ": sample ", i, " out of range (", size(), " samples)");
  const size_t k = static_cast<size_t>(std::upper_bound(d.first.begin(), d.first.end(), i) - d.first.begin()) - 1;
  const Impl::Shard& sh = d.shards[k];
  const size_t j = i - d.first[k];
  const uint64_t b = sh.idx[j], e = sh.idx[j + 1];
  return {std::span<const int32_t>(sh.tok + b, e - b), std::span<const uint8_t>(sh.msk + b, e - b)};
}

const json& Dataset::manifest() const { return impl_->manifest; }
int64_t Dataset::total_tokens() const { return impl_->total_tokens; }
int64_t Dataset::supervised_tokens() const { return impl_->supervised; }
const std::string& Dataset::dir() const { return impl_->dir; }

void Dataset::verify() const {
  const Impl& d = *impl_;
  int64_t vocab = -1;
  if (d.manifest.contains("tokenizer") && d.manifest["tokenizer"].is_object() &&
      d.manifest["tokenizer"].contains("vocab_size") && d.manifest["tokenizer"]["vocab_size"].is_number_integer()) {
    vocab = d.manifest["tokenizer"]["vocab_size"].get<int64_t>();
  }
  int64_t supervised = 0;
  for (const auto& sh : d.shards) {
    for (auto [key, f] : {std::pair<const char*, const MappedFile*>{"tokens", sh.tokens.get()},
                          {"mask", sh.mask.get()}, {"index", sh.index.get()}}) {
      if (!sh.sha.is_object() || !sh.sha.contains(key)) continue;
      const std::string got = sha256_hex(std::string_view(reinterpret_cast<const char*>(f->data()), f->size()));
      DFLASH_CHECK(got == sh.sha[key].get<std::string>(), f->path(), ": SHA-256 ", got,
                   " differs from the manifest's ", sh.sha[key].get<std::string>());
    }
    const size_t t = sh.mask->size();
    for (size_t p = 0; p < t; ++p) {
      DFLASH_CHECK(sh.msk[p] <= 1, sh.mask->path(), ": value ", int(sh.msk[p]), " at position ", p, " is not 0/1");
      supervised += sh.msk[p];
      if (vocab > 0) {
        DFLASH_CHECK(sh.tok[p] >= 0 && sh.tok[p] < vocab, sh.tokens->path(), ": token id ", sh.tok[p],
                     " at position ", p, " outside [0, ", vocab, ")");
      }
    }
  }
  DFLASH_CHECK(supervised == d.supervised, d.dir, ": ", supervised, " supervised tokens, the manifest says ",
               d.supervised);
}

// ---- DatasetWriter -----------------------------------------------------------------------------------------

struct DatasetWriter::Impl {
  std::string dir, tmp, manifest_path;
  bool overwrite = false, committed = false;
  int64_t shard_tokens = 0;
  // current shard
  std::unique_ptr<HashedOut> tok, msk;
  std::vector<uint64_t> index;
  json shards = json::array();
  int64_t samples = 0, tokens = 0, supervised = 0;

  void open_shard() {
    const size_t k = shards.size();
    tok = std::make_unique<HashedOut>(path_join(tmp, shard_name(k, "tokens")));
    msk = std::make_unique<HashedOut>(path_join(tmp, shard_name(k, "mask")));
    index.assign(1, 0);
  }
  void close_shard() {
    if (!tok) return;
    const size_t k = shards.size();
    HashedOut idx(path_join(tmp, shard_name(k, "index")));
    idx.write(index.data(), index.size() * sizeof(uint64_t));
    json sha = {{"tokens", tok->close()}, {"mask", msk->close()}, {"index", idx.close()}};
    shards.push_back({{"tokens", shard_name(k, "tokens")},
                      {"mask", shard_name(k, "mask")},
                      {"index", shard_name(k, "index")},
                      {"samples", index.size() - 1},
                      {"num_tokens", index.back()},
                      {"sha256", sha}});
    tok.reset();
    msk.reset();
    index.clear();
  }
};

DatasetWriter::DatasetWriter(const std::string& dir_in, bool overwrite, int64_t shard_tokens)
    : impl_(std::make_unique<Impl>()) {
  Impl& w = *impl_;
  w.dir = strip_slash(dir_in);
  DFLASH_CHECK(!w.dir.empty(), "output directory: empty path");
  w.overwrite = overwrite;
  w.shard_tokens = std::max<int64_t>(1, shard_tokens);
  fs::path p(w.dir);
  // the rule of every command's output (core/output_dir.h): an existing data set only with --overwrite, and never
  // a directory holding anything else; the old data set stays until commit() replaces it
  claim_output_dir(w.dir, false, overwrite, OutputOf::Prepare);
  fs::path parent = p.parent_path();
  if (parent.empty()) parent = ".";
  make_dirs(parent.string());
  // Remove temporary directories of earlier writers of this <dir> whose process is gone.
  const std::string base = p.filename().string();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    const long pid = tmp_suffix_pid(name, base);
    if (pid < 0 || pid == static_cast<long>(::getpid()) || pid_alive(pid)) continue;
    log_warn("removing ", e.path().string(), ": left by an interrupted prepare (pid ", pid, " is gone)");
    fs::remove_all(e.path(), ec);
  }
  w.tmp = w.dir + ".tmp-" + std::to_string(::getpid());
  DFLASH_CHECK(!fs::exists(w.tmp), w.tmp, ": already exists (another writer of ", w.dir, " in this process?)");
  DFLASH_CHECK(fs::create_directory(w.tmp, ec) && !ec, w.tmp, ": cannot create directory: ", ec.message());
}

DatasetWriter::~DatasetWriter() {
  Impl& w = *impl_;
  if (w.committed) return;
  w.tok.reset();
  w.msk.reset();
  std::error_code ec;
  fs::remove_all(w.tmp, ec);
}

void DatasetWriter::add(std::span<const int32_t> tokens, std::span<const uint8_t> loss_mask) {
  Impl& w = *impl_;
  DFLASH_CHECK(!w.committed, w.dir, ": add() after commit()");
  DFLASH_CHECK(!tokens.empty() && tokens.size() == loss_mask.size(), w.dir, ": sample ", w.samples, " has ",
               tokens.size(), " tokens and ", loss_mask.size(), " mask values");
  int64_t sup = 0;
  for (uint8_t v : loss_mask) {
    DFLASH_CHECK(v <= 1, w.dir, ": sample ", w.samples, ": mask value ", int(v), " is not 0/1");
    sup += v;
  }
  if (w.tok && static_cast<int64_t>(w.index.back()) >= w.shard_tokens) w.close_shard();
  if (!w.tok) w.open_shard();
  w.tok->write(tokens.data(), tokens.size_bytes());
  w.msk->write(loss_mask.data(), loss_mask.size_bytes());
  w.index.push_back(w.index.back() + tokens.size());
  w.samples += 1;
  w.tokens += static_cast<int64_t>(tokens.size());
  w.supervised += sup;
}

json DatasetWriter::commit(const json& meta) {
  Impl& w = *impl_;
  DFLASH_CHECK(!w.committed, w.dir, ": commit() twice");
  DFLASH_CHECK(meta.is_object() || meta.is_null(), "DatasetWriter::commit: meta is not a JSON object");
  DFLASH_CHECK(w.samples > 0, w.dir, ": no samples to write");
  w.close_shard();
  json m = meta.is_null() ? json::object() : meta;
  m["format"] = kDatasetFormat;
  m["version"] = kDatasetVersion;
  m["dtypes"] = {{"tokens", "int32"}, {"loss_mask", "uint8"}, {"index", "uint64"}};
  m["shards"] = w.shards;
  json& counts = m["counts"];
  if (!counts.is_object()) counts = json::object();
  counts["samples_written"] = w.samples;
  counts["tokens"] = w.tokens;
  counts["supervised_tokens"] = w.supervised;
  write_file_atomic(path_join(w.tmp, "manifest.json"), m.dump(2) + "\n");
  fsync_dir(w.tmp);
  std::error_code ec;
  std::string old;
  if (fs::exists(w.dir)) {
    DFLASH_CHECK(w.overwrite || fs::is_empty(w.dir, ec), w.dir,
                 ": appeared while writing (pass --overwrite to replace it)");
    old = w.dir + ".old-" + std::to_string(::getpid());
    fs::rename(w.dir, old, ec);
    DFLASH_CHECK(!ec, w.dir, ": cannot move the old data set aside: ", ec.message());
  }
  fs::rename(w.tmp, w.dir, ec);
  DFLASH_CHECK(!ec, w.tmp, ": cannot rename to ", w.dir, ": ", ec.message());
  w.committed = true;
  fs::path parent = fs::path(w.dir).parent_path();
  fsync_dir(parent.empty() ? "." : parent.string());
  if (!old.empty()) fs::remove_all(old, ec);
  return m;
}

int64_t DatasetWriter::samples() const { return impl_->samples; }
int64_t DatasetWriter::tokens() const { return impl_->tokens; }
int64_t DatasetWriter::supervised_tokens() const { return impl_->supervised; }
const std::string& DatasetWriter::tmp_dir() const { return impl_->tmp; }

json data_provenance(const json& m) {
  auto get = [&](const char* k) { return m.is_object() && m.contains(k) ? m[k] : json(nullptr); };
  const json tok = get("tokenizer");
  json p;
  p["created_by"] = get("created_by");
  p["tokenizer_sha256"] = tok.is_object() && tok.contains("sha256") ? tok["sha256"] : json(nullptr);
  p["chat_template"] = get("chat_template");
  p["flags"] = get("flags");
  p["max_length"] = get("max_length");
  p["inputs"] = get("inputs");
  p["counts"] = get("counts");
  return p;
}

std::vector<std::string> provenance_differences(const json& a, const json& b, const std::string& an,
                                                const std::string& bn) {
  std::vector<std::string> out;
  const bool a_has = a.is_object() && !a.empty(), b_has = b.is_object() && !b.empty();
  if (!a_has || !b_has) {
    if (a_has != b_has)
      out.push_back(cat("the ", a_has ? bn : an, " side records no data provenance (how its data was prepared); "
                        "template and flags cannot be compared"));
    return out;
  }
  auto val = [](const json& j, const std::string& k) { return j.is_object() && j.contains(k) ? j[k] : json(nullptr); };
  auto differ = [&](const std::string& field, const json& x, const json& y) {
    if (x != y) out.push_back(cat(field, ": ", x.dump(), " (", an, ") vs ", y.dump(), " (", bn, ")"));
  };
  differ("tokenizer_sha256", val(a, "tokenizer_sha256"), val(b, "tokenizer_sha256"));
  // every key of either side's object, in sorted order (nlohmann objects iterate sorted)
  auto each_key = [&](const std::string& block, const std::set<std::string>& skip) {
    const json x = val(a, block), y = val(b, block);
    if (!x.is_object() || !y.is_object()) {
      differ(block, x, y);
      return;
    }
    std::set<std::string> keys;
    for (auto it = x.begin(); it != x.end(); ++it) keys.insert(it.key());
    for (auto it = y.begin(); it != y.end(); ++it) keys.insert(it.key());
    for (const std::string& k : keys)
      if (!skip.count(k)) differ(block + "." + k, val(x, k), val(y, k));
  };
  each_key("chat_template", {"origin"});  // where the template file was read from does not change the tokens
  // the requested --format only matters through what it resolved to (flags.pairs) when that is recorded
  const bool pairs = val(val(a, "flags"), "pairs") != nullptr && val(val(b, "flags"), "pairs") != nullptr;
  each_key("flags", pairs ? std::set<std::string>{"format"} : std::set<std::string>{});
  return out;
}

}  // namespace dflash
