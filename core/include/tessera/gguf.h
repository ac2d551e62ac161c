// Read-only, memory-mapped GGUF (v2/v3) reader: metadata key/values and tensor descriptors.
// Every field is bounds-checked against the file size; malformed files throw tessera::Error with
// "<path>: offset <byte>: <field>: <problem>".
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "tessera/dtype.h"

namespace tessera {

enum class GgufType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};

std::string_view gguf_type_name(GgufType t);  // "uint8", ..., "array"; "?" for unknown ids
bool gguf_type_is_integer(GgufType t);         // UINT8..INT64 except FLOAT32/BOOL/STRING/ARRAY

// One metadata value. Scalars live in `scalar`: unsigned integers as uint64_t, signed as int64_t,
// FLOAT32/FLOAT64 as double, BOOL as bool, STRING as std::string. Arrays keep their elements in one
// typed vector chosen by elem_type, so a 200k-entry token list is one vector, not 200k values.
struct GgufValue {
  GgufType type = GgufType::UINT8;
  std::variant<uint64_t, int64_t, double, bool, std::string> scalar;

  // ARRAY only.
  GgufType elem_type = GgufType::UINT8;
  std::vector<int64_t> ints;         // integer and BOOL elements (UINT64 stored bit for bit)
  std::vector<double> floats;        // FLOAT32 / FLOAT64 elements
  std::vector<std::string> strings;  // STRING elements
  std::vector<GgufValue> arrays;     // nested ARRAY elements

  size_t array_size() const;    // number of elements (0 for non-arrays)
  std::string type_str() const; // "int32", "array of string", ...
};

struct GgufTensor {
  std::string name;
  std::vector<int64_t> shape;  // ggml order: shape[0] = ne0 (row length, contiguous)
  DType dtype = DType::F32;
  uint64_t offset = 0;  // absolute file offset of the data
  size_t nbytes = 0;
  const void* data = nullptr;  // points into the mapping; valid while the GgufFile lives

  int64_t rows() const;        // product of shape[1..]
  int64_t row_length() const;  // shape[0]
  int64_t elements() const;    // product of all of shape
};

class GgufFile {
 public:
  static std::shared_ptr<const GgufFile> open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  const std::string& path() const { return path_; }
  size_t file_size() const { return size_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the tensor data section

  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;

  // Throwing getters: a missing key (without fallback) or a wrong type names file, key and types.
  std::string get_string(std::string_view key) const;
  int64_t get_int(std::string_view key) const;  // any integer type
  int64_t get_int(std::string_view key, int64_t fallback) const;
  double get_float(std::string_view key) const;  // float32/float64 or any integer type
  double get_float(std::string_view key, double fallback) const;
  bool get_bool(std::string_view key, bool fallback) const;
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<float> get_float_array(std::string_view key) const;
  std::vector<int32_t> get_int_array(std::string_view key) const;  // elements must fit int32

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(std::string_view name) const;

 private:
  GgufFile() = default;
  void parse();
  const GgufValue& require(std::string_view key) const;
  [[noreturn]] void type_error(std::string_view key, const GgufValue& v,
                               std::string_view expected) const;

  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<GgufTensor> tensors_;

  // Transparent hashing so lookups by string_view allocate nothing.
  struct StrHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, size_t, StrHash, std::equal_to<>> kv_index_;
  std::unordered_map<std::string, size_t, StrHash, std::equal_to<>> tensor_index_;
};

}  // namespace tessera
