// comm: none — one process, no peers: every collective is the identity. The default, so that a
// pipeline without `parallel:` runs as it always has.
#include <cstring>
#include <memory>
#include <string>

#include <unistd.h>

#include "tessera/error.h"
#include "tessera/plugin.h"

namespace tessera {
namespace {

class NoneCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string host() const override {
    char name[256] = {};
    return gethostname(name, sizeof name - 1) == 0 ? std::string(name) : std::string("localhost");
  }
  void all_reduce_sum(float*, size_t) override {}
  void all_gather(const void* in, size_t bytes, void* out) override {
    if (bytes > 0) std::memmove(out, in, bytes);
  }
  void broadcast(void*, size_t, int root, bool) override { check_rank(root, "broadcast from"); }
  void send(const void*, size_t, int to) override { refuse("send to", to); }
  void recv(void*, size_t, int from) override { refuse("receive from", from); }

 private:
  static void check_rank(int r, const char* what) {
    if (r != 0) refuse(what, r);
  }
  [[noreturn]] static void refuse(const char* what, int r) {
    throw Error("comm none: cannot " + std::string(what) + " rank " + std::to_string(r) +
                ": this run has one process (launch with mpirun and `comm: { plugin: mpi }` for more)");
  }
};

void register_none(Registrar& r) {
  r.add<Communicator>("none", "One process: no peers, collectives are the identity", {},
                      [](const Params&) { return std::make_unique<NoneCommunicator>(); });
}

}  // namespace
}  // namespace tessera

TESSERA_PLUGIN("comm_none", tessera::register_none)
