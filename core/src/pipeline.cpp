#include "tessera/pipeline.h"

#include <algorithm>
#include <filesystem>
#include <iterator>

#include "tessera/error.h"
#include "tessera/speculative.h"
#include "tessera/tensor_pattern.h"

namespace tessera {

namespace {

// registry.create, its errors prefixed with `where` (the YAML file and line, then `who`): parameter
// validation names the file and line already; a plugin's own checks name at most the plugin.
template <class T>
std::shared_ptr<T> create_at(const Registry& registry, const std::string& plugin, const nlohmann::json& params,
                             const std::string& who, const std::string& where) {
  try {
    return registry.create<T>(plugin, params, where);
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.rfind(where, 0) == 0) throw;
    std::string rest = msg;
    // `who` is "KIND PLUGIN"; plugins also say "PLUGIN: " or "PLUGIN KIND: ".
    const std::string kind = who.substr(0, who.find(' '));
    for (const std::string& named : {who + ": ", plugin + ": ", plugin + " " + kind + ": "}) {
      if (rest.rfind(named, 0) == 0) rest = rest.substr(named.size());
    }
    throw Error(where + ": " + rest);
  }
}

// The quantizer's tensor patterns (keep_float: [...], overrides: [{pattern: ...}]) that match none of
// the model's weights: a typo ("ouput") that would otherwise quietly quantize what was to be kept.
void check_tensor_patterns(const ComponentSpec& c, const std::vector<std::string>& weights, const std::string& model) {
  std::vector<std::pair<std::string, std::string>> patterns;  // (parameter, pattern)
  const nlohmann::json& params = c.params;
  if (params.contains("keep_float")) {  // a list, or one pattern as a string
    const nlohmann::json& kf = params["keep_float"];
    for (const auto& v : kf.is_array() ? kf : nlohmann::json::array({kf})) {
      if (v.is_string()) patterns.emplace_back("keep_float", v.get<std::string>());
    }
  }
  if (params.contains("overrides") && params["overrides"].is_array()) {
    for (const auto& o : params["overrides"]) {
      if (!o.is_object() || !o.contains("pattern")) continue;
      const nlohmann::json& p = o["pattern"];
      for (const auto& v : p.is_array() ? p : nlohmann::json::array({p})) {
        if (v.is_string()) patterns.emplace_back("overrides", v.get<std::string>());
      }
    }
  }
  for (const auto& [param, pattern] : patterns) {
    const std::string& pat = pattern;  // clang before 16 cannot capture a structured binding
    if (std::none_of(weights.begin(), weights.end(), [&](const std::string& w) { return tensor_matches(pat, w); })) {
      throw Error((c.where.empty() ? "" : c.where + ": ") + "quantizer " + c.plugin + ": " + param + " pattern '" +
                  pattern + "' matches no weight of " + model + " (its " + std::to_string(weights.size()) +
                  " weights: " + weights.front() + " ... " + weights.back() + ")");
    }
  }
}

std::shared_ptr<Backend> make_backend(const PipelineSpec& spec, const std::string& name,
                                      const Registry& registry) {
  const std::string where = spec.backend_where.empty() ? "backend" : spec.backend_where + ": backend";
  if (name != "auto") return create_at<Backend>(registry, name, spec.backend_params, "backend " + name, where);
  // auto: the first accelerator that has a device and runs the whole float model with the
  // pipeline's KV cache type, else the CPU.
  static constexpr Op kCoreOps[] = {Op::embedding, Op::gemm,   Op::rms_norm,  Op::rope,     Op::silu_mul,
                                    Op::add,       Op::kv_write, Op::attention, Op::argmax};
  for (const char* candidate : {"cuda", "hip"}) {
    if (registry.find(ComponentKind::backend, candidate) == nullptr) continue;
    try {
      auto backend = registry.create<Backend>(candidate, nlohmann::json::object(), where);
      const bool complete = std::all_of(std::begin(kCoreOps), std::end(kCoreOps),
                                        [&](Op op) { return backend->supports(op, DType::F32); }) &&
                            backend->supports(Op::kv_write, spec.kv_dtype) &&
                            backend->supports(Op::attention, spec.kv_dtype);
      if (!backend->devices().empty() && complete) return backend;
    } catch (const Error&) {
      // No device or driver: fall through to the next candidate.
    }
  }
  return create_at<Backend>(registry, "cpu", spec.backend_params, "backend cpu", where);
}

// What decides a load's weights: the file as it is now (a replaced file loads anew), the backend
// and its settings, the quantizer and its parameters (defaults filled in, so that spelling one out
// changes nothing). `auto` also depends on the cache type. The spec is validated already.
std::string share_key(const PipelineSpec& spec, const PipelineOptions& options, const Registry& registry) {
  auto params = [&](ComponentKind kind, const std::string& plugin, const nlohmann::json& given) {
    return validate_params(registry.require(kind, plugin).params, given, plugin).json();
  };
  std::error_code ec;
  const std::filesystem::path path = std::filesystem::canonical(spec.model, ec);
  const auto size = std::filesystem::file_size(spec.model, ec);
  const auto mtime = std::filesystem::last_write_time(spec.model, ec).time_since_epoch().count();
  const ComponentSpec& q = spec.components.at(ComponentKind::quantizer);
  nlohmann::json key = {{"file", path.empty() ? spec.model : path.string()},
                        {"size", size},
                        {"mtime", mtime},
                        {"backend", spec.backend},
                        {"backend_params", spec.backend == "auto" ? spec.backend_params
                                                                  : params(ComponentKind::backend, spec.backend,
                                                                           spec.backend_params)},
                        {"threads", options.threads},
                        {"comm", spec.components.at(ComponentKind::comm).plugin},
                        {"tensor_parallel", spec.tensor_parallel},
                        {"quantizer", q.plugin},
                        {"quantizer_params", params(ComponentKind::quantizer, q.plugin, q.params)}};
  if (spec.backend == "auto") key["kv_dtype"] = dtype_name(spec.kv_dtype);
  return key.dump();
}

// `parallel:` against the ranks the communicator has.
void check_parallel(const PipelineSpec& spec, const Communicator& comm) {
  const std::string where = spec.parallel_where.empty() ? spec.path : spec.parallel_where;
  const std::string comm_plugin = spec.components.at(ComponentKind::comm).plugin;
  if (spec.pipeline_parallel > 1) {
    throw Error(where + ": parallel.pipeline " + std::to_string(spec.pipeline_parallel) +
                ": pipeline parallelism is not built yet; split the model with parallel.tensor");
  }
  if (spec.tensor_parallel != comm.size()) {
    throw Error(where + ": parallel.tensor is " + std::to_string(spec.tensor_parallel) + " but comm '" + comm_plugin +
                "' has " + std::to_string(comm.size()) + " rank" + (comm.size() == 1 ? "" : "s") +
                (spec.tensor_parallel > 1 && comm.size() == 1
                     ? std::string("; launch with mpirun -n ") + std::to_string(spec.tensor_parallel) +
                           (comm_plugin == "none" ? " and set components.comm to mpi" : "")
                     : std::string("; set parallel.tensor to the number of processes mpirun starts")));
  }
}

}  // namespace

Pipeline::~Pipeline() = default;

std::unique_ptr<Pipeline> Pipeline::build(const PipelineSpec& spec_in, const Registry& registry,
                                          const PipelineOptions& options) {
  std::unique_ptr<Pipeline> p(new Pipeline());
  p->spec_ = spec_in;
  PipelineSpec& spec = p->spec_;
  if (!options.model.empty()) {
    spec.model = options.model;
    spec.model_where = options.model_flag;
  }
  if (!options.backend.empty()) {
    if (options.backend != spec.backend) spec.backend_params = nlohmann::json::object();  // meant for the other one
    spec.backend = options.backend;
    spec.backend_where = "--backend";
  }
  if (!options.kv_dtype.empty()) {
    spec.kv_dtype_where = "--kv-dtype";
    spec.kv_dtype = parse_kv_dtype(options.kv_dtype, spec.kv_dtype_where);
  }
  validate_pipeline_spec(spec, registry);
  if (spec.model.empty()) {
    throw Error((spec.path.empty() ? std::string("pipeline") : spec.path) + ": no model given (set 'model:' or pass -m)");
  }
  const std::string model_where = spec.model_where.empty() ? std::string("model") : spec.model_where;
  if (!std::filesystem::exists(spec.model)) throw Error(model_where + ": model file '" + spec.model + "' not found");
  if (!std::filesystem::is_regular_file(spec.model)) {
    throw Error(model_where + ": model '" + spec.model + "' is not a regular file (a GGUF file is expected)");
  }
  p->model_path_ = spec.model;

  auto create = [&]<class T>(ComponentKind kind, std::shared_ptr<T>& out) {
    const ComponentSpec& c = spec.components.at(kind);
    const std::string who = std::string(kind_name(kind)) + " " + c.plugin;
    out = create_at<T>(registry, c.plugin, c.params, who, c.where.empty() ? who : c.where + ": " + who);
  };
  auto load = [&] {
    auto loaded = std::make_shared<LoadedModel>();
    loaded->backend = make_backend(spec, spec.backend, registry);
    if (options.threads > 0) {
      try {
        loaded->backend->set_threads(options.threads);
      } catch (const Error& e) {
        throw Error(std::string("--threads: ") + e.what());
      }
    }
    if (loaded->backend->devices().empty()) {
      throw Error("backend '" + std::string(loaded->backend->name()) + "' has no device");
    }
    create(ComponentKind::comm, loaded->comm);
    check_parallel(spec, *loaded->comm);
    create(ComponentKind::quantizer, loaded->quantizer);
    loaded->file = GgufFile::open(spec.model);
    try {
      loaded->model = std::make_unique<Model>(loaded->file, *loaded->backend, *loaded->quantizer, loaded->comm.get());
    } catch (const Error& e) {
      // A quantizer refusing a weight (a kernel this CPU lacks, a shape it cannot take) is a setting
      // of the pipeline: name its line. The model's own errors already name the model file.
      const std::string what = e.what();
      const std::string& where = spec.components.at(ComponentKind::quantizer).where;
      throw Error(what.rfind("quantizer", 0) == 0 && !where.empty() ? where + ": " + what : what);
    }
    return loaded;
  };
  p->loaded_ = options.share != nullptr ? options.share->get(share_key(spec, options, registry), load) : load();
  create(ComponentKind::attention, p->attention_);
  create(ComponentKind::cache, p->cache_);
  create(ComponentKind::scheduler, p->scheduler_);
  create(ComponentKind::decoder, p->decoder_);
  create(ComponentKind::constraint, p->constraint_);
  try {
    p->tokenizer_ = Tokenizer::create(load_vocabulary(*p->loaded_->file));
  } catch (const Error& e) {
    const std::string what = e.what();
    throw Error(what.rfind(spec.model, 0) == 0 ? what : spec.model + ": " + what);  // name the file once
  }
  Model& model = p->model();
  Backend& backend = p->backend();
  check_tensor_patterns(spec.components.at(ComponentKind::quantizer), model.linear_names(), spec.model);
  const ModelConfig& mc = model.config();
  if (p->tokenizer_->vocab_size() != mc.vocab) {
    throw Error(spec.model + ": tokenizer has " + std::to_string(p->tokenizer_->vocab_size()) +
                " tokens but token_embd.weight has " + std::to_string(mc.vocab) + " rows");
  }

  p->constraint_->set_vocabulary(constraint_vocab(*p->tokenizer_));
  AttentionShape shape = attention_shape(mc);
  p->attention_->configure(shape);
  CacheGeometry geometry{mc.n_layers, mc.n_kv_heads, mc.head_dim, mc.context_length, spec.kv_dtype};

  // Every op the components will call must exist on this backend, checked before the first step.
  std::vector<OpRequirement> needs = model.requirements();
  for (auto& r : p->attention_->requirements(geometry.dtype)) needs.push_back(r);
  for (const auto& r : needs) {
    if (!backend.supports(r.op, r.dtype)) {
      // The cache type is a setting: name where it was chosen.
      const bool from_kv_dtype = r.dtype == geometry.dtype && !spec.kv_dtype_where.empty() &&
                                 (r.op == Op::kv_write || r.op == Op::attention || r.op == Op::sparse_attention);
      throw Error((from_kv_dtype ? spec.kv_dtype_where + ": kv_dtype: " : std::string()) + r.who + " needs " +
                  std::string(op_name(r.op)) + " on " + std::string(dtype_name(r.dtype)) + ", which the " +
                  std::string(backend.name()) + " backend does not provide");
    }
  }
  try {
    p->cache_->configure(backend, geometry);
  } catch (const Error& e) {
    const std::string& where = spec.components.at(ComponentKind::cache).where;
    throw Error(where.empty() ? e.what() : where + ": " + e.what());
  }
  // Fixed once the pool is allocated; the engine asks on every step.
  const int64_t cache_bound = p->cache_->stats().max_seq_tokens;
  p->max_sequence_tokens_ = cache_bound > 0 ? std::min(mc.context_length, cache_bound) : mc.context_length;
  if (Speculator* speculator = p->decoder_->speculator()) {
    const ComponentSpec& c = spec.components.at(ComponentKind::decoder);
    // Its drafts and checks would run outside the steps the other ranks follow.
    if (p->comm().size() > 1) {
      throw Error(c.where + ": decoder " + c.plugin + ": speculative decoding under tensor parallelism is not built yet");
    }
    // Its set-up may run the model, which another pipeline sharing it may be running (allocation
    // before this point is thread-safe on every backend).
    std::lock_guard running(p->step_mutex());
    try {
      speculator->attach(SpeculationHost{registry, p->spec_, backend, p->loaded_->file, model, *p->cache_,
                                         *p->attention_, *p->tokenizer_});
    } catch (const Error& e) {
      throw Error(c.where + ": decoder " + c.plugin + ": " + e.what());
    }
  }
  return p;
}

bool Pipeline::follow() {
  if (comm().rank() == 0) return false;
  model().follow(*attention_, *cache_);
  return true;
}

std::string Pipeline::sequence_limit_text() const {
  const int64_t limit = max_sequence_tokens_;
  if (limit < model().config().context_length) {
    return "the " + spec_.components.at(ComponentKind::cache).plugin + " cache's " + std::to_string(limit) +
           " tokens per sequence";
  }
  return "the model's context of " + std::to_string(limit) + " tokens";
}

std::string Pipeline::describe() const {
  std::string out = std::string(loaded_->backend->name()) + " |";
  for (ComponentKind k : kComponentKinds) {
    if (k != ComponentKind::comm) out += " " + spec_.components.at(k).plugin;
  }
  if (loaded_->comm->size() > 1) {
    out += " | " + spec_.components.at(ComponentKind::comm).plugin + " tensor x" + std::to_string(loaded_->comm->size());
  }
  if (spec_.kv_dtype != DType::F32) out += " | kv " + std::string(dtype_name(spec_.kv_dtype));
  return out;
}

}  // namespace tessera
