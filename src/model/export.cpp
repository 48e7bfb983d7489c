// model/export.cpp — see export.h.
#include "model/export.h"

#include <unistd.h>

#include <filesystem>

#include "core/fs.h"
#include "core/log.h"
#include "io/safetensors.h"

namespace dflash {

nlohmann::json drafter_hf_config(const DrafterConfig& c, const nlohmann::json& training) {
  nlohmann::json j;
  j["architectures"] = {c.dflash2() ? "DFlash2DraftModel" : "DFlashDraftModel"};
  j["model_type"] = "qwen3";
  j["block_size"] = c.block_size;
  j["num_target_layers"] = c.num_target_layers;
  j["dflash_config"] = {{"mask_token_id", c.mask_token_id}, {"target_layer_ids", c.target_layer_ids}};
  if (c.embed_scale > 0) j["dflash_config"]["embed_scale"] = c.embed_scale;  // Gemma: the target's sqrt(H)
  if (c.dflash2()) {  // the keys vLLM's qwen3_dflash2.py reads; the optional scales keep their defaults (absent)
    j["dflash_config"]["block_size"] = c.block_size;
    j["dflash_config"]["conv_kernel_size"] = c.conv_kernel_size;
    j["dflash_config"]["conv_group_size"] = c.conv_group_size;
    j["dflash_config"]["selector_rank"] = c.selector_rank;
    j["dflash_config"]["selector_top_k"] = c.selector_top_k;
  }
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = rope_scaling_json(c.rope_scaling);
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["attention_bias"] = false;
  j["layer_types"] = c.layer_types.empty() ? std::vector<std::string>(static_cast<size_t>(c.num_layers), "full_attention")
                                           : c.layer_types;
  if (c.any_sliding()) {  // only then: a full-attention drafter's config keeps exactly spec 3's keys (case C11)
    j["use_sliding_window"] = true;
    j["sliding_window"] = c.sliding_window;
  }
  j["tie_word_embeddings"] = false;
  j["vocab_size"] = c.vocab_size;
  j["torch_dtype"] = "bfloat16";
  j["dtype"] = "bfloat16";
  if (!training.empty()) j["dflash_training"] = training;
  return j;
}

nlohmann::json training_record(int64_t steps, const nlohmann::json& train_config) {
  nlohmann::json config = train_config;
  nlohmann::json data = nullptr;
  if (config.is_object() && config.contains("data")) {
    data = config["data"];
    config.erase("data");
  }
  return {{"trainer", "dflash"}, {"steps", steps}, {"config", config}, {"data", data}};
}

void export_drafter(Context& ctx, const std::string& dir, const DrafterConfig& c, const ParamSet& ps,
                    const nlohmann::json& training) {
  namespace fs = std::filesystem;
  const std::string tmp = cat(dir, ".tmp-", getpid());
  fs::remove_all(tmp);
  make_dirs(tmp);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& p : ps.all()) tensors.emplace_back(p.name, cpu_to_bf16(ctx.to_host(p.master)));
  write_safetensors(tmp + "/model.safetensors", tensors, {{"format", "pt"}, {"dflash_training", training.dump()}});
  write_file_atomic(tmp + "/config.json", drafter_hf_config(c, training).dump(2) + "\n");
  // replace <dir>: move the old one aside first so a crash never leaves neither
  std::error_code ec;
  const std::string old = cat(dir, ".old-", getpid());
  if (fs::exists(dir)) fs::rename(dir, old, ec);
  DFLASH_CHECK(!ec, dir, ": cannot move the previous export aside: ", ec.message());
  fs::rename(tmp, dir, ec);
  DFLASH_CHECK(!ec, dir, ": cannot rename ", tmp, " into place: ", ec.message());
  fs::remove_all(old, ec);
  fsync_dir(fs::path(dir).parent_path().empty() ? "." : fs::path(dir).parent_path().string());
}

ExportedDrafter read_exported_drafter(const std::string& dir) {
  const std::string path = path_join(dir, "config.json");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    DFLASH_FAIL(path, ": invalid JSON: ", e.what());
  }
  auto need = [&](const char* key) -> const nlohmann::json& {
    DFLASH_CHECK(j.contains(key) && !j[key].is_null(), path, ": missing ", key);
    return j[key];
  };
  const auto& arch = need("architectures");
  DFLASH_CHECK(arch.is_array() && !arch.empty() && (arch[0] == "DFlashDraftModel" || arch[0] == "DFlash2DraftModel"),
               path, ": architectures is not [\"DFlashDraftModel\"] or [\"DFlash2DraftModel\"]: not a DFlash drafter "
               "export");
  ExportedDrafter e;
  DrafterConfig& c = e.config;
  c.arch = arch[0] == "DFlash2DraftModel" ? DraftArch::DFlash2 : DraftArch::DFlash;
  try {
    c.hidden_size = need("hidden_size").get<int64_t>();
    c.intermediate_size = need("intermediate_size").get<int64_t>();
    c.num_layers = need("num_hidden_layers").get<int64_t>();
    c.num_heads = need("num_attention_heads").get<int64_t>();
    c.num_kv_heads = j.value("num_key_value_heads", c.num_heads);
    c.head_dim = j.value("head_dim", c.hidden_size / c.num_heads);
    c.vocab_size = need("vocab_size").get<int64_t>();
    c.block_size = need("block_size").get<int64_t>();
    c.num_target_layers = need("num_target_layers").get<int64_t>();
    const auto& dc = need("dflash_config");
    DFLASH_CHECK(dc.contains("mask_token_id") && dc.contains("target_layer_ids"), path,
                 ": dflash_config needs mask_token_id and target_layer_ids");
    c.mask_token_id = dc["mask_token_id"].get<int32_t>();
    c.target_layer_ids = dc["target_layer_ids"].get<std::vector<int64_t>>();
    c.embed_scale = dc.value("embed_scale", 0.0);
    if (c.dflash2()) {
      auto key = [&](const char* k) {
        DFLASH_CHECK(dc.contains(k), path, ": dflash_config needs ", k, " for a DFlash2DraftModel");
        return dc[k].get<int64_t>();
      };
      c.conv_kernel_size = key("conv_kernel_size");
      c.conv_group_size = key("conv_group_size");
      c.selector_rank = key("selector_rank");
      c.selector_top_k = key("selector_top_k");
      // optional scales of the served form (vLLM qwen3_dflash2.py): only their defaults are supported here
      const double in_scale = dc.value("input_embedding_scale", 1.0), out_mult = dc.value("output_multiplier", 1.0);
      const double softcap = dc.contains("final_logit_softcapping") && !dc["final_logit_softcapping"].is_null()
                                 ? dc["final_logit_softcapping"].get<double>()
                                 : 0.0;
      DFLASH_CHECK(in_scale == 1.0, path, ": dflash_config.input_embedding_scale ", in_scale, " is not supported (1)");
      DFLASH_CHECK(out_mult == 1.0, path, ": dflash_config.output_multiplier ", out_mult, " is not supported (1)");
      DFLASH_CHECK(softcap <= 0.0, path, ": dflash_config.final_logit_softcapping ", softcap, " is not supported");
    }
    c.rms_norm_eps = j.value("rms_norm_eps", 1e-6);
    c.rope_theta = j.value("rope_theta", 10000.0);
    c.max_position_embeddings = j.value("max_position_embeddings", int64_t{0});
    // sliding-window layers: Hugging Face's layer_types + sliding_window, as transformers' Qwen3 reads them (with
    // use_sliding_window false, sliding_window is None and every layer attends fully); an all-full list is kept
    // as empty
    if (j.contains("layer_types") && j["layer_types"].is_array()) {
      c.layer_types = j["layer_types"].get<std::vector<std::string>>();
      DFLASH_CHECK(static_cast<int64_t>(c.layer_types.size()) == c.num_layers, path, ": layer_types has ",
                   c.layer_types.size(), " entries for num_hidden_layers = ", c.num_layers);
      bool sliding = c.any_sliding();
      if (sliding && !j.value("use_sliding_window", true)) {
        log_warn(path, ": layer_types names sliding_attention layers but use_sliding_window is false: every layer "
                 "attends fully (as transformers reads this config)");
        sliding = false;
      }
      if (sliding) {
        // vLLM reads is_causal first: false makes sliding layers bidirectional inside the block, which the sliding
        // rule here (spec 2.3: causal inside the block) does not compute
        DFLASH_CHECK(j.value("is_causal", true), path, ": is_causal false with sliding_attention layers (a "
                     "bidirectional block under a sliding window) is not supported");
        DFLASH_CHECK(j.contains("sliding_window") && j["sliding_window"].is_number_integer(), path,
                     ": layer_types has sliding_attention layers but sliding_window is not an integer");
        c.sliding_window = j["sliding_window"].get<int64_t>();
      } else {
        c.layer_types.clear();
      }
    }
    if (j.contains("rope_scaling") && j["rope_scaling"].is_object())
      c.rope_scaling = parse_rope_scaling(j["rope_scaling"], path, "rope_scaling", c.max_position_embeddings);
  } catch (const nlohmann::json::exception& ex) {
    DFLASH_FAIL(path, ": ill-typed field: ", ex.what());
  }
  try {
    c.validate();
  } catch (const Error& ex) {
    DFLASH_FAIL(path, ": ", ex.what());
  }
  e.training = j.value("dflash_training", nlohmann::json::object());
  e.weights_path = path_join(dir, "model.safetensors");
  return e;
}

std::unique_ptr<Drafter> load_exported_drafter(Context& ctx, const std::string& dir) {
  ExportedDrafter e = read_exported_drafter(dir);
  auto d = std::make_unique<Drafter>(ctx, e.config, 0);
  load_params(ctx, d->params(), WeightStore::open(e.weights_path));
  return d;
}

}  // namespace dflash
