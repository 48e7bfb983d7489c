// backend/collective.h — sums and gathers across the drafter workers of a training job: worker threads of this
// process (each with its own Context) and, through MPI, the same workers of the other processes (one per host).
// defines: HostGroup, GradReducer, make_host_grad_reducer, make_nccl_grad_reducer
//
// Every rank of a group must call each collective the same number of times in the same order (the training loop
// guarantees it: every drafter runs every step's control path, empty or not). Sums are deterministic for a fixed
// topology: local ranks are added in rank order (in double precision), then processes through MPI.
// Ranks: every process runs the same number L of local ranks; local rank r of process p is global rank p*L + r.
// Sharded collectives (the ZeRO-1 optimizer, train/optimizer.h): a flat buffer of world * `shard` elements, global
// rank g owning elements [g*shard, (g+1)*shard).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "backend/context.h"
#include "core/job_control.h"

namespace dflash {

// The host side: a rendezvous of the local ranks (threads) plus MPI across processes.
class HostGroup {
 public:
  // names[r]: local rank r's worker name (for timeout messages); timeout_s > 0: a wait longer than that fails the
  // job, naming the ranks that had not arrived.
  HostGroup(std::vector<std::string> names, JobControl& control, double timeout_s);
  int local_size() const { return static_cast<int>(names_.size()); }
  // In-place sums of x over every rank of every process; each rank passes its own buffer of the same length.
  // Throws JobAborted when the job failed meanwhile, Error on a timeout (after failing the job).
  void all_reduce(int local_rank, std::span<double> x);
  void all_reduce(int local_rank, std::span<float> x);
  // x: world() * shard elements, the same length on every rank. reduce_scatter: afterwards this rank's own shard of
  // x holds the sum over every rank (exactly the values all_reduce would give there); the rest of x is unchanged.
  // all_gather: afterwards every shard of x holds its owner's shard.
  void reduce_scatter(int local_rank, std::span<float> x, size_t shard);
  void reduce_scatter(int local_rank, std::span<double> x, size_t shard);
  void all_gather(int local_rank, std::span<float> x, size_t shard);
  void all_gather(int local_rank, std::span<double> x, size_t shard);
  // Returns once every local rank (thread) of this process has called it: no data, no MPI. Same abort and
  // timeout rules as the collectives.
  void barrier(int local_rank);
  int world() const;                       // local_size() * processes
  int global_rank(int local_rank) const;   // process * local_size() + local_rank

 private:
  enum class Op { AllReduce, ReduceScatter, AllGather, Barrier };
  template <class T>
  void collective(Op op, int local_rank, std::span<T> x, size_t shard);
  std::vector<std::string> names_;
  JobControl& control_;
  double timeout_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<void*> posted_;
  int arrived_ = 0;
  uint64_t generation_ = 0, calls_ = 0;
  std::vector<double> scratch_;
};

// Sums the drafters' flat F32 gradient buffers (ParamSet::flatten_grads) in place; with the sharded optimizer
// reduce-scatters them and all-gathers the flat master weights (and, for checkpoints, the moments).
class GradReducer {
 public:
  virtual ~GradReducer() = default;
  // Called by local rank r's worker thread with its own context and gradient buffer (on that context's device).
  virtual void all_reduce(int local_rank, Context& ctx, const Tensor& grad) = 0;
  // flat: a contiguous buffer of world * shard elements on ctx's device (F32; the host reducer also takes F64);
  // shard > 0. reduce_scatter: afterwards the own shard of flat (global rank g: elements [g*shard, (g+1)*shard))
  // holds the sum over every rank; the other elements of flat are left unspecified (NCCL may use them).
  // all_gather: afterwards every shard of flat holds its owner's shard, on every rank.
  virtual void reduce_scatter(int local_rank, Context& ctx, const Tensor& flat, int64_t shard) = 0;
  virtual void all_gather(int local_rank, Context& ctx, const Tensor& flat, int64_t shard) = 0;
  virtual std::string describe() const = 0;
};

// CPU contexts: the gradients are host memory, summed by the HostGroup.
std::unique_ptr<GradReducer> make_host_grad_reducer(HostGroup& group);

// CUDA contexts: one NCCL communicator per local drafter (ncclCommInitAll in one process; across processes the
// unique id travels by Mpi::broadcast and every rank joins with ncclCommInitRank), created here, in the warm-up,
// with one all-reduce, one reduce-scatter and one all-gather run through every communicator. all_reduce,
// reduce_scatter and all_gather enqueue ncclAllReduce / ncclReduceScatter / ncclAllGather (in place) on the
// context's stream and wait for them while polling the job's abort flag and the timeout (then ncclCommAbort,
// naming the collective).
// Throws Error if CUDA/NCCL were not built in. global_rank0: the global rank of local rank 0; world: all drafters.
//
// Launch rule (the fix for a hang seen on 2 H200s, 2026-11-30): no local rank enqueues an NCCL collective before
// every local rank has reached the same call (`local_group.barrier`). An NCCL kernel spins on its device until its
// peers' kernels run; while it spins, any CUDA call of another thread that needs that device to drain (a lazily
// loaded kernel's module load, an implicit synchronisation) blocks, and if that thread is the target worker still
// owing the other drafter a feature packet of this step, that drafter never reaches the collective: a deadlock
// (NCCL's "chain of dependencies", NVIDIA/nccl#613; lazy loading under the context lock, CUDA Lazy Loading guide).
// After the barrier every local drafter has consumed all of its packets of the step, so none waits on a target.
std::unique_ptr<GradReducer> make_nccl_grad_reducer(const std::vector<Context*>& local, int global_rank0, int world,
                                                    HostGroup& local_group, JobControl& control, double timeout_s);

}  // namespace dflash
