// Tensor parallelism's part of Model: the weight shards each rank holds, and the traffic of a step
// (the step itself from rank 0 to the others, the all-reduces, the logits gathered on rank 0).
#include <algorithm>
#include <cstring>

#include "model_parts.h"
#include "tessera/error.h"

namespace tessera {

namespace {

// A step on the wire: int64 words. [kind, layers, sequences], then per sequence [seq, tokens,
// start_pos, logit_rows, verifies, table length, token ids..., block table...]. kind 0 = stop.
constexpr int64_t kStop = 0, kStep = 1;

}  // namespace

WeightSource Model::shard_rows(const WeightSource& w, std::span<const int64_t> parts) {
  const size_t row_bytes = dtype_row_bytes(w.dtype, w.cols);
  const auto* base = static_cast<const uint8_t*>(w.data);
  // Each part's rows [P*r/N, P*(r+1)/N): one run of the file where there is one part.
  std::vector<std::pair<const uint8_t*, int64_t>> runs;
  int64_t at = 0, rows = 0;
  for (const int64_t p : parts) {
    const int64_t begin = p * rank_ / ranks_, end = p * (rank_ + 1) / ranks_;
    runs.emplace_back(base + size_t(at + begin) * row_bytes, end - begin);
    rows += end - begin;
    at += p;
  }
  WeightSource out = w;
  out.rows = rows;
  if (runs.size() == 1) {
    out.data = runs[0].first;
    return out;
  }
  std::shared_ptr<uint8_t[]> copy(new uint8_t[size_t(rows) * row_bytes]);
  size_t to = 0;
  for (const auto& [src, n] : runs) {
    std::memcpy(copy.get() + to, src, size_t(n) * row_bytes);
    to += size_t(n) * row_bytes;
  }
  out.data = copy.get();
  shard_copies_.push_back(std::move(copy));
  return out;
}

WeightSource Model::shard_cols(const WeightSource& w) {
  const int64_t begin = w.cols * rank_ / ranks_, end = w.cols * (rank_ + 1) / ranks_;
  const int64_t block = dtype_block_elems(w.dtype);
  if (begin % block != 0 || end % block != 0) {
    throw Error(file_->path() + ": tensor '" + w.name + "' (" + std::string(dtype_name(w.dtype)) + ", rows of " +
                std::to_string(w.cols) + " values) does not split into " + std::to_string(ranks_) +
                " column ranges of whole " + std::to_string(block) + "-value blocks for tensor parallelism");
  }
  const size_t row_bytes = dtype_row_bytes(w.dtype, w.cols);
  const size_t skip = dtype_row_bytes(w.dtype, begin), take = dtype_row_bytes(w.dtype, end - begin);
  std::shared_ptr<uint8_t[]> copy(new uint8_t[size_t(w.rows) * take]);
  const auto* src = static_cast<const uint8_t*>(w.data);
  for (int64_t r = 0; r < w.rows; ++r) std::memcpy(copy.get() + size_t(r) * take, src + size_t(r) * row_bytes + skip, take);
  WeightSource out = w;
  out.cols = end - begin;
  out.data = copy.get();
  shard_copies_.push_back(std::move(copy));
  return out;
}

void Model::all_reduce(float* x, int64_t n) {
  if (ranks_ == 1) return;
  if (backend_.name() == "cpu") {  // its buffers are host memory
    comm_->all_reduce_sum(x, size_t(n));
    return;
  }
  host_stage_.resize(size_t(n));
  backend_.copy_to_host(host_stage_.data(), x, size_t(n) * sizeof(float));
  comm_->all_reduce_sum(host_stage_.data(), size_t(n));
  backend_.copy_to_device(x, host_stage_.data(), size_t(n) * sizeof(float));
}

void Model::send_step(std::span<const ForwardSeq> batch, const Tables& tables, int64_t layers) {
  std::vector<int64_t> words = {kStep, layers, int64_t(batch.size())};
  for (size_t i = 0; i < batch.size(); ++i) {
    const ForwardSeq& fs = batch[i];
    words.insert(words.end(), {int64_t(fs.seq), int64_t(fs.tokens.size()), fs.start_pos, fs.logit_rows,
                               fs.verifies ? 1 : 0, int64_t(tables[i].size())});
    words.insert(words.end(), fs.tokens.begin(), fs.tokens.end());
    words.insert(words.end(), tables[i].begin(), tables[i].end());
  }
  uint64_t n = words.size();
  comm_->broadcast(&n, sizeof n, 0);
  comm_->broadcast(words.data(), n * sizeof(int64_t), 0);
}

void Model::follow(Attention& attention, Cache& cache) {
  if (rank_ == 0) throw Error("Model::follow: rank 0 runs the engine, not follow()");
  std::vector<int64_t> words;
  std::vector<std::vector<int32_t>> tokens, tables;
  std::vector<ForwardSeq> batch;
  Tables views;
  std::vector<float> logits;
  for (;;) {
    uint64_t n = 0;
    comm_->broadcast(&n, sizeof n, 0, /*idle=*/true);  // the next step comes when a request does
    words.resize(n);
    comm_->broadcast(words.data(), n * sizeof(int64_t), 0);
    if (n < 3 || words[0] == kStop) return;
    size_t at = 3;
    const auto seqs = size_t(words[2]);
    auto take = [&](size_t count) {
      if (at + count > words.size()) throw Error("tensor parallel step from rank 0 is truncated");
      std::vector<int32_t> out(words.begin() + long(at), words.begin() + long(at + count));
      at += count;
      return out;
    };
    tokens.assign(seqs, {});
    tables.assign(seqs, {});
    batch.assign(seqs, {});
    views.assign(seqs, {});
    for (size_t i = 0; i < seqs; ++i) {
      if (at + 6 > words.size()) throw Error("tensor parallel step from rank 0 is truncated");
      ForwardSeq& fs = batch[i];
      fs.seq = SeqId(words[at]);
      const auto n_tokens = size_t(words[at + 1]);
      fs.start_pos = words[at + 2];
      fs.logit_rows = words[at + 3];
      fs.verifies = words[at + 4] != 0;
      const auto n_table = size_t(words[at + 5]);
      at += 6;
      tokens[i] = take(n_tokens);
      tables[i] = take(n_table);
      fs.tokens = tokens[i];
      views[i] = tables[i];
    }
    run(batch, views, attention, cache, logits, words[1]);
  }
}

void Model::gather_logits(const float* mine, int64_t rows, std::vector<float>& logits) {
  const int64_t vocab = config_.vocab;
  auto range = [&](int r) { return std::pair{vocab * r / ranks_, vocab * (r + 1) / ranks_}; };
  if (rank_ != 0) {
    comm_->send(mine, size_t(rows * (vocab_end_ - vocab_begin_)) * sizeof(float), 0);
    return;
  }
  logits.resize(size_t(rows * vocab));
  std::vector<float> theirs;
  for (int r = 0; r < ranks_; ++r) {
    const auto [begin, end] = range(r);
    const int64_t width = end - begin;
    const float* src = mine;
    if (r > 0) {
      theirs.resize(size_t(rows * width));
      comm_->recv(theirs.data(), theirs.size() * sizeof(float), r);
      src = theirs.data();
    }
    for (int64_t row = 0; row < rows; ++row) {
      std::memcpy(logits.data() + row * vocab + begin, src + row * width, size_t(width) * sizeof(float));
    }
  }
}

}  // namespace tessera
