// Model's per-layer weights and per-step scratch, shared by model.cpp and model_decode.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tessera/model.h"

namespace tessera {

struct Model::Layer {
  DeviceBuffer attn_norm, ffn_norm;
  DeviceBuffer post_attn_norm, post_ffw_norm, q_norm, k_norm;  // where the architecture has them
  DeviceBuffer bq, bk, bv, bo;                                 // biases, where the file has them (empty otherwise)
  // q|k|v and gate|up as one Linear each where the quantizer stores the parts alike (wq, wk, wv,
  // w_gate, w_up are then null); else q|k where those two are alike (v stored otherwise, e.g.
  // kept in float or given more bits: two GEMVs instead of three).
  std::unique_ptr<Linear> wqkv, wqk, w_gate_up;
  std::unique_ptr<Linear> wq, wk, wv, wo, w_gate, w_up, w_down;
};

struct Model::Scratch {
  int64_t capacity = 0;  // tokens
  int64_t logit_capacity = 0;
  DeviceBuffer x, xb, q, k, v, att, hb, hb2, qkv, gate_up, logits;
  // decode_in_few_regions: each thread's x, xb and hb (thread 0's x and xb are x and xb), then the
  // output o and down share.
  DeviceBuffer team;
  int team_threads = 0;
  // A step's token ids, positions, KV slots, sequence descriptors and block tables, uploaded as one
  // buffer (one copy, one wait on a device), each part at a 64-byte aligned offset.
  DeviceBuffer step;
  const int32_t *ids = nullptr, *positions = nullptr, *slots = nullptr, *block_tables = nullptr;
  const AttentionSeqDesc* seqs = nullptr;
  std::vector<uint8_t> host_step;
  std::vector<int32_t> host_ids, host_positions, host_slots, host_tables, host_logit_rows;
  std::vector<AttentionSeqDesc> host_seqs;
  std::vector<uint8_t> host_verifies;  // per sequence: ForwardSeq::verifies
};

}  // namespace tessera
