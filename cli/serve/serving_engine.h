// The engine behind the HTTP server: one loop thread steps the engine while requests are in flight
// and sleeps on a condition variable otherwise (the Engine itself has no blocking wait). HTTP threads
// submit, cancel and wait on their request's handle; the loop thread hands each one its text as it
// is generated and its result when it ends. Cache statistics are read on the loop thread only (a
// Cache need not be thread-safe) and published as a snapshot after every step.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "tessera/engine.h"

namespace tessera::serve {

// One request's channel from the loop thread to the HTTP thread that serves it.
class RequestHandle {
 public:
  RequestId id() const { return id_; }
  // Waits up to `timeout` until new text or the result is there; appends the text to `text` and moves
  // the result into `result` once. Returns true when it found something.
  bool wait(std::chrono::milliseconds timeout, std::string& text, std::optional<GenerationResult>& result);

 private:
  friend class ServingEngine;
  void push_text(std::string_view text);
  void finish(GenerationResult result);

  RequestId id_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::string text_;
  std::optional<GenerationResult> result_;
};

struct EngineSnapshot {
  EngineStats engine;
  CacheStats cache;
  int64_t in_flight = 0;  // submitted and not yet finished
};

class ServingEngine {
 public:
  explicit ServingEngine(Pipeline& pipeline);
  ~ServingEngine();
  ServingEngine(const ServingEngine&) = delete;
  ServingEngine& operator=(const ServingEngine&) = delete;

  // Submits to the engine (its Error passes through: bad prompt, bad sampling values). The request's
  // on_text is replaced: text goes to the handle.
  std::shared_ptr<RequestHandle> submit(GenerationRequest request);
  void cancel(RequestId id);
  // Cancels every request in flight (shutdown past its deadline).
  void cancel_all();
  EngineSnapshot snapshot() const;
  // Non-empty once a step threw: the engine is stopped and every request fails with this message.
  std::string failure() const;
  // Stops the loop thread (requests still in flight are cancelled first).
  void stop();

 private:
  void loop();
  void dispatch(std::vector<GenerationResult> finished);
  void fail_all(const std::string& message);

  Pipeline& pipeline_;
  Engine engine_;
  mutable std::mutex mutex_;
  std::condition_variable work_cv_;
  std::unordered_map<RequestId, std::shared_ptr<RequestHandle>> live_;  // guarded by mutex_
  bool stopping_ = false;
  std::string failure_;
  EngineSnapshot snapshot_;  // guarded by mutex_
  std::thread thread_;
};

}  // namespace tessera::serve
