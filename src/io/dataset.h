// io/dataset.h — the prepared data directory: written once by `dflash prepare` (DatasetWriter), memory-mapped
// by training (Dataset).
// defines: SampleView, Dataset, DatasetWriter, kDatasetFormat, kDatasetVersion, data_provenance,
//          provenance_differences
//
// Layout of <dir> (all integers little-endian, raw arrays without headers so numpy.fromfile / mmap read them):
//   manifest.json          written last; its presence inside a directory whose name is final means complete
//   shard-NNNNN.tokens     int32[T_k]      token ids of the shard's samples, concatenated
//   shard-NNNNN.mask       uint8[T_k]      loss mask (0/1), same positions as .tokens
//   shard-NNNNN.index      uint64[n_k + 1] token offsets: sample j is [index[j], index[j+1]); index[0] = 0,
//                                          index[n_k] = T_k; strictly increasing (no empty sample)
// manifest.json: {"format": "dflash-data", "version": 1, "dtypes": {"tokens": "int32", "loss_mask": "uint8",
//   "index": "uint64"}, "shards": [{"tokens", "mask", "index" (file names), "samples", "num_tokens",
//   "sha256": {"tokens", "mask", "index"}}], "counts": {"samples_written", "tokens", "supervised_tokens", ...},
//   ...whatever the writer's caller adds (prepare: tokenizer sha256, chat template, flags, max_length, inputs,
//   skipped rows per reason)}.
//
// Samples never span shards; sample order is the write order (prepare: input order, any thread count).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dflash {

inline constexpr const char* kDatasetFormat = "dflash-data";
inline constexpr int kDatasetVersion = 1;

struct SampleView {
  std::span<const int32_t> tokens;     // [S]
  std::span<const uint8_t> loss_mask;  // [S], 0/1
};

// A read-only, memory-mapped data directory. Thread safe: every method is const after open().
class Dataset {
 public:
  // Opens and validates <dir>: manifest.json (format, version, fields and types), every shard file present with
  // exactly the size the manifest says, every index starting at 0, strictly increasing and ending at the shard's
  // token count. A directory named "<x>.tmp-<pid>" (an unfinished prepare) is refused. Throws Error naming the
  // file and what is wrong.
  static Dataset open(const std::string& dir);
  Dataset(Dataset&&) noexcept;
  Dataset& operator=(Dataset&&) noexcept;
  ~Dataset();

  size_t size() const;                      // number of samples
  SampleView get(size_t i) const;           // i < size(), else Error
  const nlohmann::json& manifest() const;
  int64_t total_tokens() const;
  int64_t supervised_tokens() const;        // from the manifest counts
  const std::string& dir() const;
  // Re-reads every shard file and checks its SHA-256 against the manifest, and that mask values are 0/1 and
  // token ids lie in [0, vocab_size) when the manifest records tokenizer.vocab_size. Throws Error on mismatch.
  void verify() const;

  struct Impl;

 private:
  Dataset();
  std::unique_ptr<Impl> impl_;
};

// Writes a data directory crash-safely: everything goes into "<dir>.tmp-<pid>", and commit() writes
// manifest.json, fsyncs and renames the directory to <dir>. A writer destroyed without commit() removes its
// temporary directory; a process killed mid-way leaves only "<dir>.tmp-<pid>", which Dataset::open refuses
// and the next writer for <dir> removes when that pid is no longer running.
class DatasetWriter {
 public:
  // Claims <dir> by the rule of every command's output (core/output_dir.h, OutputOf::Prepare): fails if <dir>
  // holds a data set, unless overwrite (it is then replaced at commit(), and kept if the writer never commits), and
  // always if it holds anything else; an empty or absent <dir> is fine. shard_tokens: a new shard starts once the
  // current one holds this many tokens.
  DatasetWriter(const std::string& dir, bool overwrite = false, int64_t shard_tokens = int64_t{1} << 28);
  ~DatasetWriter();
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;

  // Appends one sample. tokens.size() == loss_mask.size() >= 1, mask values 0/1, else Error.
  void add(std::span<const int32_t> tokens, std::span<const uint8_t> loss_mask);
  // Writes the manifest: `meta` (an object) plus format/version/dtypes/shards and counts {samples_written,
  // tokens, supervised_tokens} merged into meta["counts"]; then publishes <dir>. Returns the manifest.
  nlohmann::json commit(const nlohmann::json& meta);

  int64_t samples() const;
  int64_t tokens() const;
  int64_t supervised_tokens() const;
  const std::string& tmp_dir() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// How a data directory was made, read from its manifest exactly as `dflash prepare` writes it (prepare.h,
// RowConverter::describe): the block that train records in every checkpoint's config and in the exported drafter
// ("dflash_training"."data"), whichever command writes the export:
//   {"created_by": "dflash prepare" | null,
//    "tokenizer_sha256": hex | null,   the tokenizer the ids come from
//    "chat_template": {"sha256", "origin", "mask_rule"} | null,   the template conversations were rendered with
//    "flags": {"format" (the requested --format), "pairs" (how prompt/completion rows became tokens: "chat" or
//              "raw"), "add_generation_prompt", "enable_thinking"?, "reasoning_effort"?, "template_args"?,
//              "strftime_now"?} | null,   the format and every template variable (chat_template.h chat_flags)
//    "max_length": n | null,
//    "inputs": [{"path", "sha256", "bytes", "rows"}] | null, "counts": {...} | null}
// A key the manifest lacks (a data set not written by prepare) is null. Never throws for a valid manifest.
nlohmann::json data_provenance(const nlohmann::json& manifest);

// The fields of two provenance blocks that decide how rows become tokens and loss masks — tokenizer_sha256, every
// chat_template key but "origin" and every flag (flags.format only when the resolved flags.pairs is absent) — that differ,
// one line each: "flags.enable_thinking: true (trained) vs false (evaluated)". `a_name` / `b_name` label the
// sides. Inputs, counts and max_length are not compared (other data may rightly differ there). A side without the
// block at all gives one line saying so.
std::vector<std::string> provenance_differences(const nlohmann::json& a, const nlohmann::json& b,
                                                const std::string& a_name = "trained",
                                                const std::string& b_name = "evaluated");

}  // namespace dflash
