// CPU kernels, one op per file. Internal to the CPU backend library; compiled as C++17.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "tessera/backend.h"
#include "tessera/thread_team.h"

namespace tessera::cpu {

// Work (in multiply-adds, ~0.1 ms on one core) below which an op runs on the calling thread.
// Forking a team costs microseconds on an idle machine but a whole scheduler time slice when the
// cores are shared, so small ops never fork.
inline constexpr int64_t kParallelWork = int64_t(1) << 20;
// Decode's GEMVs and attention stream weights or KV from memory, where one core reaches about
// half of the machine's bandwidth: they fork from this many bytes read, even when the work is small.
inline constexpr int64_t kParallelStreamBytes = int64_t(256) << 10;

// Requests the `bytes` from p on (a decode stream's first lines) without waiting for them.
inline constexpr int64_t kStreamStartBytes = 1024;
inline void prefetch_lines(const void* p, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(static_cast<const char*>(p) + b, 0, 3);
}

// Inside a GEMM's team: the quantized x this thread reads. Up to kOwnQuantizeRows rows (decode,
// small batches) every thread quantizes its own copy, sooner than it would wait at a barrier; more
// are quantized together into the caller's scratch, its `parts` slices split evenly over the team,
// then the team meets at a barrier. prepare(s) sizes a scratch; quantize(s, p0, p1) fills slices
// [p0, p1).
inline constexpr int64_t kOwnQuantizeRows = 6;
template <class Scratch, class Prepare, class Quantize>
Scratch& team_quantized_x(Scratch& callers, Scratch& own, int64_t m, int64_t parts, const Prepare& prepare,
                          const Quantize& quantize) {
  if (m <= kOwnQuantizeRows) {
    prepare(own);
    quantize(own, 0, parts);
    return own;
  }
  const TeamSlice mine = team_slice(parts, team_thread(), team_size());
  quantize(callers, mine.begin, mine.end);
  team_barrier();
  return callers;
}

// body(i) for i in [0, n), split statically over the thread team only when `parallel` (a decode
// step's norms, ropes and adds are too small to fork for, ~40 times per token).
template <class Body>
void for_rows(int64_t n, bool parallel, const Body& body) {
  if (!parallel) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  team_run([&](int t, int nt) {
    const TeamSlice mine = team_slice(n, t, nt);
    for (int64_t i = mine.begin; i < mine.end; ++i) body(i);
  });
}

bool has_avx2();
// TESSERA_CPU_ISA caps the instructions the kernels use where the CPU has more: avx2 keeps them off
// AVX-512 (VNNI, the f32 prefill's 512-bit FMAs) and AMX, vnni off AMX only, scalar off AVX2 too
// (has_avx2() false: the portable paths a pre-Haswell x86-64 runs); to compare them on one machine,
// or to test what a CPU without them gets. Another value is refused by name.
enum class IsaCap { none, vnni, avx2, scalar };
IsaCap isa_cap();
// AVX-512F with AVX2 and FMA (the f32 prefill tiles' 512-bit FMAs, gemm_f32_cpu.cpp; attention's
// transposed-key scores and value sums, vec_math_cpu.cpp); TESSERA_CPU_ISA=avx2 hides it.
bool has_avx512f();

// How a decode GEMV (one row of x) reads its weights, tuned per host: the same kernels read
// fastest with different patterns on the two kinds of machine measured (2-vCPU VMs).
//  amd:   each kernel's own choice, measured on AMD EPYC (Zen 3/4): int8 and int4 one stream a
//         thread with no software prefetch (2 KiB ahead made the int8 decode ~5% slower; four
//         streams 5-7%), Q8_0/Q4_0 one stream 2 KiB ahead, f32 four streams with none.
//  intel: a software prefetch 8 KiB ahead of the reads over a thread's streams, and int8 and int4
//         (VNNI) in four streams: the hardware prefetcher stops at each 4 KiB page and one core alone
//         kept too few lines in flight (Xeon with AVX-512, alternating `tessera run` pairs: int4
//         +16%, Q8_0 +16%, f32 +5% (+18% in faster minutes), int8 +29%).
// From the CPU vendor (intel for Intel, amd otherwise); TESSERA_CPU_TUNING=amd|intel picks one on
// any CPU, to compare them on one machine. Another value is refused by name.
enum class StreamTuning { amd, intel };
StreamTuning stream_tuning();
const char* stream_tuning_name(StreamTuning t);
inline constexpr int64_t kIntelPrefetchBytes = 8192;
inline constexpr int kIntelI8DecodeStreams = 4;
inline constexpr int kIntelI4DecodeStreams = 4;
// The software prefetch distance of a decode stream: bytes ahead over all of a thread's streams
// (a kernel reading S side by side prefetches this / S ahead in each); `on_amd` is the kernel's own.
inline int64_t decode_prefetch_bytes(int64_t on_amd) {
  return stream_tuning() == StreamTuning::intel ? kIntelPrefetchBytes : on_amd;
}
// AVX-512 VNNI on 256-bit vectors (vpdpbusd on ymm), for the int8 and int4 kernels' dot products.
bool has_avx512_vnni();
#define VNNI_TARGET "avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni"

// WeightView::kernel_variant values the int8 and int4 gemms share (the bits above 0xff are their
// layout flags).
inline constexpr int32_t kKernelAuto = 0;       // the fastest this CPU has: vnni, else avx2, else scalar; int8 prefill AMX
inline constexpr int32_t kKernelReference = 2;  // scalar, row-major weights
inline constexpr int32_t kKernelAvx2 = 3;       // vpmaddubsw even where the CPU has VNNI; scalar without AVX2
inline constexpr int32_t kKernelVnni = 4;       // vpdpbusd; refused where the CPU lacks AVX-512 VNNI
inline constexpr int32_t kKernelFlags = ~0xff;
// The variants whose kernels read the packed layouts prepare_weight lays out (all but reference).
inline bool simd_kernel(int32_t variant) {
  return variant == kKernelAuto || variant == kKernelAvx2 || variant == kKernelVnni;
}
// Whether `variant` runs the VNNI dot products; throws, naming `gemm`, for kKernelVnni on a CPU
// without them.
bool vnni_for(int32_t variant, const char* gemm);
bool has_f16c();  // and AVX2

void embedding(const WeightView& table, const int32_t* ids, int64_t n, float* out);
void gemm(const float* x, int64_t m, const WeightView& w, float* y);
// Integer-weight GEMMs behind gemm(): W8A8 with per-token dynamic activation quantization, and
// group-wise int4 unpacked in registers.
void gemm_i8(const float* x, int64_t m, const WeightView& w, float* y);
void gemm_i4(const float* x, int64_t m, const WeightView& w, float* y);
// Q4_K and Q6_K against int8 activations (gemm_kquant_cpu.cpp), where the CPU has AVX2 and F16C;
// elsewhere gemm unpacks their rows to float.
bool gemm_kquant_supports(const WeightView& w);
void gemm_kquant(const float* x, int64_t m, const WeightView& w, float* y);
// The other GGUF block formats against int8 activations, read as stored, where the CPU has AVX2 and
// F16C (elsewhere gemm unpacks their rows to float): Q2_K, Q3_K, Q5_K (gemm_kquant_more_cpu.cpp),
// Q4_1, Q5_0, Q5_1 (gemm_block32_cpu.cpp), IQ4_NL and IQ4_XS (gemm_iq4_cpu.cpp).
bool gemm_kquant_more_supports(const WeightView& w);
void gemm_kquant_more(const float* x, int64_t m, const WeightView& w, float* y);
bool gemm_block32_supports(const WeightView& w);
void gemm_block32(const float* x, int64_t m, const WeightView& w, float* y);
bool gemm_iq4_supports(const WeightView& w);
void gemm_iq4(const float* x, int64_t m, const WeightView& w, float* y);
// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S (gemm_iq23_cpu.cpp), likewise.
bool gemm_iq23_supports(const WeightView& w);
void gemm_iq23(const float* x, int64_t m, const WeightView& w, float* y);
// Backend::prepare_weight for the formats above (gemm_kquant_cpu.cpp): whole 4-row tiles stored
// block-interleaved (row 0 block 0, row 1 block 0, ..., row 3 block 0, row 0 block 1, ...), the
// file's blocks unchanged, so a thread streams its rows as one run of memory; the view is marked
// with kQuantTilesPacked. Only where the AVX2 kernels above run.
inline constexpr int32_t kQuantTilesPacked = 1 << 8;  // kernel_variant flag
void prepare_weight_quant_tiles(WeightView& w);
// Backend::prepare_weight: the layouts the gemms above stream fastest (see each kernel's file).
void prepare_weight(WeightView& w);
void prepare_weight_i8(WeightView& w);
// The int8 panel layout and kernel (gemm_i8_panels_cpu.cpp), used by gemm_i8.
inline constexpr int32_t kI8PackedPanels = 1 << 8;  // kernel_variant flag
inline constexpr int32_t kI8OffsetPanels = 1 << 9;  // and their whole quads hold w + 128 (VNNI)
inline constexpr int64_t kI8DecodeClaimPanels = 4;  // a decode thread claims panels in groups of this many
void prepare_weight_i8_panels(WeightView& w, bool offset);
int64_t i8_panel_rows(const WeightView& w);  // rows [0, this) are in panels; 0 when not packed
int64_t x_quad_blocks(int64_t m);
// Rows of x in 6-row blocks [b0, b1) as the panel kernels read them; for offset panels, also
// x_offset[i] = 128 · (row i's sum over its whole quads).
void pack_x_quads(const int8_t* xq, int64_t m, int64_t k, int64_t b0, int64_t b1, bool offset, int32_t* xp,
                  int32_t* x_offset);
// Prefill (m > 1, k a multiple of 64) of panels [q0, q1) on Intel AMX (gemm_i8_amx_cpu.cpp): the
// same bits as gemm_i8_panels, from the quantized rows xq. amx_int8_usable: the CPU has AMX-INT8,
// Linux lets the process use the tiles, and TESSERA_CPU_ISA does not cap the kernels.
bool amx_int8_usable();
void gemm_i8_amx(const int8_t* xq, const float* sx, int64_t m, const WeightView& w, int64_t q0, int64_t q1, float* y);
class PanelOut;
void gemm_i8_panels(const int32_t* xp, const int32_t* x_offset, const int8_t* xq, const float* sx, int64_t m,
                    const WeightView& w, int64_t q0, int64_t q1, const PanelOut& out, bool vnni);
// Backend::gemm_parts on packed int8 panels, for a batch (m > 1) whose parts are whole panels and
// that does not run on AMX; false, writing nothing, otherwise.
bool gemm_i8_parts(const float* x, int64_t m, const WeightView& w, const OutputPart* parts, size_t n_parts);
void prepare_weight_f32(WeightView& w);
// y columns of the packed f32 panels; returns how many leading rows of W it computed (0 when the
// view is not packed).
int64_t gemm_f32_panels(const float* x, int64_t m, const WeightView& w, float* y);
// Backend::gemm_parts on packed f32 panels, for a batch (m > 1) whose parts are whole panels
// (cols multiples of 16); false, writing nothing, otherwise.
bool gemm_f32_parts(const float* x, int64_t m, const WeightView& w, const OutputPart* parts, size_t n_parts);
void prepare_weight_i4(WeightView& w);
// Rows [r0, r1) of an int4 view as a view of their own (r0 a multiple of 8: a band's first row).
WeightView i4_rows(const WeightView& w, int64_t r0, int64_t r1);
// Backend::gemv_many (gemv_many_cpu.cpp).
bool gemv_many(const float* x, const WeightView* views, float* const* ys, size_t n);
// Backend::gemv_shares and gemv_share (gemv_many_cpu.cpp): thread t of nt's part of gemv_many.
bool gemv_shares(const WeightView* views, size_t n);
void gemv_share(const float* x, const WeightView* views, float* const* ys, size_t n, int t, int nt);
bool gemm_supports(DType dtype);
void rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim, float eps);
void rope(float* x, const int32_t* positions, int64_t rows, int64_t n_heads, int64_t head_dim,
          int64_t rope_dim, float theta, RopeStyle style);
void rope_freqs(float* x, const int32_t* positions, int64_t rows, int64_t n_heads, int64_t head_dim,
                int64_t rope_dim, const float* inv_freq, float mscale, RopeStyle style);
void silu_mul(const float* gate, const float* up, float* out, int64_t n);
void gelu_mul(const float* gate, const float* up, float* out, int64_t n);
void add(const float* a, const float* b, float* out, int64_t n);
void add_rows(float* x, const float* row, int64_t rows, int64_t cols);
void scale(float* x, float s, int64_t n);
void softmax(float* x, int64_t rows, int64_t cols);
void kv_write(const KvLayerView& kv, const float* k, const float* v, const int32_t* slots, int64_t rows);
void attention(const AttentionArgs& args, const KvLayerView& kv);
void attention_block_scores(const AttentionArgs& args, const KvLayerView& kv, float* scores);
void argmax(const float* logits, int64_t rows, int64_t cols, int32_t* out);

// Row of any supported weight type to float (vectorised for f16 and bf16).
void unpack_row(DType dtype, const void* src, float* dst, int64_t n);
// The KV cache types the CPU kernels read and write.
inline bool kv_type_supported(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }
// Float row to F32, F16 or BF16, rounding to nearest even (the KV cache's stores).
void pack_row(DType dtype, const float* src, void* dst, int64_t n);

// Dot product of two float vectors (AVX2+FMA when the CPU has it).
float dot_f32(const float* a, const float* b, int64_t n);

}  // namespace tessera::cpu
