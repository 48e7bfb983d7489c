// train/run_inputs.h — what a run is trained on, recorded in every checkpoint (state.json "inputs") and checked
// when a run resumes: a resume onto another target, tokenizer, chat template or template variable, or data set is
// refused naming the field and both values, unless --allow-data-change continues on new data deliberately (never
// another target), which is then recorded in the run's provenance (config "data_changes": in every later checkpoint
// and in the export's dflash_training.config).
// defines: target_identity, run_inputs, json_differences, ResumeInputs, check_resume_inputs
//
// The record ("inputs"):
//   "target": {"config_sha256": sha256 of config.json,
//              "weights": [{"file", "bytes", "header_sha256", "sample_sha256"}, ...] per weight file, sorted: the
//                          files the loader reads (the index's shards, else model.safetensors, else *.safetensors)}
//             ("weights": {"random_seed": s} for --random-target)
//   "tokenizer_sha256": the target's tokenizer.json (Tokenizer::hash), or null
//   "data": the data set's manifest.json as written by prepare: how the rows became tokens (tokenizer, chat
//           template and its sha256, every template variable and flag, format, max length, the inputs and their
//           sha256) and what the data set holds (every shard's sha256, the counts). Compared key by key, whatever
//           keys it has: a field a later prepare adds is covered without a change here.
// Why this identity of the weights: hashing them whole costs a full read of the target at every start (16 GB for an
// 8B target: about 26 s at the 606 MB/s measured on the CI machine from a cold cache, minutes on a network file
// system; the identity of a 4 GiB file took 6 ms there: bench/RESULTS.md "what an interruption leaves behind"). A
// file's size and the sha256 of its safetensors header pin every tensor's name, dtype, shape and byte range; the
// sha256 of 16 blocks of 64 KiB spread evenly over its data catches another training of the same architecture (a
// fine-tune changes essentially every weight). It reads at most 1 MiB per file. What it misses: a change confined
// to bytes outside the samples.
// Where a file was read from is not its identity: keys named "path" or "origin" (at any depth) are not compared,
// so a target or data set moved or copied elsewhere resumes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dflash {

// The identity of the target in target_dir (see above); random_weights: the weights are drawn from `seed`. Error
// names a safetensors file whose header cannot be read.
nlohmann::json target_identity(const std::string& target_dir, bool random_weights, uint64_t seed);

// The whole record: target_identity, the tokenizer hash (empty = null), the data manifest.
nlohmann::json run_inputs(const std::string& target_dir, bool random_weights, uint64_t seed,
                          const std::string& tokenizer_sha256, const nlohmann::json& data_manifest);

// The leaves where `was` and `now` differ, one line each, "prefix.key[i]: <was> (<was_name>) vs <now> (<now_name>)"
// (a missing key reads "(absent)"; long values are shortened), in key order. Objects are compared key by key and
// arrays element by element; keys in `skip_keys` are not compared at any depth.
std::vector<std::string> json_differences(const nlohmann::json& was, const nlohmann::json& now,
                                          const std::string& prefix, const std::vector<std::string>& skip_keys,
                                          const std::string& was_name = "checkpoint",
                                          const std::string& now_name = "this run");

struct ResumeInputs {
  std::vector<std::string> differences;  // the data / tokenizer differences accepted (empty: the same inputs)
  nlohmann::json data_changes;           // the run's data change history to record from now on (an array)
};

// Checks this run's inputs (`now`: run_inputs; `provenance_now`: data_provenance of its manifest) against what the
// checkpoint recorded (`state`: its state.json; "inputs" and config.data / config.data_changes; a checkpoint
// without an "inputs" record is compared on config.data alone, with a note). Errors (naming ckpt_dir, each differing
// field with both values, at most 12 lines): any difference in the target; a difference in the tokenizer or the
// data unless allow_data_change. With allow_data_change and differences: a warning listing them, and a new entry
// {"step": step, "differences": [...], "before": the checkpoint's config.data} appended to the history.
ResumeInputs check_resume_inputs(const nlohmann::json& state, const nlohmann::json& now,
                                 const nlohmann::json& provenance_now, bool allow_data_change,
                                 const std::string& ckpt_dir, int64_t step);

}  // namespace dflash
