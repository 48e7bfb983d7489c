// backend/context.cpp — device selection, the helpers shared by every Context, and RoPE frequencies.
#include "backend/context.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>

#include "core/rope_scaling.h"

namespace dflash {

std::unique_ptr<Context> make_cpu_context(const ContextOptions& o, DType dt);
#ifdef DFLASH_HAVE_CUDA
std::unique_ptr<Context> make_cuda_context(const ContextOptions& o);
#endif

namespace {
std::atomic<int64_t> g_lazy_inits{0};  // diagnostics only: a count and the last name, never read by an op
std::mutex g_lazy_mu;
std::string g_lazy_last;
}  // namespace

int64_t lazy_init_count() { return g_lazy_inits.load(); }
std::string last_lazy_init() {
  std::lock_guard<std::mutex> lk(g_lazy_mu);
  return g_lazy_last;
}
void note_lazy_init(const char* what) {
  g_lazy_inits.fetch_add(1);
  std::lock_guard<std::mutex> lk(g_lazy_mu);
  g_lazy_last = what;
}

std::unique_ptr<Context> make_context(const std::string& device, const ContextOptions& opts) {
  note_lazy_init("context creation");
  if (device == "cpu") return make_cpu_context(opts, DType::F32);
  if (device == "cpu64") return make_cpu_context(opts, DType::F64);
  if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
#ifdef DFLASH_HAVE_CUDA
    ContextOptions o = opts;
    if (device.size() > 5) o.device_index = std::stoi(device.substr(5));
    return make_cuda_context(o);
#else
    DFLASH_FAIL("device '", device, "': this dflash was built without the CUDA backend (configure with nvcc present)");
#endif
  }
  DFLASH_FAIL("unknown device '", device, "' (expected cpu, cpu64, cuda or cuda:N)");
}

// ---- MoE argument checks (backend/context.h) -----------------------------------------------------------------------
namespace {
void need(bool ok, const char* op, const char* what, const Tensor& t, const std::string& expect) {
  DFLASH_CHECK(ok, op, ": ", what, " is ", dtype_name(t.dtype), " ", shape_str(t.shape), ", expected ", expect);
}
}  // namespace

void check_moe_route(const Tensor& logits, int64_t k, const Tensor& idx, const Tensor& weights, DType act,
                     DType param, const MoeRouteOpts& opts) {
  const char* op = "moe_route";
  need(logits.dtype == act && logits.ndim() == 2, op, "logits", logits, cat(dtype_name(act), " [T, E]"));
  const int64_t T = logits.shape[0], E = logits.shape[1];
  DFLASH_CHECK(k >= 1 && k <= E, op, ": k = ", k, " outside [1, E = ", E, "]");
  need(idx.dtype == DType::I32 && idx.numel() == T * k, op, "idx", idx, cat("I32 [", T, ", ", k, "]"));
  need(weights.dtype == param && weights.numel() == T * k, op, "weights", weights,
       cat(dtype_name(param), " [", T, ", ", k, "]"));
  DFLASH_CHECK(opts.n_group >= 1 && E % opts.n_group == 0 && opts.topk_group >= 1 && opts.topk_group <= opts.n_group,
               op, ": n_group ", opts.n_group, " must divide E = ", E, " and topk_group ", opts.topk_group,
               " be in [1, n_group]");
  if (opts.n_group > 1) {
    DFLASH_CHECK(opts.score == MoeScore::Sigmoid, op, ": group-limited choice goes with sigmoid scores only");
    DFLASH_CHECK(E / opts.n_group >= 2, op, ": groups of ", E / opts.n_group, " expert (a group's score sums its two "
                 "largest)");
    DFLASH_CHECK(opts.topk_group * (E / opts.n_group) >= k, op, ": the ", opts.topk_group, " kept groups of ",
                 E / opts.n_group, " experts cannot give k = ", k);
  } else {
    DFLASH_CHECK(opts.topk_group == 1, op, ": topk_group ", opts.topk_group, " without groups (n_group 1)");
  }
  DFLASH_CHECK(opts.scale > 0, op, ": scale must be positive, got ", opts.scale);
  DFLASH_CHECK(opts.score == MoeScore::Sigmoid || opts.scale == 1.0, op, ": a weight scale goes with sigmoid scores "
               "only");
  if (opts.choice_bias.defined()) {
    DFLASH_CHECK(opts.score == MoeScore::Sigmoid, op, ": a choice bias goes with sigmoid scores only");
    need(opts.choice_bias.dtype == DType::F32 && opts.choice_bias.numel() == E, op, "choice_bias", opts.choice_bias,
         cat("F32 [", E, "]"));
  }
}

void check_moe_group(const Tensor& idx, const Tensor& offsets, const Tensor& rows, const Tensor& slot) {
  const char* op = "moe_group";
  need(idx.dtype == DType::I32 && idx.ndim() == 2, op, "idx", idx, "I32 [T, k]");
  const int64_t n = idx.numel();
  need(offsets.dtype == DType::I32 && offsets.ndim() == 1 && offsets.numel() >= 2, op, "offsets", offsets,
       "I32 [E + 1]");
  need(rows.dtype == DType::I32 && rows.numel() == n, op, "rows", rows, cat("I32 [", n, "]"));
  need(slot.dtype == DType::I32 && slot.numel() == n, op, "slot", slot, cat("I32 [", n, "]"));
}

MoeLinearDims check_moe_linear(const Tensor& x, const Tensor* rows, const MoeWeights& mw, const Tensor& offsets,
                               const Tensor& y, MoeAct act, DType dt) {
  const char* op = "moe_linear";
  const Tensor& w = mw.w;
  const bool gated = act != MoeAct::None, q4 = mw.quantized();
  const char* fmt = mw.int4() ? "INT4" : "MXFP4";
  need(w.defined() && w.dtype == (q4 ? DType::U8 : dt) && w.ndim() == 3, op, "w", w,
       q4 ? cat("U8 [E, N', K/2] (", fmt, " with scales)") : cat(dtype_name(dt), " [E, N', K]"));
  const int64_t E = w.shape[0], Nw = w.shape[1], K = q4 ? 2 * w.shape[2] : w.shape[2], N = gated ? Nw / 2 : Nw;
  DFLASH_CHECK(!gated || Nw % 2 == 0, op, ": ", act == MoeAct::SwiGLU ? "SwiGLU" : "ClampedSwiGLU",
               " needs w [E, 2N, K], got ", shape_str(w.shape));
  if (mw.mxfp4()) {
    DFLASH_CHECK(K % 32 == 0, op, ": MXFP4 weights need K % 32 == 0 (one scale per 32 elements), got K = ", K);
    need(mw.scales.dtype == DType::U8 && mw.scales.ndim() == 3 && mw.scales.shape[0] == E &&
             mw.scales.shape[1] == Nw && mw.scales.shape[2] == K / 32,
         op, "scales", mw.scales, cat("U8 [", E, ", ", Nw, ", ", K / 32, "]"));
  } else if (mw.int4()) {
    const int64_t g = mw.int4_group;
    DFLASH_CHECK(g % 32 == 0 && K % g == 0, op, ": INT4 weights need a group size that is a multiple of 32 and "
                 "divides K, got group ", g, " and K = ", K);
    need(mw.scales.dtype == DType::BF16 && mw.scales.ndim() == 3 && mw.scales.shape[0] == E &&
             mw.scales.shape[1] == Nw && mw.scales.shape[2] == K / g,
         op, "scales", mw.scales, cat("BF16 [", E, ", ", Nw, ", ", K / g, "] (INT4, one per ", g, ")"));
  }
  if (mw.bias.defined())
    need(mw.bias.dtype == dt && mw.bias.numel() == E * Nw && mw.bias.shape.back() == Nw, op, "bias", mw.bias,
         cat(dtype_name(dt), " [", E, ", ", Nw, "]"));
  need(x.dtype == dt && x.ndim() >= 1 && x.shape.back() == K, op, "x", x, cat(dtype_name(dt), " [*, ", K, "]"));
  need(offsets.dtype == DType::I32 && offsets.numel() == E + 1, op, "offsets", offsets, cat("I32 [", E + 1, "]"));
  need(y.dtype == dt && y.ndim() >= 1 && y.shape.back() == N, op, "y", y, cat(dtype_name(dt), " [R, ", N, "]"));
  const int64_t R = y.rows();
  if (rows) {
    need(rows->dtype == DType::I32 && rows->numel() == R, op, "rows", *rows, cat("I32 [", R, "]"));
  } else {
    need(x.rows() == R, op, "x", x, cat("[", R, ", ", K, "] (the grouped rows, no gather)"));
  }
  return {R, N, K, E};
}

const char* moe_linear_op_name(MoeAct act, const MoeWeights& w) {
  const int q = w.mxfp4() ? 1 : w.int4() ? 2 : 0;
  static const char* const names[3][3] = {
      {"moe_linear", "moe_linear_mxfp4", "moe_linear_int4"},
      {"moe_linear_swiglu", "moe_linear_swiglu_mxfp4", "moe_linear_swiglu_int4"},
      {"moe_linear_clamped_swiglu", "moe_linear_clamped_swiglu_mxfp4", "moe_linear_clamped_swiglu_int4"}};
  switch (act) {
    case MoeAct::None: return names[0][q];
    case MoeAct::SwiGLU: return names[1][q];
    case MoeAct::ClampedSwiGLU: return names[2][q];
  }
  return "moe_linear";
}

void check_causal_attn_opts(const char* op, const CausalAttnOpts& o, const Tensor& q) {
  DFLASH_CHECK(o.window >= 0, op, ": window ", o.window, " must be >= 0 (0 = no window)");
  if (!o.sinks.defined()) return;
  const int64_t nh = q.ndim() == 3 ? q.shape[1] : -1;
  // on q's device, or on the host (a device backend uploads them)
  const bool where = o.sinks.device == q.device || o.sinks.device == Device::CPU;
  need(o.sinks.dtype == DType::F32 && o.sinks.numel() == nh && where, op, "sinks", o.sinks,
       cat("F32 [", nh, "] on ", device_name(q.device), q.device == Device::CPU ? "" : " or the host",
           " (one logit per query head)"));
}

void check_moe_combine(const Tensor& y, const Tensor& slot, const Tensor& weights, const Tensor& out, DType act,
                       DType param) {
  const char* op = "moe_combine";
  need(out.dtype == act && out.ndim() >= 1, op, "out", out, cat(dtype_name(act), " [T, H]"));
  const int64_t T = out.rows(), H = out.shape.back();
  need(weights.dtype == param && weights.ndim() == 2 && weights.shape[0] == T, op, "weights", weights,
       cat(dtype_name(param), " [", T, ", k]"));
  const int64_t k = weights.shape[1];
  need(slot.dtype == DType::I32 && slot.numel() == T * k, op, "slot", slot, cat("I32 [", T * k, "]"));
  need(y.dtype == act && y.ndim() >= 1 && y.shape.back() == H, op, "y", y, cat(dtype_name(act), " [R, ", H, "]"));
}

Tensor Context::zeros(DType t, Shape s) {
  Tensor x = empty(t, std::move(s));
  zero(x);
  return x;
}

Tensor Context::to_device(const Tensor& t, DType dt) {
  if (t.device == device() && t.dtype == dt) return t;
  Tensor o = empty(dt, t.shape);
  copy(o, t);
  return o;
}

Tensor Context::to_host(const Tensor& t, bool as_f32) {
  const bool is_float = t.dtype == DType::F32 || t.dtype == DType::BF16 || t.dtype == DType::F16;
  const DType dt = (as_f32 && is_float) ? DType::F32 : t.dtype;
  Tensor o = cpu_empty(dt, t.shape);
  if (t.device == Device::CPU) {
    if (dt == t.dtype) {
      o = cpu_clone(t);
    } else {
      std::vector<float> v = to_f32_vector(t);
      std::copy(v.begin(), v.end(), o.ptr<float>());
    }
    return o;
  }
  copy(o, t);
  synchronize();
  return o;
}

Tensor rope_inv_freq_proportional(int64_t head_dim, int64_t rotated, double theta) {
  DFLASH_CHECK(head_dim > 0 && head_dim % 2 == 0 && rotated >= 0 && rotated <= head_dim && rotated % 2 == 0,
               "proportional RoPE: head_dim ", head_dim, " and rotated dims ", rotated, " (even, at most head_dim)");
  Tensor t = cpu_empty(DType::F32, {head_dim / 2});
  float* f = t.ptr<float>();
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    // transformers: 1 / base^(arange(0, 2 rope_angles, 2) / head_dim) in float32, then zeros for the other angles
    const float expo = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    f[i] = 2 * i < rotated ? 1.0f / std::pow(static_cast<float>(theta), expo) : 0.0f;
  }
  return t;
}

Tensor rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& sc) {
  DFLASH_CHECK(head_dim > 0 && head_dim % 2 == 0, "RoPE needs an even head_dim, got ", head_dim);
  const int64_t half = head_dim / 2;
  Tensor t = cpu_empty(DType::F32, {half});
  float* f = t.ptr<float>();
  for (int64_t i = 0; i < half; ++i) {
    // transformers: 1 / theta^(arange(0, d, 2) / d), computed in float32 from int64 arange.
    const float expo = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    f[i] = 1.0f / std::pow(static_cast<float>(theta), expo);
  }
  if (sc.kind == "none" || sc.kind == "default") return t;
  if (sc.kind == "linear") {
    for (int64_t i = 0; i < half; ++i) f[i] = f[i] / static_cast<float>(sc.factor);
    return t;
  }
  if (sc.kind == "llama3") {
    // transformers _compute_llama3_parameters (Llama-3.1): long wavelengths divided by factor, short kept,
    // the band between smoothly interpolated.
    const double old_ctx = static_cast<double>(sc.original_max_position_embeddings);
    const double low_wavelen = old_ctx / sc.low_freq_factor;
    const double high_wavelen = old_ctx / sc.high_freq_factor;
    for (int64_t i = 0; i < half; ++i) {
      const double inv = f[i];
      const double wavelen = 2.0 * M_PI / inv;
      double out;
      if (wavelen > low_wavelen) {
        out = inv / sc.factor;
      } else if (wavelen < high_wavelen) {
        out = inv;
      } else {
        const double smooth = (old_ctx / wavelen - sc.low_freq_factor) / (sc.high_freq_factor - sc.low_freq_factor);
        out = (1.0 - smooth) * inv / sc.factor + smooth * inv;
      }
      f[i] = static_cast<float>(out);
    }
    return t;
  }
  if (sc.kind == "yarn") {
    // transformers _compute_yarn_parameters: interpolated (/ factor) and extrapolated (plain) frequencies blended by a
    // linear ramp over the dimensions between the correction range [low, high] of beta_fast / beta_slow rotations
    // at original_max_position_embeddings; tensors in float32 as torch computes them, the range in double (Python).
    const double dim = static_cast<double>(head_dim), base = theta;
    const double orig = static_cast<double>(sc.original_max_position_embeddings);
    auto correction_dim = [&](double rot) { return dim * std::log(orig / (rot * 2 * M_PI)) / (2 * std::log(base)); };
    double low = correction_dim(sc.beta_fast), high = correction_dim(sc.beta_slow);
    if (sc.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1);
    if (low == high) high += 0.001;  // linear_ramp_factor's guard against a singularity
    const float lo = static_cast<float>(low), span = static_cast<float>(high - low);
    for (int64_t i = 0; i < half; ++i) {
      const float pos_freq = std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / static_cast<float>(head_dim));
      const float extrapolation = 1.0f / pos_freq;
      const float interpolation = 1.0f / (static_cast<float>(sc.factor) * pos_freq);
      const float ramp = std::clamp((static_cast<float>(i) - lo) / span, 0.0f, 1.0f);
      const float extra = 1.0f - ramp;  // inv_freq_extrapolation_factor
      f[i] = interpolation * (1.0f - extra) + extrapolation * extra;
    }
    return t;
  }
  DFLASH_FAIL("unsupported rope_scaling type '", sc.kind, "' (supported: none, linear, llama3, yarn)");
}

}  // namespace dflash
