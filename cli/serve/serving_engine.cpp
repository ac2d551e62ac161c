#include "serving_engine.h"

#include <iostream>

#include "tessera/error.h"

namespace tessera::serve {

bool RequestHandle::wait(std::chrono::milliseconds timeout, std::string& text,
                         std::optional<GenerationResult>& result) {
  std::unique_lock lock(mutex_);
  cv_.wait_for(lock, timeout, [&] { return !text_.empty() || result_.has_value(); });
  const bool found = !text_.empty() || result_.has_value();
  text += text_;
  text_.clear();
  if (result_) {
    result = std::move(result_);
    result_.reset();
  }
  return found;
}

void RequestHandle::push_text(std::string_view text) {
  {
    std::lock_guard lock(mutex_);
    text_ += text;
  }
  cv_.notify_all();
}

void RequestHandle::finish(GenerationResult result) {
  {
    std::lock_guard lock(mutex_);
    result_ = std::move(result);
  }
  cv_.notify_all();
}

ServingEngine::ServingEngine(Pipeline& pipeline) : pipeline_(pipeline), engine_(pipeline) {
  snapshot_.engine = engine_.stats();
  snapshot_.cache = pipeline_.cache().stats();
  thread_ = std::thread([this] { loop(); });
}

ServingEngine::~ServingEngine() { stop(); }

std::shared_ptr<RequestHandle> ServingEngine::submit(GenerationRequest request) {
  auto handle = std::make_shared<RequestHandle>();
  // The callback runs on the loop thread; it holds the handle itself, so it needs no lookup.
  request.on_text = [h = handle](RequestId, std::string_view text) { h->push_text(text); };
  {
    std::lock_guard lock(mutex_);
    if (!failure_.empty()) throw Error("the engine has stopped after an internal error: " + failure_);
    if (stopping_) throw Error("the server is shutting down");
    // Registered under the lock the loop takes to dispatch results, so a result never finds no handle.
    handle->id_ = engine_.submit(std::move(request));
    live_[handle->id_] = handle;
    ++snapshot_.in_flight;
  }
  work_cv_.notify_one();
  return handle;
}

void ServingEngine::cancel(RequestId id) {
  engine_.cancel(id);
  work_cv_.notify_one();
}

void ServingEngine::cancel_all() {
  std::lock_guard lock(mutex_);
  for (const auto& [id, h] : live_) engine_.cancel(id);
  work_cv_.notify_one();
}

EngineSnapshot ServingEngine::snapshot() const {
  std::lock_guard lock(mutex_);
  return snapshot_;
}

std::string ServingEngine::failure() const {
  std::lock_guard lock(mutex_);
  return failure_;
}

void ServingEngine::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    for (const auto& [id, h] : live_) engine_.cancel(id);
  }
  work_cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void ServingEngine::loop() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      work_cv_.wait(lock, [&] { return !live_.empty() || stopping_; });
      if (live_.empty() && stopping_) return;
      if (!failure_.empty()) return;
    }
    bool worked = false;
    try {
      worked = engine_.step();
    } catch (const std::exception& e) {
      // A component failed mid-step: its state is unknown, so nothing more runs.
      std::cerr << "error: engine step failed: " << e.what() << "\n";
      fail_all(e.what());
      return;
    }
    std::vector<GenerationResult> finished = engine_.take_finished();
    const bool any = !finished.empty();
    {
      // Before the results go out: a client that reads /metrics once answered sees its request's
      // KV blocks back, not the step before.
      const CacheStats cache = pipeline_.cache().stats();
      const EngineStats stats = engine_.stats();
      std::lock_guard lock(mutex_);
      snapshot_.cache = cache;
      snapshot_.engine = stats;
    }
    dispatch(std::move(finished));
    {
      std::lock_guard lock(mutex_);
      // EngineStats' running/waiting are as of the last step that had work; a step that only retires
      // cancelled requests leaves them stale. With nothing in flight the engine holds no sequence.
      if (live_.empty()) snapshot_.engine.running = snapshot_.engine.waiting = 0;
    }
    // Requests submitted but not yet seen by step() make it return false: go round again at once,
    // but never spin on a state that makes no progress.
    if (!worked && !any) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void ServingEngine::dispatch(std::vector<GenerationResult> finished) {
  for (GenerationResult& r : finished) {
    std::shared_ptr<RequestHandle> h;
    {
      std::lock_guard lock(mutex_);
      auto it = live_.find(r.id);
      if (it == live_.end()) continue;
      h = it->second;
      live_.erase(it);
      --snapshot_.in_flight;
    }
    h->finish(std::move(r));
  }
}

void ServingEngine::fail_all(const std::string& message) {
  std::unordered_map<RequestId, std::shared_ptr<RequestHandle>> live;
  {
    std::lock_guard lock(mutex_);
    failure_ = message;
    live.swap(live_);
    snapshot_.in_flight = 0;
  }
  for (auto& [id, h] : live) {
    GenerationResult r;
    r.id = id;
    r.reason = FinishReason::error;
    r.error = "internal error: " + message;
    h->finish(std::move(r));
  }
}

}  // namespace tessera::serve
