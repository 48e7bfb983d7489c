// tests/model/fp8_target.cpp — FP8 checkpoints (io/hf_config.h Fp8Format): a target golden rewritten with its
// projections in FP8 (quant_method "fp8" with block scales, compressed-tensors "float-quantized" per channel) loads
// with those projections kept FP8 and computes, on the CPU, exactly what the same model with the dequantised
// weights computes; bad FP8 checkpoints are refused naming the tensor or the field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <numeric>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "core/error.h"
#include "core/fs.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/target.h"
#include "model/target/attention.h"
#include "model/target/linear_attention.h"
#include "common/published_configs.h"
#include "common/test_util.h"

using namespace dflash;
using nlohmann::json;

namespace {

using test::TmpDir;


std::string golden(const std::string& name) { return test::source_dir() + "/tests/golden/" + name; }

struct Fp8Copy {
  std::string method;  // "fp8" or "compressed-tensors"
  int64_t bn = 0, bk = 0;  // compressed-tensors: 1 x 0 = per channel
};

// A layer projection's weight: "model.layers.{l}.<...>proj<...>.weight", 2-D (q_proj, ..., in_proj_qkv, out_proj).
bool is_projection(const std::string& n, const Tensor& v) {
  const size_t dot = n.rfind('.', n.size() - 8);
  return n.starts_with("model.layers.") && n.ends_with(".weight") && v.ndim() == 2 &&
         n.find("proj", dot == std::string::npos ? 0 : dot) != std::string::npos;
}

// Writes golden `src` twice: `fp8_dir` with every layer projection (is_projection) quantized (F8_E4M3 +
// its scale: weight_scale_inv F32 for "fp8", weight_scale BF16 [N, 1] for per-channel compressed-tensors) and a
// quantization_config; `plain_dir` with the same projections dequantised (F32) and no quantization_config.
void write_copies(const std::string& src, const Fp8Copy& f, const std::string& fp8_dir, const std::string& plain_dir) {
  auto cpu = make_context("cpu");
  auto ws = WeightStore::open(src);
  std::vector<std::pair<std::string, Tensor>> q, p;
  for (const std::string& n : ws.names()) {
    const Tensor v = ws.f32(n);
    if (!is_projection(n, v)) {
      q.emplace_back(n, v);
      p.emplace_back(n, v);
      continue;
    }
    const int64_t N = v.shape[0], K = v.shape[1];
    LinearWeight w = cpu->quantize_fp8(v, f.bn > 0 ? f.bn : N, f.bk > 0 ? f.bk : K);
    const std::string base = n.substr(0, n.size() - 6);
    q.emplace_back(n, w.w);
    if (f.method == "fp8") {
      q.emplace_back(base + "weight_scale_inv", w.scale);
    } else {  // BF16 scales [N, 1], as llm-compressor writes them: the model is the codes times those
      q.emplace_back(base + "weight_scale", cpu_to_bf16(w.scale));
      w.scale = cpu_to_f32(q.back().second);
    }
    p.emplace_back(n, fp8_dequantize(w));
  }
  write_safetensors(fp8_dir + "/model.safetensors", q);
  write_safetensors(plain_dir + "/model.safetensors", p);
  json c = json::parse(read_file(src + "/config.json"));
  write_file_atomic(plain_dir + "/config.json", c.dump(2));
  if (f.method == "fp8") {
    c["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                {"weight_block_size", {f.bn, f.bk}}};
  } else {
    c["quantization_config"] = {
        {"quant_method", "compressed-tensors"},
        {"format", "float-quantized"},
        {"ignore", {"lm_head"}},
        {"config_groups",
         {{"group_0",
           {{"targets", {"Linear"}},
            {"weights", {{"num_bits", 8}, {"type", "float"}, {"symmetric", true}, {"strategy", "channel"}}},
            {"input_activations",
             {{"num_bits", 8}, {"type", "float"}, {"dynamic", true}, {"strategy", "token"}}}}}}}};
  }
  write_file_atomic(fp8_dir + "/config.json", c.dump(2));
}

// Every layer's output and the final norm of both copies on "cpu": equal value for value.
void expect_same_forward(const std::string& fp8_dir, const std::string& plain_dir, const std::string& what) {
  auto ctx = make_context("cpu");
  auto a = Target::load(fp8_dir, *ctx);
  auto b = Target::load(plain_dir, *ctx);
  EXPECT_EQ(a->config().linear_format, WeightFormat::FP8);
  EXPECT_EQ(b->config().linear_format, WeightFormat::Plain);
  const int64_t L = a->config().num_hidden_layers;
  std::vector<int64_t> all(static_cast<size_t>(L));
  std::iota(all.begin(), all.end(), 0);
  std::vector<int32_t> idv;
  for (int i = 0; i < 23; ++i) idv.push_back((i * 37 + 5) % 512);
  const Tensor ids = cpu_tensor_i32(idv, {23});
  auto fa = a->forward(*ctx, ids, all, true);
  auto fb = b->forward(*ctx, ids, all, true);
  EXPECT_EQ(to_f32_vector(fa.features), to_f32_vector(fb.features)) << what;
  EXPECT_EQ(to_f32_vector(fa.final_hidden), to_f32_vector(fb.final_hidden)) << what;
}

}  // namespace

// Qwen3 with 16 x 24 blocks (partial blocks at the 64-column edge): the projections stay FP8 on the device (codes +
// scales), the forward equals the dequantised model's.
TEST(Fp8Target, BlockScaledQwen3EqualsItsDequantisation) {
  TmpDir q("fp8_q3"), p("fp8_q3_plain");
  write_copies(golden("target_qwen3"), {"fp8", 16, 24}, q.path, p.path);
  auto ctx = make_context("cpu");
  auto t = Target::load(q.path, *ctx);
  const auto& L0 = t->weights().layers[0];
  const auto* attn = std::any_cast<AttentionWeights>(&L0.mixer);
  ASSERT_NE(attn, nullptr);
  EXPECT_TRUE(attn->wq.fp8());
  EXPECT_EQ(attn->wq.w.dtype, DType::F8E4M3);
  EXPECT_EQ(attn->wq.scale.shape, (Shape{128 / 16, 3}));  // [nh d = 128, H = 64]: 8 x ceil(64 / 24)
  EXPECT_TRUE(L0.mlp.w_down.fp8());
  EXPECT_EQ(t->config().fp8.granularity(), "block 16x24");
  expect_same_forward(q.path, p.path, "qwen3 block 16x24");
}

// Qwen3.5 (gated attention: q_proj holds query and gate rows per head; Gated DeltaNet projections): with 16-row
// blocks the query / gate split keeps FP8 (head_dim 32 is two blocks); with 24-row blocks the blocks straddle the
// halves and the split dequantises. Both equal the dequantised model.
TEST(Fp8Target, GatedAttentionAndLinearAttentionEqualTheirDequantisation) {
  {
    TmpDir q("fp8_q35"), p("fp8_q35_plain");
    write_copies(golden("target_qwen3_5"), {"fp8", 16, 32}, q.path, p.path);
    auto ctx = make_context("cpu");
    auto t = Target::load(q.path, *ctx);
    bool saw_gated = false;
    for (const auto& L : t->weights().layers)
      if (const auto* a = std::any_cast<AttentionWeights>(&L.mixer); a && a->wg.defined()) {
        EXPECT_TRUE(a->wq.fp8() && a->wg.fp8());
        saw_gated = true;
      }
    EXPECT_TRUE(saw_gated);
    const auto* lin = std::any_cast<LinearAttnWeights>(&t->weights().layers[0].mixer);
    ASSERT_NE(lin, nullptr);
    EXPECT_TRUE(lin->w_qkv.fp8());
    expect_same_forward(q.path, p.path, "qwen3.5 block 16x32");
  }
  {
    TmpDir q("fp8_q35b"), p("fp8_q35b_plain");
    write_copies(golden("target_qwen3_5"), {"fp8", 24, 24}, q.path, p.path);
    expect_same_forward(q.path, p.path, "qwen3.5 block 24x24");
  }
}

// Qwen3-MoE with 16 x 16 blocks: the routed experts stay FP8 (gate and up rows of every expert stacked, [E 2I, H]),
// dequantised per forward; with 24-row blocks they straddle experts (I = 32) and load dequantised. The router stays
// bf16 (it is not FP8 in the checkpoint). Both equal the dequantised model.
TEST(Fp8Target, MoeExpertsStayFp8AndEqualTheirDequantisation) {
  {
    TmpDir q("fp8_moe"), p("fp8_moe_plain");
    write_copies(golden("target_qwen3_moe"), {"fp8", 16, 16}, q.path, p.path);
    auto ctx = make_context("cpu");
    auto t = Target::load(q.path, *ctx);
    const auto& moe = t->weights().layers[0].moe;
    ASSERT_TRUE(moe.gate_up_fp8.defined());
    EXPECT_FALSE(moe.gate_up.w.defined());
    const int64_t E = t->config().moe.num_experts;
    EXPECT_EQ(moe.gate_up_fp8.w.shape, (Shape{E * 64, 64}));
    EXPECT_EQ(moe.down_fp8.w.shape, (Shape{E * 64, 32}));
    EXPECT_EQ(moe.router.dtype, DType::F32);
    expect_same_forward(q.path, p.path, "qwen3-moe block 16x16");
  }
  {
    TmpDir q("fp8_moe24"), p("fp8_moe24_plain");
    write_copies(golden("target_qwen3_moe"), {"fp8", 24, 16}, q.path, p.path);
    auto ctx = make_context("cpu");
    EXPECT_FALSE(Target::load(q.path, *ctx)->weights().layers[0].moe.gate_up_fp8.defined());
    expect_same_forward(q.path, p.path, "qwen3-moe block 24x16");
  }
}

// compressed-tensors FP8-dynamic (per-channel BF16 scales [N, 1], dynamic per-token activations).
TEST(Fp8Target, CompressedTensorsPerChannelEqualsItsDequantisation) {
  TmpDir q("fp8_ct"), p("fp8_ct_plain");
  write_copies(golden("target_qwen3"), {"compressed-tensors", 1, 0}, q.path, p.path);
  auto ctx = make_context("cpu");
  auto t = Target::load(q.path, *ctx);
  EXPECT_EQ(t->config().fp8.method, "compressed-tensors");
  EXPECT_EQ(t->config().fp8.granularity(), "per channel");
  EXPECT_EQ(std::any_cast<AttentionWeights>(&t->weights().layers[0].mixer)->wk.scale.shape, (Shape{64, 1}));
  expect_same_forward(q.path, p.path, "compressed-tensors per channel");
}

// Bad FP8 checkpoints: a scale of the wrong shape, a missing scale, FP8 tensors without a quantization_config, and
// config values dflash does not run (fmt e5m2, static activations, INT8 compressed-tensors, a quantized KV cache)
// are refused naming the tensor or the field.
TEST(Fp8Target, BadCheckpointsAreRefusedByName) {
  TmpDir q("fp8_bad"), p("fp8_bad_plain");
  write_copies(golden("target_qwen3"), {"fp8", 16, 24}, q.path, p.path);
  auto ctx = make_context("cpu");
  auto load_error = [&](const std::string& dir) {
    try {
      Target::load(dir, *ctx);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto has = [](const std::string& m, const std::string& s) { return m.find(s) != std::string::npos; };
  const std::string good_config = read_file(q.path + "/config.json");
  {  // a scale grid of another shape
    auto ws = WeightStore::open(q.path);
    std::vector<std::pair<std::string, Tensor>> out;
    for (const std::string& n : ws.names()) {
      const std::string bad = "model.layers.1.self_attn.k_proj.weight_scale_inv";
      out.emplace_back(n, n == bad ? cpu_zeros(DType::F32, {4, 2}) : cpu_clone(ws.view(n)));
    }
    TmpDir b("fp8_bad_scale");
    write_safetensors(b.path + "/model.safetensors", out);
    write_file_atomic(b.path + "/config.json", good_config);
    const std::string m = load_error(b.path);
    EXPECT_TRUE(has(m, "model.layers.1.self_attn.k_proj.weight_scale_inv") && has(m, "[4, 2]") && has(m, "[4, 3]"))
        << m;
  }
  {  // a missing scale
    auto ws = WeightStore::open(q.path);
    std::vector<std::pair<std::string, Tensor>> out;
    for (const std::string& n : ws.names())
      if (n != "model.layers.2.mlp.up_proj.weight_scale_inv") out.emplace_back(n, cpu_clone(ws.view(n)));
    TmpDir b("fp8_no_scale");
    write_safetensors(b.path + "/model.safetensors", out);
    write_file_atomic(b.path + "/config.json", good_config);
    const std::string m = load_error(b.path);
    EXPECT_TRUE(has(m, "model.layers.2.mlp.up_proj.weight_scale_inv") && has(m, "missing")) << m;
  }
  json c = json::parse(good_config);
  c.erase("quantization_config");
  write_file_atomic(q.path + "/config.json", c.dump());
  std::string m = load_error(q.path);
  EXPECT_TRUE(has(m, "F8_E4M3") && has(m, "quantization_config")) << m;
  auto config_error = [&](const json& qc) {
    json j = json::parse(good_config);
    j["quantization_config"] = qc;
    try {
      parse_model_config(j, "config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  m = config_error({{"quant_method", "fp8"}, {"fmt", "e5m2"}});
  EXPECT_TRUE(has(m, "quantization_config.fmt") && has(m, "e5m2")) << m;
  m = config_error({{"quant_method", "fp8"}, {"activation_scheme", "static"}});
  EXPECT_TRUE(has(m, "quantization_config.activation_scheme") && has(m, "static")) << m;
  m = config_error({{"quant_method", "fp8"}, {"weight_block_size", {128}}});
  EXPECT_TRUE(has(m, "quantization_config.weight_block_size")) << m;
  m = config_error({{"quant_method", "compressed-tensors"}, {"format", "int-quantized"}});
  EXPECT_TRUE(has(m, "quantization_config.format") && has(m, "int-quantized")) << m;
  json ct = {{"quant_method", "compressed-tensors"},
             {"format", "float-quantized"},
             {"config_groups",
              {{"group_0",
                {{"weights", {{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"}}},
                 {"input_activations", {{"num_bits", 8}, {"type", "float"}, {"dynamic", false}}}}}}}};
  m = config_error(ct);
  EXPECT_TRUE(has(m, "config_groups.group_0.input_activations.dynamic") && has(m, "static")) << m;
  ct["config_groups"]["group_0"]["input_activations"]["dynamic"] = true;
  ct["kv_cache_scheme"] = {{"num_bits", 8}};
  m = config_error(ct);
  EXPECT_TRUE(has(m, "kv_cache_scheme")) << m;
  ct.erase("kv_cache_scheme");
  ct["config_groups"]["group_0"]["weights"]["strategy"] = "group";
  m = config_error(ct);
  EXPECT_TRUE(has(m, "weights.strategy") && has(m, "group")) << m;
  m = config_error({{"quant_method", "awq"}});
  EXPECT_TRUE(has(m, "quantization_config.quant_method") && has(m, "awq")) << m;
}

// dflash info on Qwen3-8B-FP8's config.json (Qwen's published quantization_config): the format, the scales and the
// bytes on the device with every layer projection in FP8 (1 byte + one F32 per 128 x 128 block) beside the
// embedding, lm_head and norms in bf16.
TEST(Fp8Target, InfoNamesTheFormatAndTheDeviceBytes) {
  TmpDir tmp("fp8_info");
  json c = json::parse(test::kQwen3_8B);
  c["quantization_config"] = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
                              {"weight_block_size", {128, 128}}};
  write_file_atomic(tmp.path + "/config.json", c.dump());
  const std::string cmd = cat(DFLASH_BINARY, " info ", tmp.path, " --json > ", tmp.path, "/out.json 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(tmp.path + "/out.json");
  const json o = json::parse(read_file(tmp.path + "/out.json"))["config"];
  EXPECT_EQ(o["quant_method"], "fp8");
  EXPECT_EQ(o["fp8"]["scales"], "block 128x128");
  const int64_t H = 4096, I = 12288, per_layer = 2 * H * 32 * 128 + 2 * H * 8 * 128 + 3 * H * I;
  EXPECT_EQ(o["params"]["fp8"].get<int64_t>(), 36 * per_layer);
  const TargetParams p = target_params(parse_model_config(c, "x"));
  EXPECT_EQ(p.fp8_scale_bytes, 4 * 36 * per_layer / (128 * 128));
  EXPECT_EQ(o["device_weight_bytes"].get<int64_t>(), 2 * (p.total - p.fp8) + p.fp8 + p.fp8_scale_bytes);
  const std::string txt = cat(DFLASH_BINARY, " info ", tmp.path, " > ", tmp.path, "/out.txt 2>&1");
  ASSERT_EQ(std::system(txt.c_str()), 0);
  const std::string t = read_file(tmp.path + "/out.txt");
  EXPECT_NE(t.find("projections in FP8"), std::string::npos) << t;
  EXPECT_NE(t.find("block 128x128 scales"), std::string::npos) << t;
}
