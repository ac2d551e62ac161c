// Communicator: the processes of one distributed run (MPI ranks) and the collectives the model's
// tensor-parallel step needs. Buffers are host memory; a backend whose buffers live on a device
// stages them (Model does). Every collective is called by every rank in the same order.
// A collective that waits longer than the plugin's timeout throws tessera::Error naming the
// operation and the ranks it waited for: a rank that died ends the run with a message, not a hang.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The host this rank runs on (for messages and `tessera plugins`).
  virtual std::string host() const = 0;

  // data[i] = the sum over ranks of data[i], on every rank.
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  // out = every rank's `bytes` bytes of `in`, in rank order (out holds size() * bytes).
  virtual void all_gather(const void* in, size_t bytes, void* out) = 0;
  // data = root's data, on every rank. `idle`: the caller may wait without a deadline (a follower
  // waiting for the next step of a server with no traffic).
  virtual void broadcast(void* data, size_t bytes, int root, bool idle = false) = 0;
  virtual void send(const void* data, size_t bytes, int to) = 0;
  virtual void recv(void* data, size_t bytes, int from) = 0;
};

}  // namespace tessera
