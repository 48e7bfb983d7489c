// backend/cuda/nccl.cpp — the drafters' gradient all-reduce (or, with the sharded optimizer, the gradient
// reduce-scatter and the master all-gather) on CUDA through NCCL (backend/collective.h).
// One communicator per local drafter device, all created in the warm-up: ncclCommInitAll within one process, or
// ncclCommInitRank for every local rank inside one ncclGroupStart/End when several processes take part (the unique
// id comes from process 0 through Mpi::broadcast). NVLink multicast (NVLS) is never asked for.
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "backend/collective.h"
#include "backend/cuda/check.h"
#include "backend/mpi.h"

#define DFLASH_NCCL_CHECK(expr)                                                                                  \
  do {                                                                                                           \
    const ncclResult_t dflash_r_ = (expr);                                                                       \
    if (dflash_r_ != ncclSuccess)                                                                                \
      ::dflash::fail(::dflash::cat("NCCL error '", ncclGetErrorString(dflash_r_), "' from ", #expr, " at ",   \
                                   __FILE__, ":", __LINE__));                                                    \
  } while (0)

namespace dflash {

namespace {

class NcclGradReducer final : public GradReducer {
 public:
  NcclGradReducer(const std::vector<Context*>& local, int rank0, int world, HostGroup& local_group,
                  JobControl& control, double timeout_s)
      : local_group_(local_group), control_(control), timeout_s_(timeout_s), rank0_(rank0), world_(world) {
    const int n = static_cast<int>(local.size());
    DFLASH_CHECK(n > 0, "nccl: no local drafters");
    for (Context* c : local)
      DFLASH_CHECK(c->device() == Device::CUDA, "nccl: drafter context ", c->describe(), " is not a CUDA context");
    setenv("NCCL_NVLS_ENABLE", "0", 0);  // never NVLink multicast (a shared host's GPUs can be put out of service)
    comms_.assign(static_cast<size_t>(n), nullptr);
    if (world == n) {
      std::vector<int> devs;
      for (Context* c : local) devs.push_back(c->device_index());
      DFLASH_NCCL_CHECK(ncclCommInitAll(comms_.data(), n, devs.data()));
    } else {
      ncclUniqueId id{};
      if (Mpi::rank() == 0) DFLASH_NCCL_CHECK(ncclGetUniqueId(&id));
      Mpi::broadcast(&id, sizeof id, 0);
      DFLASH_NCCL_CHECK(ncclGroupStart());
      for (int i = 0; i < n; ++i) {
        DFLASH_CUDA_CHECK(cudaSetDevice(local[static_cast<size_t>(i)]->device_index()));
        DFLASH_NCCL_CHECK(ncclCommInitRank(&comms_[static_cast<size_t>(i)], world, id, rank0 + i));
      }
      DFLASH_NCCL_CHECK(ncclGroupEnd());
    }
    // one all-reduce, reduce-scatter and all-gather through every communicator now, so nothing in NCCL is set up
    // on first use (the sharded optimizer's collectives are warmed up whether it is used or not: cheap)
    constexpr size_t kShard = 256;
    std::vector<Tensor> bufs;
    for (Context* c : local) bufs.push_back(c->zeros(DType::F32, {static_cast<int64_t>(kShard) * world}));
    for (int kind = 0; kind < 3; ++kind) {
      DFLASH_NCCL_CHECK(ncclGroupStart());
      for (int i = 0; i < n; ++i) {
        Context* c = local[static_cast<size_t>(i)];
        DFLASH_CUDA_CHECK(cudaSetDevice(c->device_index()));
        const cudaStream_t st = static_cast<cudaStream_t>(c->native_stream());
        float* b = bufs[static_cast<size_t>(i)].ptr<float>();
        float* own = b + static_cast<size_t>(rank0 + i) * kShard;
        if (kind == 0) DFLASH_NCCL_CHECK(ncclAllReduce(b, b, kShard * world, ncclFloat32, ncclSum, comms_[i], st));
        if (kind == 1) DFLASH_NCCL_CHECK(ncclReduceScatter(b, own, kShard, ncclFloat32, ncclSum, comms_[i], st));
        if (kind == 2) DFLASH_NCCL_CHECK(ncclAllGather(own, b, kShard, ncclFloat32, comms_[i], st));
      }
      DFLASH_NCCL_CHECK(ncclGroupEnd());
    }
    for (Context* c : local) c->synchronize();
    for (Context* c : local) devices_.push_back(c->device_index());
    calls_.assign(static_cast<size_t>(n), 0);
  }
  ~NcclGradReducer() override {
    for (ncclComm_t c : comms_)
      if (c) aborted_ ? ncclCommAbort(c) : ncclCommDestroy(c);
  }

  void all_reduce(int r, Context& ctx, const Tensor& grad) override {
    DFLASH_CHECK(grad.device == Device::CUDA && grad.dtype == DType::F32, "nccl all-reduce: F32 CUDA gradients expected");
    const size_t i = static_cast<size_t>(r);
    launch_together(r);
    DFLASH_CUDA_CHECK(cudaSetDevice(devices_[i]));
    DFLASH_NCCL_CHECK(ncclAllReduce(grad.data, grad.data, static_cast<size_t>(grad.numel()), ncclFloat32, ncclSum,
                                    comms_[i], static_cast<cudaStream_t>(ctx.native_stream())));
    wait(r, ctx, "all-reduce");
  }
  // In place: NCCL's in-place reduce-scatter has recvbuff = sendbuff + rank * recvcount, its in-place all-gather
  // sendbuff = recvbuff + rank * sendcount (rank: the global drafter rank, the communicator's rank).
  void reduce_scatter(int r, Context& ctx, const Tensor& flat, int64_t shard) override {
    float* own = check_flat("reduce-scatter", r, flat, shard);
    launch_together(r);
    DFLASH_CUDA_CHECK(cudaSetDevice(devices_[static_cast<size_t>(r)]));
    DFLASH_NCCL_CHECK(ncclReduceScatter(flat.data, own, static_cast<size_t>(shard), ncclFloat32, ncclSum,
                                        comms_[static_cast<size_t>(r)], static_cast<cudaStream_t>(ctx.native_stream())));
    wait(r, ctx, "reduce-scatter");
  }
  void all_gather(int r, Context& ctx, const Tensor& flat, int64_t shard) override {
    float* own = check_flat("all-gather", r, flat, shard);
    launch_together(r);
    DFLASH_CUDA_CHECK(cudaSetDevice(devices_[static_cast<size_t>(r)]));
    DFLASH_NCCL_CHECK(ncclAllGather(own, flat.data, static_cast<size_t>(shard), ncclFloat32,
                                    comms_[static_cast<size_t>(r)], static_cast<cudaStream_t>(ctx.native_stream())));
    wait(r, ctx, "all-gather");
  }
  std::string describe() const override { return cat("NCCL ", NCCL_MAJOR, ".", NCCL_MINOR, ", ", world_, " ranks"); }

 private:
  // The launch rule of make_nccl_grad_reducer (collective.h): every local rank reaches the call before any enqueues.
  void launch_together(int r) {
    if (local_group_.local_size() > 1) local_group_.barrier(r);
  }
  // Checks a sharded collective's buffer, selects local rank r's device, returns the start of its own shard.
  float* check_flat(const char* what, int r, const Tensor& flat, int64_t shard) {
    DFLASH_CHECK(flat.device == Device::CUDA && flat.dtype == DType::F32, "nccl ", what, ": an F32 CUDA buffer expected");
    DFLASH_CHECK(shard > 0 && flat.numel() == shard * world_, "nccl ", what, ": ", flat.numel(), " elements are not ",
                 world_, " shards of ", shard);
    DFLASH_CUDA_CHECK(cudaSetDevice(devices_[static_cast<size_t>(r)]));
    return flat.ptr<float>() + static_cast<size_t>(rank0_ + r) * static_cast<size_t>(shard);
  }
  // Waits for the collective just enqueued on ctx's stream, polling the job's state: a peer that died or hangs
  // must not hang this thread (ncclCommAbort, then an Error naming the collective, or JobAborted).
  void wait(int r, Context& ctx, const char* what) {
    const size_t i = static_cast<size_t>(r);
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t call = ++calls_[i];
    for (;;) {
      const cudaError_t q = cudaStreamQuery(static_cast<cudaStream_t>(ctx.native_stream()));
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) DFLASH_CUDA_CHECK(q);
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comms_[i], &async);
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const bool timed_out = timeout_s_ > 0 && waited > timeout_s_;
      if (control_.failed() || async != ncclSuccess || timed_out) {
        aborted_ = true;
        ncclCommAbort(comms_[i]);
        comms_[i] = nullptr;
        if (async != ncclSuccess)
          DFLASH_FAIL("NCCL ", what, " #", call, " (rank ", rank0_ + r, " of ", world_, "): ", ncclGetErrorString(async));
        if (timed_out)
          DFLASH_FAIL("NCCL ", what, " #", call, ": rank ", rank0_ + r, " (cuda:", devices_[i], ") waited ",
                      static_cast<int>(waited), " s (--collective-timeout) for the other drafter ranks of ", world_);
        control_.check();
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  HostGroup& local_group_;
  JobControl& control_;
  double timeout_s_;
  int rank0_, world_;
  std::vector<ncclComm_t> comms_;
  std::vector<int> devices_;
  std::atomic<bool> aborted_{false};
  std::vector<uint64_t> calls_;  // per local rank (each touched by its own thread only)
};

}  // namespace

std::unique_ptr<GradReducer> make_nccl_grad_reducer(const std::vector<Context*>& local, int global_rank0, int world,
                                                    HostGroup& local_group, JobControl& control, double timeout_s) {
  return std::make_unique<NcclGradReducer>(local, global_rank0, world, local_group, control, timeout_s);
}

}  // namespace dflash
