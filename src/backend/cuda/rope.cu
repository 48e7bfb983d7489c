// cuda/rope.cu — rotate-half RoPE (Su et al. 2021; HF Llama/Qwen layout), in place on x [T, heads, d]:
//   for i < d/2, t = pos * inv_freq[i] (formed in fp32, as transformers does):
//   (x_i, x_{i+d/2}) -> (x_i cos t - x_{i+d/2} sin t, x_{i+d/2} cos t + x_i sin t);  inverse: rotate by -t.
// One thread per (token, head, i); cos/sin are the accurate cosf/sinf (full range reduction: positions reach
// thousands of radians). Math in fp32, stored in x's dtype (BF16 or F32). BF16 heads with d % 16 == 0 move 8
// values per load (k_rope_bf16x8). Partial rotary: inv_freq [r/2] with r < d rotates the first r dims of each head
// (half = r/2 in the formula) and leaves the rest (cpu/rope.cpp).
#include "backend/cuda/common.cuh"

namespace dflash::cuda {

namespace {

template <class T>
__global__ void k_rope(T* __restrict__ x, const int* __restrict__ pos, const float* __restrict__ inv_freq, int64_t Tn,
                       int heads, int half, int d, float sgn) {
  const int64_t n = Tn * heads * half;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(idx % half);
    const int64_t th = idx / half;  // token * heads + head
    const int64_t t = th / heads;
    const float ang = static_cast<float>(pos[t]) * inv_freq[i];
    const float c = cosf(ang), s = sgn * sinf(ang);
    T* v = x + th * d;
    const float a = to_f(v[i]), b = to_f(v[i + half]);
    v[i] = from_f<T>(a * c - b * s);
    v[i + half] = from_f<T>(b * c + a * s);
  }
}

// The same for BF16 with half % 8 == 0 and x 16-byte aligned: thread = (token, head, 8 consecutive i), one 16-byte
// load and store for x_i.. and one for x_{i+half}..
__global__ void k_rope_bf16x8(bf16* __restrict__ x, const int* __restrict__ pos, const float* __restrict__ inv_freq,
                              int64_t Tn, int heads, int half, int d, float sgn) {
  const int hc = half / 8;  // chunks per half head
  const int64_t n = Tn * heads * hc;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int i0 = static_cast<int>(idx % hc) * 8;
    const int64_t th = idx / hc;  // token * heads + head
    const float p = static_cast<float>(pos[th / heads]);
    uint4* v = reinterpret_cast<uint4*>(x + th * d + i0);
    uint4* w = reinterpret_cast<uint4*>(x + th * d + half + i0);
    float a[8], b[8];
    bf16x8_to_f(*v, a);
    bf16x8_to_f(*w, b);
    DFLASH_UNROLL
    for (int k = 0; k < 8; ++k) {
      const float ang = p * inv_freq[i0 + k];
      const float c = cosf(ang), sn = sgn * sinf(ang);
      const float ak = a[k], bk = b[k];
      a[k] = ak * c - bk * sn;
      b[k] = bk * c + ak * sn;
    }
    *v = f_to_bf16x8(a);
    *w = f_to_bf16x8(b);
  }
}

}  // namespace

void rope(Env& e, const Tensor& x, const Tensor& pos, const Tensor& inv_freq, bool inverse) {
  check_on_dev("rope", x, "x");
  check_dev("rope", pos, "pos", DType::I32);
  check_dev("rope", inv_freq, "inv_freq", DType::F32);
  const int64_t Tn = x.dim(0), heads = x.dim(1), d = x.dim(2), half = inv_freq.numel();
  const int64_t n = Tn * heads * half;
  if (n == 0) return;
  const float sgn = inverse ? -1.f : 1.f;
  const unsigned g = grid_for(n, 256, e.num_sms);
  const int H = static_cast<int>(heads), hf = static_cast<int>(half), D = static_cast<int>(d);
  if (x.dtype == DType::BF16 && bf16x8_ok(half, x.data) && d % 8 == 0) {
    DFLASH_LAUNCH(grid_for(n / 8, 256, e.num_sms), 256, 0, e.stream, k_rope_bf16x8)(
        static_cast<bf16*>(x.data), pos.ptr<int>(), inv_freq.ptr<float>(), Tn, H, hf, D, sgn);
  } else if (x.dtype == DType::BF16) {
    DFLASH_LAUNCH(g, 256, 0, e.stream, k_rope<bf16>)(static_cast<bf16*>(x.data), pos.ptr<int>(), inv_freq.ptr<float>(),
                                                     Tn, H, hf, D, sgn);
  } else if (x.dtype == DType::F32) {
    DFLASH_LAUNCH(g, 256, 0, e.stream, k_rope<float>)(x.ptr<float>(), pos.ptr<int>(), inv_freq.ptr<float>(), Tn, H,
                                                      hf, D, sgn);
  } else {
    DFLASH_FAIL("rope (cuda): dtype ", dtype_name(x.dtype), " (BF16 or F32)");
  }
  check_launch("rope");
}

}  // namespace dflash::cuda
