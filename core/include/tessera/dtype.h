// Element types of tensors: plain floats and integers, packed int4, and GGUF block formats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tessera {

enum class DType : uint8_t {
  F32,
  F16,
  BF16,
  I8,
  I32,
  I4,    // two 4-bit values per byte, low nibble first
  Q8_0,  // GGUF: blocks of 32, fp16 scale + 32 x int8
  Q4_0,  // GGUF: blocks of 32, fp16 scale + 16 bytes of nibbles (offset 8)
  Q4_K,  // GGUF k-quants: super-blocks of 256
  Q6_K,
  // More GGUF block formats (layouts in core/src/gguf/): blocks of 32 with a min or a fifth bit,
  // the 2/3/5-bit k-quants, and the non-linear 4-bit table (IQ4_NL blocks of 32, IQ4_XS of 256).
  Q4_1,
  Q5_0,
  Q5_1,
  Q2_K,
  Q3_K,
  Q5_K,
  IQ4_NL,
  IQ4_XS,
  // Grid (codebook) formats of 256 (tables in tessera/iq_grids.h): 8 or 4 elements per entry index,
  // with signs and 4-bit scales per 16 or 32.
  IQ2_XXS,
  IQ2_XS,
  IQ2_S,
  IQ3_XXS,
  IQ3_S,
};

// IQ4_NL and IQ4_XS: the 16 levels a 4-bit quant indexes (ggml's kvalues_iq4nl), times the scale.
inline constexpr int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

std::string_view dtype_name(DType t);
// Elements per storage block (1 for scalar types, 2 for I4, 32 for Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/IQ4_NL,
// 256 for the k-quants, IQ4_XS and the IQ2/IQ3 grid formats).
int64_t dtype_block_elems(DType t);
size_t dtype_block_bytes(DType t);
// Bytes of a row of n elements; throws Error when n is not a multiple of the block.
size_t dtype_row_bytes(DType t, int64_t n);
bool dtype_is_float(DType t);  // F32, F16, BF16

float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);  // round to nearest even

// Converts n elements of a row stored as `t` to float (every type but I8, I32 and I4).
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// The first of `rows` rows (of `cols` elements, stored as `t`) holding an infinity or a NaN, or -1:
// float elements, and the scales of block formats.
int64_t first_non_finite_row(DType t, const void* data, int64_t rows, int64_t cols);

}  // namespace tessera
