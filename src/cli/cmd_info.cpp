// cli/cmd_info.cpp — `dflash info [PATH] [--device DEV] [--json]`: a model directory's parsed config.json — its
// family, the per-layer plan, total and active parameters per token, what the weights take on the device, the
// drafter defaults — and its weight summary, or a .safetensors file's tensors and metadata; with --device, the
// device and which kernel runs each group of ops there (the CUDA kernel tiers, backend/kernel_tier.h).
// `dflash info --plan --target DIR [train's layout options]`: the memory plan of a training layout
// (train/memory_plan.h) as a table (--json: as JSON); exit status 1 when it does not fit, with train's refusal.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/fs.h"
#include "io/hf_config.h"
#include "io/model_family.h"
#include "io/safetensors.h"
#include "model/drafter.h"
#include "model/target.h"
#include "model/target/mixer.h"
#include "io/dataset.h"
#include "train/memory_plan.h"
#include "train/trainer.h"

namespace dflash::cli {

namespace {

using ojson = nlohmann::ordered_json;

// One layer's plan in words: "attention (qk-norm) + MoE 128 experts top-8 of width 768",
// "attention (q/k/v bias, o bias, sinks, sliding window 128) + MoE 32 experts top-4 of width 2880 (top-k
// renormalised; clamped SwiGLU, biases; MXFP4)".
std::string layer_text(const ModelConfig& c, const LayerSpec& s) {
  const std::string a = token_mixer(s.mixer).describe(c, s) + (s.sandwich_norms ? " (sandwich norms)" : "");
  const char* dense = c.mlp_act == MlpAct::GeluTanh ? "GeGLU (gelu_tanh)" : "SwiGLU";
  const std::string tail = s.layer_scalar ? " x layer_scalar" : "";
  if (s.mlp == ChannelMixer::Dense) return cat(a, " + dense ", dense, " of width ", s.mlp_width, tail);
  std::vector<std::string> notes;
  if (c.moe.router == RouterKind::SigmoidTopK)
    notes.push_back(c.moe.score_correction_bias ? "sigmoid router, score-correction bias" : "sigmoid router");
  if (c.moe.n_group > 1) notes.push_back(cat("top-", c.moe.topk_group, " of ", c.moe.n_group, " groups"));
  if (c.moe.norm_topk_prob) notes.push_back("top-k renormalised");
  if (c.moe.routed_scaling_factor != 1.0) notes.push_back(cat("x ", c.moe.routed_scaling_factor));
  if (c.moe.router_scales) notes.push_back("router scales");
  std::string act = c.moe.act == ExpertAct::ClampedSwiGLU ? "clamped SwiGLU"
                    : c.moe.act == ExpertAct::GeluTanh    ? "GeGLU"
                                                           : "";
  if (c.moe.router_bias || c.moe.expert_bias) act += act.empty() ? "biases" : ", biases";
  if (!act.empty()) notes.push_back(act);
  if (c.moe.expert_format == WeightFormat::MXFP4) notes.push_back("MXFP4");
  if (c.moe.expert_format == WeightFormat::INT4)
    notes.push_back(c.moe.int4_group > 0 ? cat("INT4 in groups of ", c.moe.int4_group) : "INT4 per channel");
  std::string m = cat(a, " + MoE ", c.moe.num_experts, " experts top-", c.moe.top_k, " of width ", s.mlp_width);
  for (size_t i = 0; i < notes.size(); ++i) m += (i ? "; " : " (") + notes[i] + (i + 1 == notes.size() ? ")" : "");
  if (c.moe.shared_expert_width > 0)
    m += cat(" + shared expert of width ", c.moe.shared_expert_width, c.moe.shared_expert_gate ? "" : " (no gate)");
  if (c.moe.dense_beside_width > 0) m += cat(" beside a dense ", dense, " of width ", c.moe.dense_beside_width);
  return m + tail;
}

// The plan as runs of equal consecutive layers: [{"layers": "0-1", "plan": "..."}, ...]. A plan that repeats with a
// short period (hybrid models: 3 linear-attention layers, then one attention layer; gpt-oss: sliding, full, sliding,
// ...) and would take more than 6 runs is shown for one period, as runs of the layer index modulo the period:
// "0-2 of every 4", "0 of every 2". The JSON and the text form show the same runs.
ojson plan_json(const ModelConfig& c) {
  const int64_t L = c.num_hidden_layers;
  std::vector<std::string> text(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) text[static_cast<size_t>(l)] = layer_text(c, c.layer(l));
  auto runs_of = [&](int64_t n, const std::string& suffix) {
    ojson runs = ojson::array();
    int64_t start = 0;
    for (int64_t l = 1; l <= n; ++l) {
      if (l < n && text[static_cast<size_t>(l)] == text[static_cast<size_t>(start)]) continue;
      runs.push_back({{"layers", (l - 1 == start ? std::to_string(start) : cat(start, "-", l - 1)) + suffix},
                      {"plan", text[static_cast<size_t>(start)]}});
      start = l;
    }
    return runs;
  };
  ojson runs = runs_of(L, "");
  if (runs.size() <= 6) return runs;
  for (int64_t p = 2; p <= 8 && 2 * p <= L; ++p) {
    bool periodic = true;
    for (int64_t l = p; l < L && periodic; ++l) periodic = text[static_cast<size_t>(l)] == text[static_cast<size_t>(l % p)];
    if (periodic) return runs_of(p, cat(" of every ", p));
  }
  return runs;
}

ojson config_json(const ModelConfig& c) {
  ojson j;
  j["arch"] = arch_name(c.arch);
  j["family"] = family_of(c.arch).title;
  j["architecture"] = c.architecture;
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
  } else if (c.rope_scaling.kind == "yarn") {
    j["rope_scaling"]["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
    j["rope_scaling"]["beta_fast"] = c.rope_scaling.beta_fast;
    j["rope_scaling"]["beta_slow"] = c.rope_scaling.beta_slow;
    j["rope_scaling"]["truncate"] = c.rope_scaling.truncate;
    j["rope_scaling"]["attention_factor"] = c.rope_scaling.attention_scaling();  // as resolved
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_bias"] = c.attention_bias;
  j["qk_norm"] = c.qk_norm;
  if (c.zero_centred_norms) j["zero_centred_norms"] = true;
  if (c.rope_dim() != c.head_dim) j["rotary_dim"] = c.rope_dim();
  if (c.embed_scale > 0) j["embed_scale"] = c.embed_scale;
  if (c.final_logit_softcap > 0) j["final_logit_softcapping"] = c.final_logit_softcap;
  if (c.rope_alt.defined())
    j["rope_full_attention"] = {{"rope_type", "proportional"}, {"rope_theta", c.rope_alt.theta},
                                {"head_dim", c.rope_alt.dim}, {"rotary_dim", c.rope_alt.rotated}};
  // each mixer kind with config keys of its own that some layer uses: {"layers": how many, its keys...}
  for (const TokenMixerKind* m : token_mixers()) {
    if (!m->info_key) continue;
    int64_t n = 0;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) n += c.layer(i).mixer == m->kind;
    if (n == 0) continue;
    ojson keys = {{"layers", n}};
    for (const auto& [key, value] : m->info_keys(c)) keys[key] = value;
    j[m->info_key] = keys;
  }
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_ids"] = c.eos_token_ids;
  j["torch_dtype"] = c.torch_dtype;
  if (c.has_moe())
    j["moe"] = {{"num_experts", c.moe.num_experts}, {"num_experts_per_tok", c.moe.top_k},
                {"moe_intermediate_size", c.moe.expert_width}, {"norm_topk_prob", c.moe.norm_topk_prob},
                {"decoder_sparse_step", c.moe.decoder_sparse_step}, {"mlp_only_layers", c.moe.mlp_only_layers},
                {"shared_expert_intermediate_size", c.moe.shared_expert_width},
                {"n_group", c.moe.n_group}, {"topk_group", c.moe.topk_group},
                {"routed_scaling_factor", c.moe.routed_scaling_factor}};
  j["layers"] = plan_json(c);
  const TargetParams p = target_params(c);
  j["params"] = {{"total", p.total}, {"active_per_token", p.active}, {"embedding", p.embedding}};
  j["device_weight_bytes_bf16"] = p.bf16_bytes();
  if (c.moe.expert_format != WeightFormat::Plain) j["quant_method"] = weight_format_name(c.moe.expert_format);
  if (c.linear_format == WeightFormat::FP8) {
    j["quant_method"] = c.fp8.method;
    j["fp8"] = {{"format", "e4m3"}, {"scales", c.fp8.granularity()}, {"scale_tensor", c.fp8.scale_name},
                {"activations", "dynamic per token"}, {"not_converted", c.fp8.not_converted}};
    j["params"]["fp8"] = p.fp8;
  }
  if (c.int4.declared) {
    j["quant_method"] = "compressed-tensors";
    j["int4"] = {{"format", "pack-quantized"}, {"group_size", c.int4.group_size}, {"ignore", c.int4.ignore}};
    j["params"]["int4"] = p.int4;
    j["params"]["int4_scales"] = p.int4_scales;
  }
  j["params"]["mxfp4"] = p.mxfp4;
  j["device_weight_bytes"] = p.device_bytes();  // MXFP4 / INT4 experts kept so, FP8 projections in FP8
  try {
    j["default_target_layer_ids_nf5"] = default_target_layer_ids(c.num_hidden_layers, 5);
  } catch (const Error&) {
    j["default_target_layer_ids_nf5"] = nullptr;  // too few layers for 5 distinct taps
  }
  j["drafter_default_intermediate_size"] = default_intermediate_size(c);
  return j;
}

std::string human(double n) {
  return n >= 1e9 ? cat(std::round(n / 1e7) / 100, "B") : n >= 1e6 ? cat(std::round(n / 1e4) / 100, "M") : cat(n);
}

// The checkpoint's tensors; those under one of `ignored` (the family's prefixes that are not the language model:
// vision tower, MTP head) counted apart by prefix.
ojson weights_json(const WeightStore& ws, const std::vector<std::string>& ignored) {
  int64_t params = 0;
  std::map<std::string, int64_t> dtypes;
  ojson skipped = ojson::object();
  size_t bytes = 0, read = 0;
  for (const auto& n : ws.names()) {
    bool skip = false;
    for (const std::string& p : ignored)
      if (n.starts_with(p)) {
        skipped[p] = skipped.value(p, 0) + 1;
        skip = true;
        break;
      }
    if (skip) continue;
    ++read;
    const TensorInfo& t = ws.info(n);
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    params += numel;
    bytes += t.end - t.begin;
    dtypes[dtype_name(t.dtype)] += 1;
  }
  ojson j = {{"tensors", read}, {"params", params}, {"bytes", bytes}, {"dtypes", dtypes}};
  if (!skipped.empty()) j["ignored"] = skipped;  // not read: {"model.visual.": 333, "mtp.": 15}
  return j;
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
  if (j.contains("device")) {
    std::printf("device: %s\n", j["device"]["name"].get<std::string>().c_str());
    for (const auto& r : j["device"]["kernels"])
      std::printf("  %-40s %s\n", r["ops"].get<std::string>().c_str(), r["kernel"].get<std::string>().c_str());
    if (!j.contains("path")) return;
  }
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
    std::printf("arch: %s (%s, %s)\n", c["arch"].get<std::string>().c_str(), c["family"].get<std::string>().c_str(),
                c["architecture"].get<std::string>().c_str());
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
    for (const auto& r : c["layers"])
      std::printf("  layer %-7s %s\n", r["layers"].get<std::string>().c_str(), r["plan"].get<std::string>().c_str());
    const ojson& p = c["params"];
    const bool mx = p["mxfp4"].get<int64_t>() > 0, f8 = p.contains("fp8");
    const bool q4 = p.contains("int4") && p["int4"].get<int64_t>() > 0;
    std::printf("params: %s total, %s active per token; weights on the device (%s): %.2f GiB\n",
                human(p["total"].get<double>()).c_str(), human(p["active_per_token"].get<double>()).c_str(),
                mx ? "bf16, experts in MXFP4" : f8 ? "bf16, projections in FP8" : q4 ? "bf16, experts in INT4" : "bf16",
                c["device_weight_bytes"].get<double>() / (1 << 30));
    if (f8)
      std::printf("  of which FP8 (%s e4m3, %s scales, activations dynamic per token): %s params in %.2f GiB (%.2f "
                  "GiB in bf16); not converted: %s\n",
                  c["quant_method"].get<std::string>().c_str(), c["fp8"]["scales"].get<std::string>().c_str(),
                  human(p["fp8"].get<double>()).c_str(), p["fp8"].get<double>() / (1 << 30),
                  p["fp8"].get<double>() * 2 / (1 << 30), c["fp8"]["not_converted"].dump().c_str());
    if (mx)
      std::printf("  of which MXFP4 (experts, 17/32 byte per parameter): %s params in %.2f GiB (%.2f GiB in bf16)\n",
                  human(p["mxfp4"].get<double>()).c_str(), p["mxfp4"].get<double>() * 17 / 32 / (1 << 30),
                  p["mxfp4"].get<double>() * 2 / (1 << 30));
    if (q4) {
      const double n = p["int4"].get<double>(), ns = p["int4_scales"].get<double>();
      const int64_t g = c["int4"]["group_size"].get<int64_t>();
      std::printf("  of which INT4 (experts, compressed-tensors pack-quantized, a bf16 scale per %s): %s params in %.2f "
                  "GiB (%.2f GiB in bf16); ignore: %s\n",
                  g > 0 ? cat(g, " columns").c_str() : "row", human(n).c_str(),
                  (n / 2 + 2 * ns) / (1 << 30), n * 2 / (1 << 30), c["int4"]["ignore"].dump().c_str());
    }
    const ojson& t = c["default_target_layer_ids_nf5"];
    const std::string ids = t.is_null() ? "n/a (too few layers)" : list(t.get<std::vector<int64_t>>());
    std::printf("default target_layer_ids (nf=5): %s; drafter intermediate_size default %lld\n", ids.c_str(),
                I(c, "drafter_default_intermediate_size"));
  }
  if (j.contains("weights")) {
    const ojson& w = j["weights"];
    const double p = w["params"].get<double>();
    std::printf("weights: %zu tensors, %lld params (%s), %.3f GiB, dtypes %s\n", w["tensors"].get<size_t>(),
                I(w, "params"), human(p).c_str(), w["bytes"].get<double>() / (1 << 30), w["dtypes"].dump().c_str());
    if (w.contains("ignored"))
      for (const auto& [prefix, n] : w["ignored"].items())
        std::printf("ignored by name (not the language model): %lld tensors under %s\n", n.get<long long>(),
                    prefix.c_str());
  }
}

}  // namespace

void register_info(CLI::App& app) {
  auto* sub = app.add_subcommand("info", "show a model directory's config and weights, or a .safetensors file");
  static std::string path;
  static bool as_json = false;
  static bool plan = false;
  static TrainConfig layout;
  static std::string data;
  sub->add_option("path", path, "model directory, config.json or .safetensors file");
  sub->add_flag("--json", as_json, "print JSON");
  sub->add_flag("--plan", plan, "the memory plan of a training layout (with --target and train's layout options): "
                "bytes per device, exit status 1 when it does not fit");
  sub->add_option("--target", layout.target_dir, "--plan: the target model directory (or give it as PATH)");
  sub->add_option("--data", data, "--plan: a data directory whose longest sequence sizes the plan (else --max-length)");
  add_layout_options(sub, layout);
  sub->callback([sub] {
    if (plan) {
      if (layout.target_dir.empty()) layout.target_dir = path;
      DFLASH_CHECK(!layout.target_dir.empty(), "info --plan: give --target DIR");
      int64_t longest = 0;
      if (!data.empty()) {
        const Dataset d = Dataset::open(data);
        for (size_t i = 0; i < d.size(); ++i)
          longest = std::max<int64_t>(longest, static_cast<int64_t>(d.get(i).tokens.size()));
      }
      const int64_t assumed = layout.device_memory.empty() ? 0 : parse_bytes(layout.device_memory, "--device-memory");
      const MemoryPlanInputs in = memory_plan_inputs(layout, longest);
      const MemoryPlan p = plan_memory(in);
      if (as_json) {
        nlohmann::json j = p;
        nlohmann::json fr = nlohmann::json::object();
        for (const auto& [pool, need] : p.needed()) fr[pool] = pool_free_bytes(pool, assumed);
        j["free"] = fr;
        std::cout << j.dump(2) << "\n";
      } else {
        std::cout << memory_plan_table(p, assumed);
      }
      std::cout.flush();
      check_memory_plan(in, p, assumed);
      return;
    }
    const bool show_device = sub->count("--device") > 0;  // (train's layout option, bound to layout.device)
    DFLASH_CHECK(!path.empty() || show_device,
                 "info: give a model directory, a .safetensors file, --device or --plan --target DIR");
    ojson out;
    if (show_device) {
      const std::unique_ptr<Context> ctx = make_context(layout.device);
      ojson rows = ojson::array();
      for (const auto& [ops, kernel] : ctx->kernel_table()) rows.push_back({{"ops", ops}, {"kernel", kernel}});
      out["device"] = {{"name", ctx->describe()}, {"kernels", rows}};
    }
    if (path.empty()) {
      // --device alone
    } else if (file_exists(path) && path.ends_with(".safetensors")) {
      out.update(file_json(*SafetensorsFile::open(path)));
    } else {
      DFLASH_CHECK(file_exists(path) || dir_exists(path), path, ": no such file or directory");
      out["path"] = path;
      const bool is_dir = dir_exists(path);
      std::vector<std::string> ignored;
      if (!is_dir || file_exists(path_join(path, "config.json"))) {
        const ModelConfig c = load_model_config(path);
        out["config"] = config_json(c);
        ignored = family_of(c.arch).names.ignored;
        ignored.insert(ignored.end(), c.ignored_weights.begin(), c.ignored_weights.end());
      }
      if (is_dir && has_weights(path)) out["weights"] = weights_json(WeightStore::open(path), ignored);
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
