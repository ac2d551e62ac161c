#include "deployment.h"

#include <iostream>
#include <random>
#include <sstream>

#include "tessera/error.h"
#include "tessera/gguf.h"

namespace tessera::serve {

namespace {

std::string chat_template_text(const std::string& model_path) {
  const auto file = GgufFile::open(model_path);
  if (file->find("tokenizer.chat_template") == nullptr) return "";
  return file->get_string("tokenizer.chat_template");
}

// FNV-1a then a finalizer: stable across runs and machines, so a user keeps its variant over restarts too.
uint64_t stable_hash(const std::string& a, const std::string& b) {
  uint64_t h = 1469598103934665603ull;
  for (const std::string* s : {&a, &b}) {
    for (const char c : *s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;  // separator: ("ab","c") and ("a","bc") differ
  }
  // FNV leaves the high bits of short texts alike ("a".."j" all land near 0.381): mix them (fmix64).
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

}  // namespace

Deployment::Deployment(const DeploymentSpec& spec, const PipelineBuilder& build, const std::string& chat_setting) {
  for (const ModelSpec& m : spec.models) {
    ServedModel served;
    served.name = m.name;
    for (const VariantSpec& vs : m.variants) {
      auto v = std::make_unique<Variant>();
      v->model = m.name;
      v->name = vs.name;
      v->weight = vs.weight;
      try {
        v->pipeline = build(vs.pipeline);
        std::string note;
        v->chat = ChatTemplate::choose(chat_setting, chat_template_text(v->pipeline->model_path()), &note);
        if (!note.empty()) std::cerr << "model '" << m.name << "' variant '" << vs.name << "': " << note << "\n";
      } catch (const Error& e) {
        throw Error(vs.where + ": model '" + m.name + "' variant '" + vs.name + "': " + e.what());
      }
      v->engine = std::make_unique<ServingEngine>(*v->pipeline);
      served.variants.push_back(std::move(v));
    }
    models_.push_back(std::move(served));
  }
}

Deployment::~Deployment() { stop(); }

const ServedModel* Deployment::find(const std::string& name) const {
  if (name.empty()) return &models_.front();
  for (const ServedModel& m : models_) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

Variant& Deployment::route(const ServedModel& model, const std::string& user) const {
  if (model.variants.size() == 1) return *model.variants.front();
  double total = 0;
  for (const auto& v : model.variants) total += v->weight.load();
  double point;
  if (user.empty()) {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    point = std::uniform_real_distribution<double>(0, 1)(rng);
  } else {
    point = double(stable_hash(model.name, user) >> 11) * 0x1.0p-53;  // uniform in [0, 1)
  }
  point *= total;
  for (const auto& v : model.variants) {
    const double w = v->weight.load();
    if (w > 0 && point < w) return *v;
    point -= w;
  }
  // Rounding at the top end, or every weight 0 (weights are checked > 0 in total at load): the last
  // variant with weight, else the first.
  for (auto it = model.variants.rbegin(); it != model.variants.rend(); ++it) {
    if ((*it)->weight.load() > 0) return **it;
  }
  return *model.variants.front();
}

std::string Deployment::names() const {
  std::string out;
  for (const ServedModel& m : models_) out += (out.empty() ? "'" : ", '") + m.name + "'";
  return out;
}

std::string Deployment::describe() const {
  std::ostringstream out;
  for (const ServedModel& m : models_) {
    if (&m != &models_.front()) out << "; ";
    out << "model '" << m.name << "'";
    if (m.variants.size() == 1) {
      out << ": " << m.variants.front()->pipeline->describe();
      continue;
    }
    double total = 0;
    for (const auto& v : m.variants) total += v->weight.load();
    out << " (variants";
    for (const auto& v : m.variants) out << " " << v->name << " " << 100 * v->weight.load() / total << "%";
    out << ")";
  }
  return out.str();
}

void Deployment::cancel_all() {
  for (ServedModel& m : models_) {
    for (auto& v : m.variants) v->engine->cancel_all();
  }
}

void Deployment::stop() {
  for (ServedModel& m : models_) {
    for (auto& v : m.variants) {
      if (v->engine) v->engine->stop();
    }
  }
}

std::string Deployment::failure() const {
  for (const ServedModel& m : models_) {
    for (const auto& v : m.variants) {
      const std::string f = v->engine->failure();
      if (!f.empty()) return "model '" + m.name + "' variant '" + v->name + "': " + f;
    }
  }
  return "";
}

}  // namespace tessera::serve
