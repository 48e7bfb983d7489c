// cli/cmd_info.cpp — `dflash info PATH [--json]`: a model directory's parsed config.json and weight summary,
// or a .safetensors file's tensors and metadata.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/fs.h"
#include "io/hf_config.h"
#include "io/safetensors.h"

namespace dflash::cli {

namespace {

using ojson = nlohmann::ordered_json;

ojson config_json(const ModelConfig& c) {
  ojson j;
  j["arch"] = arch_name(c.arch);
  j["model_type"] = c.model_type;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = {{"kind", c.rope_scaling.kind}};
  if (c.rope_scaling.kind != "none") j["rope_scaling"]["factor"] = c.rope_scaling.factor;
  if (c.rope_scaling.kind == "llama3") {
    j["rope_scaling"]["low_freq_factor"] = c.rope_scaling.low_freq_factor;
    j["rope_scaling"]["high_freq_factor"] = c.rope_scaling.high_freq_factor;
    j["rope_scaling"]["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_bias"] = c.attention_bias;
  j["qk_norm"] = c.qk_norm;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_ids"] = c.eos_token_ids;
  j["torch_dtype"] = c.torch_dtype;
  try {
    j["default_target_layer_ids_nf5"] = default_target_layer_ids(c.num_hidden_layers, 5);
  } catch (const Error&) {
    j["default_target_layer_ids_nf5"] = nullptr;  // too few layers for 5 distinct taps
  }
  return j;
}

ojson weights_json(const WeightStore& ws) {
  int64_t params = 0;
  std::map<std::string, int64_t> dtypes;
  size_t bytes = 0;
  for (const auto& n : ws.names()) {
    const TensorInfo& t = ws.info(n);
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    params += numel;
    bytes += t.end - t.begin;
    dtypes[dtype_name(t.dtype)] += 1;
  }
  return {{"tensors", ws.names().size()}, {"params", params}, {"bytes", bytes}, {"dtypes", dtypes}};
}

ojson file_json(const SafetensorsFile& f) {
  ojson ts = ojson::array();
  for (const auto& t : f.tensors())
    ts.push_back({{"name", t.name}, {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}});
  return {{"path", f.path()}, {"tensors", ts}, {"metadata", f.metadata()}};
}

bool has_weights(const std::string& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".safetensors" || e.path().filename() == "model.safetensors.index.json") return true;
  return false;
}

std::string list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

long long I(const ojson& j, const char* key) { return j[key].get<long long>(); }

void print_text(const ojson& j) {
  if (j.contains("tensors") && j["tensors"].is_array()) {  // one .safetensors file
    std::printf("%s: %zu tensors\n", j["path"].get<std::string>().c_str(), j["tensors"].size());
    for (const auto& t : j["tensors"])
      std::printf("  %-60s %-5s %s\n", t["name"].get<std::string>().c_str(), t["dtype"].get<std::string>().c_str(),
                  list(t["shape"].get<std::vector<int64_t>>()).c_str());
    for (const auto& [k, v] : j["metadata"].items())
      std::printf("  metadata %s = %s\n", k.c_str(), v.get<std::string>().c_str());
    return;
  }
  std::printf("path: %s\n", j["path"].get<std::string>().c_str());
  if (j.contains("config")) {
    const ojson& c = j["config"];
    std::printf("arch: %s\n", c["arch"].get<std::string>().c_str());
    std::printf("layers %lld, hidden %lld, intermediate %lld, heads %lld (kv %lld), head_dim %lld, vocab %lld\n",
                I(c, "num_hidden_layers"), I(c, "hidden_size"), I(c, "intermediate_size"),
                I(c, "num_attention_heads"), I(c, "num_key_value_heads"), I(c, "head_dim"),
                I(c, "vocab_size"));
    std::printf("rope: theta %g, scaling %s, max positions %lld\n", c["rope_theta"].get<double>(),
                c["rope_scaling"].dump().c_str(), I(c, "max_position_embeddings"));
    std::printf("rms_norm_eps %g, tie_word_embeddings %s, attention_bias %s, qk_norm %s\n",
                c["rms_norm_eps"].get<double>(), c["tie_word_embeddings"].dump().c_str(),
                c["attention_bias"].dump().c_str(), c["qk_norm"].dump().c_str());
    std::printf("bos %lld, eos %s, dtype %s\n", I(c, "bos_token_id"),
                list(c["eos_token_ids"].get<std::vector<int64_t>>()).c_str(),
                c["torch_dtype"].get<std::string>().c_str());
    const ojson& t = c["default_target_layer_ids_nf5"];
    const std::string ids = t.is_null() ? "n/a (too few layers)" : list(t.get<std::vector<int64_t>>());
    std::printf("default target_layer_ids (nf=5): %s\n", ids.c_str());
  }
  if (j.contains("weights")) {
    const ojson& w = j["weights"];
    const double p = w["params"].get<double>();
    const std::string human = p >= 1e9 ? cat(p / 1e9, "B") : p >= 1e6 ? cat(p / 1e6, "M") : cat(p);
    std::printf("weights: %zu tensors, %lld params (%s), %.3f GiB, dtypes %s\n", w["tensors"].get<size_t>(),
                I(w, "params"), human.c_str(), w["bytes"].get<double>() / (1 << 30), w["dtypes"].dump().c_str());
  }
}

}  // namespace

void register_info(CLI::App& app) {
  auto* sub = app.add_subcommand("info", "show a model directory's config and weights, or a .safetensors file");
  static std::string path;
  static bool as_json = false;
  sub->add_option("path", path, "model directory, config.json or .safetensors file")->required();
  sub->add_flag("--json", as_json, "print JSON");
  sub->callback([] {
    ojson out;
    if (file_exists(path) && path.ends_with(".safetensors")) {
      out = file_json(*SafetensorsFile::open(path));
    } else {
      DFLASH_CHECK(file_exists(path) || dir_exists(path), path, ": no such file or directory");
      out["path"] = path;
      const bool is_dir = dir_exists(path);
      if (!is_dir || file_exists(path_join(path, "config.json"))) out["config"] = config_json(load_model_config(path));
      if (is_dir && has_weights(path)) out["weights"] = weights_json(WeightStore::open(path));
      DFLASH_CHECK(out.contains("config") || out.contains("weights"), path, ": no config.json and no .safetensors");
    }
    if (as_json) {
      std::cout << out.dump(2) << "\n";
    } else {
      print_text(out);
    }
  });
}

}  // namespace dflash::cli
