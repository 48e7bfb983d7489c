// backend/mpi.cpp — Mpi over the MPI C API (when DFLASH_HAVE_MPI), or the single-process fallbacks.
#include "backend/mpi.h"

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

#include "core/error.h"

#ifdef DFLASH_HAVE_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only (no C++ bindings to link)
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace dflash {

namespace {
int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : 0;
}
bool g_active = false;  // written once by init() on the main thread before any worker thread starts
int g_rank = 0, g_size = 1;
constexpr int kAbortTag = 7707;
}  // namespace

bool Mpi::launched() {
  return env_int("OMPI_COMM_WORLD_SIZE") > 1 || env_int("PMIX_SIZE") > 1 || env_int("PMI_SIZE") > 1 ||
         (env_int("SLURM_NTASKS") > 1 && std::getenv("SLURM_PROCID") != nullptr && std::getenv("PMI_FD") != nullptr);
}
bool Mpi::active() { return g_active; }
int Mpi::rank() { return g_rank; }
int Mpi::size() { return g_size; }
std::string Mpi::hostname() {
  char b[256] = {0};
  gethostname(b, sizeof b - 1);
  return b;
}

#ifdef DFLASH_HAVE_MPI

namespace {
void finalize_at_exit() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}
// Waits for `req`, running `poll` between tests; fails after timeout_s.
void wait_request(MPI_Request& req, const std::function<void()>& poll, double timeout_s, const std::string& what) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int spin = 0;; ++spin) {
    int done = 0;
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (poll) poll();
    if (timeout_s > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s)
      DFLASH_FAIL(what, ": no answer from the other processes within the collective timeout of ", timeout_s,
                  " s (this is process ", g_rank, " of ", g_size, " on ", Mpi::hostname(), ")");
    if (spin > 100) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}
template <class T>
void all_reduce_impl(T* x, size_t n, MPI_Datatype dt, const std::function<void()>& poll, double timeout_s,
                     const std::string& what) {
  DFLASH_CHECK(g_active, "mpi: all_reduce before init");
  DFLASH_CHECK(n <= static_cast<size_t>(INT32_MAX), "mpi: ", what, ": ", n, " elements (at most 2^31 - 1)");
  MPI_Request req;
  DFLASH_CHECK(MPI_Iallreduce(MPI_IN_PLACE, x, static_cast<int>(n), dt, MPI_SUM, MPI_COMM_WORLD, &req) == MPI_SUCCESS,
               "mpi: MPI_Iallreduce failed (", what, ")");
  wait_request(req, poll, timeout_s, what);
}
template <class T>
void all_gather_impl(T* x, size_t block, MPI_Datatype dt, const std::function<void()>& poll, double timeout_s,
                     const std::string& what) {
  DFLASH_CHECK(g_active, "mpi: all_gather before init");
  DFLASH_CHECK(block <= static_cast<size_t>(INT32_MAX), "mpi: ", what, ": blocks of ", block, " elements (at most 2^31 - 1)");
  MPI_Request req;
  DFLASH_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, static_cast<int>(block), dt, MPI_COMM_WORLD,
                              &req) == MPI_SUCCESS,
               "mpi: MPI_Iallgather failed (", what, ")");
  wait_request(req, poll, timeout_s, what);
}
}  // namespace

void Mpi::init() {
  if (g_active) return;
  int provided = 0;
  DFLASH_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) == MPI_SUCCESS, "mpi: MPI_Init_thread failed");
  DFLASH_CHECK(provided >= MPI_THREAD_MULTIPLE, "mpi: the MPI library gives thread level ", provided,
               ", dflash needs MPI_THREAD_MULTIPLE (worker threads reduce while the main thread watches for aborts)");
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  g_active = true;
  std::atexit(finalize_at_exit);
}
void Mpi::all_reduce_sum(double* x, size_t n, const std::function<void()>& poll, double timeout_s, const std::string& what) {
  all_reduce_impl(x, n, MPI_DOUBLE, poll, timeout_s, what);
}
void Mpi::all_reduce_sum(float* x, size_t n, const std::function<void()>& poll, double timeout_s, const std::string& what) {
  all_reduce_impl(x, n, MPI_FLOAT, poll, timeout_s, what);
}
void Mpi::all_gather(float* x, size_t block, const std::function<void()>& poll, double timeout_s, const std::string& what) {
  all_gather_impl(x, block, MPI_FLOAT, poll, timeout_s, what);
}
void Mpi::all_gather(double* x, size_t block, const std::function<void()>& poll, double timeout_s, const std::string& what) {
  all_gather_impl(x, block, MPI_DOUBLE, poll, timeout_s, what);
}
void Mpi::broadcast(void* p, size_t bytes, int root) {
  DFLASH_CHECK(MPI_Bcast(p, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD) == MPI_SUCCESS, "mpi: MPI_Bcast failed");
}
void Mpi::send_abort(const std::string& message) {
  if (!g_active) return;
  const std::string m = cat("process ", g_rank, " (", hostname(), "): ", message);
  std::vector<MPI_Request> reqs;
  for (int r = 0; r < g_size; ++r) {
    if (r == g_rank) continue;
    reqs.emplace_back();
    MPI_Isend(m.data(), static_cast<int>(m.size()), MPI_CHAR, r, kAbortTag, MPI_COMM_WORLD, &reqs.back());
  }
  // give the messages a moment to leave; the receivers may already be gone
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& q : reqs) {
    int done = 0;
    while (!done && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2)) {
      MPI_Test(&q, &done, MPI_STATUS_IGNORE);
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}
std::optional<Mpi::AbortMessage> Mpi::poll_abort() {
  if (!g_active) return std::nullopt;
  int flag = 0;
  MPI_Status st;
  MPI_Iprobe(MPI_ANY_SOURCE, kAbortTag, MPI_COMM_WORLD, &flag, &st);
  if (!flag) return std::nullopt;
  int n = 0;
  MPI_Get_count(&st, MPI_CHAR, &n);
  std::string m(static_cast<size_t>(n), '\0');
  MPI_Recv(m.data(), n, MPI_CHAR, st.MPI_SOURCE, kAbortTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  return AbortMessage{st.MPI_SOURCE, m};
}
void Mpi::abort_job(int code) {
  if (g_active) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

#else  // no MPI built in

void Mpi::init() {
  DFLASH_FAIL("this process was started by an MPI launcher, but dflash was built without MPI: install Open MPI "
              "(scripts/setup.sh: openmpi-bin libopenmpi-dev) and build again");
}
void Mpi::all_reduce_sum(double*, size_t, const std::function<void()>&, double, const std::string&) {
  DFLASH_FAIL("mpi: not built in");
}
void Mpi::all_reduce_sum(float*, size_t, const std::function<void()>&, double, const std::string&) {
  DFLASH_FAIL("mpi: not built in");
}
void Mpi::all_gather(float*, size_t, const std::function<void()>&, double, const std::string&) {
  DFLASH_FAIL("mpi: not built in");
}
void Mpi::all_gather(double*, size_t, const std::function<void()>&, double, const std::string&) {
  DFLASH_FAIL("mpi: not built in");
}
void Mpi::broadcast(void*, size_t, int) { DFLASH_FAIL("mpi: not built in"); }
void Mpi::send_abort(const std::string&) {}
std::optional<Mpi::AbortMessage> Mpi::poll_abort() { return std::nullopt; }
void Mpi::abort_job(int code) { std::_Exit(code); }

#endif

}  // namespace dflash
