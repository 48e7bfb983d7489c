// cli/cmd_export.cpp — `dflash export`: a training checkpoint -> the z-lab Hugging Face drafter format (spec 3), with
// the same "dflash_training" record (config, data provenance) as train's own export; --out is claimed first
// (core/output_dir.h: an earlier export is replaced only with --overwrite).
#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "cli/commands.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/output_dir.h"
#include "io/dataset.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/export.h"
#include "train/checkpoint.h"

namespace dflash::cli {

void register_export(CLI::App& app) {
  auto* sub = app.add_subcommand("export", "export a trained drafter (checkpoint) in the z-lab Hugging Face format");
  struct Opts {
    std::string run, checkpoint, out;
    bool overwrite = false;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("--run", o->run, "training output directory (uses its checkpoints/LATEST)");
  sub->add_option("--checkpoint", o->checkpoint, "a checkpoint directory (checkpoints/step-NNNNNNNN)");
  sub->add_option("--out", o->out, "export directory (config.json + model.safetensors); a new or empty one, or an "
                  "earlier export with --overwrite")
      ->required();
  sub->add_flag("--overwrite", o->overwrite, "replace an earlier export in --out");
  sub->callback([o] {
    claim_output_dir(o->out, false, o->overwrite, OutputOf::Export);  // before any work; nothing touched if refused
    std::string ck = o->checkpoint;
    if (ck.empty()) {
      DFLASH_CHECK(!o->run.empty(), "export: give --run or --checkpoint");
      ck = latest_checkpoint(o->run);
      DFLASH_CHECK(!ck.empty(), o->run, ": no checkpoint (checkpoints/LATEST missing)");
    }
    const auto state = nlohmann::json::parse(read_file(path_join(ck, "state.json")));
    const auto& c = state.at("config");
    ModelConfig tc = load_model_config(c.at("target_dir").get<std::string>());
    DrafterConfig dc = DrafterConfig::for_target(tc, c.at("num_layers"), c.at("block_size"),
                                                 c.at("target_layer_ids").get<std::vector<int64_t>>(),
                                                 c.at("mask_token_id"));
    dc.intermediate_size = c.at("intermediate_size");
    dc.layer_types = c.value("layer_types", std::vector<std::string>{});  // resolved by train; absent before windows
    dc.sliding_window = c.value("sliding_window", int64_t{0});
    dc.arch = parse_draft_arch(c.value("arch", std::string("dflash")), "the checkpoint's arch");  // absent: DFlash
    dc.conv_kernel_size = c.value("conv_kernel_size", dc.conv_kernel_size);
    dc.conv_group_size = c.value("conv_group_size", dc.conv_group_size);
    dc.selector_rank = c.value("selector_rank", dc.selector_rank);
    dc.selector_top_k = c.value("selector_top_k", dc.selector_top_k);
    dc.validate();
    auto ctx = make_context("cpu");
    Drafter d(*ctx, dc, 0);
    load_params(*ctx, d.params(), WeightStore::open(path_join(ck, "params.safetensors")));
    nlohmann::json config = c;
    if (!config.contains("data")) {  // a checkpoint of an older trainer: the data directory's manifest, if still there
      const std::string data_dir = c.value("data_dir", std::string());
      if (!data_dir.empty() && file_exists(path_join(data_dir, "manifest.json"))) {
        config["data"] = data_provenance(Dataset::open(data_dir).manifest());
        log_warn("export: ", ck, " records no data provenance; taken from ", data_dir, "/manifest.json as it is now");
      } else {
        log_warn("export: ", ck, " records no data provenance and ", data_dir.empty() ? "no data directory" : data_dir,
                 " is gone: the export cannot say how its data was prepared");
      }
    }
    nlohmann::json training = training_record(state.at("step").get<int64_t>(), config);
    export_drafter(*ctx, o->out, dc, d.params(), training);
    log_info("exported ", ck, " -> ", o->out);
  });
}

}  // namespace dflash::cli
