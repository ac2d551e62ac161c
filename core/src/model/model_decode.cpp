// One token's layers in a parallel region per layer instead of one per op (Backend::gemv_share).
// A CPU decode step forked ~60 regions, each paying a fork, a join and both threads' streams
// starting cold, with the caller alone between them for norms, adds and silu; where the host's
// two vCPUs sit on two CCDs (a cache line's round trip ~300 ns) that cost several microseconds a
// GEMV. Here a region runs from one attention to the next: o, the FFN and the next layer's q, k, v,
// each GEMV dealt out by rows, with a barrier where an output is read whole. Every thread keeps
// its own x, xb and hb and updates them alike from the shared outputs (the same ops on the same
// bits), so norms, adds and silu need no barrier of their own. The logits are the op-by-op path's.
#include <cstring>

#include "model_parts.h"
#include "tessera/thread_team.h"

namespace tessera {

namespace {

const DeviceBuffer kNoBias;  // down has no bias

// Weights that share their input, run as one gemv_share call, and their outputs.
struct Group {
  WeightView views[3];
  float* outs[3] = {};
  size_t n = 0;
  bool runs_as_gemm = true;
  void add(const Linear& linear, float* out) {
    runs_as_gemm = runs_as_gemm && linear.runs_as_gemm();
    views[n] = linear.view();
    outs[n++] = out;
  }
};

// Where a layer's q, k, v, gate and up land: each Linear's own output, or its part of a fused one's.
struct Outputs {
  float *q = nullptr, *k = nullptr, *v = nullptr, *gate = nullptr, *up = nullptr;
};

template <class Layer>
Group qkv_group(const Layer& L, const Outputs& o) {
  Group g;
  if (L.wqkv != nullptr) {
    g.add(*L.wqkv, o.q);
  } else if (L.wqk != nullptr) {
    g.add(*L.wqk, o.q);
    g.add(*L.wv, o.v);
  } else {
    g.add(*L.wq, o.q);
    g.add(*L.wk, o.k);
    g.add(*L.wv, o.v);
  }
  return g;
}

template <class Layer>
Group ffn_group(const Layer& L, const Outputs& o) {
  Group g;
  if (L.w_gate_up != nullptr) {
    g.add(*L.w_gate_up, o.gate);
  } else {
    g.add(*L.w_gate, o.gate);
    g.add(*L.w_up, o.up);
  }
  return g;
}

Group one(const Linear& linear, float* out) {
  Group g;
  g.add(linear, out);
  return g;
}

}  // namespace

bool Model::layers_share_gemvs() const {
  auto shares = [&](const Group& g) { return g.runs_as_gemm && backend_.gemv_shares(g.views, g.n); };
  for (const Layer& L : layers_) {
    if (!shares(qkv_group(L, {})) || !shares(one(*L.wo, nullptr)) || !shares(ffn_group(L, {})) ||
        !shares(one(*L.w_down, nullptr))) {
      return false;
    }
  }
  return true;
}

bool Model::decode_in_few_regions(AttentionStep& step, Attention& attention, Cache& cache, int64_t layers) {
  const int threads = team_max_threads();
  if (!layers_share_gemvs_ || threads < 2) return false;
  const ModelConfig& c = config_;
  Scratch& s = *scratch_;
  const int64_t q_dim = c.q_dim(), kv_dim = c.kv_dim();
  // Each thread's x, xb and hb, 64-byte aligned, then the output o and down share.
  const int64_t dim_floats = (c.dim + 15) / 16 * 16, ffn_floats = (c.ffn_dim + 15) / 16 * 16;
  const int64_t per_thread = 2 * dim_floats + ffn_floats;
  if (s.team_threads < threads) {
    s.team = DeviceBuffer(backend_, size_t(per_thread * threads + dim_floats) * 4);
    s.team_threads = threads;
  }
  float* const proj = s.team.as<float>() + per_thread * threads;
  float* const att = s.att.as<float>();
  auto outputs = [&](const Layer& L) {
    Outputs o{s.q.as<float>(), s.k.as<float>(), s.v.as<float>(), s.hb.as<float>(), s.hb2.as<float>()};
    if (L.wqkv != nullptr || L.wqk != nullptr) {  // a fused output's parts used in place
      o.q = s.qkv.as<float>();
      o.k = o.q + q_dim;
      if (L.wqkv != nullptr) o.v = o.k + kv_dim;
    }
    if (L.w_gate_up != nullptr) {
      o.gate = s.gate_up.as<float>();
      o.up = o.gate + c.ffn_dim;
    }
    return o;
  };

  // One region: layer `done`'s o projection and FFN after its attention (none for -1), then layer
  // `next`'s norm and q, k, v (none past the last). Each output is written in shares and read
  // whole only past the barrier after it, and rewritten only past a later barrier or the join, so
  // no thread writes what another still reads.
  auto region = [&](int64_t done, int64_t next) {
    team_run([&](int t, int nt) {
      float* mine = s.team.as<float>() + per_thread * t;
      float* x = t == 0 ? s.x.as<float>() : mine;
      float* xb = t == 0 ? s.xb.as<float>() : mine + dim_floats;
      float* hb = mine + 2 * dim_floats;
      auto share = [&](const float* in, const Group& g) { backend_.gemv_share(in, g.views, g.outs, g.n, t, nt); };
      if (done < 0) {
        if (t > 0) std::memcpy(x, s.x.as<float>(), size_t(c.dim) * 4);
      } else {
        const Layer& L = layers_[size_t(done)];
        const Outputs io = outputs(L);
        // A sublayer's output: the shared projection, or (bias, post-norm) this thread's xb made
        // from it, which is free until the next norm writes it.
        auto sublayer_out = [&](const DeviceBuffer& bias, const DeviceBuffer& post_norm) -> const float* {
          if (bias.size() == 0 && post_norm.size() == 0) return proj;
          std::memcpy(xb, proj, size_t(c.dim) * 4);
          if (bias.size() > 0) backend_.add_rows(xb, bias.as<float>(), 1, c.dim);
          if (post_norm.size() > 0) backend_.rms_norm(xb, post_norm.as<float>(), xb, 1, c.dim, c.rms_eps);
          return xb;
        };
        share(att, one(*L.wo, proj));
        team_barrier();
        backend_.add(x, sublayer_out(L.bo, L.post_attn_norm), x, c.dim);
        backend_.rms_norm(x, L.ffn_norm.as<float>(), xb, 1, c.dim, c.rms_eps);
        share(xb, ffn_group(L, io));
        team_barrier();
        activate(io.gate, io.up, hb, c.ffn_dim);
        share(hb, one(*L.w_down, proj));
        team_barrier();
        backend_.add(x, sublayer_out(kNoBias, L.post_ffw_norm), x, c.dim);
      }
      if (next < layers) {
        const Layer& L = layers_[size_t(next)];
        backend_.rms_norm(x, L.attn_norm.as<float>(), xb, 1, c.dim, c.rms_eps);
        share(xb, qkv_group(L, outputs(L)));
      }
    });
  };
  region(-1, 0);
  for (int64_t l = 0; l < layers; ++l) {
    const Outputs io = outputs(layers_[size_t(l)]);
    attention_inputs(layers_[size_t(l)], io.q, io.k, io.v, s.positions, 1);
    step.layer = l;
    attention.forward(backend_, step, cache.layer(l), io.q, io.k, io.v, att);
    region(l, l + 1);
  }
  return true;
}

}  // namespace tessera
