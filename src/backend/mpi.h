// backend/mpi.h — the processes of a multi-host job, through MPI (Open MPI from Debian; started by `mpirun` or
// `srun`): one process per host, each running its own target and drafter worker threads. MPI carries the host-side
// sums of the drafters (the CPU backend's gradients, every backend's step statistics), the NCCL unique id, and the
// abort message of a failed process. Built only when CMake finds MPI (DFLASH_HAVE_MPI); without it a job started
// by a launcher is refused with a clear message, and a single process needs nothing of this.
// defines: Mpi
#pragma once
#include <cstddef>
#include <functional>
#include <optional>
#include <string>

namespace dflash {

class Mpi {
 public:
  // True when this process was started by an MPI launcher (Open MPI's OMPI_COMM_WORLD_SIZE, PMIx or Slurm's PMI
  // variables) with a world of more than one process.
  static bool launched();
  // MPI_Init_thread(MPI_THREAD_MULTIPLE) once, from the main thread, before any worker thread; MPI_Finalize at exit.
  // Throws Error if MPI was not built in or the library cannot give MPI_THREAD_MULTIPLE.
  static void init();
  static bool active();  // init() has run
  static int rank();     // 0 when not active
  static int size();     // 1 when not active
  static std::string hostname();

  // In-place sums over all processes (MPI_Iallreduce, then MPI_Test every few ms). Between tests `poll` runs; it
  // may throw (the job's abort). After timeout_s (> 0) without completion throws Error naming `what`.
  static void all_reduce_sum(double* x, size_t n, const std::function<void()>& poll, double timeout_s,
                             const std::string& what);
  static void all_reduce_sum(float* x, size_t n, const std::function<void()>& poll, double timeout_s,
                             const std::string& what);
  // In-place gather over all processes (MPI_Iallgather with MPI_IN_PLACE, polled as all_reduce_sum): x holds
  // size() blocks of `block` elements; process p's block p is copied into block p of every process.
  static void all_gather(float* x, size_t block, const std::function<void()>& poll, double timeout_s,
                         const std::string& what);
  static void all_gather(double* x, size_t block, const std::function<void()>& poll, double timeout_s,
                         const std::string& what);
  // Root's `bytes` bytes at p are copied to every process (blocking; used in the warm-up only).
  static void broadcast(void* p, size_t bytes, int root);
  // A failed process tells every other one (non-blocking sends of `message`), and the others find it with
  // poll_abort() (a probe; returns the sender's rank and "process R (host): message").
  static void send_abort(const std::string& message);
  struct AbortMessage {
    int from = -1;
    std::string text;
  };
  static std::optional<AbortMessage> poll_abort();
  // Ends the whole job now (MPI_Abort) with `code`.
  [[noreturn]] static void abort_job(int code);
};

}  // namespace dflash
