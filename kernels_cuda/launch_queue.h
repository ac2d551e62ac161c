// Deferred launches with CUDA graph replay. A decode step is a few hundred small kernel launches
// whose host-side cost (~2-3 us each) is as long as the kernels themselves; a CUDA graph replays a
// run of them with one launch. The backend's ops do not launch at once: each is queued with a key
// (every value its launch uses: pointers, sizes, parameters) and the queue is launched in segments
// of kSegmentOps ops, and whatever is left when the caller next needs the stream (a copy to or from
// the host, a synchronisation, a free). A segment whose keys equal a segment captured before is
// replayed from its graph; one seen before but not captured is captured now; others run op by op.
// Segments let the GPU start on a step while the host is still queueing the rest of it.
//
// A replay launches exactly the kernels the ops would have launched, with the same arguments, so it
// is correct whatever the memory behind the pointers holds now. A capture that fails (an op whose
// library refuses stream capture) is not an error: that segment runs op by op from then on. On HIP
// (no device to test graphs on here) every segment runs op by op.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <list>
#include <type_traits>
#include <vector>

#include "kernels_gpu.h"

namespace tessera::gpu {

// Appends the words a launch's arguments are compared by.
class LaunchKey {
 public:
  explicit LaunchKey(std::vector<uint64_t>& out) : out_(out) {}
  template <class T>
  void put(const T& v) {
    if constexpr (std::is_pointer_v<T>) {
      out_.push_back(reinterpret_cast<uintptr_t>(v));
    } else if constexpr (std::is_enum_v<T>) {
      out_.push_back(static_cast<uint64_t>(v));
    } else if constexpr (std::is_same_v<T, float>) {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      out_.push_back(bits);
    } else if constexpr (std::is_integral_v<T>) {
      out_.push_back(static_cast<uint64_t>(v));
    } else {
      put_struct(v);
    }
  }

 private:
  // Every member, so that equal keys mean equal launches.
  void put_struct(const GpuWeight& w);
  void put_struct(const KvPools& kv);
  void put_struct(const AttnParams& a);

  std::vector<uint64_t>& out_;
};

class LaunchQueue {
 public:
  // immediate: launch every op when it is pushed (no graphs), as a plain stream would.
  LaunchQueue(cudaStream_t stream, bool immediate) : stream_(stream), immediate_(immediate) {}
  ~LaunchQueue();
  LaunchQueue(const LaunchQueue&) = delete;
  LaunchQueue& operator=(const LaunchQueue&) = delete;

  // Queues `launch` (which enqueues on the stream it is given); `op` names it in errors and `key`
  // lists every value `launch` uses. May launch earlier ops (a full segment); throws
  // tessera::Error naming a failed op.
  template <class... T>
  void push(const char* op, std::function<void(cudaStream_t)> launch, const T&... key) {
    if (immediate_) return run_now(op, launch);
    const size_t at = key_.size();
    key_.push_back(0);
    LaunchKey w(key_);
    w.put(op);
    (w.put(key), ...);
    key_[at] = key_.size() - at;  // keeps two segments from matching by a shifted split of their words
    ops_.push_back(Op{op, std::move(launch)});
    if (ops_.size() >= kSegmentOps) flush();
  }
  // Launches what is queued, in order.
  void flush();

 private:
  static constexpr size_t kSegmentOps = 64;
  struct Op {
    const char* name;
    std::function<void(cudaStream_t)> launch;
  };
  struct Graph {
    std::vector<uint64_t> key;
    void* exec = nullptr;  // cudaGraphExec_t
  };

  void run_now(const char* op, const std::function<void(cudaStream_t)>& launch);
  void run_direct();
  bool capture();  // false: not captured, nothing launched

  cudaStream_t stream_;
  bool immediate_;
  std::vector<Op> ops_;
  std::vector<uint64_t> key_;  // the queued segment's keys, end to end
  std::list<std::vector<uint64_t>> seen_;     // segments run op by op once lately, most recent first
  std::list<std::vector<uint64_t>> refused_;  // segments whose capture failed
  std::list<Graph> graphs_;                   // most recently used first
};

}  // namespace tessera::gpu
