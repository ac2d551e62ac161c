#include "tessera/model_share.h"

namespace tessera {

std::shared_ptr<LoadedModel> ModelShare::get(const std::string& key,
                                             const std::function<std::shared_ptr<LoadedModel>()>& load) {
  std::lock_guard lock(mutex_);
  std::erase_if(models_, [](const auto& entry) { return entry.second.expired(); });
  if (auto it = models_.find(key); it != models_.end()) {
    if (auto held = it->second.lock()) return held;
  }
  std::shared_ptr<LoadedModel> loaded = load();
  models_[key] = loaded;
  return loaded;
}

size_t ModelShare::live() const {
  std::lock_guard lock(mutex_);
  size_t n = 0;
  for (const auto& [key, model] : models_) n += model.expired() ? 0 : 1;
  return n;
}

}  // namespace tessera
