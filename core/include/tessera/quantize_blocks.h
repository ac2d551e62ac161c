// Float rows to storage formats: the inverse of dequantize_row for the formats a writer needs.
// Q8_0 and Q4_0 follow ggml's reference quantizers (quantize_row_q8_0_ref / _q4_0_ref), so files
// written with them hold the same blocks llama.cpp would write for the same floats. Q4_K and Q6_K
// write ggml's layouts from a plain range fit (see quantize_blocks.cpp), not its scale search. The
// other GGUF formats (Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS; core/src/gguf/) follow
// ggml's reference quantizers, scale searches included.
#pragma once

#include <cstdint>

#include "tessera/dtype.h"

namespace tessera {

// True for the formats quantize_row can produce: the float types and every GGUF block format.
bool quantize_supported(DType t);

// Converts n floats to one row of `t` at dst (dtype_row_bytes(t, n) bytes). Throws Error for other
// formats or when n is not a whole number of blocks.
void quantize_row(DType t, const float* src, void* dst, int64_t n);

}  // namespace tessera
