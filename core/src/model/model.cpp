#include "tessera/model.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "model_parts.h"
#include "tessera/error.h"

namespace tessera {

namespace {

const GgufTensor& require_tensor(const GgufFile& f, const std::string& name,
                                 std::vector<int64_t> shape) {
  const GgufTensor* t = f.find_tensor(name);
  if (t == nullptr) throw Error(f.path() + ": tensor '" + name + "' is missing");
  // ggml counts missing dimensions as 1: trailing ones in the file are the same shape.
  std::vector<int64_t> stored = t->shape;
  while (stored.size() > shape.size() && stored.back() == 1) stored.pop_back();
  if (stored != shape) {
    auto show = [](const std::vector<int64_t>& s) {
      std::string out = "[";
      for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
      return out + "]";
    };
    throw Error(f.path() + ": tensor '" + name + "' has shape " + show(t->shape) + ", expected " +
                show(shape) + " (ggml order)");
  }
  // Integer tensors (GGUF I8/I32) hold no scale: as a weight a kernel would read them as another
  // format's blocks.
  if (t->dtype == DType::I8 || t->dtype == DType::I32) {
    throw Error(f.path() + ": tensor '" + name + "' is stored as " + std::string(dtype_name(t->dtype)) +
                ", not a weight type");
  }
  // A NaN or infinite weight (or block scale) would turn every logit it reaches into NaN.
  if (const int64_t row = first_non_finite_row(t->dtype, t->data, t->rows(), t->row_length()); row >= 0) {
    throw Error(f.path() + ": tensor '" + name + "' has a non-finite value (NaN or infinity) in row " +
                std::to_string(row));
  }
  return *t;
}

WeightSource source_of(const GgufTensor& t, const std::string& name) {
  WeightSource w;
  w.name = name;
  w.dtype = t.dtype;
  w.data = t.data;
  w.rows = t.rows();
  w.cols = t.row_length();
  return w;
}

}  // namespace

Model::Model(std::shared_ptr<const GgufFile> file, Backend& backend, Quantizer& quantizer, Communicator* comm)
    : file_(std::move(file)), backend_(backend), comm_(comm), rank_(comm != nullptr ? comm->rank() : 0),
      ranks_(comm != nullptr ? comm->size() : 1), config_(read_model_config(*file_)),
      scratch_(std::make_unique<Scratch>()) {
  const GgufFile& f = *file_;
  // Shapes in the file are the whole model's (c); config_ becomes this rank's shard of it.
  const ModelConfig c = config_;
  const int64_t q_dim = c.q_dim(), kv_dim = c.kv_dim();
  vocab_end_ = c.vocab;
  if (ranks_ > 1) {
    auto divides = [&](int64_t n, const std::string& what) {
      if (n % ranks_ != 0) {
        throw Error(f.path() + ": tensor parallelism over " + std::to_string(ranks_) + " ranks needs " + what + " (" +
                    std::to_string(n) + ") divisible by " + std::to_string(ranks_));
      }
    };
    divides(c.n_heads, "the attention heads");
    divides(c.n_kv_heads, "the KV heads");
    divides(c.ffn_dim, "the FFN width");
    config_.n_heads /= ranks_;
    config_.n_kv_heads /= ranks_;
    config_.ffn_dim /= ranks_;
    vocab_begin_ = c.vocab * rank_ / ranks_;
    vocab_end_ = c.vocab * (rank_ + 1) / ranks_;
  }
  // How a weight is divided between tensor-parallel ranks: by output rows (each part of a tensor
  // that stores several alike), by input columns, or not at all.
  enum class Split { whole, rows, cols };

  // A vector (norm weights, biases) as f32 in backend memory.
  // `split`: only this rank's share (a bias of rows split between ranks).
  auto norm = [&](const std::string& name, int64_t n = 0, bool split = false) {
    if (n == 0) n = c.dim;
    const GgufTensor& t = require_tensor(f, name, {n});
    std::vector<float> host(static_cast<size_t>(n));
    dequantize_row(t.dtype, t.data, host.data(), n);
    if (split && ranks_ > 1) {
      host = std::vector<float>(host.begin() + n * rank_ / ranks_, host.begin() + n * (rank_ + 1) / ranks_);
    }
    DeviceBuffer buf(backend_, host.size() * sizeof(float));
    buf.upload(host.data(), host.size() * sizeof(float));
    weight_bytes_ += buf.size();
    decode_bytes_per_token_ += buf.size();
    return buf;
  };
  auto shard = [&](WeightSource w, Split split, std::vector<int64_t> parts = {}) {
    if (ranks_ == 1 || split == Split::whole) return w;
    if (split == Split::cols) return shard_cols(w);
    if (parts.empty()) parts = {w.rows};
    return shard_rows(w, parts);
  };
  auto linear = [&](const std::string& name, int64_t out, int64_t in, Split split, std::vector<int64_t> parts = {}) {
    const GgufTensor& t = require_tensor(f, name, {in, out});
    const WeightSource w = shard(source_of(t, name), split, std::move(parts));
    std::unique_ptr<Linear> l = quantizer.make_linear(backend_, w);
    weight_bytes_ += l->resident_bytes();
    decode_bytes_per_token_ += l->resident_bytes();
    if (name != "output.weight") layer_macs_per_token_ += w.rows * w.cols;
    formats_.push_back(l->format());
    linear_names_.push_back(name);
    return l;
  };
  // Weights that share their input as one Linear, or null where the quantizer keeps them apart.
  auto fused = [&](const std::vector<std::pair<std::string, int64_t>>& parts, int64_t in) {
    std::vector<WeightSource> sources;
    int64_t out = 0;
    for (const auto& [name, rows] : parts) {
      sources.push_back(shard(source_of(require_tensor(f, name, {in, rows}), name), Split::rows));
      out += sources.back().rows;
    }
    std::unique_ptr<Linear> l = quantizer.make_fused_linear(backend_, sources);
    if (l == nullptr) return l;
    if (l->out_features() != out || l->in_features() != in) {
      throw Error("quantizer's fused Linear for " + parts.front().first + "... is " +
                  std::to_string(l->out_features()) + "x" + std::to_string(l->in_features()) + ", expected " +
                  std::to_string(out) + "x" + std::to_string(in));
    }
    weight_bytes_ += l->resident_bytes();
    decode_bytes_per_token_ += l->resident_bytes();
    layer_macs_per_token_ += in * out;
    for (const auto& part : parts) {
      formats_.push_back(l->format());  // one per weight
      linear_names_.push_back(part.first);
    }
    return l;
  };

  const GgufTensor& emb = require_tensor(f, "token_embd.weight", {c.dim, c.vocab});
  if (!backend_.supports(Op::embedding, emb.dtype)) {
    throw Error(std::string(backend_.name()) + " backend lacks embedding on " +
                std::string(dtype_name(emb.dtype)) + " (token_embd.weight)");
  }
  embedding_buffer_ = DeviceBuffer(backend_, emb.nbytes);
  embedding_buffer_.upload(emb.data, emb.nbytes);
  weight_bytes_ += emb.nbytes;
  decode_bytes_per_token_ += dtype_row_bytes(emb.dtype, c.dim);
  embedding_ = WeightView{embedding_buffer_.get(), emb.dtype, c.vocab, c.dim};

  layers_.resize(static_cast<size_t>(c.n_layers));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    Layer& L = layers_[static_cast<size_t>(i)];
    const std::string p = "blk." + std::to_string(i) + ".";
    L.attn_norm = norm(p + "attn_norm.weight");
    L.ffn_norm = norm(p + "ffn_norm.weight");
    if (c.post_norms) {
      L.post_attn_norm = norm(p + "post_attention_norm.weight");
      L.post_ffw_norm = norm(p + "post_ffw_norm.weight");
    }
    if (c.qk_norm) {
      L.q_norm = norm(p + "attn_q_norm.weight", c.head_dim);
      L.k_norm = norm(p + "attn_k_norm.weight", c.head_dim);
    }
    // Biases: required where the architecture has them, loaded where a file has them otherwise.
    auto bias = [&](const std::string& name, int64_t n, bool required, bool split) {
      return required || f.find_tensor(name) != nullptr ? norm(name, n, split) : DeviceBuffer();
    };
    L.bq = bias(p + "attn_q.bias", q_dim, c.qkv_bias, true);
    L.bk = bias(p + "attn_k.bias", kv_dim, c.qkv_bias, true);
    L.bv = bias(p + "attn_v.bias", kv_dim, c.qkv_bias, true);
    L.bo = bias(p + "attn_output.bias", c.dim, false, false);  // added once, after the all-reduce
    if (c.fused_qkv) {
      L.wqkv = linear(p + "attn_qkv.weight", q_dim + 2 * kv_dim, c.dim, Split::rows, {q_dim, kv_dim, kv_dim});
    } else {
      L.wqkv = fused({{p + "attn_q.weight", q_dim}, {p + "attn_k.weight", kv_dim}, {p + "attn_v.weight", kv_dim}}, c.dim);
    }
    if (L.wqkv == nullptr) {
      L.wqk = fused({{p + "attn_q.weight", q_dim}, {p + "attn_k.weight", kv_dim}}, c.dim);
      if (L.wqk == nullptr) {
        L.wq = linear(p + "attn_q.weight", q_dim, c.dim, Split::rows);
        L.wk = linear(p + "attn_k.weight", kv_dim, c.dim, Split::rows);
      }
      L.wv = linear(p + "attn_v.weight", kv_dim, c.dim, Split::rows);
    }
    L.wo = linear(p + "attn_output.weight", c.dim, q_dim, Split::cols);
    if (c.fused_gate_up) {
      L.w_gate_up = linear(p + "ffn_up.weight", 2 * c.ffn_dim, c.dim, Split::rows, {c.ffn_dim, c.ffn_dim});
    } else {
      L.w_gate_up = fused({{p + "ffn_gate.weight", c.ffn_dim}, {p + "ffn_up.weight", c.ffn_dim}}, c.dim);
    }
    if (L.w_gate_up == nullptr) {
      L.w_gate = linear(p + "ffn_gate.weight", c.ffn_dim, c.dim, Split::rows);
      L.w_up = linear(p + "ffn_up.weight", c.ffn_dim, c.dim, Split::rows);
    }
    L.w_down = linear(p + "ffn_down.weight", c.dim, c.ffn_dim, Split::cols);
    any_fused_ = any_fused_ || L.wqkv != nullptr || L.wqk != nullptr || L.w_gate_up != nullptr;
    plain_layers_ = plain_layers_ && L.bq.size() == 0 && L.bk.size() == 0 && L.bv.size() == 0 && L.bo.size() == 0;
  }
  if (!c.rope_inv_freq.empty()) {
    rope_freqs_ = DeviceBuffer(backend_, c.rope_inv_freq.size() * sizeof(float));
    rope_freqs_.upload(c.rope_inv_freq.data(), c.rope_inv_freq.size() * sizeof(float));
  }
  output_norm_ = norm("output_norm.weight");
  if (c.tied_output) {
    // Tied embeddings: the head reads token_embd; the quantizer still sees it as "output.weight"
    // so that per-layer rules for the output layer apply.
    std::unique_ptr<Linear> l = quantizer.make_linear(backend_, shard(source_of(emb, "output.weight"), Split::rows));
    weight_bytes_ += l->resident_bytes();
    decode_bytes_per_token_ += l->resident_bytes();
    formats_.push_back(l->format());
    linear_names_.push_back("output.weight");
    output_ = std::move(l);
  } else {
    output_ = linear("output.weight", c.vocab, c.dim, Split::rows);
  }
  layers_share_gemvs_ = layers_share_gemvs();
}

Model::~Model() {
  if (ranks_ > 1 && rank_ == 0) {
    try {  // the other ranks' follow() returns
      uint64_t n = 3;
      int64_t stop[3] = {0, 0, 0};
      comm_->broadcast(&n, sizeof n, 0);
      comm_->broadcast(stop, sizeof stop, 0);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "warning: could not stop the other tensor-parallel ranks: %s\n", e.what());
    }
  }
}

bool Model::is_float_format(const std::string& format) {
  const std::string type = format.substr(0, format.find(' '));
  return type == "f32" || type == "f16" || type == "bf16";
}

std::string Model::weight_formats() const {
  std::map<std::string, int> counts;
  for (const auto& f : formats_) ++counts[f];
  std::string out;
  for (const auto& [f, n] : counts) out += (out.empty() ? "" : ", ") + f + " x " + std::to_string(n);
  return out;
}

std::vector<OpRequirement> Model::requirements() const {
  const ModelConfig& c = config_;
  const std::string who = "model (" + c.architecture + ")";
  std::vector<OpRequirement> out = {{Op::rms_norm, DType::F32, who}, {Op::add, DType::F32, who}};
  out.push_back({c.activation == FfnActivation::gelu_tanh ? Op::gelu_mul : Op::silu_mul, DType::F32, who});
  if (c.rope_inv_freq.empty() || c.rope_theta_swa > 0) out.push_back({Op::rope, DType::F32, who});
  if (!c.rope_inv_freq.empty()) out.push_back({Op::rope_freqs, DType::F32, who});
  if (!plain_layers_) out.push_back({Op::add_rows, DType::F32, who});
  if (c.embed_scale > 0) out.push_back({Op::scale, DType::F32, who});
  return out;
}

void Model::rope(int64_t layer, float* q, float* k, const int32_t* positions, int64_t rows) {
  const ModelConfig& c = config_;
  const bool slides = !c.layer_slides.empty() && c.layer_slides[size_t(layer)] != 0;
  if (slides && c.rope_theta_swa > 0) {  // Gemma 3's local layers: their own base, unscaled
    backend_.rope(q, positions, rows, c.n_heads, c.head_dim, c.rope_dim, c.rope_theta_swa, c.rope_style);
    backend_.rope(k, positions, rows, c.n_kv_heads, c.head_dim, c.rope_dim, c.rope_theta_swa, c.rope_style);
  } else if (rope_freqs_.size() > 0) {
    const float* f = rope_freqs_.as<float>();
    backend_.rope_freqs(q, positions, rows, c.n_heads, c.head_dim, c.rope_dim, f, c.rope_mscale, c.rope_style);
    backend_.rope_freqs(k, positions, rows, c.n_kv_heads, c.head_dim, c.rope_dim, f, c.rope_mscale, c.rope_style);
  } else {
    backend_.rope(q, positions, rows, c.n_heads, c.head_dim, c.rope_dim, c.rope_theta, c.rope_style);
    backend_.rope(k, positions, rows, c.n_kv_heads, c.head_dim, c.rope_dim, c.rope_theta, c.rope_style);
  }
}

void Model::attention_inputs(const Layer& L, float* q, float* k, float* v, const int32_t* positions, int64_t rows) {
  const ModelConfig& c = config_;
  if (L.bq.size() > 0) backend_.add_rows(q, L.bq.as<float>(), rows, c.q_dim());
  if (L.bk.size() > 0) backend_.add_rows(k, L.bk.as<float>(), rows, c.kv_dim());
  if (L.bv.size() > 0) backend_.add_rows(v, L.bv.as<float>(), rows, c.kv_dim());
  if (c.qk_norm) {
    backend_.rms_norm(q, L.q_norm.as<float>(), q, rows * c.n_heads, c.head_dim, c.rms_eps);
    backend_.rms_norm(k, L.k_norm.as<float>(), k, rows * c.n_kv_heads, c.head_dim, c.rms_eps);
  }
  rope(&L - layers_.data(), q, k, positions, rows);
}

void Model::activate(const float* gate, const float* up, float* out, int64_t n) {
  if (config_.activation == FfnActivation::gelu_tanh) {
    backend_.gelu_mul(gate, up, out, n);
  } else {
    backend_.silu_mul(gate, up, out, n);
  }
}

void Model::upload_step(std::span<const ForwardSeq> batch, const Tables& tables, int64_t block_size) {
  Scratch& s = *scratch_;
  s.host_ids.clear();
  s.host_positions.clear();
  s.host_slots.clear();
  s.host_tables.clear();
  s.host_seqs.clear();
  s.host_verifies.clear();
  s.host_logit_rows.clear();
  int32_t row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const ForwardSeq& fs = batch[i];
    const auto table = tables[i];
    const int64_t n = static_cast<int64_t>(fs.tokens.size());
    const int64_t end = fs.start_pos + n;
    AttentionSeqDesc d;
    d.q_start = row;
    d.q_len = static_cast<int32_t>(n);
    d.context_len = static_cast<int32_t>(end);
    d.block_table_offset = static_cast<int32_t>(s.host_tables.size());
    s.host_seqs.push_back(d);
    s.host_verifies.push_back(fs.verifies ? 1 : 0);
    s.host_tables.insert(s.host_tables.end(), table.begin(), table.end());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = fs.start_pos + i;
      s.host_ids.push_back(fs.tokens[static_cast<size_t>(i)]);
      s.host_positions.push_back(static_cast<int32_t>(pos));
      s.host_slots.push_back(static_cast<int32_t>(table[static_cast<size_t>(pos / block_size)] * block_size +
                                                  pos % block_size));
    }
    const int64_t wanted = std::min<int64_t>(fs.logit_rows, n);
    for (int64_t i = n - wanted; i < n; ++i) s.host_logit_rows.push_back(row + static_cast<int32_t>(i));
    row += static_cast<int32_t>(n);
  }
  // The block tables, whose size changes as sequences grow, go last: the other parts keep their
  // offsets while the batch keeps its shape, and the buffer grows to powers of two, so their
  // addresses (part of what a GPU backend's captured decode step replays) rarely change.
  size_t at = 0;
  std::vector<size_t> offsets;
  auto place = [&](const auto& vec) {
    offsets.push_back(at);
    at += (vec.size() * sizeof(vec[0]) + 63) / 64 * 64;
  };
  place(s.host_ids);
  place(s.host_positions);
  place(s.host_slots);
  place(s.host_seqs);
  place(s.host_tables);
  s.host_step.resize(at);
  size_t part = 0;
  auto copy = [&](const auto& vec) {
    if (!vec.empty()) std::memcpy(s.host_step.data() + offsets[part], vec.data(), vec.size() * sizeof(vec[0]));
    ++part;
  };
  copy(s.host_ids);
  copy(s.host_positions);
  copy(s.host_slots);
  copy(s.host_seqs);
  copy(s.host_tables);
  s.step.ensure(backend_, std::bit_ceil(std::max<size_t>(at, 64)));
  if (at > 0) s.step.upload(s.host_step.data(), at);
  const auto* base = s.step.as<uint8_t>();
  s.ids = reinterpret_cast<const int32_t*>(base + offsets[0]);
  s.positions = reinterpret_cast<const int32_t*>(base + offsets[1]);
  s.slots = reinterpret_cast<const int32_t*>(base + offsets[2]);
  s.seqs = reinterpret_cast<const AttentionSeqDesc*>(base + offsets[3]);
  s.block_tables = reinterpret_cast<const int32_t*>(base + offsets[4]);
}

void Model::forward(std::span<const ForwardSeq> batch, Attention& attention, Cache& cache,
                    std::vector<float>& logits, int64_t n_layers) {
  const ModelConfig& c = config_;
  if (n_layers < 0 || n_layers > c.n_layers) {
    throw Error("forward: n_layers " + std::to_string(n_layers) + " is outside 0.." + std::to_string(c.n_layers));
  }
  if (rank_ != 0) throw Error("forward: tensor-parallel rank " + std::to_string(rank_) + " runs rank 0's steps (follow())");
  // Checked before a tensor-parallel step goes out, so that no rank fails it alone.
  Tables tables;
  int64_t T = 0;
  const int64_t block_size = cache.layer(0).block_size;
  for (const ForwardSeq& fs : batch) {
    tables.push_back(cache.block_table(fs.seq));
    const int64_t end = fs.start_pos + int64_t(fs.tokens.size());
    if (end > int64_t(tables.back().size()) * block_size) {
      throw Error("cache holds " + std::to_string(tables.back().size() * size_t(block_size)) + " slots for sequence " +
                  std::to_string(fs.seq) + " but the step needs " + std::to_string(end));
    }
    T += int64_t(fs.tokens.size());
  }
  const int64_t layers = n_layers == 0 ? c.n_layers : n_layers;
  if (T > 0 && ranks_ > 1) send_step(batch, tables, layers);
  run(batch, tables, attention, cache, logits, layers);
}

void Model::run(std::span<const ForwardSeq> batch, const Tables& tables, Attention& attention, Cache& cache,
                std::vector<float>& logits, int64_t layers) {
  const ModelConfig& c = config_;
  int64_t T = 0;
  for (const auto& fs : batch) T += static_cast<int64_t>(fs.tokens.size());
  if (T == 0) {
    logits.clear();
    return;
  }
  Scratch& s = *scratch_;
  const int64_t q_dim = c.q_dim(), kv_dim = c.kv_dim();
  if (T > s.capacity) {
    const int64_t cap = std::max<int64_t>(T, 16);
    auto f32 = [&](DeviceBuffer& b, int64_t cols) { b = DeviceBuffer(backend_, size_t(cap * cols) * 4); };
    f32(s.x, c.dim);
    f32(s.xb, c.dim);
    f32(s.q, q_dim);
    f32(s.k, kv_dim);
    f32(s.v, kv_dim);
    f32(s.att, q_dim);
    f32(s.hb, c.ffn_dim);
    f32(s.hb2, c.ffn_dim);
    if (any_fused_) {
      f32(s.qkv, q_dim + 2 * kv_dim);
      f32(s.gate_up, 2 * c.ffn_dim);
    }
    s.capacity = cap;
  }
  upload_step(batch, tables, cache.layer(0).block_size);
  const int32_t* ids = s.ids;
  const int32_t* pos = s.positions;
  float* x = s.x.as<float>();
  float* xb = s.xb.as<float>();
  float* att = s.att.as<float>();
  // One token through Linears that share xb but were kept apart (the quantizer stored them in
  // different formats: v in int8 beside an int4 q|k, a sensitive ffn_up in float): all in one
  // backend call where it can (Backend::gemv_many), a parallel region where each took one.
  using Apart = std::pair<Linear*, float*>;  // a Linear and its output
  auto at_once = [&](std::span<const Apart> linears) {
    if (T != 1 || linears.size() > 3) return false;
    WeightView views[3];
    float* outs[3];
    size_t n = 0;
    for (const auto& [linear, out] : linears) {
      if (!linear->runs_as_gemm()) return false;
      views[n] = linear->view();
      outs[n++] = out;
    }
    return backend_.gemv_many(xb, views, outs, n);
  };
  // xb through weights that share it: each part's own Linear, or the fused one, which writes a
  // batch's parts to their own buffers where it can; otherwise its output holds each token's parts
  // side by side (one token's are used in place, a batch's copied apart).
  struct Part {
    Linear* alone;
    float** out;
    int64_t cols;
  };
  auto project = [&](Linear* fused, float* joined, std::initializer_list<Part> parts) {
    if (fused == nullptr) {
      Apart apart[3];
      size_t n = 0;
      for (const Part& p : parts) apart[n++] = {p.alone, *p.out};
      if (!at_once({apart, n})) {
        for (const Part& p : parts) p.alone->forward(xb, T, *p.out);
      }
      return;
    }
    if (T > 1) {
      OutputPart outs[3];
      size_t n = 0;
      for (const Part& p : parts) outs[n++] = {*p.out, p.cols};
      if (fused->forward_parts(xb, T, {outs, n})) return;
    }
    fused->forward(xb, T, joined);
    const size_t pitch = size_t(fused->out_features()) * 4;
    int64_t at = 0;
    for (const Part& p : parts) {
      if (T == 1) {
        *p.out = joined + at;
      } else {
        backend_.copy_rows(*p.out, size_t(p.cols) * 4, joined + at, pitch, size_t(p.cols) * 4, T);
      }
      at += p.cols;
    }
  };

  AttentionStep step;
  step.n_tokens = T;
  step.slots = s.slots;
  step.seqs = s.seqs;
  step.block_tables = s.block_tables;
  step.host_seqs = s.host_seqs;
  step.host_verifies = s.host_verifies;
  for (const auto& d : s.host_seqs) {
    step.max_q_len = std::max(step.max_q_len, d.q_len);
    step.max_context_len = std::max(step.max_context_len, d.context_len);
  }

  backend_.embedding(embedding_, ids, T, x);
  if (c.embed_scale > 0) backend_.scale(x, c.embed_scale, T * c.dim);
  // Tensor parallelism's all-reduces sit between the GEMVs that one region would run back to back.
  const bool decoded = T == 1 && ranks_ == 1 && decode_in_few_regions(step, attention, cache, layers);
  for (int64_t l = 0; l < layers && !decoded; ++l) {
    Layer& L = layers_[static_cast<size_t>(l)];
    step.layer = l;
    backend_.rms_norm(x, L.attn_norm.as<float>(), xb, T, c.dim, c.rms_eps);
    float* q = s.q.as<float>();
    float* k = s.k.as<float>();
    float* v = s.v.as<float>();
    if (L.wqkv != nullptr) {
      project(L.wqkv.get(), s.qkv.as<float>(),
              {{L.wq.get(), &q, q_dim}, {L.wk.get(), &k, kv_dim}, {L.wv.get(), &v, kv_dim}});
    } else if (L.wqk == nullptr) {
      project(nullptr, nullptr, {{L.wq.get(), &q, q_dim}, {L.wk.get(), &k, kv_dim}, {L.wv.get(), &v, kv_dim}});
    } else if (float* joined = s.qkv.as<float>(); at_once(std::array<Apart, 2>{{{L.wqk.get(), joined}, {L.wv.get(), v}}})) {
      q = joined;  // q|k's output used in place, as project does
      k = joined + q_dim;
    } else {
      project(L.wqk.get(), joined, {{L.wq.get(), &q, q_dim}, {L.wk.get(), &k, kv_dim}});
      L.wv->forward(xb, T, v);
    }
    attention_inputs(L, q, k, v, pos, T);
    attention.forward(backend_, step, cache.layer(l), q, k, v, att);
    L.wo->forward(att, T, xb);
    all_reduce(xb, T * c.dim);
    if (L.bo.size() > 0) backend_.add_rows(xb, L.bo.as<float>(), T, c.dim);
    if (c.post_norms) backend_.rms_norm(xb, L.post_attn_norm.as<float>(), xb, T, c.dim, c.rms_eps);
    backend_.add(x, xb, x, T * c.dim);
    backend_.rms_norm(x, L.ffn_norm.as<float>(), xb, T, c.dim, c.rms_eps);
    float* hb = s.hb.as<float>();
    float* hb2 = s.hb2.as<float>();
    project(L.w_gate_up.get(), s.gate_up.as<float>(),
            {{L.w_gate.get(), &hb, c.ffn_dim}, {L.w_up.get(), &hb2, c.ffn_dim}});
    activate(hb, hb2, hb, T * c.ffn_dim);
    L.w_down->forward(hb, T, xb);
    all_reduce(xb, T * c.dim);
    if (c.post_norms) backend_.rms_norm(xb, L.post_ffw_norm.as<float>(), xb, T, c.dim, c.rms_eps);
    backend_.add(x, xb, x, T * c.dim);
  }

  // Only the rows whose logits are wanted go through the output head.
  // Under tensor parallelism each rank's head gives its vocabulary rows' logits, gathered on rank 0.
  const auto rows = static_cast<int64_t>(s.host_logit_rows.size());
  const int64_t vocab = vocab_end_ - vocab_begin_;
  logits.resize(static_cast<size_t>(rows * c.vocab));
  if (rows == 0) return;
  if (rows > s.logit_capacity) {
    s.logits = DeviceBuffer(backend_, size_t(rows * vocab) * 4);
    s.logit_capacity = rows;
  }
  const bool all_rows = rows == T;
  float* head_in = x;
  if (!all_rows) {
    // Gather the wanted rows to the front of xb.
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t src = s.host_logit_rows[static_cast<size_t>(r)];
      backend_.copy_on_device(xb + r * c.dim, x + src * c.dim, size_t(c.dim) * 4);
    }
    head_in = xb;
  }
  backend_.rms_norm(head_in, output_norm_.as<float>(), head_in, rows, c.dim, c.rms_eps);
  output_->forward(head_in, rows, s.logits.as<float>());
  if (ranks_ == 1) {
    backend_.copy_to_host(logits.data(), s.logits.get(), logits.size() * sizeof(float));
  } else {
    host_stage_.resize(size_t(rows * vocab));
    backend_.copy_to_host(host_stage_.data(), s.logits.get(), host_stage_.size() * sizeof(float));
    gather_logits(host_stage_.data(), rows, logits);
    if (rank_ != 0) return;
  }
  if (c.final_softcap > 0) {  // Gemma 2: cap * tanh(logit / cap), on the host copy every decoder reads
    for (float& v : logits) v = c.final_softcap * std::tanh(v / c.final_softcap);
  }
}

}  // namespace tessera
