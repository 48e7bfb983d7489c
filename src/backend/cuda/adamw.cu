// cuda/adamw.cu — AdamW with decoupled weight decay (Loshchilov & Hutter 2019), torch.optim.AdamW semantics, on
// F32 master weights and moments; the BF16 (or F32) compute copy is written from the updated master:
//   g = grad * grad_scale; p *= (1 - lr*wd); m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// Every operation is an explicitly rounded fp32 op (__fmul_rn, ...: no FMA contraction), in the CPU op's order, so
// the result equals the CPU backend's F32 AdamW bit for bit.
#include <cmath>

#include "backend/cuda/common.cuh"

namespace dflash::cuda {

namespace {

struct AdamWParams {
  float* p;
  const float* g;
  float* m;
  float* v;
  bf16* pc_bf16;  // compute copy (BF16) or null
  float* pc_f32;  // compute copy (F32, distinct from p) or null
  int64_t n;
  float b1, b2, one_minus_b1, one_minus_b2, eps, gs, step_size, bc2_sqrt, decay;
};

// One element (the CPU op's sequence of rounded operations).
__device__ __forceinline__ void adamw_one(const AdamWParams& a, float g, float& p, float& m, float& v) {
  const float gi = __fmul_rn(g, a.gs);
  p = __fmul_rn(p, a.decay);
  m = __fadd_rn(__fmul_rn(a.b1, m), __fmul_rn(a.one_minus_b1, gi));
  v = __fadd_rn(__fmul_rn(a.b2, v), __fmul_rn(__fmul_rn(a.one_minus_b2, gi), gi));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), a.bc2_sqrt), a.eps);
  p = __fsub_rn(p, __fdiv_rn(__fmul_rn(a.step_size, m), denom));
}

__global__ void k_adamw(AdamWParams a) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < a.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float p = a.p[i], m = a.m[i], v = a.v[i];
    adamw_one(a, a.g[i], p, m, v);
    a.m[i] = m;
    a.v[i] = v;
    a.p[i] = p;
    if (a.pc_bf16) a.pc_bf16[i] = __float2bfloat16(p);
    if (a.pc_f32) a.pc_f32[i] = p;
  }
}

// The same, four elements per thread with 16-byte loads and stores (n % 4 == 0, every pointer 16-byte aligned,
// the BF16 copy 8-byte aligned): the op is bound by its 30 bytes per parameter of traffic.
__global__ void k_adamw4(AdamWParams a) {
  const int64_t n4 = a.n / 4;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float4 p = reinterpret_cast<const float4*>(a.p)[i], m = reinterpret_cast<const float4*>(a.m)[i],
           v = reinterpret_cast<const float4*>(a.v)[i];
    const float4 g = reinterpret_cast<const float4*>(a.g)[i];
    adamw_one(a, g.x, p.x, m.x, v.x);
    adamw_one(a, g.y, p.y, m.y, v.y);
    adamw_one(a, g.z, p.z, m.z, v.z);
    adamw_one(a, g.w, p.w, m.w, v.w);
    reinterpret_cast<float4*>(a.m)[i] = m;
    reinterpret_cast<float4*>(a.v)[i] = v;
    reinterpret_cast<float4*>(a.p)[i] = p;
    if (a.pc_bf16) {
      __nv_bfloat162 lo = __floats2bfloat162_rn(p.x, p.y), hi = __floats2bfloat162_rn(p.z, p.w);
      uint2 pk;
      pk.x = *reinterpret_cast<uint32_t*>(&lo);
      pk.y = *reinterpret_cast<uint32_t*>(&hi);
      reinterpret_cast<uint2*>(a.pc_bf16)[i] = pk;
    }
    if (a.pc_f32) reinterpret_cast<float4*>(a.pc_f32)[i] = p;
  }
}

}  // namespace

void adamw(Env& e, const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWArgs& a,
           const Tensor& param_compute) {
  const char* op = "adamw";
  check_dev(op, param, "param", DType::F32);
  check_dev(op, grad, "grad", DType::F32);
  check_dev(op, m, "m", DType::F32);
  check_dev(op, v, "v", DType::F32);
  const int64_t n = param.numel();
  AdamWParams p{};
  p.p = param.ptr<float>();
  p.g = grad.ptr<float>();
  p.m = m.ptr<float>();
  p.v = v.ptr<float>();
  if (param_compute.defined() && param_compute.data != param.data) {
    check_on_dev(op, param_compute, "param_compute");
    if (param_compute.dtype == DType::BF16)
      p.pc_bf16 = static_cast<bf16*>(param_compute.data);
    else if (param_compute.dtype == DType::F32)
      p.pc_f32 = param_compute.ptr<float>();
    else
      DFLASH_FAIL(op, ": param_compute dtype ", dtype_name(param_compute.dtype), " (BF16 or F32)");
  }
  p.n = n;
  // host-side constants exactly as the CPU op forms them
  const double bc1 = 1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(a.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(a.step));
  p.step_size = static_cast<float>(a.lr / bc1);
  p.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  p.decay = 1.0f - a.lr * a.weight_decay;
  p.b1 = a.beta1;
  p.b2 = a.beta2;
  p.one_minus_b1 = 1.0f - a.beta1;
  p.one_minus_b2 = 1.0f - a.beta2;
  p.eps = a.eps;
  p.gs = a.grad_scale;
  if (n == 0) return;
  auto al = [](const void* q, uintptr_t b) { return q == nullptr || reinterpret_cast<uintptr_t>(q) % b == 0; };
  if (n % 4 == 0 && al(p.p, 16) && al(p.g, 16) && al(p.m, 16) && al(p.v, 16) && al(p.pc_f32, 16) && al(p.pc_bf16, 8))
    DFLASH_LAUNCH(grid_for(n / 4, 256, e.num_sms), 256, 0, e.stream, k_adamw4)(p);
  else
    DFLASH_LAUNCH(grid_for(n, 256, e.num_sms), 256, 0, e.stream, k_adamw)(p);
  check_launch("adamw");
}

}  // namespace dflash::cuda
