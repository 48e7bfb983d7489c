// model/export.h — the z-lab Hugging Face drafter format (spec 3), written by `dflash export` and read back by
// `dflash eval` / `generate`: a directory with config.json and model.safetensors (bf16), top-level tensor names
// (fc.weight [H, nf*H], hidden_norm.weight, norm.weight, layers.{l}.*), no embedding / lm_head tensors.
// Loadable by SGLang (--speculative-algorithm DFLASH) and vLLM.
// defines: drafter_hf_config, training_record, export_drafter, ExportedDrafter, load_exported_drafter
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "model/drafter.h"

namespace dflash {

// The config.json of spec 3 for `c`; `training` (template, flags, tokenizer hash, steps...) is recorded under
// the extra key "dflash_training" (ignored by the serving engines).
nlohmann::json drafter_hf_config(const DrafterConfig& c, const nlohmann::json& training = nlohmann::json::object());

// The "dflash_training" block of an export, the same whichever command writes it (train at its end, `dflash
// export` from a checkpoint): {"trainer": "dflash", "steps": steps, "config": the train config without "data",
// "data": train_config["data"]} where "data" is the data provenance the trainer puts into its config
// (io/dataset.h data_provenance: tokenizer sha256, chat template, every template flag, format, max length,
// inputs); null when the config has none (a checkpoint of an older trainer).
nlohmann::json training_record(int64_t steps, const nlohmann::json& train_config);

// Writes <dir>/config.json and <dir>/model.safetensors (bf16; `training` also goes into the safetensors
// metadata as JSON). The directory appears complete or not at all: files are written into "<dir>.tmp-<pid>"
// which then replaces <dir> — the whole directory: callers claim it first (core/output_dir.h; train owns
// <out>/export, `dflash export` claims --out). Master weights are read from `ps` (any device; copied to the host).
void export_drafter(Context& ctx, const std::string& dir, const DrafterConfig& c, const ParamSet& ps,
                    const nlohmann::json& training = nlohmann::json::object());

struct ExportedDrafter {
  DrafterConfig config;
  nlohmann::json training;  // the "dflash_training" block, {} if absent
  std::string weights_path;
};
// Reads <dir>/config.json (Error naming the file and field; refuses a config that is not a DFlash drafter).
ExportedDrafter read_exported_drafter(const std::string& dir);
// A Drafter on ctx with the exported weights.
std::unique_ptr<Drafter> load_exported_drafter(Context& ctx, const std::string& dir);

}  // namespace dflash
