// backend/cuda/ops.h — the CUDA implementations of the Context ops (one .cu file per op) and the Env they run in.
// defines: dflash::cuda::Env, the op functions, error bits of device-side checks, attention configuration
//          queries, make_cuda_context_for_test
//
// Every op takes an Env (what it needs from its CudaContext: the stream, the cuBLASLt handle, a workspace, the
// device error word, the shared-memory budget and a stream-ordered allocator) and Tensors on the device. The
// CudaContext's <op>_impl in context.cpp are the one dispatch point: they move host index tensors to the device and
// call these. Shapes and semantics are those documented on Context in backend/context.h, and Context's public ops
// have checked the shapes (backend/context_ops.cpp); these check what is CUDA's own: tensors on the device, the
// dtypes (activations BF16, parameter gradients / saved statistics F32) and the kernels' limits.
//
// Index checks that would need a device->host copy (token ids, row indices, labels, anchors) are done on the
// device: a kernel that meets a bad index writes zeros in its place and sets a bit in *Env::err_flag; the
// context turns the bits into an Error at its next synchronising call (synchronize, to_host, lm_head_loss,
// sum_squares).
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <string>

#ifdef DFLASH_CUDA_EMU
#include "cuda_emu.h"  // tests/cuda/emu: runs the kernels on the CPU (see tests/cuda/emu/README.md)
#else
#include <cublasLt.h>          // defines: cublasLtHandle_t
#include <cuda_runtime_api.h>  // defines: cudaStream_t
#endif

#include "backend/context.h"
#include "backend/kernel_tier.h"

namespace dflash::cuda {

enum ErrBits : int {
  kErrEmbeddingId = 1,   // embedding: token id outside [0, V)
  kErrGatherRow = 2,     // gather_rows / lm_head_loss: row index outside the source
  kErrLossLabel = 4,     // lm_head_loss: label outside [0, V)
  kErrAnchor = 8,        // dflash_attention: a valid block's anchor outside [0, S]
  kErrExpertId = 16,     // moe_group: an expert id outside [0, E)
  kErrScaleRow = 32,     // scale_rows: a row outside [0, R) or not after the previous one
  kErrSelectorId = 64,   // candidate_selector: a row outside [0, R) (with gradients: or not after the previous
                         // one), or a predecessor / candidate id outside [0, V)
};
// "embedding: token id outside [0, V); ..." for the bits set.
std::string describe_error_bits(int bits);

struct Env {
  cudaStream_t stream = nullptr;
  int device = 0;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;    // device scratch of the stream's ops, one op at a time (stream order): cuBLASLt's
  size_t workspace_bytes = 0;   // workspace, the dK/dV kernel's split-tile sums (attention_wgmma.cu)
  int* err_flag = nullptr;         // device int, see ErrBits
  int smem_limit = 48 * 1024;      // dynamic shared memory one block may use (device opt-in maximum, or lower)
  int num_sms = 1;
  std::function<Tensor(DType, Shape)> alloc;  // stream-ordered device allocation (freed on the stream)
  // The Hopper grouped GEMM's variant (moe.cu kWgVariants: 0 = tiles of 128 columns, 4 stages; 1 = 256 columns, 4
  // stages; 2 = 128 columns, 6 stages), from DFLASH_MOE_GEMM_VARIANT when the context is made (a benchmarking knob;
  // -1 = the measured default).
  int moe_variant = -1;
  // The kernel tier (backend/kernel_tier.h): Hopper runs the warpgroup-MMA / TMA kernels where they apply, Portable
  // never does (the emulator's, every non-Hopper card's, and any card's with DFLASH_KERNELS=portable).
  KernelTier tier = KernelTier::Portable;
  // Whether the device has FP8 tensor cores that cuBLASLt's block-scaled and outer-vector FP8 GEMMs use (compute
  // capability 9.0 and later); elsewhere FP8 weights are dequantised to bf16 for each product (linear_fp8.cu).
  bool fp8_tensor_cores = false;
  // Whether the attention forward may run on warpgroup MMA (attention_wgmma.cu) on the Hopper tier;
  // DFLASH_ATTN_WGMMA=0 when the context is made turns it off, so that the mma.sync forward (attention_tc.cu) can be
  // timed on the same shapes (a benchmarking knob).
  bool attn_wgmma = true;
};

// Throws, naming the device, if the driver cannot load this build's kernels on the current device (no code for its
// compute capability, or PTX newer than the driver compiles); elementwise.cu.
void check_kernel_image(const std::string& device);

// Checks that t is a CUDA tensor of dtype dt (Error naming op and tensor otherwise).
void check_dev(const char* op, const Tensor& t, const char* name, DType dt);
void check_on_dev(const char* op, const Tensor& t, const char* name);

// ---- conversions and copies (elementwise.cu) ----------------------------------------------------------------
void convert(Env& e, const Tensor& dst, const Tensor& src);  // device F32 <-> BF16 (or same dtype: copy)

// ---- dense algebra (linear.cu) ------------------------------------------------------------------------------
// RAII holders for the cuBLASLt descriptors of one call (linear.cu, linear_fp8.cu).
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtDescs() = default;
  LtDescs(const LtDescs&) = delete;
  LtDescs& operator=(const LtDescs&) = delete;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};
// Row-major C[M,N] = op(A)[M,K] op(B)[K,N] + beta C_in through cuBLASLt, A and B BF16, fp32 accumulation, C BF16 or
// F32. op(A) = A^T when ta (A stored [K,M]), likewise B. C_in (C's dtype and ldc) is C itself when null.
void gemm(Env& e, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B,
          int64_t ldb, float beta, void* C, DType c_type, int64_t ldc, const void* C_in = nullptr);
void linear(Env& e, const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& y, float beta, const Tensor* c);
// y[M,N] += bias[N] over the rows (y BF16 or F32, bias of y's dtype).
void add_bias(Env& e, const Tensor& y, const Tensor& bias);
// ---- FP8 linears (linear_fp8.cu): Context::linear with an FP8 LinearWeight, and Context::quantize_fp8 (w BF16) ----
void linear_fp8(Env& e, const Tensor& x, const LinearWeight& w, const Tensor* bias, const Tensor& y, float beta,
                const Tensor* c);
LinearWeight quantize_fp8(Env& e, const Tensor& w, int64_t block_n, int64_t block_k);
Tensor dequantize_fp8(Env& e, const LinearWeight& w);  // -> BF16 [N, K]
// Whether linear_fp8 runs w on the FP8 tensor cores (block 128 x 128 or per channel, K % 16 == 0, N % 8 == 0) on a
// device that has them (Env::fp8_tensor_cores) rather than dequantising it (a benchmark's and a test's question;
// cuBLASLt may still decline a shape).
bool linear_fp8_on_tensor_cores(const LinearWeight& w);
void linear_dx(Env& e, const Tensor& dy, const Tensor& w, const Tensor& dx, float beta);
void linear_dw(Env& e, const Tensor& dy, const Tensor& x, const Tensor& dw, const Tensor* db);

// ---- normalisation, activations, elementwise ----------------------------------------------------------------
// rope: pos and inv_freq on the device. BF16 rows of D = 64, 128, 256 (16-byte aligned) fuse the RoPE into the
// one-pass row kernels; other rows run the composition (rmsnorm then rope on y; rope inverse on a copy of dy, then
// the backward).
void rmsnorm(Env& e, const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd,
             const RopeArgs* rope = nullptr);
void rmsnorm_backward(Env& e, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dw, float beta, const RopeArgs* rope = nullptr);
void rope(Env& e, const Tensor& x, const Tensor& pos, const Tensor& inv_freq, bool inverse);
void silu_mul(Env& e, const Tensor& gate, const Tensor& up, const Tensor& out);
void gelu_tanh_mul(Env& e, const Tensor& gate, const Tensor& up, const Tensor& out);  // gelu_tanh.cu
void softcap(Env& e, const Tensor& x, float cap);                                      // softcap.cu
void silu_mul_backward(Env& e, const Tensor& dout, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                       const Tensor& dup);
void embedding(Env& e, const Tensor& table, const Tensor& ids, const Tensor& out);
void add(Env& e, const Tensor& y, const Tensor& x, float alpha);
void copy_columns(Env& e, const Tensor& dst, const Tensor& src, int64_t col0);
void gather_columns(Env& e, const Tensor& dst, const Tensor& src, int64_t col0);
void gather_rows(Env& e, const Tensor& dst, const Tensor& src, const Tensor& rows);
// dst[rows[r], :] = src[r, :]  (the inverse of gather_rows; used by lm_head_loss)
void scatter_rows(Env& e, const Tensor& dst, const Tensor& src, const Tensor& rows);
void argmax(Env& e, const Tensor& x, const Tensor& out);
// x[rows[r], :] *= scale[r] (x F32 or BF16, scale F32, rows strictly ascending; a bad row sets kErrScaleRow)
void scale_rows(Env& e, const Tensor& x, const Tensor& rows, const Tensor& scale);
double sum_squares(Env& e, const Tensor& x);  // synchronises
void fill_normal(Env& e, const Tensor& out, double stdev, uint64_t seed, RngPurpose purpose, uint64_t stream);

// ---- attention ----------------------------------------------------------------------------------------------
// opts (context.h): sinks F32 on the device; the window and sinks run on the mma.sync and SIMT kernels (head dims
// other than 128, or any window: the wgmma forward has neither).
void attention_causal(Env& e, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                      int64_t q_offset, float scale, const CausalAttnOpts& opts = {});
void attention_causal_batch(Env& e, const Tensor& q, const Tensor& out, std::span<const CausalSeq> seqs,
                            float scale, const CausalAttnOpts& opts = {});
void dflash_attention(Env& e, const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse);
void dflash_attention_backward(Env& e, const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse,
                               const Tensor& dout, const Tensor& dq, const Tensor& dk_ctx, const Tensor& dv_ctx,
                               const Tensor& dk_blk, const Tensor& dv_blk);
// The largest head_dim the attention kernels support, and whether head_dim d can run within smem_limit bytes of
// shared memory per block (false: `why` says what is missing).
constexpr int kMaxHeadDim = 256;
bool attention_supported(int d, int smem_limit, std::string* why);
// Human-readable tile configuration chosen for head_dim d under smem_limit, e.g. "fwd D128 M32 nk64 (50 KB) ...".
std::string attention_config(int d, int smem_limit);
// Sets the kernels' dynamic-shared-memory attribute to smem_optin (called once per context at construction; the
// Hopper kernels' only on the Hopper tier).
void attention_init_attributes(int smem_optin, KernelTier tier);

// ---- Mixture of Experts (moe.cu) -----------------------------------------------------------------------------
// Shapes as backend/context.h; logits / x / w / y / out BF16, weights F32. moe_route and moe_group take E <= 1024
// experts and k <= 32.
void moe_route(Env& e, const Tensor& logits, int64_t k, bool normalize, const Tensor& idx, const Tensor& weights,
               const MoeRouteOpts& opts = {});
void moe_group(Env& e, const Tensor& idx, const Tensor& offsets, const Tensor& rows, const Tensor& slot);
// w: bf16 or MXFP4 (MoeWeights; on the device), optional bias; act None, SwiGLU or ClampedSwiGLU.
void moe_linear(Env& e, const Tensor& x, const Tensor* rows, const MoeWeights& w, const Tensor& offsets,
                const Tensor& y, MoeAct act, const MoeLinearDims& d);
void moe_combine(Env& e, const Tensor& y, const Tensor& slot, const Tensor& weights, const Tensor& out, float beta);
// The kernel moe_linear runs for N output columns and inner size K (aligned: x and the weights 16-byte aligned):
// "wgmma" (the Hopper grouped GEMM, Hopper tier; K % 8 == 0, N even), "mma" (the portable tensor-core grouped GEMM,
// mma.sync; K % 8 == 0) or "simt" (any shape).
std::string moe_linear_path(const Env& e, int64_t N, int64_t K, bool aligned = true);
// Sets the Hopper grouped GEMM's dynamic-shared-memory attribute (once per context, at construction, on the Hopper
// tier; the portable kernels need no opt-in).
void moe_init_attributes(int smem_optin, KernelTier tier);

// ---- hybrid linear-attention targets (hybrid_rows.cu, conv1d_causal.cu, gated_delta_rule.cu, gated_delta_chunk.cu)
// Arguments checked by backend/context.h's check_* (whose dims they take); act BF16 (F32 accepted too), g / beta /
// state F32.
void rmsnorm_gated(Env& e, const Tensor& x, const Tensor& w, const Tensor* z, float eps, bool zero_centred,
                   const Tensor& y, const RowsDims& d);
void sigmoid_gate(Env& e, const Tensor& y, const Tensor& gate, const RowsDims& d);
void conv1d_causal(Env& e, const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& y, const Conv1dDims& d);
void gdn_gate(Env& e, const Tensor& ba, const Tensor& A_log, const Tensor& dt_bias, const Tensor& g, const Tensor& beta,
              int64_t T);
// The recurrent kernel, or the chunked tensor-core ones where they apply (gated_delta_chunk_applies).
void gated_delta_rule(Env& e, const GatedDeltaArgs& a, const Tensor& out, int64_t T);
// The chunked kernels (WY form, mma.sync; a state-free kernel over all chunks, then the state's walk): BF16 qkv,
// dk = dv = 128, T >= 64, 206 KiB of shared memory per block (128 KiB with one stage of tiles, where the device has
// less); a stream-ordered workspace of ~1.8 MB per 64 tokens at
// 32 value / 16 key heads.
bool gated_delta_chunk_applies(const Env& e, const GatedDeltaArgs& a, int64_t T);
void gated_delta_chunk(Env& e, const GatedDeltaArgs& a, const Tensor& out, int64_t T);
// Sets the chunked kernels' dynamic-shared-memory attribute (once per context, at construction).
void gated_delta_init_attributes(int smem_optin);

// ---- loss and optimizer -------------------------------------------------------------------------------------
// Synchronises (the stats are host vectors). With a.topk > 0 (at most 32; topk_ids / topk_logits on the device) the
// per-row top-k of the bf16 logits.
LossStats lm_head_loss(Env& e, const LossArgs& a);
void adamw(Env& e, const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWArgs& a,
           const Tensor& param_compute);

// ---- DFlash2 (dynamic_conv.cu, candidate_selector.cu) ----------------------------------------------------------
// Arguments checked by check_dynamic_conv / check_candidate_selector (whose dims they take). dynamic_conv takes at
// most 8 taps. candidate_selector: index tensors, cand_logit, labels and weights on the device; a bad index zeroes
// its row's scores and statistics, adds no gradient and sets kErrSelectorId. Synchronises when a.labels is defined
// (the statistics are host vectors). The codebook gradients are scattered with fp32 atomics (their order, hence the
// last bits, may vary from run to run).
void dynamic_conv(Env& e, const DynConvArgs& a, const Tensor& y, const Tensor* res, const DynConvDims& d);
void dynamic_conv_backward(Env& e, const DynConvArgs& a, const Tensor& dy, const Tensor& du, const Tensor& d_delta,
                           const Tensor& d_base, const DynConvDims& d);
SelectorStats candidate_selector(Env& e, const SelectorArgs& a, const Tensor& scores, const SelectorDims& d);

// ---- what runs where (CudaContext::kernel_table, `dflash info --device cuda`; docs/gpus.md) -------------------------
// One line per op group for e's tier and shared-memory limit, naming the kernel each case of the op runs, in the
// order the op tries them.
std::string attention_forward_kernels(const Env& e);  // attention_tc.cu
std::string dflash_backward_kernels(const Env& e);    // attention_tc.cu
std::string moe_linear_kernels(const Env& e);         // moe.cu
std::string gated_delta_kernels(const Env& e);        // gated_delta_chunk.cu

// A CUDA context whose shared-memory budget is capped at smem_cap_bytes (> 0) instead of the device's opt-in
// limit: case C07 tests that a valid smaller configuration is chosen.
std::unique_ptr<Context> make_cuda_context_for_test(const ContextOptions& o, int smem_cap_bytes);

}  // namespace dflash::cuda
