// backend/cuda/nccl.cpp — the drafters' gradient all-reduce on CUDA through NCCL (backend/collective.h).
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
  NcclGradReducer(const std::vector<Context*>& local, int rank0, int world, JobControl& control, double timeout_s)
      : control_(control), timeout_s_(timeout_s), rank0_(rank0), world_(world) {
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
    // one all-reduce through every communicator now, so nothing in NCCL is set up on first use
    std::vector<Tensor> bufs;
    for (Context* c : local) bufs.push_back(c->zeros(DType::F32, {1024}));
    DFLASH_NCCL_CHECK(ncclGroupStart());
    for (int i = 0; i < n; ++i) {
      Context* c = local[static_cast<size_t>(i)];
      DFLASH_CUDA_CHECK(cudaSetDevice(c->device_index()));
      DFLASH_NCCL_CHECK(ncclAllReduce(bufs[i].data, bufs[i].data, 1024, ncclFloat32, ncclSum, comms_[i],
                                      static_cast<cudaStream_t>(c->native_stream())));
    }
    DFLASH_NCCL_CHECK(ncclGroupEnd());
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
    DFLASH_CUDA_CHECK(cudaSetDevice(devices_[i]));
    DFLASH_NCCL_CHECK(ncclAllReduce(grad.data, grad.data, static_cast<size_t>(grad.numel()), ncclFloat32, ncclSum,
                                    comms_[i], static_cast<cudaStream_t>(ctx.native_stream())));
    // wait for it here, polling the job's state: a peer that died or hangs must not hang this thread
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
          DFLASH_FAIL("NCCL all-reduce #", call, " (rank ", rank0_ + r, " of ", world_, "): ", ncclGetErrorString(async));
        if (timed_out)
          DFLASH_FAIL("NCCL all-reduce #", call, ": rank ", rank0_ + r, " (cuda:", devices_[i], ") waited ",
                      static_cast<int>(waited), " s (--collective-timeout) for the other drafter ranks of ", world_);
        control_.check();
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  std::string describe() const override { return cat("NCCL ", NCCL_MAJOR, ".", NCCL_MINOR, ", ", world_, " ranks"); }

 private:
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
                                                    JobControl& control, double timeout_s) {
  return std::make_unique<NcclGradReducer>(local, global_rank0, world, control, timeout_s);
}

}  // namespace dflash
