// Weights loaded once for every pipeline that reads the same model file on the same backend with the
// same quantizer: the variants of a deployment, and the old and new deployment during a reload. The
// pipelines keep their own attention, cache, scheduler, decoder and tokenizer; they share the backend,
// the quantizer and the Model, and take turns on it (one step at a time, `step_mutex`), as its
// per-step scratch and the backend's thread team serve one forward at a time.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "tessera/backend.h"
#include "tessera/gguf.h"
#include "tessera/model.h"
#include "tessera/quantizer.h"

namespace tessera {

struct LoadedModel {
  // Declaration order is destruction order reversed: the Model (weights in backend memory, Linears
  // made by the quantizer's library) goes before the quantizer and the backend.
  std::shared_ptr<Backend> backend;
  std::shared_ptr<Communicator> comm;  // the ranks that share the model (tensor parallelism)
  std::shared_ptr<Quantizer> quantizer;
  std::shared_ptr<const GgufFile> file;
  std::unique_ptr<Model> model;
  std::mutex step_mutex;  // held by whoever runs the model (an engine step, an eval window)
};

class ModelShare {
 public:
  // The loaded model for `key` while any pipeline still holds it, else `load()`'s (kept, weakly, for
  // the next pipeline). Thread-safe; loads run one at a time.
  std::shared_ptr<LoadedModel> get(const std::string& key, const std::function<std::shared_ptr<LoadedModel>()>& load);
  // Models held by some pipeline now.
  size_t live() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::weak_ptr<LoadedModel>> models_;
};

}  // namespace tessera
