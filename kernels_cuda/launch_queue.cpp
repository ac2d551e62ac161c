#include "launch_queue.h"

#include <string>

#include "tessera/error.h"

namespace tessera::gpu {

namespace {

[[noreturn]] void fail(const std::string& what, cudaError_t status) {
  throw Error(std::string(TESSERA_GPU_BACKEND) + " backend: " + what + " failed (" + cudaGetErrorString(status) +
              ")");
}

// Graphs kept: a few decode steps' segments per batch shape in flight, a speculative draft and
// verification; and segments remembered as run once (a second sighting captures them).
constexpr size_t kMaxGraphs = 64;
constexpr size_t kMaxSeen = 64;

}  // namespace

void LaunchKey::put_struct(const GpuWeight& w) {
  put(w.data);
  put(w.format);
  put(w.rows);
  put(w.cols);
  put(w.scales);
  put(w.zeros);
  put(w.group_size);
  put(w.iq_tables);
}

void LaunchKey::put_struct(const KvPools& kv) {
  put(kv.k);
  put(kv.v);
  put(kv.type);
  put(kv.num_blocks);
  put(kv.block_size);
  put(kv.n_kv_heads);
  put(kv.head_dim);
}

void LaunchKey::put_struct(const AttnParams& a) {
  put(a.q);
  put(a.out);
  put(a.n_tokens);
  put(a.n_heads);
  put(a.scale);
  put(a.window);
  put(a.seqs);
  put(a.n_seqs);
  put(a.block_tables);
  put(a.max_q_len);
  put(a.max_context_len);
  put(a.sparse_block);
  put(a.seq_base);
  put(a.offsets);
  put(a.kept);
}

void LaunchQueue::run_now(const char* op, const std::function<void(cudaStream_t)>& launch) {
  launch(stream_);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) fail(std::string(op) + " launch", status);
}

void LaunchQueue::run_direct() {
  for (const Op& op : ops_) run_now(op.name, op.launch);
}

#if defined(TESSERA_HIP)

LaunchQueue::~LaunchQueue() = default;
bool LaunchQueue::capture() { return false; }

#else

namespace {
cudaGraphExec_t exec_of(const void* p) { return static_cast<cudaGraphExec_t>(const_cast<void*>(p)); }
}  // namespace

LaunchQueue::~LaunchQueue() {
  for (Graph& g : graphs_) (void)cudaGraphExecDestroy(exec_of(g.exec));
}

bool LaunchQueue::capture() {
  if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  bool ok = true;
  try {
    for (const Op& op : ops_) {
      op.launch(stream_);
      if (cudaPeekAtLastError() != cudaSuccess) {
        ok = false;
        break;
      }
    }
  } catch (const Error&) {  // an op's own check of a call capture refused; it runs again below
    ok = false;
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  cudaGraphExec_t exec = nullptr;
  if (ok && ended == cudaSuccess && graph != nullptr) ok = cudaGraphInstantiateWithFlags(&exec, graph, 0) == cudaSuccess;
  if (graph != nullptr) (void)cudaGraphDestroy(graph);
  if (!ok || ended != cudaSuccess) {
    (void)cudaGetLastError();  // the capture's error: the ops are launched one by one instead
    return false;
  }
  if (graphs_.size() == kMaxGraphs) {
    (void)cudaGraphExecDestroy(exec_of(graphs_.back().exec));
    graphs_.pop_back();
  }
  graphs_.push_front(Graph{key_, exec});
  const cudaError_t status = cudaGraphLaunch(exec, stream_);
  if (status != cudaSuccess) fail("graph launch", status);
  return true;
}

#endif

void LaunchQueue::flush() {
  if (ops_.empty()) return;
  struct Clear {  // the queue is empty afterwards, whether the launches succeeded or threw
    LaunchQueue& q;
    ~Clear() {
      q.ops_.clear();
      q.key_.clear();
    }
  } clear{*this};
  auto remember = [&](std::list<std::vector<uint64_t>>& list) {
    if (list.size() == kMaxSeen) list.pop_back();
    list.push_front(key_);
  };
#if !defined(TESSERA_HIP)
  for (auto it = graphs_.begin(); it != graphs_.end(); ++it) {
    if (it->key != key_) continue;
    graphs_.splice(graphs_.begin(), graphs_, it);
    const cudaError_t status = cudaGraphLaunch(exec_of(it->exec), stream_);
    if (status != cudaSuccess) fail("graph launch", status);
    return;
  }
  for (auto it = seen_.begin(); it != seen_.end(); ++it) {
    if (*it != key_) continue;
    seen_.erase(it);
    if (capture()) return;
    remember(refused_);
    return run_direct();
  }
  for (const auto& k : refused_) {
    if (k == key_) return run_direct();
  }
#endif
  run_direct();
  remember(seen_);
}

}  // namespace tessera::gpu
