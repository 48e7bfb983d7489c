// train/run_inputs.cpp — see run_inputs.h.
#include "train/run_inputs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/fs.h"
#include "core/log.h"
#include "core/sha256.h"

namespace dflash {

namespace {

using json = nlohmann::json;

// Keys that say where something was read from, not what it is: never compared.
const std::vector<std::string> kLocationKeys = {"path", "origin"};
constexpr int64_t kSampleBlocks = 16, kSampleBlock = 64 << 10;
constexpr size_t kMaxLines = 12;

// Reads exactly n bytes at off; Error names the path.
void read_at(int fd, const std::string& path, void* dst, size_t n, int64_t off) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = pread(fd, static_cast<char*>(dst) + done, n - done, static_cast<off_t>(off + done));
    if (r < 0 && errno == EINTR) continue;
    DFLASH_CHECK(r > 0, path, ": cannot read ", n, " bytes at offset ", off, ": ",
                 r < 0 ? std::strerror(errno) : "end of file");
    done += static_cast<size_t>(r);
  }
}

json weights_file_identity(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DFLASH_CHECK(fd >= 0, path, ": cannot open: ", std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st{};
  DFLASH_CHECK(fstat(fd, &st) == 0, path, ": cannot stat: ", std::strerror(errno));
  const int64_t size = st.st_size;
  DFLASH_CHECK(size >= 8, path, ": ", size, " bytes, too short for a safetensors header");
  uint8_t len8[8];
  read_at(fd, path, len8, 8, 0);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= static_cast<uint64_t>(len8[i]) << (8 * i);
  DFLASH_CHECK(hlen <= static_cast<uint64_t>(size - 8), path, ": header length ", hlen, " exceeds the file (", size,
               " bytes)");
  std::string header(static_cast<size_t>(hlen), '\0');
  read_at(fd, path, header.data(), header.size(), 8);
  const int64_t begin = 8 + static_cast<int64_t>(hlen), len = size - begin;
  std::string sample;
  if (len <= kSampleBlocks * kSampleBlock) {
    sample.resize(static_cast<size_t>(len));
    read_at(fd, path, sample.data(), sample.size(), begin);
  } else {
    sample.resize(static_cast<size_t>(kSampleBlocks * kSampleBlock));
    for (int64_t i = 0; i < kSampleBlocks; ++i)
      read_at(fd, path, sample.data() + i * kSampleBlock, kSampleBlock,
              begin + i * (len - kSampleBlock) / (kSampleBlocks - 1));
  }
  return {{"file", std::filesystem::path(path).filename().string()},
          {"bytes", size},
          {"header_sha256", sha256_hex(header)},
          {"sample_sha256", sha256_hex(sample)}};
}

// The weight files of a target directory, as WeightStore::open picks them (io/safetensors.h): the shards named by
// model.safetensors.index.json, else model.safetensors, else every *.safetensors file; sorted by name.
std::vector<std::string> weight_files(const std::string& dir) {
  std::vector<std::string> files;
  const std::string index = path_join(dir, "model.safetensors.index.json");
  if (file_exists(index)) {
    json idx;
    try {
      idx = json::parse(read_file(index));
    } catch (const json::exception& e) {
      DFLASH_FAIL(index, ": invalid JSON: ", e.what());
    }
    DFLASH_CHECK(idx.is_object() && idx.contains("weight_map") && idx["weight_map"].is_object(), index,
                 ": weight_map: missing or not an object");
    for (const auto& [tensor, shard] : idx["weight_map"].items())
      if (shard.is_string()) files.push_back(path_join(dir, shard.get<std::string>()));
  } else if (file_exists(path_join(dir, "model.safetensors"))) {
    files.push_back(path_join(dir, "model.safetensors"));
  } else {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
      if (e.path().extension() == ".safetensors" && e.is_regular_file()) files.push_back(e.path().string());
    DFLASH_CHECK(!ec, dir, ": cannot list: ", ec.message());
  }
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  return files;
}

std::string shorten(const json& v, bool present) {
  if (!present) return "(absent)";
  std::string s = v.dump();
  if (s.size() > 96) s = s.substr(0, 80) + "... (" + std::to_string(s.size()) + " characters)";
  return s;
}

void differences(const json* a, const json* b, const std::string& at, const std::vector<std::string>& skip,
                 const std::string& an, const std::string& bn, std::vector<std::string>& out) {
  if (a && b && a->is_object() && b->is_object()) {
    std::vector<std::string> keys;
    for (auto it = a->begin(); it != a->end(); ++it) keys.push_back(it.key());
    for (auto it = b->begin(); it != b->end(); ++it) keys.push_back(it.key());
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    for (const std::string& k : keys) {
      if (std::find(skip.begin(), skip.end(), k) != skip.end()) continue;
      const auto ia = a->find(k), ib = b->find(k);
      differences(ia == a->end() ? nullptr : &*ia, ib == b->end() ? nullptr : &*ib, at.empty() ? k : at + "." + k,
                  skip, an, bn, out);
    }
    return;
  }
  if (a && b && a->is_array() && b->is_array()) {
    for (size_t i = 0; i < std::max(a->size(), b->size()); ++i)
      differences(i < a->size() ? &(*a)[i] : nullptr, i < b->size() ? &(*b)[i] : nullptr, cat(at, "[", i, "]"),
                  skip, an, bn, out);
    return;
  }
  if ((a == nullptr) != (b == nullptr) || (a && *a != *b))
    out.push_back(cat(at, ": ", shorten(a ? *a : json(), a != nullptr), " (", an, ") vs ",
                      shorten(b ? *b : json(), b != nullptr), " (", bn, ")"));
}

std::string listing(const std::vector<std::string>& lines) {
  std::string s;
  for (size_t i = 0; i < lines.size() && i < kMaxLines; ++i) s += "\n  " + lines[i];
  if (lines.size() > kMaxLines) s += cat("\n  ... and ", lines.size() - kMaxLines, " more");
  return s;
}

}  // namespace

json target_identity(const std::string& target_dir, bool random_weights, uint64_t seed) {
  const std::string cfg = path_join(target_dir, "config.json");
  json id = {{"config_sha256", sha256_hex(read_file(cfg))}};
  if (random_weights) {
    id["weights"] = {{"random_seed", seed}};
    return id;
  }
  json w = json::array();
  for (const std::string& f : weight_files(target_dir)) w.push_back(weights_file_identity(f));
  id["weights"] = w;
  return id;
}

json run_inputs(const std::string& target_dir, bool random_weights, uint64_t seed, const std::string& tokenizer_sha256,
                const json& data_manifest) {
  return {{"target", target_identity(target_dir, random_weights, seed)},
          {"tokenizer_sha256", tokenizer_sha256.empty() ? json(nullptr) : json(tokenizer_sha256)},
          {"data", data_manifest}};
}

std::vector<std::string> json_differences(const json& was, const json& now, const std::string& prefix,
                                          const std::vector<std::string>& skip_keys, const std::string& was_name,
                                          const std::string& now_name) {
  std::vector<std::string> out;
  differences(&was, &now, prefix, skip_keys, was_name, now_name, out);
  return out;
}

ResumeInputs check_resume_inputs(const json& state, const json& now, const json& provenance_now,
                                 bool allow_data_change, const std::string& ckpt_dir, int64_t step) {
  const json config = state.value("config", json::object());
  const json before = config.value("data", json());
  ResumeInputs r;
  r.data_changes = config.value("data_changes", json::array());
  std::vector<std::string> target, data;
  if (state.contains("inputs")) {
    const json& was = state["inputs"];
    target = json_differences(was.value("target", json()), now.value("target", json()), "target", kLocationKeys);
    for (const char* k : {"tokenizer_sha256", "data"}) {
      const auto more = json_differences(was.value(k, json()), now.value(k, json()), k, kLocationKeys);
      data.insert(data.end(), more.begin(), more.end());
    }
  } else {
    log_info("resume: ", ckpt_dir, " records no identity of its target and data set (written by an earlier dflash): "
             "only how its data was made (config.data) is compared");
    data = json_differences(before, provenance_now, "data", kLocationKeys);
  }
  DFLASH_CHECK(target.empty(), "train --resume: ", ckpt_dir, " was trained on another target than this run's (",
               target.size(), " difference", target.size() == 1 ? "" : "s", "):", listing(target),
               "\nThe drafter learnt to read that target's hidden states: a resume needs the same target (its "
               "config.json and weights; --allow-data-change does not cover it). Give the checkpoint's target, or "
               "start a new run");
  if (data.empty()) return r;
  DFLASH_CHECK(allow_data_change, "train --resume: ", ckpt_dir, " was trained on other data than this run's (",
               data.size(), " difference", data.size() == 1 ? "" : "s", "):", listing(data),
               "\nGive the checkpoint's data set (and tokenizer), or pass --allow-data-change with --resume to "
               "continue this run on the new data deliberately (recorded in the run's provenance)");
  log_warn("train --resume --allow-data-change: continuing from step ", step, " on other data than ", ckpt_dir,
           " was trained on (", data.size(), " difference", data.size() == 1 ? "" : "s", ", recorded in the run's "
           "data_changes):", listing(data));
  r.differences = data;
  r.data_changes.push_back({{"step", step}, {"differences", data}, {"before", before}});
  return r;
}

}  // namespace dflash
