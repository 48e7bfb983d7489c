// backend/op_profile.h — per-op time and FLOPs of a Context, when it was made with ContextOptions::profile_ops.
// defines: OpProfileRow, OpProfile, gemm_key, dflash_attn_fwd_flop, format_op_profile
//
// The profile is the evidence behind a speed figure: where a training step's time goes, op by op. Every op of a
// profiling Context is timed by its public op (backend/context_ops.cpp, Context::OpScope) on the backend's clock
// (backend/<dev>/context.cpp): on CUDA by a pair of events around its kernels on the context's stream (device time,
// no host gaps), on the CPU by the wall time of the (synchronous) op. GEMM ops are keyed by their shape
// ("linear_dw 8192x4096x12288" = M x N x K of y = x w^T) so each weight of a layer shows its own throughput.
// Profiling adds two events per op and nothing else; a Context made without profile_ops records nothing.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dflash {

struct DFlashAttnArgs;

struct OpProfileRow {
  std::string op;      // op name, GEMMs with their M x N x K
  int64_t calls = 0;
  double ms = 0;       // total milliseconds over the calls
  double flop = 0;     // total floating-point operations counted (0 where the op has no FLOP model: memory ops)
};

// Accumulates rows by op key. Owned by one Context and used by its owning thread only (not thread-safe).
class OpProfile {
 public:
  void add(const std::string& op, double ms, double flop);
  std::vector<OpProfileRow> rows() const;  // sorted by time, longest first
  void clear() { rows_.clear(); }

 private:
  std::map<std::string, OpProfileRow> rows_;
};

// "op MxNxK" for a GEMM of M rows, N outputs, K inputs (2*M*N*K flop).
std::string gemm_key(const char* op, int64_t M, int64_t N, int64_t K);
// "op RxD" for a row-wise op over R rows of D elements (RMSNorm: one call per norm and shape).
std::string rows_key(const char* op, int64_t R, int64_t D);

// Forward FLOPs of DFlash attention counted on the unmasked work: 4 * d * nh * sum over valid blocks of
// B * (a_j + B) (QK^T and PV; FlashAttention's convention; the backward is counted as 2.5x this). Needs the anchors and
// valid flags on the host; returns 0 when they are on a device.
double dflash_attn_fwd_flop(const DFlashAttnArgs& a, int64_t nh, int64_t d);

// A text table: op, calls, ms, share of the total, TFLOP/s (where FLOPs are counted).
std::string format_op_profile(const std::vector<OpProfileRow>& rows);

}  // namespace dflash
