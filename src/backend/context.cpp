// backend/context.cpp — device selection, the helpers shared by every Context, and RoPE frequencies.
#include "backend/context.h"

#include <atomic>
#include <cmath>
#include <mutex>

#include "io/hf_config.h"

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
  DFLASH_FAIL("unsupported rope_scaling type '", sc.kind, "' (supported: none, linear, llama3)");
}

}  // namespace dflash
