// comm: mpi — the ranks of an MPI job (Open MPI's mpirun, on one host or many). Each communicator
// works on its own duplicate of MPI_COMM_WORLD. Collectives are MPI's non-blocking ones, waited on
// with a deadline (`timeout_s`), so that a rank that stopped answering ends the run with a message
// naming the operation rather than a hang; a follower waiting for the next step of an idle server
// (broadcast with `idle`) waits without one, sleeping between polls so that it leaves the cores to
// the ranks that compute.
#include <dlfcn.h>
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "tessera/error.h"
#include "tessera/plugin.h"

namespace tessera {
namespace {

// MPI may be initialised once per process and must be finalised before it exits (Open MPI's mpirun
// reports a rank that exits without MPI_Finalize as failed). This library therefore stays loaded
// to the end of the process, and this object's destructor, run at exit, finalises.
struct MpiSession {
  bool initialised_here = false;
  bool broken = false;  // a collective timed out: peers may never join MPI_Finalize's fence

  static MpiSession& get() {
    static MpiSession session;
    return session;
  }
  void ensure_initialised() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) throw Error("comm mpi: MPI was already finalised in this process");
    int initialised = 0;
    MPI_Initialized(&initialised);
    int provided = MPI_THREAD_SINGLE;
    if (!initialised) {
      pin_library();
      // The server's engine thread makes the calls, not the one that initialised: SERIALIZED at least.
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        throw Error("comm mpi: MPI_Init_thread failed");
      }
      initialised_here = true;
    } else {
      MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED) {
      throw Error("comm mpi: this MPI gives thread level " + std::to_string(provided) +
                  "; calls from the engine's thread need MPI_THREAD_SERIALIZED or more");
    }
  }
  ~MpiSession() {
    if (!initialised_here) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (broken) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Finalize();
  }

 private:
  static void pin_library() {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&MpiSession::get), &info) != 0 && info.dli_fname != nullptr) {
      dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);  // the handle is never closed
    }
  }
};

std::string error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, size_t(std::max(len, 0)));
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(const Params& p) : timeout_(p.get_float("timeout_s")) {
    MpiSession::get().ensure_initialised();
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    // Errors come back as codes (turned into tessera::Error) instead of aborting the job.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    char name[MPI_MAX_PROCESSOR_NAME];
    int len = 0;
    MPI_Get_processor_name(name, &len);
    host_.assign(name, size_t(std::max(len, 0)));
  }
  ~MpiCommunicator() override {
    if (!MpiSession::get().broken) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string host() const override { return host_; }

  void all_reduce_sum(float* data, size_t n) override {
    std::lock_guard lock(mutex_);
    for (size_t at = 0; at < n; at += kChunk) {
      MPI_Request req;
      check(MPI_Iallreduce(MPI_IN_PLACE, data + at, int(std::min(kChunk, n - at)), MPI_FLOAT, MPI_SUM, comm_, &req),
            "all_reduce_sum");
      wait(req, "all_reduce_sum", false);
    }
  }
  void all_gather(const void* in, size_t bytes, void* out) override {
    std::lock_guard lock(mutex_);
    check_count(bytes, "all_gather");
    MPI_Request req;
    check(MPI_Iallgather(in, int(bytes), MPI_BYTE, out, int(bytes), MPI_BYTE, comm_, &req), "all_gather");
    wait(req, "all_gather", false);
  }
  void broadcast(void* data, size_t bytes, int root, bool idle) override {
    std::lock_guard lock(mutex_);
    check_rank(root, "broadcast from");
    auto* p = static_cast<char*>(data);
    for (size_t at = 0; at < bytes || (at == 0 && bytes == 0); at += kChunk) {
      MPI_Request req;
      check(MPI_Ibcast(p + at, int(std::min(kChunk, bytes - at)), MPI_BYTE, root, comm_, &req), "broadcast");
      wait(req, "broadcast", idle && at == 0);
      if (bytes == 0) break;
    }
  }
  void send(const void* data, size_t bytes, int to) override {
    std::lock_guard lock(mutex_);
    check_rank(to, "send to");
    const auto* p = static_cast<const char*>(data);
    for (size_t at = 0; at < bytes; at += kChunk) {
      MPI_Request req;
      check(MPI_Isend(p + at, int(std::min(kChunk, bytes - at)), MPI_BYTE, to, 0, comm_, &req), "send");
      wait(req, "send to rank " + std::to_string(to), false);
    }
  }
  void recv(void* data, size_t bytes, int from) override {
    std::lock_guard lock(mutex_);
    check_rank(from, "receive from");
    auto* p = static_cast<char*>(data);
    for (size_t at = 0; at < bytes; at += kChunk) {
      MPI_Request req;
      check(MPI_Irecv(p + at, int(std::min(kChunk, bytes - at)), MPI_BYTE, from, 0, comm_, &req), "recv");
      wait(req, "receive from rank " + std::to_string(from), false);
    }
  }

 private:
  static constexpr size_t kChunk = size_t(1) << 30;  // MPI counts are int

  void check(int code, const std::string& what) const {
    if (MpiSession::get().broken) throw Error("comm mpi: an earlier operation timed out; the job cannot go on");
    if (code != MPI_SUCCESS) throw Error("comm mpi: " + what + " failed on rank " + who() + ": " + error_text(code));
  }
  void check_count(size_t bytes, const char* what) const {
    if (bytes > size_t(INT_MAX)) throw Error(std::string("comm mpi: ") + what + " of " + std::to_string(bytes) + " bytes is over MPI's count limit");
  }
  void check_rank(int r, const char* what) const {
    if (r < 0 || r >= size_) {
      throw Error("comm mpi: cannot " + std::string(what) + " rank " + std::to_string(r) + ": the job has ranks 0.." +
                  std::to_string(size_ - 1));
    }
  }
  std::string who() const { return std::to_string(rank_) + " of " + std::to_string(size_) + " (" + host_ + ")"; }

  // Polls `req`: spinning at first (a step's collectives answer in microseconds), then yielding, then
  // sleeping (an idle follower, or peers still computing on an oversubscribed host).
  void wait(MPI_Request& req, const std::string& what, bool idle) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    for (int polls = 0;; ++polls) {
      int done = 0;
      const int code = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (code != MPI_SUCCESS) check(code, what);
      if (done) return;
      const auto waited = Clock::now() - start;
      if (!idle && waited > std::chrono::duration<double>(timeout_)) {
        MpiSession::get().broken = true;
        throw Error("comm mpi: " + what + " on rank " + who() + " timed out after " + std::to_string(int(timeout_)) +
                    " s waiting for the other ranks (one may have died or stopped answering); comm.timeout_s sets the limit");
      }
      if (polls < 2000) continue;
      if (waited < std::chrono::milliseconds(2)) {
        sched_yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(idle ? 500 : 50));
      }
    }
  }

  double timeout_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::string host_;
  std::mutex mutex_;
};

void register_mpi(Registrar& r) {
  r.add<Communicator>(
      "mpi", "The ranks of an MPI job (mpirun -n N ...): collectives over MPI on host buffers",
      {{"timeout_s", ParamType::number, 120.0,
        "seconds a collective waits for the other ranks before the run ends with an error naming it"}},
      [](const Params& p) {
        if (!(p.get_float("timeout_s") > 0)) throw Error("comm mpi: timeout_s must be > 0");
        return std::make_unique<MpiCommunicator>(p);
      });
}

}  // namespace
}  // namespace tessera

TESSERA_PLUGIN("comm_mpi", tessera::register_mpi)
