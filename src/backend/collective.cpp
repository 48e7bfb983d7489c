// backend/collective.cpp — HostGroup (threads + MPI) and the host gradient reducer.
#include "backend/collective.h"

#include <chrono>

#include "backend/mpi.h"

namespace dflash {

HostGroup::HostGroup(std::vector<std::string> names, JobControl& control, double timeout_s)
    : names_(std::move(names)), control_(control), timeout_s_(timeout_s), posted_(names_.size(), nullptr) {
  DFLASH_CHECK(!names_.empty(), "HostGroup: no ranks");
}

void HostGroup::all_reduce(int r, std::span<double> x) { reduce(r, x); }
void HostGroup::all_reduce(int r, std::span<float> x) { reduce(r, x); }

template <class T>
void HostGroup::reduce(int r, std::span<T> x) {
  const int L = local_size();
  DFLASH_CHECK(r >= 0 && r < L, "HostGroup: local rank ", r, " of ", L);
  std::unique_lock<std::mutex> lk(mu_);
  control_.check();
  const uint64_t gen = generation_;
  posted_[static_cast<size_t>(r)] = x.data();
  if (++arrived_ == L) {
    // the last rank to arrive sums everyone's buffer in rank order, then across processes, then hands it back
    const size_t n = x.size();
    scratch_.assign(n, 0.0);
    for (int q = 0; q < L; ++q) {
      const T* p = static_cast<const T*>(posted_[static_cast<size_t>(q)]);
      for (size_t i = 0; i < n; ++i) scratch_[i] += static_cast<double>(p[i]);
    }
    std::vector<T> sum(n);
    for (size_t i = 0; i < n; ++i) sum[i] = static_cast<T>(scratch_[i]);
    ++calls_;
    if (Mpi::active() && Mpi::size() > 1) {
      try {
        Mpi::all_reduce_sum(sum.data(), n, [this] { control_.check(); }, timeout_s_,
                            cat("all-reduce #", calls_, " across processes"));
      } catch (const JobAborted&) {
        throw;
      } catch (const Error& e) {
        control_.fail(names_[static_cast<size_t>(r)], e.what());
        cv_.notify_all();
        throw;
      }
    }
    for (int q = 0; q < L; ++q) {
      T* p = static_cast<T*>(posted_[static_cast<size_t>(q)]);
      std::copy(sum.begin(), sum.end(), p);
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
      const std::string msg = cat("all-reduce #", calls_ + 1, ": ", names_[static_cast<size_t>(r)], " waited ",
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
  std::string describe() const override { return Mpi::active() ? "host sums + MPI" : "host sums"; }

 private:
  HostGroup& g_;
};
}  // namespace

std::unique_ptr<GradReducer> make_host_grad_reducer(HostGroup& group) {
  return std::make_unique<HostGradReducer>(group);
}

#ifndef DFLASH_HAVE_CUDA
std::unique_ptr<GradReducer> make_nccl_grad_reducer(const std::vector<Context*>&, int, int, JobControl&, double) {
  DFLASH_FAIL("NCCL gradient all-reduce: this dflash was built without the CUDA backend");
}
#endif

}  // namespace dflash
