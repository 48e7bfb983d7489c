// io/hf_config.cpp — a target's config.json: the keys every family shares, with the defaults of Hugging Face
// transformers; the family (io/model_family.cpp) reads its own keys and makes the per-layer plan.
#include "io/hf_config.h"

#include <algorithm>
#include <cmath>
#include <regex>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "io/model_family.h"

namespace dflash {

using nlohmann::json;
using Fields = JsonFields;

const char* arch_name(Arch a) { return family_of(a).model_type; }

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::Plain: return "plain";
    case WeightFormat::MXFP4: return "mxfp4";
    case WeightFormat::FP8: return "fp8";
    case WeightFormat::INT4: return "int4";
  }
  return "plain";
}

namespace {

// compressed-tensors' match of one target / ignore entry against a module name (utils/match.py).
bool ct_match(const std::string& entry, const std::string& module) {
  if (entry.rfind("re:", 0) == 0)
    return std::regex_search(module, std::regex(entry.substr(3)), std::regex_constants::match_continuous);
  return entry == module || entry == "Linear";
}

}  // namespace

bool Int4Format::covers(const std::string& module) const {
  if (!declared) return false;
  const bool target = std::any_of(targets.begin(), targets.end(), [&](const auto& t) { return ct_match(t, module); });
  // (an ignore entry "Linear" would ignore everything, as compressed-tensors does; names match whole)
  return target && std::none_of(ignore.begin(), ignore.end(), [&](const auto& i) { return ct_match(i, module); });
}

std::string Fp8Format::granularity() const {
  if (block_n == 0 && block_k == 0) return "per tensor";
  if (block_n == 1 && block_k == 0) return "per channel";
  return cat("block ", block_n, "x", block_k);
}

namespace {

// A list of strings (absent: empty), for modules_to_not_convert / ignore.
std::vector<std::string> string_list(const Fields& f, const char* key) {
  std::vector<std::string> out;
  const json* v = f.get(key);
  if (!v) return out;
  DFLASH_CHECK(v->is_array(), f.src, ": ", f.prefix, key, ": expected a list of strings, got ", v->dump());
  for (const auto& e : *v) {
    DFLASH_CHECK(e.is_string(), f.src, ": ", f.prefix, key, ": expected a list of strings, got ", v->dump());
    out.push_back(e.get<std::string>());
  }
  return out;
}

// transformers' FineGrainedFP8Config (integrations/finegrained_fp8.py): fmt, activation_scheme, weight_block_size.
void parse_fp8(const Fields& q, Fp8Format& fp8) {
  // "float8_e4m3fn" (torch's name of the same format): MiniMax-M2's published configs
  const std::string fmt = q.opt_str("fmt", "e4m3");
  DFLASH_CHECK(fmt == "e4m3" || fmt == "float8_e4m3fn", q.src, ": ", q.prefix, "fmt: '", fmt,
               "' is not supported (FP8 weights in \"e4m3\")");
  const std::string act = q.opt_str("activation_scheme", "dynamic");
  DFLASH_CHECK(act == "dynamic", q.src, ": ", q.prefix, "activation_scheme: '", act,
               "' is not supported (only \"dynamic\": activations scaled per token as they come; static input "
               "scales are not read)");
  if (q.get("weight_block_size")) {
    const std::vector<int64_t> b = q.opt_int_list("weight_block_size");
    DFLASH_CHECK(b.size() == 2 && b[0] > 0 && b[1] > 0, q.src, ": ", q.prefix,
                 "weight_block_size: expected two positive integers [rows, columns], got ",
                 q.get("weight_block_size")->dump());
    fp8.block_n = b[0];
    fp8.block_k = b[1];
  }
  fp8.method = "fp8";
  fp8.scale_name = "weight_scale_inv";
  fp8.not_converted = string_list(q, "modules_to_not_convert");
}

// One of compressed-tensors' config_groups: its message prefix ("quantization_config.config_groups.<name>."), its
// fields and its weights' fields. Error naming the group when it is not an object or has no weights.
struct CtGroup {
  std::string prefix;
  Fields group, weights;
};
CtGroup ct_group(const Fields& q, const std::string& name, const json& g) {
  const std::string gp = q.prefix + "config_groups." + name + ".";
  DFLASH_CHECK(g.is_object(), q.src, ": ", gp, ": expected an object, got ", g.dump());
  const Fields gf{g, q.src, gp};
  const json* w = gf.get("weights");
  DFLASH_CHECK(w && w->is_object(), q.src, " missing ", gp, "weights");
  return {gp, gf, Fields{*w, q.src, gp + "weights."}};
}

// compressed-tensors' QuantizationConfig with format "pack-quantized" (Int4Format): one config group of symmetric
// 4-bit integer weights in groups of a multiple of 32 (or per channel), no activation quantization.
void parse_compressed_int4(const Fields& q, Int4Format& f) {
  DFLASH_CHECK(q.get("kv_cache_scheme") == nullptr, q.src, ": ", q.prefix,
               "kv_cache_scheme: a quantized KV cache is not supported (dflash keeps the cache in bf16)");
  const std::string status = q.opt_str("quantization_status", "compressed");
  DFLASH_CHECK(status == "compressed", q.src, ": ", q.prefix, "quantization_status: '", status,
               "' is not supported (\"compressed\": the packed weights of pack-quantized)");
  const json* groups = q.get("config_groups");
  DFLASH_CHECK(groups && groups->is_object() && groups->size() == 1, q.src, ": ", q.prefix,
               "config_groups: expected one group (several INT4 schemes in one checkpoint are not supported)");
  const CtGroup cg = ct_group(q, groups->begin().key(), groups->begin().value());
  const std::string& gp = cg.prefix;
  const Fields &gf = cg.group, &wf = cg.weights;
  const int64_t bits = wf.opt_int("num_bits", 0);
  const std::string type = wf.opt_str("type", "");
  DFLASH_CHECK(bits == 4 && type == "int", q.src, ": ", gp, "weights: num_bits ", bits, " type '", type,
               "' is not supported (pack-quantized: 4-bit integer weights; INT8 and other widths are not read)");
  DFLASH_CHECK(wf.opt_bool("symmetric", true), q.src, ": ", gp,
               "weights.symmetric: false is not supported (asymmetric INT4 with zero points: weight_zero_point)");
  DFLASH_CHECK(!wf.opt_bool("dynamic", false), q.src, ": ", gp, "weights.dynamic: true is not supported");
  const json* ao = wf.get("actorder");
  DFLASH_CHECK(!ao || ao->is_null() || (ao->is_boolean() && !ao->get<bool>()), q.src, ": ", gp, "weights.actorder: ",
               ao ? ao->dump() : "", " is not supported (activation-ordered groups: weight_g_idx)");
  const json* bs = wf.get("block_structure");
  DFLASH_CHECK(!bs || bs->is_null(), q.src, ": ", gp, "weights.block_structure: ", bs ? bs->dump() : "",
               " is not supported (INT4 in groups along K or per channel)");
  const std::string strategy = wf.opt_str("strategy", "");
  if (strategy == "group") {
    f.group_size = wf.opt_int("group_size", 0);
    DFLASH_CHECK(f.group_size > 0 && f.group_size % 32 == 0, q.src, ": ", gp, "weights.group_size: ", f.group_size,
                 " is not supported (a positive multiple of 32: the grouped GEMM reads one scale per 32 columns)");
  } else {
    DFLASH_CHECK(strategy == "channel", q.src, ": ", gp, "weights.strategy: '", strategy,
                 "' is not supported (INT4: group or channel)");
    f.group_size = 0;
  }
  for (const char* a : {"input_activations", "output_activations"}) {
    const json* v = gf.get(a);
    DFLASH_CHECK(!v || v->is_null(), q.src, ": ", gp, a, ": quantized activations are not supported (INT4 weights "
                 "with bf16 activations: W4A16)");
  }
  f.targets = string_list(gf, "targets");
  if (f.targets.empty()) f.targets = {"Linear"};
  for (const std::string& t : f.targets)
    DFLASH_CHECK(t == "Linear" || t.rfind("re:", 0) == 0, q.src, ": ", gp, "targets: '", t,
                 "' is not supported (Linear layers, or \"re:\" patterns of their names)");
  f.ignore = string_list(q, "ignore");
  for (const std::string& i : f.ignore) {
    if (i.rfind("re:", 0) != 0) continue;
    try {
      (void)std::regex(i.substr(3));
    } catch (const std::regex_error& e) {
      DFLASH_FAIL(q.src, ": ", q.prefix, "ignore: '", i, "' is not a regular expression this reader takes (", e.what(),
                  ")");
    }
  }
  f.declared = true;
}

// compressed-tensors' QuantizationConfig with format "float-quantized" (llm-compressor's FP8 schemes): every
// config group must quantize weights to 8-bit floats, symmetric, by channel, tensor or block, with dynamic (or no)
// input activation quantization; all groups alike.
void parse_compressed_fp8(const Fields& q, Fp8Format& fp8) {
  const std::string format = q.opt_str("format", "");
  DFLASH_CHECK(format == "float-quantized", q.src, ": ", q.prefix, "format: '", format,
               "' is not supported (compressed-tensors \"float-quantized\": FP8 weights; \"pack-quantized\": INT4 "
               "weights; int-quantized and other formats are not read)");
  DFLASH_CHECK(q.get("kv_cache_scheme") == nullptr, q.src, ": ", q.prefix,
               "kv_cache_scheme: a quantized KV cache is not supported (dflash keeps the cache in bf16)");
  const json* groups = q.get("config_groups");
  DFLASH_CHECK(groups && groups->is_object() && !groups->empty(), q.src, ": ", q.prefix,
               "config_groups: expected an object of one or more groups");
  bool first = true;
  for (const auto& [name, g] : groups->items()) {
    const CtGroup cg = ct_group(q, name, g);
    const std::string& gp = cg.prefix;
    const Fields &gf = cg.group, &wf = cg.weights;
    DFLASH_CHECK(wf.opt_int("num_bits", 0) == 8 && wf.opt_str("type", "") == "float", q.src, ": ", gp,
                 "weights: num_bits ", wf.opt_int("num_bits", 0), " type '", wf.opt_str("type", ""),
                 "' is not supported (8-bit float weights)");
    DFLASH_CHECK(wf.opt_bool("symmetric", true), q.src, ": ", gp, "weights.symmetric: false is not supported");
    DFLASH_CHECK(!wf.opt_bool("dynamic", false), q.src, ": ", gp, "weights.dynamic: true is not supported");
    const std::string strategy = wf.opt_str("strategy", "");
    int64_t bn = 0, bk = 0;
    if (strategy == "channel") {
      bn = 1;
    } else if (strategy == "block") {
      const std::vector<int64_t> b = wf.opt_int_list("block_structure");
      DFLASH_CHECK(b.size() == 2 && b[0] > 0 && b[1] > 0, q.src, ": ", gp,
                   "weights.block_structure: expected two positive integers [rows, columns]");
      bn = b[0];
      bk = b[1];
    } else {
      DFLASH_CHECK(strategy == "tensor", q.src, ": ", gp, "weights.strategy: '", strategy,
                   "' is not supported (channel, tensor or block)");
    }
    if (const json* a = gf.get("input_activations")) {
      const Fields af{*a, q.src, gp + "input_activations."};
      DFLASH_CHECK(af.opt_bool("dynamic", false), q.src, ": ", gp,
                   "input_activations.dynamic: false is not supported (static input scales; only dynamic "
                   "activation quantization)");
    }
    DFLASH_CHECK(gf.get("output_activations") == nullptr, q.src, ": ", gp,
                 "output_activations: quantized outputs are not supported");
    for (const std::string& t : string_list(gf, "targets"))
      DFLASH_CHECK(t == "Linear" || t.rfind("re:", 0) == 0, q.src, ": ", gp, "targets: '", t,
                   "' is not supported (Linear layers)");
    DFLASH_CHECK(first || (bn == fp8.block_n && bk == fp8.block_k), q.src, ": ", gp,
                 "weights: groups with different strategies are not supported");
    fp8.block_n = bn;
    fp8.block_k = bk;
    first = false;
  }
  fp8.method = "compressed-tensors";
  fp8.scale_name = "weight_scale";
  fp8.not_converted = string_list(q, "ignore");
}

}  // namespace

void parse_quantization_config(const json& qj, const std::string& src, ModelConfig& c) {
  DFLASH_CHECK(qj.is_object(), src, ": quantization_config: expected an object, got ", qj.dump());
  const Fields q{qj, src, "quantization_config."};
  const std::string method = q.opt_str("quant_method", "");
  if (method == "mxfp4") {  // the experts only (gpt-oss): modules_to_not_convert names the rest
    c.moe.expert_format = WeightFormat::MXFP4;
  } else if (method == "fp8") {
    parse_fp8(q, c.fp8);
    c.linear_format = WeightFormat::FP8;
  } else if (method == "compressed-tensors" && q.opt_str("format", "") == "pack-quantized") {
    parse_compressed_int4(q, c.int4);
  } else if (method == "compressed-tensors") {
    parse_compressed_fp8(q, c.fp8);
    c.linear_format = WeightFormat::FP8;
  } else {
    DFLASH_FAIL(src, ": quantization_config.quant_method: '", method, "' is not supported (\"fp8\" and "
                "compressed-tensors \"float-quantized\": FP8 linears; compressed-tensors \"pack-quantized\": INT4 "
                "weights; \"mxfp4\": gpt-oss's experts; or no quantization_config: bf16)");
  }
}

LayerSpec ModelConfig::layer(int64_t l) const {
  DFLASH_CHECK(l >= 0 && l < num_hidden_layers, "layer ", l, " outside [0, ", num_hidden_layers, ")");
  if (!layers.empty()) return layers[static_cast<size_t>(l)];
  LayerSpec s;  // a config built by hand: the dense plan
  s.attention.bias = attention_bias;
  s.attention.qk_norm = qk_norm;
  s.mlp_width = intermediate_size;
  return s;
}

bool ModelConfig::has_moe() const {
  for (int64_t l = 0; l < num_hidden_layers; ++l)
    if (layer(l).mlp == ChannelMixer::MoE) return true;
  return false;
}

bool ModelConfig::has_linear_attention() const {
  for (int64_t l = 0; l < num_hidden_layers; ++l)
    if (layer(l).mixer == TokenMixer::LinearAttention) return true;
  return false;
}

namespace {


// RopeScaling's checkpoint keys, for both directions (fields_to_json / fields_from_json): f(key, member, required).
const auto rope_scaling_fields = [](auto& rs, auto&& f) {
  f("kind", rs.kind, true);
  f("factor", rs.factor, true);
  f("low_freq_factor", rs.low_freq_factor, true);
  f("high_freq_factor", rs.high_freq_factor, true);
  f("original_max_position_embeddings", rs.original_max_position_embeddings, true);
  f("beta_fast", rs.beta_fast, false);  // YaRN's keys: absent in checkpoints written before YaRN
  f("beta_slow", rs.beta_slow, false);
  f("truncate", rs.truncate, false);
  f("attention_factor", rs.attention_factor, false);
  f("mscale", rs.mscale, false);
  f("mscale_all_dim", rs.mscale_all_dim, false);
};

}  // namespace

void to_json(json& j, const RopeScaling& rs) { fields_to_json(j, rs, rope_scaling_fields); }
void from_json(const json& j, RopeScaling& rs) { fields_from_json(j, rs, rope_scaling_fields); }

RopeScaling parse_rope_scaling(const json& r, const std::string& src, const std::string& name, int64_t max_positions) {
  DFLASH_CHECK(r.is_object(), src, ": ", name, ": expected an object, got ", r.dump());
  Fields f{r, src, name + "."};
  std::string kind = f.opt_str("rope_type", f.opt_str("type", "default"));
  RopeScaling rs;
  if (kind == "default" || kind == "none") return rs;
  if (kind == "linear") {
    rs.kind = "linear";
    rs.factor = f.req_num("factor");
  } else if (kind == "llama3") {
    rs.kind = "llama3";
    rs.factor = f.req_num("factor");
    rs.low_freq_factor = f.req_num("low_freq_factor");
    rs.high_freq_factor = f.req_num("high_freq_factor");
    rs.original_max_position_embeddings = f.req_int("original_max_position_embeddings");
    DFLASH_CHECK(rs.high_freq_factor > rs.low_freq_factor && rs.original_max_position_embeddings > 0, src, ": ", name,
                 ": llama3 needs high_freq_factor > low_freq_factor and original_max_position_embeddings > 0");
  } else if (kind == "yarn") {
    // transformers: beta_fast / beta_slow "or" their defaults (absent, null or 0), truncate defaults to true,
    // original_max_position_embeddings to max_position_embeddings (standardize_rope_params)
    rs.kind = "yarn";
    rs.factor = f.req_num("factor");
    rs.original_max_position_embeddings = max_positions > 0 ? f.opt_int("original_max_position_embeddings", max_positions)
                                                            : f.req_int("original_max_position_embeddings");
    rs.beta_fast = f.opt_num("beta_fast", 0.0);
    rs.beta_slow = f.opt_num("beta_slow", 0.0);
    if (rs.beta_fast == 0) rs.beta_fast = 32.0;
    if (rs.beta_slow == 0) rs.beta_slow = 1.0;
    rs.truncate = f.opt_bool("truncate", true);
    rs.attention_factor = f.opt_num("attention_factor", 0.0);
    rs.mscale = f.opt_num("mscale", 0.0);
    rs.mscale_all_dim = f.opt_num("mscale_all_dim", 0.0);
    DFLASH_CHECK(!f.get("attention_factor") || rs.attention_factor > 0, src, ": ", name,
                 ".attention_factor: must be positive, got ", rs.attention_factor);
    DFLASH_CHECK(rs.original_max_position_embeddings > 0, src, ": ", name,
                 ".original_max_position_embeddings: must be positive, got ", rs.original_max_position_embeddings);
  } else {
    DFLASH_FAIL(src, ": ", name, ".rope_type: unsupported rope type '", kind,
                "' (supported: default, linear, llama3, yarn)");
  }
  DFLASH_CHECK(rs.factor > 0, src, ": ", name, ".factor: must be positive, got ", rs.factor);
  return rs;
}

json rope_scaling_json(const RopeScaling& rs) {
  if (rs.kind == "none" || rs.kind == "default") return nullptr;
  json j = {{"rope_type", rs.kind}, {"factor", rs.factor}};
  if (rs.kind == "llama3") {
    j["low_freq_factor"] = rs.low_freq_factor;
    j["high_freq_factor"] = rs.high_freq_factor;
    j["original_max_position_embeddings"] = rs.original_max_position_embeddings;
  } else if (rs.kind == "yarn") {
    j["original_max_position_embeddings"] = rs.original_max_position_embeddings;
    j["beta_fast"] = rs.beta_fast;
    j["beta_slow"] = rs.beta_slow;
    j["truncate"] = rs.truncate;
    if (rs.attention_factor > 0) j["attention_factor"] = rs.attention_factor;
    if (rs.mscale != 0) j["mscale"] = rs.mscale;
    if (rs.mscale_all_dim != 0) j["mscale_all_dim"] = rs.mscale_all_dim;
  }
  return j;
}

namespace {

// INT4 (c.int4): the routed experts are kept INT4 when the config covers them (the first MoE layer's expert 0 gate
// projection stands for all: the ignore lists of published checkpoints name modules by kind, not by index).
void set_int4_experts(ModelConfig& c, const WeightNames& n, const std::string& src) {
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.layers[static_cast<size_t>(l)].mlp != ChannelMixer::MoE) continue;
    std::string gate = n.expert_gate;
    if (gate.ends_with(".weight")) gate.resize(gate.size() - 7);
    if (!c.int4.covers(cat(n.layer, l, ".", n.expert, "0.", gate))) return;
    DFLASH_CHECK(n.experts_layout == ExpertsLayout::Rows && !c.moe.router_scales, src,
                 ": quantization_config: INT4 experts are read as per-expert linears (mlp.experts.{e}.*_proj) only");
    c.moe.expert_format = WeightFormat::INT4;
    c.moe.int4_group = c.int4.group_size;
    return;
  }
}

}  // namespace

ModelConfig parse_model_config(const json& top, const std::string& src) {
  DFLASH_CHECK(top.is_object(), src, ": expected a JSON object, got ", top.type_name());
  Fields f0{top, src, ""};
  ModelConfig c;

  // Architecture: `architectures` and `model_type` must both name a supported family and agree. An exported DFlash
  // drafter ("DFlashDraftModel") is a Qwen3-style stack; its model_type decides.
  const ModelFamily* from_list = nullptr;
  if (const json* a = f0.get("architectures")) {
    DFLASH_CHECK(a->is_array(), src, ": architectures: expected a list of strings, got ", a->dump());
    for (const auto& e : *a) {
      DFLASH_CHECK(e.is_string(), src, ": architectures: expected a list of strings, got ", a->dump());
      const std::string name = e.get<std::string>();
      if (name == "DFlashDraftModel") continue;
      const ModelFamily* x = family_by_architecture(name);
      DFLASH_CHECK(x != nullptr, "unsupported architecture '", name, "' in ", src, " (supported: ",
                   supported_architectures(), ")");
      DFLASH_CHECK(from_list == nullptr || x == from_list, src, ": architectures: names two different models: ",
                   a->dump());
      from_list = x;
    }
  }
  const ModelFamily* fam = nullptr;
  c.model_type = f0.opt_str("model_type", "");
  if (!c.model_type.empty()) {
    fam = family_by_model_type(c.model_type);
    DFLASH_CHECK(fam != nullptr, "unsupported model_type '", c.model_type, "' in ", src, " (supported: ",
                 supported_model_types(), ")");
    DFLASH_CHECK(from_list == nullptr || fam == from_list, src, ": model_type '", c.model_type,
                 "' disagrees with architectures ", top["architectures"].dump());
  } else {
    DFLASH_CHECK(from_list != nullptr, src, " missing model_type");
    fam = from_list;
    c.model_type = fam->model_type;
  }
  c.arch = fam->arch;
  c.architecture = fam->architecture;

  // The text model's keys: at the top level, or under text_config (image-text checkpoints, as transformers'
  // get_text_config reads them).
  const json* tc = f0.get("text_config");
  const json& j = tc && tc->is_object() && !top.contains("hidden_size") ? *tc : top;
  Fields f{j, src, &j == &top ? "" : "text_config."};

  c.hidden_size = f.req_int("hidden_size");
  // intermediate_size: the width of the dense layers; a family without dense layers may lack it (Qwen3.5-MoE), so
  // it is checked once the plan is made (below).
  const bool has_intermediate = f.get("intermediate_size") != nullptr;
  c.intermediate_size = f.opt_int("intermediate_size", 0);
  c.num_hidden_layers = f.req_int("num_hidden_layers");
  c.num_attention_heads = f.req_int("num_attention_heads");
  c.vocab_size = f.req_int("vocab_size");
  c.num_key_value_heads = f.opt_int("num_key_value_heads", c.num_attention_heads);
  DFLASH_CHECK(c.hidden_size > 0, src, ": hidden_size: must be positive, got ", c.hidden_size);
  DFLASH_CHECK(c.num_hidden_layers > 0, src, ": num_hidden_layers: must be positive, got ", c.num_hidden_layers);
  DFLASH_CHECK(c.vocab_size > 0, src, ": vocab_size: must be positive, got ", c.vocab_size);
  DFLASH_CHECK(c.num_attention_heads > 0, src, ": num_attention_heads: must be positive, got ",
               c.num_attention_heads);
  DFLASH_CHECK(c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0, src,
               ": num_key_value_heads: ", c.num_key_value_heads, " must be positive and divide num_attention_heads ",
               c.num_attention_heads);
  c.max_position_embeddings = f.opt_int("max_position_embeddings", 32768);  // (LlamaConfig's 2048: read_llama)
  c.rms_norm_eps = f.opt_num("rms_norm_eps", 1e-6);
  DFLASH_CHECK(c.rms_norm_eps > 0, src, ": rms_norm_eps: must be positive, got ", c.rms_norm_eps);

  // RoPE: transformers >= 4.56 / 5 write "rope_parameters" {rope_theta, rope_type, ...}; older files put
  // rope_theta at the top level and the scaling under "rope_scaling" (key "rope_type", or "type" before 4.45).
  c.rope_theta = f.opt_num("rope_theta", 10000.0);
  if (const json* rp = f.get("rope_parameters")) {
    c.rope_scaling = parse_rope_scaling(*rp, src, f.prefix + "rope_parameters", c.max_position_embeddings);
    c.rope_theta = Fields{*rp, src, f.prefix + "rope_parameters."}.opt_num("rope_theta", c.rope_theta);
  } else if (const json* rs = f.get("rope_scaling")) {
    c.rope_scaling = parse_rope_scaling(*rs, src, f.prefix + "rope_scaling", c.max_position_embeddings);
  }
  DFLASH_CHECK(c.rope_theta > 0, src, ": rope_theta: must be positive, got ", c.rope_theta);

  // Keys an image-text checkpoint may keep at the top level beside text_config.
  auto either = [&](const char* key) { return f0.get(key) ? f0 : f; };
  c.tie_word_embeddings = either("tie_word_embeddings").opt_bool("tie_word_embeddings", false);
  c.bos_token_id = either("bos_token_id").opt_int("bos_token_id", -1);
  if (const json* e = either("eos_token_id").get("eos_token_id")) {
    if (e->is_array()) {
      for (const auto& x : *e) c.eos_token_ids.push_back(f.to_int(x, "eos_token_id"));
    } else {
      c.eos_token_ids.push_back(f.to_int(*e, "eos_token_id"));
    }
  }
  c.torch_dtype = f0.opt_str("torch_dtype", f0.opt_str("dtype", "bfloat16"));

  fam->read(f, c);  // the family's own keys and defaults (head_dim, biases, qk-norm, MoE, BOS / EOS defaults)
  if (const json* q = either("quantization_config").get("quantization_config")) parse_quantization_config(*q, src, c);
  DFLASH_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0, src, ": head_dim: must be a positive even number, got ",
               c.head_dim);
  // Sliding-window attention in the target (Qwen2 / Qwen3 use_sliding_window) is not run yet: refused rather than
  // computed as full attention.
  DFLASH_CHECK(!f.opt_bool("use_sliding_window", false), src, ": use_sliding_window: true is not supported (this ",
               fam->title, " target's layers would attend over a window of ", f.opt_int("sliding_window", 0),
               " tokens; dflash runs full causal attention in the target)");
  c.layers.clear();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) c.layers.push_back(fam->layer(c, l));
  if (c.int4.declared) set_int4_experts(c, fam->names, src);
  for (const LayerSpec& s : c.layers) {
    if (s.mlp != ChannelMixer::Dense) continue;
    DFLASH_CHECK(has_intermediate, src, " missing ", f.prefix, "intermediate_size");
    DFLASH_CHECK(c.intermediate_size > 0, src, ": intermediate_size: must be positive, got ", c.intermediate_size);
  }
  return c;
}

ModelConfig load_model_config(const std::string& dir_or_file) {
  const std::string path = dir_exists(dir_or_file) ? path_join(dir_or_file, "config.json") : dir_or_file;
  DFLASH_CHECK(file_exists(path), path, ": no such file");
  json j;
  try {
    j = json::parse(read_file(path));
  } catch (const json::exception& e) {
    DFLASH_FAIL(path, ": invalid JSON: ", e.what());
  }
  return parse_model_config(j, path);
}

std::vector<int64_t> default_target_layer_ids(int64_t lt, int64_t nf) {
  DFLASH_CHECK(lt >= 1 && nf >= 1, "default_target_layer_ids: need num_target_layers >= 1 and nf >= 1, got ", lt,
               " and ", nf);
  if (nf == 1) return {lt / 2};
  // ids[i] = round(1 + i*(lt-4)/(nf-1)) = round(m/d) with m = (nf-1) + i*(lt-4), rounded half away from zero,
  // in exact integer arithmetic.
  const int64_t d = nf - 1;
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < nf; ++i) {
    const int64_t m = d + i * (lt - 4);
    const int64_t r = m >= 0 ? (2 * m + d) / (2 * d) : -((-2 * m + d) / (2 * d));
    DFLASH_CHECK(r >= 0 && r < lt && (ids.empty() || r > ids.back()), "default_target_layer_ids: cannot spread ", nf,
                 " distinct layers over a target of ", lt, " layers; give target_layer_ids explicitly");
    ids.push_back(r);
  }
  return ids;
}

void validate_target_layer_ids(const std::vector<int64_t>& ids, int64_t lt) {
  const std::string list = json(ids).dump();
  DFLASH_CHECK(!ids.empty(), "target_layer_ids: the list is empty; give at least one target layer");
  for (size_t i = 0; i < ids.size(); ++i) {
    DFLASH_CHECK(ids[i] >= 0 && (lt <= 0 || ids[i] < lt), "target_layer_ids ", list, ": layer ", ids[i],
                 " is not a decoder layer of the target (0 .. ", lt - 1, ")");
    for (size_t k = 0; k < i; ++k)
      DFLASH_CHECK(ids[k] != ids[i], "target_layer_ids ", list, ": layer ", ids[i],
                   " is given twice; each tapped layer must be a different one");
  }
  for (size_t i = 1; i < ids.size(); ++i) {
    if (ids[i] > ids[i - 1]) continue;
    std::vector<int64_t> sorted = ids;
    std::sort(sorted.begin(), sorted.end());
    DFLASH_FAIL("target_layer_ids ", list, ": not in increasing order (", ids[i], " after ", ids[i - 1],
                "); the order is the order of the feature columns the drafter is trained on and that SGLang / vLLM "
                "rebuild from the exported list, so the ids must be ascending: give ", json(sorted).dump());
  }
}

void validate_mask_token_id(int64_t id, int64_t vocab_size, const char* option) {
  DFLASH_CHECK(id == kAutoMaskTokenId || id >= 0, option, " ", id, ": not a token id (give an id >= 0, or ",
               kAutoMaskTokenId, " for the tokenizer's mask token)");
  DFLASH_CHECK(vocab_size <= 0 || id < vocab_size, option, " ", id, ": not a row of the target's ", vocab_size,
               "-row embedding");
}

}  // namespace dflash
