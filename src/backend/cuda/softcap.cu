// cuda/softcap.cu — logit soft-capping in place, x = cap tanh(x / cap) (Gemma's final_logit_softcapping), fp32 math,
// stored in x's dtype (BF16 or F32). One element per thread and step of a grid-stride loop. CPU reference:
// cpu/softcap.cpp.
#include "backend/cuda/common.cuh"

namespace dflash::cuda {

namespace {

template <class T>
__global__ void k_softcap(T* x, int64_t n, float cap) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = from_f<T>(cap * tanhf(to_f(x[i]) / cap));
}

}  // namespace

void softcap(Env& e, const Tensor& x, float cap) {
  check_on_dev("softcap", x, "x");
  const int64_t n = x.numel();
  if (n == 0) return;
  const unsigned gr = grid_for(n, 256, e.num_sms);
  if (x.dtype == DType::BF16) {
    DFLASH_LAUNCH(gr, 256, 0, e.stream, k_softcap<bf16>)(static_cast<bf16*>(x.data), n, cap);
  } else if (x.dtype == DType::F32) {
    DFLASH_LAUNCH(gr, 256, 0, e.stream, k_softcap<float>)(x.ptr<float>(), n, cap);
  } else {
    DFLASH_FAIL("softcap (cuda): dtype ", dtype_name(x.dtype), " (BF16 or F32)");
  }
  check_launch("softcap");
}

}  // namespace dflash::cuda
