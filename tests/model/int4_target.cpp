// tests/model/int4_target.cpp — INT4 checkpoints (io/hf_config.h Int4Format: compressed-tensors pack-quantized, as
// Kimi-K2-Thinking / K2.5 publish their routed experts): tools/ref_int4.py's Qwen3-MoE with INT4 experts and an INT4
// dense MLP (tests/golden/target_qwen3_moe_int4) loads with the experts kept 4-bit and the dense MLP dequantised, and
// matches the float64 golden of its dequantised weights on the CPU; the config's coverage rule (targets minus ignore,
// Kimi-K2-Thinking's list); parameter counts and device bytes; bad INT4 checkpoints and schemes refused by name.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "core/error.h"
#include "core/fs.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/target.h"
#include "common/golden_checks.h"
#include "common/test_util.h"

using namespace dflash;
using nlohmann::json;

namespace {

const std::string kName = "target_qwen3_moe_int4";
std::string golden_dir() { return test::source_dir() + "/tests/golden/" + kName; }

bool has(const std::string& m, const std::string& s) { return m.find(s) != std::string::npos; }

}  // namespace

// The golden of the dequantised weights (tools/ref_int4.py, float64), every layer, the logits, the cached decode and
// the experts chosen, with the experts INT4 on the device: U8 codes and BF16 scales, groups of 32.
TEST(Int4Target, Qwen3MoeMatchesTheGoldenOfItsDequantisedWeights) {
  test::check_golden(kName, "cpu", {.experts = true});
}
TEST(Int4Target, Qwen3MoeInFp64) { test::check_golden(kName, "cpu64", {.experts = true}); }

TEST(Int4Target, ExpertsStayInt4AndTheDenseMlpIsDequantised) {
  auto ctx = make_context("cpu");
  auto t = Target::load(golden_dir(), *ctx);
  const ModelConfig& c = t->config();
  EXPECT_TRUE(c.int4.declared);
  EXPECT_EQ(c.int4.group_size, 32);
  EXPECT_EQ(c.moe.expert_format, WeightFormat::INT4);
  EXPECT_EQ(c.moe.int4_group, 32);
  const int64_t E = c.moe.num_experts, H = c.hidden_size, I = c.moe.expert_width;
  const auto& moe = t->weights().layers[0].moe;
  ASSERT_TRUE(moe.gate_up.int4());
  EXPECT_EQ(moe.gate_up.w.dtype, DType::U8);
  EXPECT_EQ(moe.gate_up.w.shape, (Shape{E, 2 * I, H / 2}));
  EXPECT_EQ(moe.gate_up.scales.dtype, DType::BF16);
  EXPECT_EQ(moe.gate_up.scales.shape, (Shape{E, 2 * I, H / 32}));
  EXPECT_EQ(moe.down.w.shape, (Shape{E, H, I / 2}));
  EXPECT_EQ(moe.down.scales.shape, (Shape{E, H, I / 32}));
  EXPECT_EQ(moe.router.dtype, DType::F32);  // ignored: "re:.*mlp\\.gate$"
  // layer 2 is dense; its MLP is INT4 in the file, dequantised when loaded (== the golden's dequantised weights)
  const auto& dense = t->weights().layers[2].mlp;
  EXPECT_FALSE(dense.w_down.fp8());
  EXPECT_EQ(dense.w_down.w.dtype, DType::F32);
  auto g = SafetensorsFile::open(golden_dir() + "/golden.safetensors");
  EXPECT_EQ(to_f32_vector(ctx->to_host(dense.w_down.w)),
            to_f32_vector(g->view("int4_dequantised.model.layers.2.mlp.down_proj")));
}

// Coverage (compressed-tensors' matching: "re:" = re.match from the start, else the whole name) with
// Kimi-K2-Thinking's published quantization_config: only the routed experts are INT4.
TEST(Int4Target, KimiIgnoreListCoversOnlyTheRoutedExperts) {
  const json q = json::parse(R"({
    "config_groups": {"group_0": {"input_activations": null, "output_activations": null, "targets": ["Linear"],
      "weights": {"actorder": null, "block_structure": null, "dynamic": false, "group_size": 32, "num_bits": 4,
                  "observer": "minmax", "observer_kwargs": {}, "strategy": "group", "symmetric": true,
                  "type": "int"}}},
    "format": "pack-quantized",
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": null, "quant_method": "compressed-tensors", "quantization_status": "compressed"})");
  ModelConfig c;
  parse_quantization_config(q, "config.json", c);
  const Int4Format& f = c.int4;
  EXPECT_TRUE(f.declared);
  EXPECT_EQ(f.group_size, 32);
  EXPECT_EQ(c.linear_format, WeightFormat::Plain);
  EXPECT_TRUE(f.covers("model.layers.1.mlp.experts.0.gate_proj"));
  EXPECT_TRUE(f.covers("model.layers.60.mlp.experts.383.down_proj"));
  EXPECT_FALSE(f.covers("model.layers.1.mlp.shared_experts.gate_proj"));
  EXPECT_FALSE(f.covers("model.layers.0.mlp.gate_proj"));  // the dense first layer
  EXPECT_FALSE(f.covers("model.layers.3.self_attn.kv_a_proj_with_mqa"));
  EXPECT_FALSE(f.covers("lm_head"));
  EXPECT_TRUE(f.covers("lm_head_2"));  // a plain entry names the whole module
  Int4Format only;  // regex targets: re.match anchors at the start only
  only.declared = true;
  only.targets = {"re:model\\.layers\\.\\d+\\.mlp\\.experts"};
  EXPECT_TRUE(only.covers("model.layers.7.mlp.experts.1.up_proj"));
  EXPECT_FALSE(only.covers("x.model.layers.7.mlp.experts.1.up_proj"));
}

// Parameters and bytes: 3 MoE layers x 8 experts x 3 H I INT4 parameters, half a byte each and 2 bytes per scale of
// 32; dflash info names the format.
TEST(Int4Target, ParamsAndInfo) {
  const ModelConfig c = load_model_config(golden_dir());
  const TargetParams p = target_params(c);
  const int64_t n = 3 * 8 * 3 * 64 * 32;
  EXPECT_EQ(p.int4, n);
  EXPECT_EQ(p.int4_scales, n / 32);
  EXPECT_EQ(p.device_bytes(2), 2 * (p.total - n) + n / 2 + 2 * (n / 32));
  test::TmpDir tmp("int4_info");
  const std::string cmd = cat(DFLASH_BINARY, " info ", golden_dir(), " --json > ", tmp.path, "/out.json 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(tmp.path + "/out.json");
  const json o = json::parse(read_file(tmp.path + "/out.json"))["config"];
  EXPECT_EQ(o["quant_method"], "compressed-tensors");
  EXPECT_EQ(o["int4"]["group_size"], 32);
  EXPECT_EQ(o["params"]["int4"].get<int64_t>(), n);
  EXPECT_EQ(o["device_weight_bytes"].get<int64_t>(), p.device_bytes());
  EXPECT_TRUE(has(o["layers"].dump(), "INT4 in groups of 32")) << o["layers"].dump();
}

// Schemes dflash does not run are refused naming the file and the field: zero points, other bit widths and types,
// activation ordering, groups not a multiple of 32, quantized activations, several groups, strategy tensor, a status
// other than compressed, an ignore regex std::regex cannot read.
TEST(Int4Target, UnsupportedSchemesAreRefusedByName) {
  const json good = json::parse(read_file(golden_dir() + "/config.json"));
  auto config_error = [&](auto&& edit) {
    json j = good;
    edit(j["quantization_config"]);
    try {
      parse_model_config(j, "config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string w = "quantization_config.config_groups.group_0.weights";
  std::string m = config_error([](json& q) { q["config_groups"]["group_0"]["weights"]["symmetric"] = false; });
  EXPECT_TRUE(has(m, "config.json") && has(m, w + ".symmetric") && has(m, "zero point")) << m;
  m = config_error([](json& q) { q["config_groups"]["group_0"]["weights"]["num_bits"] = 8; });
  EXPECT_TRUE(has(m, "group_0.weights") && has(m, "num_bits 8")) << m;
  m = config_error([](json& q) { q["config_groups"]["group_0"]["weights"]["type"] = "float"; });
  EXPECT_TRUE(has(m, "group_0.weights") && has(m, "type 'float'")) << m;
  m = config_error([](json& q) { q["config_groups"]["group_0"]["weights"]["actorder"] = "group"; });
  EXPECT_TRUE(has(m, w + ".actorder") && has(m, "group")) << m;
  m = config_error([](json& q) { q["config_groups"]["group_0"]["weights"]["group_size"] = 16; });
  EXPECT_TRUE(has(m, w + ".group_size") && has(m, "16")) << m;
  m = config_error([](json& q) { q["config_groups"]["group_0"]["weights"]["strategy"] = "tensor"; });
  EXPECT_TRUE(has(m, w + ".strategy") && has(m, "tensor")) << m;
  m = config_error([](json& q) {
    q["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}, {"type", "float"}, {"dynamic", true}};
  });
  EXPECT_TRUE(has(m, "group_0.input_activations") && has(m, "W4A16")) << m;
  m = config_error([](json& q) { q["config_groups"]["group_1"] = q["config_groups"]["group_0"]; });
  EXPECT_TRUE(has(m, "quantization_config.config_groups") && has(m, "one group")) << m;
  m = config_error([](json& q) { q["quantization_status"] = "frozen"; });
  EXPECT_TRUE(has(m, "quantization_config.quantization_status") && has(m, "frozen")) << m;
  m = config_error([](json& q) { q["ignore"] = {"re:(unclosed"}; });
  EXPECT_TRUE(has(m, "quantization_config.ignore") && has(m, "re:(unclosed")) << m;
  m = config_error([](json& q) { q["kv_cache_scheme"] = {{"num_bits", 8}}; });
  EXPECT_TRUE(has(m, "kv_cache_scheme")) << m;
  // strategy channel reads (one scale per row)
  json j = good;
  j["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = "channel";
  const ModelConfig c = parse_model_config(j, "config.json");
  EXPECT_EQ(c.moe.expert_format, WeightFormat::INT4);
  EXPECT_EQ(c.moe.int4_group, 0);
  // experts ignored: read (dequantised) as plain experts
  j = good;
  j["quantization_config"]["ignore"].push_back("re:.*experts.*");
  EXPECT_EQ(parse_model_config(j, "config.json").moe.expert_format, WeightFormat::Plain);
}

// Bad INT4 checkpoints: a scale missing or of another shape, a zero point, weight_shape disagreeing, packed tensors
// under a config.json without pack-quantized, plain experts where the config covers them: refused naming the tensor.
TEST(Int4Target, BadCheckpointsAreRefusedByName) {
  auto ctx = make_context("cpu");
  auto ws = WeightStore::open(golden_dir());
  const std::string cfg = read_file(golden_dir() + "/config.json");
  auto load_error = [&](auto&& edit, const std::string& config) {
    std::vector<std::pair<std::string, Tensor>> out;
    for (const std::string& n : ws.names()) edit(out, n, cpu_clone(ws.view(n)));
    test::TmpDir b("int4_bad");
    write_safetensors(b.path + "/model.safetensors", out);
    write_file_atomic(b.path + "/config.json", config);
    try {
      Target::load(b.path, *ctx);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  using Out = std::vector<std::pair<std::string, Tensor>>;
  const std::string s = "model.layers.1.mlp.experts.4.up_proj.weight_scale";
  std::string m = load_error([&](Out& o, const std::string& n, Tensor t) { if (n != s) o.emplace_back(n, t); }, cfg);
  EXPECT_TRUE(has(m, s) && has(m, "missing")) << m;
  m = load_error(
      [&](Out& o, const std::string& n, Tensor t) { o.emplace_back(n, n == s ? cpu_zeros(DType::BF16, {32, 1}) : t); },
      cfg);
  EXPECT_TRUE(has(m, s) && has(m, "[32, 1]") && has(m, "[32, 2]")) << m;
  const std::string d = "model.layers.2.mlp.gate_proj.";
  m = load_error(
      [&](Out& o, const std::string& n, Tensor t) {
        o.emplace_back(n, t);
        if (n == d + "weight_packed") o.emplace_back(d + "weight_zero_point", cpu_zeros(DType::I32, {16, 2}));
      },
      cfg);
  EXPECT_TRUE(has(m, d + "weight_packed") && has(m, "zero point")) << m;
  m = load_error(
      [&](Out& o, const std::string& n, Tensor t) {
        o.emplace_back(n, n == d + "weight_shape" ? cpu_tensor_i32({128, 32}, {2}) : t);
      },
      cfg);
  EXPECT_TRUE(has(m, d + "weight_shape") && has(m, "[128, 64]")) << m;
  json plain = json::parse(cfg);
  plain.erase("quantization_config");
  m = load_error([&](Out& o, const std::string& n, Tensor t) { o.emplace_back(n, t); }, plain.dump());
  EXPECT_TRUE(has(m, "weight_packed") && has(m, "pack-quantized")) << m;
  // an expert stored plain where the config covers the experts
  const std::string e = "model.layers.3.mlp.experts.6.down_proj.";
  m = load_error(
      [&](Out& o, const std::string& n, Tensor t) {
        if (!n.starts_with(e)) o.emplace_back(n, t);
        if (n == e + "weight_packed") o.emplace_back(e + "weight", cpu_zeros(DType::F32, {64, 32}));
      },
      cfg);
  EXPECT_TRUE(has(m, e + "weight") && has(m, "not INT4")) << m;
}
