// Writes GGUF v3 files (little-endian) to the letter of the spec, so that GgufFile and other
// readers accept them: metadata of every value type, tensor infos, then the tensors packed in
// order (as ggml's reader requires) at offsets aligned to general.alignment (default 32), with
// zeroed padding after each one.
//
// Tensor data can be given as bytes or as a callback that fills the tensor's bytes when write()
// reaches it, so a multi-gigabyte model is streamed one tensor at a time. write() goes to
// "<path>.tmp" and renames it over <path> only when complete: an error never leaves a partial file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "tessera/dtype.h"
#include "tessera/gguf.h"

namespace tessera {

class GgufWriter {
 public:
  // Fills dst with exactly nbytes of tensor data (called once per tensor, in order, by write()).
  using TensorFill = std::function<void(uint8_t* dst, size_t nbytes)>;

  // Metadata, in the order added. Keys must be unique and non-empty; "general.alignment" must be a
  // uint32 power of two and also sets the data alignment.
  void add_uint8(const std::string& key, uint8_t v);
  void add_int8(const std::string& key, int8_t v);
  void add_uint16(const std::string& key, uint16_t v);
  void add_int16(const std::string& key, int16_t v);
  void add_uint32(const std::string& key, uint32_t v);
  void add_int32(const std::string& key, int32_t v);
  void add_uint64(const std::string& key, uint64_t v);
  void add_int64(const std::string& key, int64_t v);
  void add_float32(const std::string& key, float v);
  void add_float64(const std::string& key, double v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);
  void add_string_array(const std::string& key, std::span<const std::string> v);
  void add_float32_array(const std::string& key, std::span<const float> v);
  void add_float64_array(const std::string& key, std::span<const double> v);
  void add_int32_array(const std::string& key, std::span<const int32_t> v);
  void add_uint32_array(const std::string& key, std::span<const uint32_t> v);
  void add_int64_array(const std::string& key, std::span<const int64_t> v);
  void add_uint8_array(const std::string& key, std::span<const uint8_t> v);
  void add_bool_array(const std::string& key, std::span<const bool> v);
  // Sets general.alignment (adds the key).
  void set_alignment(uint32_t alignment);
  uint32_t alignment() const { return alignment_; }

  // Tensors, in file order. shape is in ggml order (shape[0] = row length), 1 to 4 dimensions;
  // shape[0] must be a whole number of dtype blocks. Names are unique and at most 63 bytes.
  void add_tensor(const std::string& name, std::vector<int64_t> shape, DType dtype,
                  std::vector<uint8_t> data);
  void add_tensor(const std::string& name, std::vector<int64_t> shape, DType dtype, TensorFill fill);

  // Bytes of the finished file (header, metadata, infos, padding and data).
  uint64_t file_size() const;
  size_t tensor_count() const { return tensors_.size(); }

  // Writes the file; throws Error naming the path on any failure (the target is left untouched).
  void write(const std::string& path) const;

  // The ggml type id of a dtype in GGUF tensor infos; throws for types GGUF cannot hold.
  static uint32_t ggml_type_id(DType t);

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    DType dtype;
    size_t nbytes;
    std::vector<uint8_t> data;
    TensorFill fill;
  };
  void add_kv(const std::string& key, GgufType type, std::string payload);
  Tensor& new_tensor(const std::string& name, std::vector<int64_t> shape, DType dtype);
  uint64_t padded(uint64_t n) const { return (n + alignment_ - 1) / alignment_ * alignment_; }
  std::string header_bytes() const;  // header, metadata and tensor infos, unpadded

  std::vector<std::pair<std::string, std::string>> kv_;  // key, encoded type + value
  std::vector<Tensor> tensors_;
  std::unordered_set<std::string> keys_, tensor_names_;  // duplicates refused in constant time
  uint32_t alignment_ = 32;
};

}  // namespace tessera
