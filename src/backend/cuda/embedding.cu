// cuda/embedding.cu — token embedding gather: out[t, :] = table[ids[t], :] for ids [T] I32, table [V, H] (any
// dtype; rows are copied as raw elements). An id outside [0, V) gives a zero row and sets kErrEmbeddingId (the
// context raises it at its next synchronising call).
#include "backend/cuda/common.cuh"

namespace dflash::cuda {

namespace {

template <class E>
__global__ void k_embedding(E* __restrict__ out, const E* __restrict__ table, const int* __restrict__ ids, int64_t T,
                            int64_t H, int64_t V, int* err) {
  const int64_t n = T * H;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / H, c = i - t * H;
    const int id = ids[t];
    if (id < 0 || id >= V) {
      if (c == 0) atomicOr(err, kErrEmbeddingId);
      out[i] = E(0);
    } else {
      out[i] = table[static_cast<int64_t>(id) * H + c];
    }
  }
}

template <class E>
void launch(Env& e, void* out, const void* table, const int* ids, int64_t T, int64_t H, int64_t V) {
  const unsigned g = grid_for(T * H, 256, e.num_sms);
  DFLASH_LAUNCH(g, 256, 0, e.stream, k_embedding<E>)(static_cast<E*>(out), static_cast<const E*>(table), ids, T, H, V,
                                                     e.err_flag);
  check_launch("embedding");
}

}  // namespace

void embedding(Env& e, const Tensor& table, const Tensor& ids, const Tensor& out) {
  check_on_dev("embedding", table, "table");
  check_dev("embedding", ids, "ids", DType::I32);
  check_dev("embedding", out, "out", table.dtype);
  const int64_t V = table.dim(0), H = table.dim(1), T = ids.numel();
  if (T == 0 || H == 0) return;
  switch (dtype_size(table.dtype)) {
    case 2: launch<uint16_t>(e, out.data, table.data, ids.ptr<int>(), T, H, V); break;
    case 4: launch<uint32_t>(e, out.data, table.data, ids.ptr<int>(), T, H, V); break;
    default: DFLASH_FAIL("embedding (cuda): table dtype ", dtype_name(table.dtype), " (BF16, F16 or F32)");
  }
}

}  // namespace dflash::cuda
