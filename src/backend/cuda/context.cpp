// backend/cuda/context.cpp — CudaContext: the CUDA Context and its single dispatch point to the op files
// (src/backend/cuda/<op>.cu, declared in ops.h).
//
// Everything mutable lives in the context (case C01: no process-global mutable state):
//  * its own non-blocking stream; every op is enqueued on it;
//  * a stream-ordered memory pool (cudaMemPoolCreate) for its device: tensors are cudaMallocFromPoolAsync'ed on
//    the stream and their owner's deleter cudaFreeAsync's them on the same stream. Bytes in use and the peak are
//    counted; memory_limit_bytes (> 0) makes an allocation past the limit throw an Error naming the size asked
//    for and the current use (case C03). The stream and the pool live in a DeviceState shared with every tensor
//    allocated from it, so a tensor that outlives its context is still freed correctly;
//  * a cuBLASLt handle and its 32 MiB workspace, the device error word of the index checks (ops.h), all created in
//    the constructor (nothing is created lazily). The kernels' shared-memory attribute is set there too, to the
//    device's opt-in maximum (an idempotent per-function setting, identical from every context).
// Methods returning host values synchronise the stream and turn device error bits into an Error.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "backend/cuda/check.h"
#include "backend/cuda/ops.h"

#ifndef DFLASH_CUDA_ARCHS_TEXT  // (set by CMakeLists.txt from DFLASH_CUDA_ARCHS; the kernel emulator: the portable tier)
#define DFLASH_CUDA_ARCHS_TEXT "compute_80"
#endif

namespace dflash {

namespace {

constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;

// The stream and the memory pool, shared by the context and the deleters of the tensors it allocated.
struct DeviceState {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaMemPool_t pool = nullptr;
  std::atomic<int64_t> in_use{0}, peak{0};
  int64_t limit = 0;
  ~DeviceState() {
    int old = -1;
    cudaGetDevice(&old);
    cudaSetDevice(device);
    if (stream) cudaStreamSynchronize(stream);
    if (pool) cudaMemPoolDestroy(pool);
    if (stream) cudaStreamDestroy(stream);
    if (old >= 0 && old != device) cudaSetDevice(old);
  }
};

struct LtDeleter {
  void operator()(cublasLtHandle_t h) const {
    if (h) cublasLtDestroy(h);
  }
};

class CudaContext final : public Context {
 public:
  CudaContext(const ContextOptions& o, int smem_cap) : Context(o.profile_ops), dev_(o.device_index) {
    int n = 0;
    const cudaError_t ce = cudaGetDeviceCount(&n);
    DFLASH_CHECK(ce == cudaSuccess && n > 0, "cuda:", dev_, ": no usable CUDA device (",
                 ce == cudaSuccess ? "device count 0" : cudaGetErrorString(ce), ")");
    DFLASH_CHECK(dev_ >= 0 && dev_ < n, "cuda:", dev_, ": device index out of range (", n, " devices)");
    DFLASH_CUDA_CHECK(cudaSetDevice(dev_));
    cudaDeviceProp prop{};
    DFLASH_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev_));
    name_ = prop.name;
    // the kernel tier (backend/kernel_tier.h); refuses a card before 8.0 and one the build has no code for
    const std::string who = cat("cuda:", dev_, " ", name_);
    const TierChoice tier = choose_kernel_tier(who, prop.major, prop.minor, parse_cuda_targets(DFLASH_CUDA_ARCHS_TEXT),
                                               std::getenv("DFLASH_KERNELS"));
    cuda::check_kernel_image(who);  // (the driver may still be unable to load it: PTX newer than the driver)
    tier_reason_ = tier.reason;
    env_.tier = tier.tier;
    env_.fp8_tensor_cores = prop.major >= 9;
    int optin = 0;
    DFLASH_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev_));
    st_ = std::make_shared<DeviceState>();
    st_->device = dev_;
    st_->limit = o.memory_limit_bytes;
    DFLASH_CUDA_CHECK(cudaStreamCreateWithFlags(&st_->stream, cudaStreamNonBlocking));
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev_;
    DFLASH_CUDA_CHECK(cudaMemPoolCreate(&st_->pool, &props));
    uint64_t keep = UINT64_MAX;  // keep freed memory in the pool (no release at each synchronisation)
    DFLASH_CUDA_CHECK(cudaMemPoolSetAttribute(st_->pool, cudaMemPoolAttrReleaseThreshold, &keep));
    cublasLtHandle_t h = nullptr;
    DFLASH_CUBLAS_CHECK(cublasLtCreate(&h));
    lt_.reset(h);
    workspace_ = empty(DType::U8, {static_cast<int64_t>(kLtWorkspaceBytes)});
    err_ = empty(DType::I32, {1});
    DFLASH_CUDA_CHECK(cudaMemsetAsync(err_.data, 0, sizeof(int), st_->stream));
    cuda::attention_init_attributes(optin, env_.tier);
    cuda::moe_init_attributes(optin, env_.tier);
    cuda::gated_delta_init_attributes(optin);
    env_.stream = st_->stream;
    env_.device = dev_;
    env_.lt = lt_.get();
    env_.workspace = workspace_.data;
    env_.workspace_bytes = kLtWorkspaceBytes;
    env_.err_flag = err_.ptr<int>();
    env_.smem_limit = smem_cap > 0 ? std::min(smem_cap, optin) : optin;
    env_.num_sms = prop.multiProcessorCount;
    if (const char* v = std::getenv("DFLASH_MOE_GEMM_VARIANT")) env_.moe_variant = std::atoi(v);  // (cuda/ops.h Env)
    if (const char* v = std::getenv("DFLASH_ATTN_WGMMA")) env_.attn_wgmma = std::atoi(v) != 0;  // (cuda/ops.h Env)
    env_.alloc = [this](DType t, Shape s) { return empty(t, std::move(s)); };
    DFLASH_CUDA_CHECK(cudaStreamSynchronize(st_->stream));
  }

  ~CudaContext() override {
    cudaSetDevice(dev_);
    cudaStreamSynchronize(st_->stream);
    for (const Pending& p : pending_) {
      cudaEventDestroy(p.start);
      cudaEventDestroy(p.stop);
    }
    for (cudaEvent_t e : open_) cudaEventDestroy(e);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    workspace_ = Tensor{};
    err_ = Tensor{};
    lt_.reset();
  }

  Device device() const override { return Device::CUDA; }
  DType compute_dtype() const override { return DType::BF16; }
  DType param_dtype() const override { return DType::F32; }
  std::string describe() const override {
    return cat("cuda:", dev_, " ", name_, " (", kernel_tier_name(env_.tier), " kernels)");
  }
  std::vector<std::pair<std::string, std::string>> kernel_table() const override;

  // ---- memory -------------------------------------------------------------------------------------------------
  Tensor empty(DType t, Shape s) override {
    use();
    Tensor x;
    x.dtype = t;
    x.device = Device::CUDA;
    x.shape = std::move(s);
    for (int64_t d : x.shape) DFLASH_CHECK(d >= 0, "cuda: negative dimension in shape ", shape_str(x.shape));
    const int64_t bytes = std::max<int64_t>(256, (static_cast<int64_t>(x.nbytes()) + 255) / 256 * 256);
    const int64_t now = st_->in_use.load();
    if (st_->limit > 0 && now + bytes > st_->limit)
      DFLASH_FAIL("cuda:", dev_, ": allocating ", bytes, " bytes for ", dtype_name(t), " ", shape_str(x.shape),
                  " would exceed the memory limit of ", st_->limit, " bytes (", now, " bytes in use, peak ",
                  st_->peak.load(), ")");
    void* p = nullptr;
    const cudaError_t e = cudaMallocFromPoolAsync(&p, static_cast<size_t>(bytes), st_->pool, st_->stream);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the (non-sticky) allocation error
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      DFLASH_FAIL("cuda:", dev_, ": out of device memory allocating ", bytes, " bytes for ", dtype_name(t), " ",
                  shape_str(x.shape), " (", now, " bytes in use by this context, ", free_b, " of ", total_b,
                  " bytes free on the device): ", cudaGetErrorString(e));
    }
    const int64_t after = st_->in_use.fetch_add(bytes) + bytes;
    int64_t pk = st_->peak.load();
    while (after > pk && !st_->peak.compare_exchange_weak(pk, after)) {
    }
    std::shared_ptr<DeviceState> keep = st_;
    x.owner = std::shared_ptr<void>(p, [keep, bytes](void* q) {
      int old = -1;
      cudaGetDevice(&old);
      if (old != keep->device) cudaSetDevice(keep->device);
      cudaFreeAsync(q, keep->stream);
      if (old >= 0 && old != keep->device) cudaSetDevice(old);
      keep->in_use.fetch_sub(bytes);
    });
    x.data = p;
    return x;
  }

  void zero(const Tensor& t) override {
    const OpScope scope = op("zero");
    DFLASH_CHECK(t.device == Device::CUDA, "cuda context: zero() of a ", device_name(t.device), " tensor");
    if (t.nbytes()) DFLASH_CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.nbytes(), st_->stream));
  }

  void copy(const Tensor& dst, const Tensor& src) override {
    const OpScope scope =
        op(dst.device == src.device ? "copy" : dst.device == Device::CUDA ? "copy h2d" : "copy d2h");
    DFLASH_CHECK(dst.numel() == src.numel(), "copy: ", shape_str(src.shape), " -> ", shape_str(dst.shape));
    if (src.numel() == 0) return;
    const bool dd = dst.device == Device::CUDA, sd = src.device == Device::CUDA;
    cudaStream_t s = st_->stream;
    if (!dd && !sd) {
      host_copy(dst, src);
    } else if (dd && sd) {
      if (src.dtype == dst.dtype) {  // also between devices (peer copy; staged by the driver if peers are off)
        cudaPointerAttributes ad{}, as{};
        DFLASH_CUDA_CHECK(cudaPointerGetAttributes(&ad, dst.data));
        DFLASH_CUDA_CHECK(cudaPointerGetAttributes(&as, src.data));
        if (ad.device != as.device)
          DFLASH_CUDA_CHECK(cudaMemcpyPeerAsync(dst.data, ad.device, src.data, as.device, src.nbytes(), s));
        else
          DFLASH_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDeviceToDevice, s));
      } else {
        cuda::convert(env_, dst, src);
      }
    } else if (dd) {  // host -> device
      if (src.dtype == dst.dtype) {
        // from pageable memory the call returns once the source has been staged: src may be freed after it
        DFLASH_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyHostToDevice, s));
        return;
      }
      DFLASH_CHECK(dst.dtype == DType::F32 || dst.dtype == DType::BF16, "copy to cuda: unsupported conversion ",
                   dtype_name(src.dtype), " -> ", dtype_name(dst.dtype));
      const Tensor h32 = src.dtype == DType::F32 ? src : cpu_to_f32(src);  // F64/F16/BF16 -> F32 on the host
      if (dst.dtype == DType::F32) {
        DFLASH_CUDA_CHECK(cudaMemcpyAsync(dst.data, h32.data, h32.nbytes(), cudaMemcpyHostToDevice, s));
      } else {
        Tensor tmp = empty(DType::F32, src.shape);
        DFLASH_CUDA_CHECK(cudaMemcpyAsync(tmp.data, h32.data, h32.nbytes(), cudaMemcpyHostToDevice, s));
        cuda::convert(env_, dst, tmp);
      }
    } else {  // device -> host
      if (src.dtype == dst.dtype) {
        DFLASH_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDeviceToHost, s));
        DFLASH_CUDA_CHECK(cudaStreamSynchronize(s));
        return;
      }
      if (dst.dtype == DType::F32 || dst.dtype == DType::BF16) {
        Tensor tmp = empty(dst.dtype, src.shape);
        cuda::convert(env_, tmp, src);
        DFLASH_CUDA_CHECK(cudaMemcpyAsync(dst.data, tmp.data, tmp.nbytes(), cudaMemcpyDeviceToHost, s));
        DFLASH_CUDA_CHECK(cudaStreamSynchronize(s));
      } else if (dst.dtype == DType::F64 && (src.dtype == DType::F32 || src.dtype == DType::BF16)) {
        Tensor h = cpu_empty(DType::F32, src.shape);
        copy(h, src);
        host_copy(dst, h);
      } else {
        DFLASH_FAIL("copy from cuda: unsupported conversion ", dtype_name(src.dtype), " -> ", dtype_name(dst.dtype));
      }
    }
  }

  void synchronize() override {
    use();
    DFLASH_CUDA_CHECK(cudaStreamSynchronize(st_->stream));
    check_device_errors();
  }
  // ---- events ------------------------------------------------------------------------------------------------
  struct CudaEvent final : Event {
    cudaEvent_t e = nullptr;
    int device = 0;
    ~CudaEvent() override {
      if (e) cudaEventDestroy(e);
    }
  };
  std::unique_ptr<Event> create_event() override {
    use();
    note_lazy_init("cuda event");
    auto ev = std::make_unique<CudaEvent>();
    ev->device = dev_;
    DFLASH_CUDA_CHECK(cudaEventCreateWithFlags(&ev->e, cudaEventDisableTiming));
    return ev;
  }
  void record(Event& e) override {
    use();
    auto& ce = dynamic_cast<CudaEvent&>(e);
    DFLASH_CHECK(ce.device == dev_, "cuda:", dev_, ": record() of an event made by cuda:", ce.device);
    DFLASH_CUDA_CHECK(cudaEventRecord(ce.e, st_->stream));
  }
  void wait(const Event& e) override {
    use();
    DFLASH_CUDA_CHECK(cudaStreamWaitEvent(st_->stream, dynamic_cast<const CudaEvent&>(e).e, 0));
  }
  void host_wait(const Event& e) override { DFLASH_CUDA_CHECK(cudaEventSynchronize(dynamic_cast<const CudaEvent&>(e).e)); }
  void enable_peer_access(const Context& other) override {
    const int peer = other.device_index();
    if (other.device() != Device::CUDA || peer == dev_) return;
    int can = 0;
    DFLASH_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, dev_, peer));
    if (!can) return;
    use();
    const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
    else DFLASH_CUDA_CHECK(e);
    // memory of a stream-ordered pool is visible to other devices only when the pool says so
    cudaMemAccessDesc desc{};
    desc.location.type = cudaMemLocationTypeDevice;
    desc.location.id = peer;
    desc.flags = cudaMemAccessFlagsProtReadWrite;
    DFLASH_CUDA_CHECK(cudaMemPoolSetAccess(st_->pool, &desc, 1));
  }
  int device_index() const override { return dev_; }
  void* native_stream() const override { return st_->stream; }

  MemoryStats memory() const override { return {st_->in_use.load(), st_->peak.load(), st_->limit}; }
  void reset_peak_memory() override { st_->peak.store(st_->in_use.load()); }

  // ---- the ops' computation (their arguments checked by Context's public ops) -------------------------------------
  // Index and small host tensors are uploaded first (on_device). The backend's own checks (tensors on this device,
  // BF16 activations, the kernels' limits) are in the op files.
 protected:
  void linear_impl(const Tensor& x, const LinearWeight& w, const Tensor* b, const Tensor& y, float beta,
                   const Tensor* c) override {
    if (w.fp8()) return cuda::linear_fp8(env_, x, w, b, y, beta, c);
    cuda::linear(env_, x, w.w, b, y, beta, c);
  }
  Tensor dequantize_fp8_impl(const LinearWeight& w) override { return cuda::dequantize_fp8(env_, w); }
  LinearWeight quantize_fp8_impl(const Tensor& w, int64_t block_n, int64_t block_k) override {
    return cuda::quantize_fp8(env_, w, block_n, block_k);
  }
  void linear_dx_impl(const Tensor& dy, const Tensor& w, const Tensor& dx, float beta) override {
    cuda::linear_dx(env_, dy, w, dx, beta);
  }
  void linear_dw_impl(const Tensor& dy, const Tensor& x, const Tensor& dw, const Tensor* db) override {
    cuda::linear_dw(env_, dy, x, dw, db);
  }
  void rmsnorm_impl(const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd,
                    const RopeArgs* rope) override {
    const RopeArgs r = rope ? on_device(*rope) : RopeArgs{};
    cuda::rmsnorm(env_, x, w, eps, y, rstd, rope ? &r : nullptr);
  }
  void rmsnorm_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                             const Tensor& dw, float beta, const RopeArgs* rope) override {
    const RopeArgs r = rope ? on_device(*rope) : RopeArgs{};
    cuda::rmsnorm_backward(env_, dy, x, w, rstd, dx, dw, beta, rope ? &r : nullptr);
  }
  void rope_impl(const Tensor& x, const Tensor& pos, const Tensor& inv_freq, bool inverse) override {
    cuda::rope(env_, x, on_device(pos), on_device(inv_freq), inverse);
  }
  void silu_mul_impl(const Tensor& g, const Tensor& u, const Tensor& out) override { cuda::silu_mul(env_, g, u, out); }
  void gelu_tanh_mul_impl(const Tensor& g, const Tensor& u, const Tensor& out) override {
    cuda::gelu_tanh_mul(env_, g, u, out);
  }
  void softcap_impl(const Tensor& x, float cap) override { cuda::softcap(env_, x, cap); }
  void silu_mul_backward_impl(const Tensor& dout, const Tensor& g, const Tensor& u, const Tensor& dg,
                              const Tensor& du) override {
    cuda::silu_mul_backward(env_, dout, g, u, dg, du);
  }
  void embedding_impl(const Tensor& table, const Tensor& ids, const Tensor& out) override {
    cuda::embedding(env_, table, on_device(ids), out);
  }
  void add_impl(const Tensor& y, const Tensor& x, float alpha) override { cuda::add(env_, y, x, alpha); }
  void copy_columns_impl(const Tensor& dst, const Tensor& src, int64_t col0) override {
    cuda::copy_columns(env_, dst, src, col0);
  }
  void gather_columns_impl(const Tensor& dst, const Tensor& src, int64_t col0) override {
    cuda::gather_columns(env_, dst, src, col0);
  }
  void gather_rows_impl(const Tensor& dst, const Tensor& src, const Tensor& rows) override {
    cuda::gather_rows(env_, dst, src, on_device(rows));
  }
  void argmax_impl(const Tensor& x, const Tensor& out) override { cuda::argmax(env_, x, out); }
  void scale_rows_impl(const Tensor& x, const Tensor& rows, const Tensor& scale) override {
    cuda::scale_rows(env_, x, on_device(rows), on_device(scale));
  }
  void attention_causal_impl(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, int64_t q_offset,
                             float scale, const CausalAttnOpts& opts) override {
    cuda::attention_causal(env_, q, k, v, out, q_offset, scale, on_device(opts));
  }
  void attention_causal_batch_impl(const Tensor& q, const Tensor& out, std::span<const CausalSeq> seqs, float scale,
                                   const CausalAttnOpts& opts) override {
    cuda::attention_causal_batch(env_, q, out, seqs, scale, on_device(opts));
  }
  void dflash_attention_impl(const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse) override {
    cuda::dflash_attention(env_, on_device(a), out, lse);
  }
  void dflash_attention_backward_impl(const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse, const Tensor& dout,
                                      const Tensor& dq, const Tensor& dkc, const Tensor& dvc, const Tensor& dkb,
                                      const Tensor& dvb) override {
    cuda::dflash_attention_backward(env_, on_device(a), out, lse, dout, dq, dkc, dvc, dkb, dvb);
  }
  void rmsnorm_gated_impl(const Tensor& x, const Tensor& w, const Tensor* z, float eps, bool zero_centred,
                          const Tensor& y, const RowsDims& d) override {
    cuda::rmsnorm_gated(env_, x, w, z, eps, zero_centred, y, d);
  }
  void sigmoid_gate_impl(const Tensor& y, const Tensor& gate, const RowsDims& d) override {
    cuda::sigmoid_gate(env_, y, gate, d);
  }
  void conv1d_causal_impl(const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& y,
                          const Conv1dDims& d) override {
    cuda::conv1d_causal(env_, x, w, state, y, d);
  }
  void gdn_gate_impl(const Tensor& ba, const Tensor& A_log, const Tensor& dt_bias, const Tensor& g, const Tensor& beta,
                     int64_t T) override {
    cuda::gdn_gate(env_, ba, A_log, dt_bias, g, beta, T);
  }
  void gated_delta_rule_impl(const GatedDeltaArgs& a, const Tensor& out, int64_t T) override {
    cuda::gated_delta_rule(env_, a, out, T);
  }
  void moe_route_impl(const Tensor& logits, int64_t k, bool normalize, const Tensor& idx, const Tensor& weights,
                      const MoeRouteOpts& opts) override {
    cuda::moe_route(env_, on_device(logits), k, normalize, idx, weights, opts);
  }
  void moe_group_impl(const Tensor& idx, const Tensor& offsets, const Tensor& rows, const Tensor& slot) override {
    cuda::moe_group(env_, on_device(idx), offsets, rows, slot);
  }
  void moe_linear_impl(const Tensor& x, const Tensor* rows, const MoeWeights& w, const Tensor& offsets, const Tensor& y,
                       MoeAct act, const MoeLinearDims& d) override {
    const Tensor r = rows ? on_device(*rows) : Tensor{};
    cuda::moe_linear(env_, x, rows ? &r : nullptr, on_device(w), on_device(offsets), y, act, d);
  }
  void moe_combine_impl(const Tensor& y, const Tensor& slot, const Tensor& weights, const Tensor& out,
                        float beta) override {
    cuda::moe_combine(env_, y, on_device(slot), on_device(weights), out, beta);
  }
  LossStats lm_head_loss_impl(const LossArgs& a) override {
    LossArgs d = a;
    d.rows = on_device(a.rows);
    d.labels = on_device(a.labels);
    d.weights = on_device(a.weights);
    LossStats st = cuda::lm_head_loss(env_, d);
    check_device_errors();
    return st;
  }
  void dynamic_conv_impl(const DynConvArgs& a, const Tensor& y, const Tensor* res, const DynConvDims& d) override {
    cuda::dynamic_conv(env_, a, y, res, d);
  }
  void dynamic_conv_backward_impl(const DynConvArgs& a, const Tensor& dy, const Tensor& du, const Tensor& d_delta,
                                  const Tensor& d_base, const DynConvDims& d) override {
    cuda::dynamic_conv_backward(env_, a, dy, du, d_delta, d_base, d);
  }
  SelectorStats candidate_selector_impl(const SelectorArgs& a, const Tensor& scores, const SelectorDims& d) override {
    SelectorArgs s = a;
    s.rows = on_device(a.rows);
    s.prev = on_device(a.prev);
    s.cand = on_device(a.cand);
    s.cand_logit = on_device(a.cand_logit);
    s.labels = on_device(a.labels);
    s.weights = on_device(a.weights);
    SelectorStats st = cuda::candidate_selector(env_, s, scores, d);
    if (a.labels.defined()) check_device_errors();
    return st;
  }
  void adamw_impl(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const AdamWArgs& a,
                  const Tensor& pc) override {
    cuda::adamw(env_, p, g, m, v, a, pc);
  }
  void fill_normal_impl(const Tensor& out, double std, uint64_t seed, RngPurpose purpose, uint64_t stream) override {
    cuda::fill_normal(env_, out, std, seed, purpose, stream);
  }
  double sum_squares_impl(const Tensor& x) override {
    const double s = cuda::sum_squares(env_, x);
    check_device_errors();
    return s;
  }

  // ---- per-op profile (ContextOptions::profile_ops, backend/op_profile.h) ---------------------------------------
  // An op's scope records an event before and after its kernels on the stream; the pairs are resolved into
  // milliseconds when the profile is read (or every kMaxPending ops, which synchronises). Every op makes the device
  // current first.
  void op_begin(bool timed) override {
    use();
    if (!timed) return;
    cudaEvent_t start = take_event();
    cudaEventRecord(start, st_->stream);
    open_.push_back(start);
  }
  void op_end(std::string key, double flop) override {
    cudaEvent_t stop = take_event();
    cudaEventRecord(stop, st_->stream);
    pending_.push_back({std::move(key), open_.back(), stop, flop});
    open_.pop_back();
    if (pending_.size() >= kMaxPending && cudaStreamSynchronize(st_->stream) == cudaSuccess) flush_op_profile();
  }

 private:
  void use() const { DFLASH_CUDA_CHECK(cudaSetDevice(dev_)); }

  struct Pending {  // an op's pair of events, not yet read
    std::string op;
    cudaEvent_t start, stop;
    double flop;
  };
  static constexpr size_t kMaxPending = 4096;
  cudaEvent_t take_event() {
    if (events_.empty()) {
      note_lazy_init("profiling event");
      cudaEvent_t e = nullptr;
      DFLASH_CUDA_CHECK(cudaEventCreate(&e));
      return e;
    }
    cudaEvent_t e = events_.back();
    events_.pop_back();
    return e;
  }
  // The stream has been synchronised: every pending pair has completed.
  void flush_op_profile() override {
    for (Pending& p : pending_) {
      float ms = 0;
      if (cudaEventElapsedTime(&ms, p.start, p.stop) == cudaSuccess) profile_.add(p.op, ms, p.flop);
      events_.push_back(p.start);
      events_.push_back(p.stop);
    }
    pending_.clear();
  }

  // Index / small host tensors passed to an op are uploaded first (ops read them on the device).
  Tensor on_device(const Tensor& t) {
    if (!t.defined() || t.device == Device::CUDA) return t;
    return to_device(t);
  }
  RopeArgs on_device(const RopeArgs& r) { return {on_device(r.pos), on_device(r.inv_freq), r.heads}; }
  CausalAttnOpts on_device(const CausalAttnOpts& o) { return {o.window, on_device(o.sinks)}; }
  MoeWeights on_device(const MoeWeights& w) {
    MoeWeights d;
    d.w = on_device(w.w);
    d.scales = on_device(w.scales);
    d.int4_group = w.int4_group;
    d.bias = on_device(w.bias);
    return d;
  }
  DFlashAttnArgs on_device(const DFlashAttnArgs& a) {
    DFlashAttnArgs d = a;
    d.anchors = on_device(a.anchors);
    d.valid = on_device(a.valid);
    return d;
  }

  void check_device_errors() {
    int h = 0;
    DFLASH_CUDA_CHECK(cudaMemcpyAsync(&h, err_.data, sizeof(int), cudaMemcpyDeviceToHost, st_->stream));
    DFLASH_CUDA_CHECK(cudaStreamSynchronize(st_->stream));
    if (h != 0) {
      DFLASH_CUDA_CHECK(cudaMemsetAsync(err_.data, 0, sizeof(int), st_->stream));
      DFLASH_CUDA_CHECK(cudaStreamSynchronize(st_->stream));
      DFLASH_FAIL("cuda:", dev_, ": invalid input found on the device: ", cuda::describe_error_bits(h));
    }
  }

  static void host_copy(const Tensor& dst, const Tensor& src) {
    if (dst.dtype == src.dtype) {
      if (dst.data != src.data) std::memmove(dst.data, src.data, src.nbytes());
      return;
    }
    const std::vector<float> v = to_f32_vector(src);  // F32 / BF16 / F16 / F64 sources
    if (dst.dtype == DType::F32) {
      std::memcpy(dst.data, v.data(), v.size() * sizeof(float));
    } else if (dst.dtype == DType::F64) {
      double* d = dst.ptr<double>();
      for (size_t i = 0; i < v.size(); ++i) d[i] = v[i];
    } else if (dst.dtype == DType::BF16) {
      uint16_t* d = dst.ptr<uint16_t>();
      for (size_t i = 0; i < v.size(); ++i) d[i] = f32_to_bf16(v[i]);
    } else {
      DFLASH_FAIL("copy: unsupported conversion ", dtype_name(src.dtype), " -> ", dtype_name(dst.dtype));
    }
  }

  int dev_;
  std::string name_;
  std::string tier_reason_;  // why this kernel tier (kernel_tier.h), for the kernel table
  std::shared_ptr<DeviceState> st_;
  std::unique_ptr<std::remove_pointer_t<cublasLtHandle_t>, LtDeleter> lt_;
  Tensor workspace_, err_;
  cuda::Env env_;
  std::vector<cudaEvent_t> open_;  // start events of the open op scopes, innermost last
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> events_;
};

std::vector<std::pair<std::string, std::string>> CudaContext::kernel_table() const {
  const cuda::Env& e = env_;
  return {
      {"kernel tier", cat(kernel_tier_name(e.tier), " (", tier_reason_, "; DFLASH_KERNELS=portable forces the portable "
                          "tier)")},
      {"shared memory per block", cat(e.smem_limit / 1024, " KiB")},
      {"dense linears (bf16)", "cuBLASLt"},
      {"FP8 linears", e.fp8_tensor_cores ? "cuBLASLt on the FP8 tensor cores (128 x 128 blocks or per channel), else "
                                           "dequantised to bf16 and cuBLASLt"
                                         : "dequantised to bf16 and cuBLASLt (FP8 scaling by block or channel needs "
                                           "compute capability 9.0)"},
      {"attention forward (target, drafter)", cuda::attention_forward_kernels(e)},
      {"DFlash attention backward", cuda::dflash_backward_kernels(e)},
      {"MoE grouped GEMMs", cuda::moe_linear_kernels(e)},
      {"gated delta rule (hybrid targets)", cuda::gated_delta_kernels(e)},
      {"norms, RoPE, losses, top-k, optimizer, DFlash2 convolution and selector", "CUDA cores"},
  };
}

}  // namespace

std::unique_ptr<Context> make_cuda_context(const ContextOptions& o) { return std::make_unique<CudaContext>(o, 0); }

namespace cuda {
std::unique_ptr<Context> make_cuda_context_for_test(const ContextOptions& o, int smem_cap_bytes) {
  return std::make_unique<CudaContext>(o, smem_cap_bytes);
}
}  // namespace cuda

}  // namespace dflash
