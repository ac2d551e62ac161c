#include "tessera/bench/runner.h"

#include <atomic>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "tessera/error.h"

namespace tessera::bench {

namespace {

GenerationRequest make_request(const TraceRequest& r, const Workload& w) {
  GenerationRequest req;
  req.prompt = r.prompt;
  req.max_tokens = r.output_tokens;
  req.expected_output = r.output_tokens;
  req.user = user_name(r.user);
  req.ignore_eos = w.ignore_eos;
  return req;
}

size_t status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string k = key;
  while (std::getline(in, line)) {
    if (line.rfind(k, 0) == 0) return size_t(std::stoull(line.substr(k.size())));
  }
  return 0;
}

}  // namespace

size_t current_rss_bytes() { return status_kib("VmRSS:") * 1024; }
size_t peak_rss_bytes() { return status_kib("VmHWM:") * 1024; }
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  out.flush();
  return bool(out);
}

RunResult run_trace(Pipeline& pipeline, const Trace& trace, const Workload& workload, const Progress& progress) {
  const int64_t total = int64_t(trace.requests.size());
  RunResult out;
  out.results.resize(size_t(total));
  out.scheduled.assign(size_t(total), 0.0);
  Engine engine(pipeline);
  std::vector<int64_t> index_of(size_t(total) + 1, -1);  // request id -> trace index
  std::mutex ids_mutex;

  // KV in use, sampled after every step and at each request's first token: a request admitted and
  // finished within one step (one output token) holds its blocks only inside that step.
  Cache& cache = pipeline.cache();
  auto sample_kv = [&] {
    const CacheStats cs = cache.stats();
    out.kv_bytes_peak = std::max(out.kv_bytes_peak, cs.bytes_used);
    out.kv_blocks_peak = std::max(out.kv_blocks_peak, cs.blocks_used);
  };
  auto submit = [&](int64_t i) {
    GenerationRequest req = make_request(trace.requests[size_t(i)], workload);
    req.on_token = [&sample_kv, first = true](RequestId, int32_t) mutable {  // on the engine's thread
      if (first) sample_kv();
      first = false;
    };
    const RequestId id = engine.submit(std::move(req));
    std::lock_guard lock(ids_mutex);
    if (id >= index_of.size()) index_of.resize(id + 1, -1);
    index_of[id] = i;
  };

  const double t0 = engine.now();
  out.start = t0;
  std::atomic<bool> stop{false};
  std::exception_ptr submit_error;
  std::thread submitter;
  int64_t next = 0;  // closed loop: the next request to submit
  if (workload.arrival.process == Arrival::Process::poisson) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < total; ++i) out.scheduled[size_t(i)] = t0 + trace.requests[size_t(i)].arrival;
    submitter = std::thread([&, start] {
      try {
        for (int64_t i = 0; i < total && !stop; ++i) {
          const auto due = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                       std::chrono::duration<double>(trace.requests[size_t(i)].arrival));
          // Short sleeps, so that a failing engine does not wait for a far arrival.
          while (!stop && std::chrono::steady_clock::now() < due) {
            std::this_thread::sleep_until(std::min(due, std::chrono::steady_clock::now() + std::chrono::milliseconds(20)));
          }
          if (stop) break;
          submit(i);
        }
      } catch (...) {
        submit_error = std::current_exception();
        stop = true;
      }
    });
  } else {
    for (; next < std::min(total, workload.arrival.concurrency); ++next) {
      out.scheduled[size_t(next)] = engine.now();
      submit(next);
    }
  }

  int64_t finished = 0;
  try {
    while (finished < total && !stop) {
      const bool worked = engine.step();
      sample_kv();
      for (GenerationResult& r : engine.take_finished()) {
        int64_t i;
        {
          std::lock_guard lock(ids_mutex);
          i = r.id < index_of.size() ? index_of[r.id] : -1;
        }
        if (i < 0) throw Error("the engine finished request " + std::to_string(r.id) + ", which the bench never submitted");
        out.end = std::max(out.end, r.finished);
        out.results[size_t(i)] = std::move(r);
        ++finished;
        if (progress) progress(finished, total);
        if (workload.arrival.process == Arrival::Process::closed && next < total) {
          out.scheduled[size_t(next)] = engine.now();
          submit(next++);
        }
      }
      // Idle between Poisson arrivals: wait briefly for the submitter instead of spinning.
      if (!worked && finished < total) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  } catch (...) {
    stop = true;
    if (submitter.joinable()) submitter.join();
    throw;
  }
  if (submitter.joinable()) submitter.join();
  if (submit_error) std::rethrow_exception(submit_error);
  out.engine = engine.stats();
  out.cache = pipeline.cache().stats();
  return out;
}

}  // namespace tessera::bench
