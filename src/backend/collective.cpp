// backend/collective.cpp — HostGroup (threads + MPI) and the host gradient reducer.
#include "backend/collective.h"

#include <algorithm>
#include <chrono>

#include "backend/mpi.h"

namespace dflash {

HostGroup::HostGroup(std::vector<std::string> names, JobControl& control, double timeout_s)
    : names_(std::move(names)), control_(control), timeout_s_(timeout_s), posted_(names_.size(), nullptr) {
  DFLASH_CHECK(!names_.empty(), "HostGroup: no ranks");
}

void HostGroup::all_reduce(int r, std::span<double> x) { collective(Op::AllReduce, r, x, 0); }
void HostGroup::all_reduce(int r, std::span<float> x) { collective(Op::AllReduce, r, x, 0); }
void HostGroup::reduce_scatter(int r, std::span<float> x, size_t shard) { collective(Op::ReduceScatter, r, x, shard); }
void HostGroup::reduce_scatter(int r, std::span<double> x, size_t shard) { collective(Op::ReduceScatter, r, x, shard); }
void HostGroup::all_gather(int r, std::span<float> x, size_t shard) { collective(Op::AllGather, r, x, shard); }
void HostGroup::all_gather(int r, std::span<double> x, size_t shard) { collective(Op::AllGather, r, x, shard); }
void HostGroup::barrier(int r) { collective(Op::Barrier, r, std::span<double>(), 0); }
int HostGroup::world() const { return local_size() * Mpi::size(); }
int HostGroup::global_rank(int r) const { return Mpi::rank() * local_size() + r; }

template <class T>
void HostGroup::collective(Op op, int r, std::span<T> x, size_t shard) {
  const int L = local_size();
  const char* what = op == Op::AllReduce       ? "all-reduce"
                     : op == Op::ReduceScatter ? "reduce-scatter"
                     : op == Op::AllGather     ? "all-gather"
                                               : "barrier";
  DFLASH_CHECK(r >= 0 && r < L, "HostGroup: local rank ", r, " of ", L);
  DFLASH_CHECK(op == Op::AllReduce || op == Op::Barrier || (shard > 0 && x.size() == shard * static_cast<size_t>(world())), "HostGroup ",
               what, ": ", x.size(), " elements are not ", world(), " shards of ", shard);
  std::unique_lock<std::mutex> lk(mu_);
  control_.check();
  const uint64_t gen = generation_;
  posted_[static_cast<size_t>(r)] = op == Op::Barrier ? static_cast<void*>(this) : static_cast<void*>(x.data());
  if (++arrived_ == L && op == Op::Barrier) {  // everyone is here: release them
    for (int q = 0; q < L; ++q) posted_[static_cast<size_t>(q)] = nullptr;
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  if (arrived_ == L) {
    // the last rank to arrive does the work for everyone: sums every rank's buffer in rank order (or collects the
    // local ranks' shards), then combines across processes, then hands each rank its part
    const size_t n = x.size();
    const size_t g0 = static_cast<size_t>(global_rank(0));  // global rank of local rank 0
    auto buf = [&](int q) { return static_cast<T*>(posted_[static_cast<size_t>(q)]); };
    std::vector<T> out(n);
    if (op == Op::AllGather) {
      for (int q = 0; q < L; ++q) {
        const size_t b = (g0 + static_cast<size_t>(q)) * shard;
        std::copy(buf(q) + b, buf(q) + b + shard, out.begin() + static_cast<std::ptrdiff_t>(b));
      }
    } else {
      scratch_.assign(n, 0.0);
      for (int q = 0; q < L; ++q) {
        const T* p = buf(q);
        for (size_t i = 0; i < n; ++i) scratch_[i] += static_cast<double>(p[i]);
      }
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<T>(scratch_[i]);
    }
    ++calls_;
    if (Mpi::active() && Mpi::size() > 1) {
      try {
        const auto poll = [this] { control_.check(); };
        const std::string name = cat(what, " #", calls_, " across processes");
        // a reduce-scatter sums the whole buffer across processes too: each shard's sum is then exactly the
        // all-reduce's (the same additions in the same order), whatever the sharding
        if (op == Op::AllGather)
          Mpi::all_gather(out.data(), static_cast<size_t>(L) * shard, poll, timeout_s_, name);
        else
          Mpi::all_reduce_sum(out.data(), n, poll, timeout_s_, name);
      } catch (const JobAborted&) {
        throw;
      } catch (const Error& e) {
        control_.fail(names_[static_cast<size_t>(r)], e.what());
        cv_.notify_all();
        throw;
      }
    }
    for (int q = 0; q < L; ++q) {
      if (op == Op::ReduceScatter) {
        const size_t b = (g0 + static_cast<size_t>(q)) * shard;
        std::copy(out.begin() + static_cast<std::ptrdiff_t>(b), out.begin() + static_cast<std::ptrdiff_t>(b + shard),
                  buf(q) + b);
      } else {
        std::copy(out.begin(), out.end(), buf(q));
      }
      posted_[static_cast<size_t>(q)] = nullptr;
    }
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (generation_ == gen) {
    cv_.wait_for(lk, kPollInterval);
    if (generation_ != gen) break;
    if (control_.failed()) {
      posted_[static_cast<size_t>(r)] = nullptr;
      --arrived_;
      control_.check();
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (timeout_s_ > 0 && waited > timeout_s_) {
      std::string missing;
      for (int q = 0; q < L; ++q)
        if (!posted_[static_cast<size_t>(q)]) missing += (missing.empty() ? "" : ", ") + names_[static_cast<size_t>(q)];
      const std::string msg = cat(what, " #", calls_ + 1, ": ", names_[static_cast<size_t>(r)], " waited ",
                                  static_cast<int>(waited), " s (--collective-timeout) for ", missing);
      posted_[static_cast<size_t>(r)] = nullptr;
      --arrived_;
      control_.fail(names_[static_cast<size_t>(r)], msg);
      cv_.notify_all();
      DFLASH_FAIL(msg);
    }
  }
}

namespace {
class HostGradReducer final : public GradReducer {
 public:
  explicit HostGradReducer(HostGroup& g) : g_(g) {}
  void all_reduce(int r, Context& ctx, const Tensor& grad) override {
    DFLASH_CHECK(grad.device == Device::CPU, "host gradient reducer: a ", device_name(grad.device), " tensor");
    if (grad.dtype == DType::F64) {
      g_.all_reduce(r, std::span<double>(grad.ptr<double>(), static_cast<size_t>(grad.numel())));
    } else {
      g_.all_reduce(r, std::span<float>(grad.ptr<float>(), static_cast<size_t>(grad.numel())));
    }
  }
  void reduce_scatter(int r, Context&, const Tensor& flat, int64_t shard) override {
    DFLASH_CHECK(flat.device == Device::CPU && shard > 0, "host reduce-scatter: a ", device_name(flat.device), " tensor");
    if (flat.dtype == DType::F64)
      g_.reduce_scatter(r, std::span<double>(flat.ptr<double>(), static_cast<size_t>(flat.numel())), static_cast<size_t>(shard));
    else
      g_.reduce_scatter(r, std::span<float>(flat.ptr<float>(), static_cast<size_t>(flat.numel())), static_cast<size_t>(shard));
  }
  void all_gather(int r, Context&, const Tensor& flat, int64_t shard) override {
    DFLASH_CHECK(flat.device == Device::CPU && shard > 0, "host all-gather: a ", device_name(flat.device), " tensor");
    if (flat.dtype == DType::F64)
      g_.all_gather(r, std::span<double>(flat.ptr<double>(), static_cast<size_t>(flat.numel())), static_cast<size_t>(shard));
    else
      g_.all_gather(r, std::span<float>(flat.ptr<float>(), static_cast<size_t>(flat.numel())), static_cast<size_t>(shard));
  }
  std::string describe() const override { return Mpi::active() ? "host sums + MPI" : "host sums"; }

 private:
  HostGroup& g_;
};
}  // namespace

std::unique_ptr<GradReducer> make_host_grad_reducer(HostGroup& group) {
  return std::make_unique<HostGradReducer>(group);
}

#ifndef DFLASH_HAVE_CUDA
std::unique_ptr<GradReducer> make_nccl_grad_reducer(const std::vector<Context*>&, int, int, HostGroup&, JobControl&,
                                                    double) {
  DFLASH_FAIL("NCCL gradient all-reduce: this dflash was built without the CUDA backend");
}
#endif

}  // namespace dflash
