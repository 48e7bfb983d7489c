// train/memory_plan.cpp — the memory plan of a training layout (train/memory_plan.h).
#include "train/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "backend/device_memory.h"
#include "core/error.h"
#include "io/model_family.h"
#include "model/target.h"  // target_layer_params
#include "train/optimizer.h"  // shard_layout

namespace dflash {

const char* const kMemoryItems[kNumMemoryItems] = {"target weights", "KV / state", "target act", "drafter head",
                                                   "drafter weights", "gradients", "optimizer", "packets",
                                                   "drafter act"};

int64_t DevicePlan::total() const {
  int64_t t = 0;
  for (int64_t b : bytes) t += b;
  return t;
}

std::vector<std::pair<std::string, int64_t>> MemoryPlan::needed() const {
  std::vector<std::pair<std::string, int64_t>> v;
  for (const DevicePlan& d : devices) {
    auto it = std::find_if(v.begin(), v.end(), [&](const auto& p) { return p.first == d.pool; });
    if (it == v.end()) v.emplace_back(d.pool, d.total());
    else it->second += d.total();
  }
  return v;
}

namespace {

struct Sizes {
  int64_t a, p;  // compute and parameter dtype bytes
};
Sizes sizes_of(const std::string& backend) {
  if (backend == "cuda") return {2, 4};
  if (backend == "cpu64") return {8, 8};
  return {4, 4};
}

// The stage's weights as its device holds them: its layers, the embedding (stage 0), the final norm and lm_head
// (the last stage).
int64_t stage_weight_bytes(const ModelConfig& c, const TargetStage& st, bool first, bool last, bool split, int64_t a) {
  TargetParams p;
  for (int64_t l = st.first; l < st.end; ++l) p += target_layer_params(c, l);
  int64_t b = p.device_bytes(a);
  const int64_t VH = c.vocab_size * c.hidden_size;
  if (first) b += VH * a;
  if (last) b += c.hidden_size * a + ((c.tie_word_embeddings && !split) ? 0 : VH * a);
  return b;
}

// One layer's keys and values of a sequence of T tokens, or its recurrent state and convolution window.
int64_t layer_state_bytes(const ModelConfig& c, const LayerSpec& s, int64_t T, Sizes z) {
  if (s.mixer == TokenMixer::LinearAttention) {
    const LinearAttnConfig& la = c.linear_attn;
    return la.num_value_heads * la.key_head_dim * la.value_head_dim * z.p +
           std::max<int64_t>(0, la.conv_kernel - 1) * la.conv_dim() * z.a;
  }
  // latent attention: the expanded k and v of every head, v padded to the query's head dim
  if (s.mixer == TokenMixer::LatentAttention) return 2 * T * c.num_attention_heads * c.mla.qk_head_dim() * z.a;
  return 2 * T * c.num_key_value_heads * c.head_dim * z.a;
}

// One layer's transients beyond its state, for T rows: the token mixer's projections and the channel mixer's.
int64_t layer_transient_bytes(const ModelConfig& c, const LayerSpec& s, int64_t T, Sizes z) {
  int64_t b = 0;
  if (s.mixer == TokenMixer::LinearAttention) {
    const LinearAttnConfig& la = c.linear_attn;
    b += T * (2 * la.conv_dim() + 2 * la.value_dim()) * z.a + 2 * T * la.num_value_heads * z.p;
  } else if (s.mixer == TokenMixer::LatentAttention) {
    // q, its RoPE part, the latent, the expanded k_nope | v, k and v padded, the output and its first dv dims
    const MlaConfig& m = c.mla;
    const int64_t nh = c.num_attention_heads, dq = m.qk_head_dim();
    b += T * (m.q_lora_rank + m.kv_lora_rank * 2 + nh * (4 * dq + 2 * m.qk_rope_head_dim +
                                                          2 * (m.qk_nope_head_dim + m.v_head_dim))) * z.a;
  } else {
    const int64_t q = c.num_attention_heads * c.head_dim;
    b += T * q * (2 + (s.attention.output_gate ? 1 : 0)) * z.a;
  }
  if (s.mlp == ChannelMixer::Dense) {
    b += 3 * T * s.mlp_width * z.a;
  } else {
    const int64_t E = c.moe.num_experts, k = c.moe.top_k, H = c.hidden_size;
    b += T * E * z.a + T * k * (4 * 4 + z.p) + T * k * (2 * s.mlp_width + H) * z.a +
         3 * T * c.moe.shared_expert_width * z.a;
  }
  return b;
}

// The drafter step's activations for one sequence of T tokens (see the header).
int64_t drafter_act_bytes(const DrafterConfig& dc, int64_t T, int64_t max_anchors, Sizes z) {
  const int64_t H = dc.hidden_size, I = dc.intermediate_size, nh = dc.num_heads, nkv = dc.num_kv_heads,
                d = dc.head_dim, V = dc.vocab_size;
  const int64_t N = std::min(max_anchors, T), NB = N * dc.block_size;
  int64_t per_layer = NB * (6 * H + 3 * nh * d + 4 * nkv * d + 3 * I) * z.a + 3 * T * nkv * d * z.a +
                      NB * (nh + 4) * z.p;
  if (dc.dflash2()) per_layer += NB * (2 * dc.conv_coefficients() + 4 * H) * z.a;
  const int64_t global = 2 * T * H * z.a + 4 * NB * H * z.a + 2 * std::min<int64_t>(NB, 1024) * V * 4;
  return (dc.num_layers + 1) * per_layer + global;  // + one layer's gradients in the backward
}

std::string gib(int64_t b) {
  if (b < 0) return "?";
  if (b == 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(b) / (1 << 30));
  return buf;
}

}  // namespace

MemoryPlanInputs memory_plan_inputs(const TrainConfig& cfg, int64_t data_max_tokens, int nproc) {
  MemoryPlanInputs in;
  in.topo = parse_topology(cfg);
  in.target = load_model_config(cfg.target_dir);
  in.drafter = resolve_drafter_config(cfg, in.target, cfg.mask_token_id >= 0 ? cfg.mask_token_id : 0);
  DFLASH_CHECK(cfg.max_length >= 0, "--max-length ", cfg.max_length, ": give 0 (as prepared) or a positive length");
  in.max_tokens = cfg.max_length > 0 ? (data_max_tokens > 0 ? std::min(cfg.max_length, data_max_tokens)
                                                            : cfg.max_length)
                                     : data_max_tokens;
  DFLASH_CHECK(in.max_tokens > 0, "the memory plan needs the longest sequence: give --max-length (or --data)");
  DFLASH_CHECK(cfg.max_anchors > 0, "--max-anchors ", cfg.max_anchors, ": give a positive count");
  DFLASH_CHECK(cfg.queue_depth > 0, "--queue-depth ", cfg.queue_depth, ": give a positive count");
  in.max_anchors = cfg.max_anchors;
  in.queue_depth = cfg.queue_depth;
  in.soft = cfg.kl_weight > 0;
  in.shard_optimizer = cfg.shard_optimizer;
  in.nproc = nproc;
  return in;
}

MemoryPlan plan_memory(const MemoryPlanInputs& in) {
  const ModelConfig& c = in.target;
  const DrafterConfig& dc = in.drafter;
  const Topology& topo = in.topo;
  const Sizes z = sizes_of(topo.backend);
  const bool cuda = topo.backend == "cuda";
  const int S = topo.split;
  const int64_t T = in.max_tokens, H = c.hidden_size, nfH = dc.nf() * H;
  MemoryPlan plan;
  plan.backend = topo.backend;
  plan.split = S;
  plan.max_tokens = T;
  plan.stages = split_target_layers(c, S);
  std::map<int, size_t> cuda_row;  // device index -> row
  auto row = [&](int dev, const std::string& cpu_name) -> DevicePlan& {
    if (cuda) {
      if (auto it = cuda_row.find(dev); it != cuda_row.end()) return plan.devices[it->second];
      cuda_row[dev] = plan.devices.size();
      plan.devices.push_back({});
      plan.devices.back().name = plan.devices.back().pool = topo.device_name(dev);
      return plan.devices.back();
    }
    plan.devices.push_back({});
    plan.devices.back().name = cat(topo.backend, " ", cpu_name);
    plan.devices.back().pool = "host";
    return plan.devices.back();
  };
  auto add_role = [](DevicePlan& d, const std::string& r) { d.roles += (d.roles.empty() ? "" : ", ") + r; };

  // target workers: the weights once per (device, stage), as the trainer loads them
  std::set<std::pair<int, int>> loaded;
  std::set<int> unsplit_target_on;
  for (int w = 0; w < topo.target_workers(); ++w)
    for (int s = 0; s < S; ++s) {
      const int dev = topo.target_device(w, s);
      const TargetStage& st = plan.stages[static_cast<size_t>(s)];
      const std::string role = S == 1 ? cat("target ", w) : cat("target ", w, " stage ", s);
      DevicePlan& d = row(dev, role);
      add_role(d, S == 1 ? role : cat(role, " (layers ", st.first, "-", st.end - 1, ")"));
      if (loaded.insert({dev, s}).second)
        d.bytes[kTargetWeights] += stage_weight_bytes(c, st, s == 0, s == S - 1, S > 1, z.a);
      if (S == 1) unsplit_target_on.insert(dev);
      int64_t state = 0, transient = 0;
      for (int64_t l = st.first; l < st.end; ++l) {
        const LayerSpec ls = c.layer(l);
        state = std::max(state, layer_state_bytes(c, ls, T, z));
        transient = std::max(transient, layer_transient_bytes(c, ls, T, z));
      }
      d.bytes[kKvState] += state;
      int64_t act = 2 * T * H * z.a + T * nfH * z.a + transient;  // h, x, features, the largest layer's
      if (s > 0) act += T * (H + nfH) * z.a;                      // the hand-off received from the stage before
      if (s == S - 1 && in.soft) act += T * H * z.a;              // the final hidden
      d.bytes[kTargetAct] += act;
    }

  // drafter workers
  const std::vector<DrafterParamSpec> specs = drafter_param_specs(dc);
  int64_t numel = 0, flat = 0;
  for (const DrafterParamSpec& p : specs) {
    int64_t n = 1;
    for (int64_t x : p.shape) n *= x;
    numel += n;
    flat += (n + 63) / 64 * 64;  // model/params.h: every parameter 64-element aligned in the flat layout
  }
  const int world = static_cast<int>(topo.drafters.size()) * in.nproc;
  const bool sharded = in.shard_optimizer && world > 1;
  const ShardLayout lay = shard_layout(flat, sharded ? world : 1);
  for (size_t i = 0; i < topo.drafters.size(); ++i) {
    const int dev = topo.drafters[i];
    DevicePlan& d = row(dev, cat("drafter ", i));
    add_role(d, cat("drafter ", i));
    if (!unsplit_target_on.count(dev))  // its own copy of the target's embedding and lm_head
      d.bytes[kDrafterHead] += (c.tie_word_embeddings ? 1 : 2) * c.vocab_size * H * z.a;
    if (sharded) {
      d.bytes[kDrafterWeights] += lay.padded() * z.p + (z.a != z.p ? numel * z.a : 0);
      d.bytes[kGradients] += lay.padded() * z.p;
      d.bytes[kOptimizer] += 2 * lay.shard * z.p;
    } else {
      d.bytes[kDrafterWeights] += numel * z.p + (z.a != z.p ? numel * z.a : 0);
      d.bytes[kGradients] += flat * z.p;
      d.bytes[kOptimizer] += 2 * numel * z.p;
    }
    d.bytes[kPackets] += static_cast<int64_t>(in.queue_depth) * T * (nfH + (in.soft ? H : 0)) * z.a;
    d.bytes[kDrafterAct] += drafter_act_bytes(dc, T, in.max_anchors, z);
  }
  return plan;
}

int64_t pool_free_bytes(const std::string& pool, int64_t assumed) {
  if (assumed > 0) return assumed;
  return device_memory(pool == "host" ? "cpu" : pool).free_bytes;
}

namespace {

// The first pool that does not fit: its name, bytes needed and free; empty name when all fit.
struct Overflow {
  std::string pool;
  int64_t needed = 0, free = 0;
};
// `unknown_as` >= 0: the free bytes of a pool that reports none (the devices a suggested layout would add).
Overflow first_overflow(const MemoryPlan& plan, int64_t assumed, int64_t unknown_as = -1) {
  for (const auto& [pool, need] : plan.needed()) {
    int64_t f = pool_free_bytes(pool, assumed);
    if (f < 0) f = unknown_as;
    if (f >= 0 && need > f) return {pool, need, f};
  }
  return {};
}

}  // namespace

void check_memory_plan(const MemoryPlanInputs& in, const MemoryPlan& plan, int64_t assumed) {
  const Overflow o = first_overflow(plan, assumed);
  if (o.pool.empty()) return;
  // the largest items of the pool, for the message
  int64_t items[kNumMemoryItems] = {};
  for (const DevicePlan& d : plan.devices)
    if (d.pool == o.pool)
      for (int k = 0; k < kNumMemoryItems; ++k) items[k] += d.bytes[k];
  std::vector<int> order(kNumMemoryItems);
  for (int k = 0; k < kNumMemoryItems; ++k) order[static_cast<size_t>(k)] = k;
  std::sort(order.begin(), order.end(), [&](int x, int y) { return items[x] > items[y]; });
  std::string parts;
  for (int i = 0; i < 3 && items[order[static_cast<size_t>(i)]] > 0; ++i)
    parts += cat(i ? ", " : "", kMemoryItems[order[static_cast<size_t>(i)]], " ",
                 items[order[static_cast<size_t>(i)]]);
  // a layout that fits: a larger split over the same target devices, the same workers over more devices, a shorter
  // --max-length
  std::string fix;
  const Topology& t = in.topo;
  const int ndev = static_cast<int>(t.targets.size()), W = t.target_workers();
  auto fits = [&](const MemoryPlanInputs& x) {
    try {
      return first_overflow(plan_memory(x), assumed, o.free).pool.empty();
    } catch (const Error&) {
      return false;
    }
  };
  const bool cuda = t.backend == "cuda";
  for (int s = t.split + 1; fix.empty() && s <= std::min<int64_t>(ndev, in.target.num_hidden_layers); ++s) {
    if (ndev % s != 0) continue;
    MemoryPlanInputs x = in;
    x.topo.split = s;
    if (fits(x)) fix = cat("--target-split ", s, " over the same ", ndev, " target devices (", ndev / s, " worker",
                           ndev / s == 1 ? "" : "s", " of ", s, " stages)");
  }
  for (int s = t.split + 1; fix.empty() && cuda && s <= std::min<int64_t>(8, in.target.num_hidden_layers); ++s) {
    MemoryPlanInputs x = in;
    x.topo.split = s;
    x.topo.targets.clear();
    for (int i = 0; i < W * s; ++i) x.topo.targets.push_back(1000 + i);  // devices not otherwise used
    if (fits(x)) fix = cat("--target-split ", s, " over ", W * s, " target devices (", W, " worker", W == 1 ? "" : "s",
                           " of ", s, " stages)");
  }
  for (int64_t len = in.max_tokens / 2; fix.empty() && len >= 16; len /= 2) {
    MemoryPlanInputs x = in;
    x.max_tokens = len;
    if (fits(x)) fix = cat("--max-length ", len);
  }
  DFLASH_FAIL("memory plan: ", o.pool == "host" ? std::string("the host (every CPU worker)") : o.pool, " needs ",
              o.needed, " bytes (", gib(o.needed), " GiB: ", parts, ") and has ", o.free, " bytes (", gib(o.free),
              " GiB) free; ", fix.empty() ? "no layout with a larger --target-split or a shorter --max-length fits"
                                          : cat("a layout that fits: ", fix),
              " (dflash info --plan prints the whole plan)");
}

std::string memory_plan_table(const MemoryPlan& plan, int64_t assumed) {
  std::string out = cat("memory plan (GiB; ", plan.backend, ", ", plan.split, " stage", plan.split == 1 ? "" : "s",
                        " per target worker, sequences of up to ", plan.max_tokens, " tokens)\n");
  char buf[64];
  size_t w0 = 6;
  for (const DevicePlan& d : plan.devices) w0 = std::max(w0, d.name.size());
  std::snprintf(buf, sizeof buf, "%-*s", static_cast<int>(w0), "device");
  out += buf;
  for (const char* n : kMemoryItems) {
    std::snprintf(buf, sizeof buf, " %15s", n);
    out += buf;
  }
  out += "           total            free\n";
  for (const DevicePlan& d : plan.devices) {
    std::snprintf(buf, sizeof buf, "%-*s", static_cast<int>(w0), d.name.c_str());
    out += buf;
    for (int64_t b : d.bytes) {
      std::snprintf(buf, sizeof buf, " %15s", gib(b).c_str());
      out += buf;
    }
    const std::string free = d.pool == "host" ? std::string("(host)") : gib(pool_free_bytes(d.pool, assumed));
    std::snprintf(buf, sizeof buf, " %15s %15s", gib(d.total()).c_str(), free.c_str());
    out += cat(buf, "   ", d.roles, "\n");
  }
  for (size_t s = 0; s < plan.stages.size(); ++s)
    out += cat("stage ", s, ": layers ", plan.stages[s].first, "-", plan.stages[s].end - 1, "\n");
  for (const auto& [pool, need] : plan.needed()) {
    const int64_t f = pool_free_bytes(pool, assumed);
    out += cat(pool, ": needs ", need, " bytes (", gib(need), " GiB), ",
               f < 0 ? std::string("free unknown") : cat(f, " bytes (", gib(f), " GiB) free"),
               f >= 0 && need > f ? ": DOES NOT FIT" : "", "\n");
  }
  return out;
}

void to_json(nlohmann::json& j, const MemoryPlan& p) {
  j = nlohmann::json{{"backend", p.backend}, {"target_split", p.split}, {"max_tokens", p.max_tokens}};
  nlohmann::json stages = nlohmann::json::array();
  for (const TargetStage& s : p.stages) stages.push_back({{"first", s.first}, {"end", s.end}});
  j["stages"] = stages;
  nlohmann::json devs = nlohmann::json::array();
  for (const DevicePlan& d : p.devices) {
    nlohmann::json b = nlohmann::json::object();
    for (int k = 0; k < kNumMemoryItems; ++k) b[kMemoryItems[k]] = d.bytes[k];
    devs.push_back({{"name", d.name}, {"pool", d.pool}, {"roles", d.roles}, {"bytes", b}, {"total", d.total()}});
  }
  j["devices"] = devs;
  nlohmann::json pools = nlohmann::json::object();
  for (const auto& [pool, need] : p.needed()) pools[pool] = need;
  j["needed"] = pools;
}

int64_t parse_bytes(const std::string& s, const char* option) {
  size_t n = 0;
  double v = 0;
  try {
    v = std::stod(s, &n);
  } catch (const std::exception&) {
    n = 0;
  }
  std::string unit = s.substr(n);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  double mul = 0;
  if (unit.empty() || unit == "B") mul = 1;
  else if (unit == "K" || unit == "KIB") mul = 1024.0;
  else if (unit == "M" || unit == "MIB") mul = 1024.0 * 1024;
  else if (unit == "G" || unit == "GIB") mul = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TIB") mul = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "KB") mul = 1e3;
  else if (unit == "MB") mul = 1e6;
  else if (unit == "GB") mul = 1e9;
  else if (unit == "TB") mul = 1e12;
  DFLASH_CHECK(n > 0 && mul > 0 && v > 0 && std::isfinite(v), option, " '", s,
               "': expected a positive size in bytes, e.g. 80GiB, 512MiB, 2.5e9");
  return static_cast<int64_t>(std::llround(v * mul));
}

}  // namespace dflash
