// io/hf_config.cpp — config.json of Llama / Qwen2 / Qwen3 with the defaults of Hugging Face transformers.
#include "io/hf_config.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"

namespace dflash {

using nlohmann::json;

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Llama: return "llama";
    case Arch::Qwen2: return "qwen2";
    case Arch::Qwen3: return "qwen3";
  }
  return "?";
}

namespace {

// Typed field access on one JSON object; a null value counts as absent (as transformers treats it).
struct Fields {
  const json& j;
  const std::string& src;
  std::string prefix;  // "rope_scaling." for nested objects, for messages

  const json* get(const char* key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  int64_t to_int(const json& v, const char* key) const {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {  // 4096.0: accepted when integral
      const double d = v.get<double>();
      if (d > -9e15 && d < 9e15 && d == static_cast<double>(static_cast<int64_t>(d))) return static_cast<int64_t>(d);
    }
    DFLASH_FAIL(src, ": ", prefix, key, ": expected an integer, got ", v.dump());
  }
  int64_t req_int(const char* key) const {
    const json* v = get(key);
    DFLASH_CHECK(v != nullptr, src, " missing ", prefix, key);
    return to_int(*v, key);
  }
  int64_t opt_int(const char* key, int64_t def) const {
    const json* v = get(key);
    return v ? to_int(*v, key) : def;
  }
  double req_num(const char* key) const {
    const json* v = get(key);
    DFLASH_CHECK(v != nullptr, src, " missing ", prefix, key);
    DFLASH_CHECK(v->is_number(), src, ": ", prefix, key, ": expected a number, got ", v->dump());
    return v->get<double>();
  }
  double opt_num(const char* key, double def) const { return get(key) ? req_num(key) : def; }
  bool opt_bool(const char* key, bool def) const {
    const json* v = get(key);
    if (!v) return def;
    DFLASH_CHECK(v->is_boolean(), src, ": ", prefix, key, ": expected true or false, got ", v->dump());
    return v->get<bool>();
  }
  std::string opt_str(const char* key, const std::string& def) const {
    const json* v = get(key);
    if (!v) return def;
    DFLASH_CHECK(v->is_string(), src, ": ", prefix, key, ": expected a string, got ", v->dump());
    return v->get<std::string>();
  }
};

bool arch_from_model_type(const std::string& t, Arch* a) {
  if (t == "llama") *a = Arch::Llama;
  else if (t == "qwen2") *a = Arch::Qwen2;
  else if (t == "qwen3") *a = Arch::Qwen3;
  else return false;
  return true;
}

// Reads rope scaling from `r` (an object of rope_scaling or rope_parameters). `name` is the key, for messages.
RopeScaling parse_rope(const json& r, const std::string& src, const std::string& name) {
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
  } else {
    DFLASH_FAIL(src, ": ", name, ".rope_type: unsupported rope type '", kind, "' (supported: default, linear, llama3)");
  }
  DFLASH_CHECK(rs.factor > 0, src, ": ", name, ".factor: must be positive, got ", rs.factor);
  return rs;
}

}  // namespace

ModelConfig parse_model_config(const json& j, const std::string& src) {
  DFLASH_CHECK(j.is_object(), src, ": expected a JSON object, got ", j.type_name());
  Fields f{j, src, ""};
  ModelConfig c;

  // Architecture: `architectures` and `model_type` must both name a supported model and agree. An exported
  // DFlash drafter ("DFlashDraftModel") is a Qwen3-style stack; its model_type decides.
  bool have_arch = false;
  Arch from_list = Arch::Qwen3;
  if (const json* a = f.get("architectures")) {
    DFLASH_CHECK(a->is_array(), src, ": architectures: expected a list of strings, got ", a->dump());
    for (const auto& e : *a) {
      DFLASH_CHECK(e.is_string(), src, ": architectures: expected a list of strings, got ", a->dump());
      const std::string name = e.get<std::string>();
      Arch x;
      if (name == "LlamaForCausalLM") x = Arch::Llama;
      else if (name == "Qwen2ForCausalLM") x = Arch::Qwen2;
      else if (name == "Qwen3ForCausalLM") x = Arch::Qwen3;
      else if (name == "DFlashDraftModel") continue;
      else DFLASH_FAIL("unsupported architecture '", name, "' in ", src, " (supported: LlamaForCausalLM, "
                       "Qwen2ForCausalLM, Qwen3ForCausalLM)");
      DFLASH_CHECK(!have_arch || x == from_list, src, ": architectures: names two different models: ", a->dump());
      from_list = x;
      have_arch = true;
    }
  }
  c.model_type = f.opt_str("model_type", "");
  if (!c.model_type.empty()) {
    DFLASH_CHECK(arch_from_model_type(c.model_type, &c.arch), "unsupported model_type '", c.model_type, "' in ", src,
                 " (supported: llama, qwen2, qwen3)");
    DFLASH_CHECK(!have_arch || c.arch == from_list, src, ": model_type '", c.model_type,
                 "' disagrees with architectures ", j["architectures"].dump());
  } else {
    DFLASH_CHECK(have_arch, src, " missing model_type");
    c.arch = from_list;
    c.model_type = arch_name(c.arch);
  }

  c.hidden_size = f.req_int("hidden_size");
  c.intermediate_size = f.req_int("intermediate_size");
  c.num_hidden_layers = f.req_int("num_hidden_layers");
  c.num_attention_heads = f.req_int("num_attention_heads");
  c.vocab_size = f.req_int("vocab_size");
  c.num_key_value_heads = f.opt_int("num_key_value_heads", c.num_attention_heads);
  DFLASH_CHECK(c.hidden_size > 0, src, ": hidden_size: must be positive, got ", c.hidden_size);
  DFLASH_CHECK(c.intermediate_size > 0, src, ": intermediate_size: must be positive, got ", c.intermediate_size);
  DFLASH_CHECK(c.num_hidden_layers > 0, src, ": num_hidden_layers: must be positive, got ", c.num_hidden_layers);
  DFLASH_CHECK(c.vocab_size > 0, src, ": vocab_size: must be positive, got ", c.vocab_size);
  DFLASH_CHECK(c.num_attention_heads > 0, src, ": num_attention_heads: must be positive, got ",
               c.num_attention_heads);
  DFLASH_CHECK(c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0, src,
               ": num_key_value_heads: ", c.num_key_value_heads, " must be positive and divide num_attention_heads ",
               c.num_attention_heads);
  // transformers: Llama/Qwen2 head_dim = H / nh unless given (null too); an absent key in Qwen3Config means 128.
  const bool qwen3_default = c.arch == Arch::Qwen3 && !j.contains("head_dim");
  c.head_dim = f.opt_int("head_dim", qwen3_default ? 128 : c.hidden_size / c.num_attention_heads);
  DFLASH_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0, src, ": head_dim: must be a positive even number, got ",
               c.head_dim);
  c.max_position_embeddings = f.opt_int("max_position_embeddings", c.arch == Arch::Llama ? 2048 : 32768);
  c.rms_norm_eps = f.opt_num("rms_norm_eps", 1e-6);
  DFLASH_CHECK(c.rms_norm_eps > 0, src, ": rms_norm_eps: must be positive, got ", c.rms_norm_eps);

  // RoPE: transformers >= 4.56 / 5 write "rope_parameters" {rope_theta, rope_type, ...}; older files put
  // rope_theta at the top level and the scaling under "rope_scaling" (key "rope_type", or "type" before 4.45).
  c.rope_theta = f.opt_num("rope_theta", 10000.0);
  if (const json* rp = f.get("rope_parameters")) {
    c.rope_scaling = parse_rope(*rp, src, "rope_parameters");
    c.rope_theta = Fields{*rp, src, "rope_parameters."}.opt_num("rope_theta", c.rope_theta);
  } else if (const json* rs = f.get("rope_scaling")) {
    c.rope_scaling = parse_rope(*rs, src, "rope_scaling");
  }
  DFLASH_CHECK(c.rope_theta > 0, src, ": rope_theta: must be positive, got ", c.rope_theta);

  c.tie_word_embeddings = f.opt_bool("tie_word_embeddings", false);
  c.attention_bias = c.arch == Arch::Qwen2 ? true : f.opt_bool("attention_bias", false);
  c.qk_norm = c.arch == Arch::Qwen3;

  const int64_t def_bos = c.arch == Arch::Llama ? 1 : -1;  // LlamaConfig defaults bos 1, eos 2
  c.bos_token_id = j.contains("bos_token_id") ? f.opt_int("bos_token_id", -1) : def_bos;
  if (const json* e = f.get("eos_token_id")) {
    if (e->is_array()) {
      for (const auto& x : *e) c.eos_token_ids.push_back(f.to_int(x, "eos_token_id"));
    } else {
      c.eos_token_ids.push_back(f.to_int(*e, "eos_token_id"));
    }
  } else if (c.arch == Arch::Llama && !j.contains("eos_token_id")) {
    c.eos_token_ids.push_back(2);
  }
  c.torch_dtype = f.opt_str("torch_dtype", f.opt_str("dtype", "bfloat16"));
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
