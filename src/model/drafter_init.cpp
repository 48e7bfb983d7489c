#include "model/drafter_init.h"

#include <algorithm>
#include <sstream>

#include "io/safetensors.h"

namespace dflash {

std::vector<int64_t> resolve_init_layers(const std::string& spec, const DrafterConfig& c) {
  const int64_t Ld = c.num_layers, Lt = c.num_target_layers;
  if (spec.empty()) return {};
  std::vector<int64_t> out;
  if (spec == "next") {
    DFLASH_CHECK(Ld <= Lt, "--init-from-target next: the drafter has ", Ld, " layers, the target only ", Lt);
    const int64_t first = std::min(c.target_layer_ids.back() + 1, Lt - Ld);
    for (int64_t l = 0; l < Ld; ++l) out.push_back(first + l);
    return out;
  }
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int64_t v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    DFLASH_CHECK(used == item.size() && !item.empty(), "--init-from-target: '", item, "' in '", spec,
                 "' is not a layer index (give \"next\" or a comma list of target layer indices)");
    DFLASH_CHECK(v >= 0 && v < Lt, "--init-from-target: layer ", v, " is outside the target's layers 0..", Lt - 1);
    out.push_back(v);
  }
  DFLASH_CHECK(static_cast<int64_t>(out.size()) == Ld, "--init-from-target: '", spec, "' names ", out.size(),
               " target layers, the drafter has ", Ld, " (--num-layers): give one per draft layer");
  return out;
}

void init_drafter_from_target(Context& ctx, ParamSet& ps, const DrafterConfig& c, const WeightStore& target,
                              std::span<const int64_t> layers, const std::string& fc) {
  DFLASH_CHECK(fc == "random" || fc == "last", "--init-fc: '", fc, "' is not one of random, last");
  DFLASH_CHECK(layers.empty() || static_cast<int64_t>(layers.size()) == c.num_layers, "init_drafter_from_target: ",
               layers.size(), " target layers for ", c.num_layers, " draft layers");
  auto set = [&](const std::string& dst, const std::string& src) {
    Param& p = ps.get(dst);
    ctx.copy(p.master, ctx.to_device(target.f32(src, p.shape), p.master.dtype));
  };
  static const char* const kWeights[] = {"input_layernorm.weight",  "post_attention_layernorm.weight",
                                         "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                         "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                                         "mlp.gate_proj.weight",    "mlp.up_proj.weight",
                                         "mlp.down_proj.weight"};
  for (size_t l = 0; l < layers.size(); ++l) {
    const std::string src = cat("model.layers.", layers[l], "."), dst = cat("layers.", l, ".");
    DFLASH_CHECK(!target.has(src + "linear_attn.out_proj.weight"), "--init-from-target: target layer ", layers[l],
                 " is a linear-attention (Gated DeltaNet) layer; it cannot start a Qwen3-style draft layer (keep the "
                 "spec's random init)");  // (a hybrid model's gated attention fails the q_proj shape check below)
    DFLASH_CHECK(target.has(src + "mlp.gate_proj.weight") ||
                     !(target.has(src + "mlp.gate.weight") || target.has(src + "mlp.router.weight")),
                 "--init-from-target: target layer ", layers[l], " is a Mixture-of-Experts layer; its experts cannot "
                 "start a dense draft layer (name dense target layers, or keep the spec's random init)");
    for (const char* w : kWeights) set(dst + w, src + w);
    for (const char* w : {"self_attn.q_norm.weight", "self_attn.k_norm.weight"})
      if (target.has(src + w)) set(dst + w, src + w);
  }
  if (!layers.empty()) {
    set("hidden_norm.weight", cat("model.layers.", layers[0], ".input_layernorm.weight"));
    set("norm.weight", "model.norm.weight");
  }
  if (fc == "last") {
    const int64_t H = c.hidden_size, nf = c.nf();
    std::vector<float> w(static_cast<size_t>(H * nf * H), 0.f);
    for (int64_t i = 0; i < H; ++i) w[static_cast<size_t>(i * nf * H + (nf - 1) * H + i)] = 1.f;
    Param& p = ps.get("fc.weight");
    ctx.copy(p.master, ctx.to_device(cpu_tensor(std::move(w), {H, nf * H}), p.master.dtype));
  }
  ps.sync_compute(ctx);
}

}  // namespace dflash
