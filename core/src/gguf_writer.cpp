#include "tessera/gguf_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <future>
#include <limits>

#include "tessera/error.h"

namespace tessera {

namespace {

constexpr uint32_t kVersion = 3;
constexpr size_t kMaxName = 63;  // GGML_MAX_NAME (64) includes the terminating NUL
constexpr size_t kMaxDims = 4;

template <typename T>
void put(std::string& out, T v) {
  static_assert(std::endian::native == std::endian::little, "GGUF is written little-endian");
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

void put_string(std::string& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.append(s);
}

template <typename T>
std::string scalar(T v) {
  std::string s;
  put<T>(s, v);
  return s;
}

template <typename T>
std::string array(GgufType elem, std::span<const T> v) {
  std::string s;
  put<uint32_t>(s, static_cast<uint32_t>(elem));
  put<uint64_t>(s, v.size());
  for (const T& x : v) put<T>(s, x);
  return s;
}

// Owns the temporary file: closes it, and removes it unless commit() renamed it into place.
class TempFile {
 public:
  explicit TempFile(const std::string& path) : path_(path), tmp_(path + ".tmp") {
    if (path.empty()) throw Error("GGUF output: the file name is empty");
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(path_ + ": cannot create " + tmp_ + ": " + std::strerror(errno));
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  void write_all(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t(1) << 30));
      if (w < 0) {
        if (errno == EINTR) continue;
        throw Error(path_ + ": cannot write: " + std::strerror(errno));
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  void commit() {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw Error(path_ + ": cannot write: " + std::strerror(errno));
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      throw Error(path_ + ": cannot rename " + tmp_ + " into place: " + std::strerror(errno));
    }
    committed_ = true;
  }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

uint32_t GgufWriter::ggml_type_id(DType t) {
  switch (t) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::Q4_0: return 2;
    case DType::Q8_0: return 8;
    case DType::Q4_K: return 12;
    case DType::Q6_K: return 14;
    case DType::Q4_1: return 3;
    case DType::Q5_0: return 6;
    case DType::Q5_1: return 7;
    case DType::Q2_K: return 10;
    case DType::Q3_K: return 11;
    case DType::Q5_K: return 13;
    case DType::IQ4_NL: return 20;
    case DType::IQ4_XS: return 23;
    case DType::IQ2_XXS: return 16;
    case DType::IQ2_XS: return 17;
    case DType::IQ3_XXS: return 18;
    case DType::IQ3_S: return 21;
    case DType::IQ2_S: return 22;
    case DType::I8: return 24;
    case DType::I32: return 26;
    case DType::BF16: return 30;
    case DType::I4: break;
  }
  throw Error("GGUF has no tensor type for " + std::string(dtype_name(t)));
}

void GgufWriter::add_kv(const std::string& key, GgufType type, std::string payload) {
  if (key.empty()) throw Error("gguf writer: empty metadata key");
  if (keys_.count(key) != 0) throw Error("gguf writer: duplicate metadata key '" + key + "'");
  if (key == "general.alignment") {
    uint32_t a = 0;
    if (type == GgufType::UINT32) std::memcpy(&a, payload.data(), 4);
    if (type != GgufType::UINT32 || a == 0 || (a & (a - 1)) != 0) {
      throw Error("gguf writer: general.alignment must be a uint32 power of two");
    }
    alignment_ = a;
  }
  keys_.insert(key);
  kv_.emplace_back(key, scalar<uint32_t>(static_cast<uint32_t>(type)) + payload);
}

void GgufWriter::add_uint8(const std::string& k, uint8_t v) { add_kv(k, GgufType::UINT8, scalar(v)); }
void GgufWriter::add_int8(const std::string& k, int8_t v) { add_kv(k, GgufType::INT8, scalar(v)); }
void GgufWriter::add_uint16(const std::string& k, uint16_t v) { add_kv(k, GgufType::UINT16, scalar(v)); }
void GgufWriter::add_int16(const std::string& k, int16_t v) { add_kv(k, GgufType::INT16, scalar(v)); }
void GgufWriter::add_uint32(const std::string& k, uint32_t v) { add_kv(k, GgufType::UINT32, scalar(v)); }
void GgufWriter::add_int32(const std::string& k, int32_t v) { add_kv(k, GgufType::INT32, scalar(v)); }
void GgufWriter::add_uint64(const std::string& k, uint64_t v) { add_kv(k, GgufType::UINT64, scalar(v)); }
void GgufWriter::add_int64(const std::string& k, int64_t v) { add_kv(k, GgufType::INT64, scalar(v)); }
void GgufWriter::add_float32(const std::string& k, float v) { add_kv(k, GgufType::FLOAT32, scalar(v)); }
void GgufWriter::add_float64(const std::string& k, double v) { add_kv(k, GgufType::FLOAT64, scalar(v)); }
void GgufWriter::add_bool(const std::string& k, bool v) {
  add_kv(k, GgufType::BOOL, scalar<uint8_t>(v ? 1 : 0));
}
void GgufWriter::add_string(const std::string& k, const std::string& v) {
  std::string s;
  put_string(s, v);
  add_kv(k, GgufType::STRING, std::move(s));
}
void GgufWriter::add_string_array(const std::string& k, std::span<const std::string> v) {
  std::string s;
  put<uint32_t>(s, static_cast<uint32_t>(GgufType::STRING));
  put<uint64_t>(s, v.size());
  for (const auto& x : v) put_string(s, x);
  add_kv(k, GgufType::ARRAY, std::move(s));
}
void GgufWriter::add_float32_array(const std::string& k, std::span<const float> v) {
  add_kv(k, GgufType::ARRAY, array(GgufType::FLOAT32, v));
}
void GgufWriter::add_float64_array(const std::string& k, std::span<const double> v) {
  add_kv(k, GgufType::ARRAY, array(GgufType::FLOAT64, v));
}
void GgufWriter::add_int32_array(const std::string& k, std::span<const int32_t> v) {
  add_kv(k, GgufType::ARRAY, array(GgufType::INT32, v));
}
void GgufWriter::add_uint32_array(const std::string& k, std::span<const uint32_t> v) {
  add_kv(k, GgufType::ARRAY, array(GgufType::UINT32, v));
}
void GgufWriter::add_int64_array(const std::string& k, std::span<const int64_t> v) {
  add_kv(k, GgufType::ARRAY, array(GgufType::INT64, v));
}
void GgufWriter::add_uint8_array(const std::string& k, std::span<const uint8_t> v) {
  add_kv(k, GgufType::ARRAY, array(GgufType::UINT8, v));
}
void GgufWriter::add_bool_array(const std::string& k, std::span<const bool> v) {
  std::string s;
  put<uint32_t>(s, static_cast<uint32_t>(GgufType::BOOL));
  put<uint64_t>(s, v.size());
  for (bool x : v) put<uint8_t>(s, x ? 1 : 0);
  add_kv(k, GgufType::ARRAY, std::move(s));
}

void GgufWriter::set_alignment(uint32_t alignment) { add_uint32("general.alignment", alignment); }

GgufWriter::Tensor& GgufWriter::new_tensor(const std::string& name, std::vector<int64_t> shape, DType dtype) {
  const std::string what = "gguf writer: tensor '" + name + "'";
  if (name.empty() || name.size() > kMaxName) {
    throw Error(what + ": names must be 1 to " + std::to_string(kMaxName) + " bytes");
  }
  if (tensor_names_.count(name) != 0) throw Error(what + ": duplicate tensor name");
  if (shape.empty() || shape.size() > kMaxDims) throw Error(what + ": needs 1 to 4 dimensions");
  uint64_t elems = 1;
  for (int64_t d : shape) {
    if (d <= 0 || __builtin_mul_overflow(elems, static_cast<uint64_t>(d), &elems) ||
        elems > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw Error(what + ": dimension " + std::to_string(d) + " is not positive or overflows");
    }
  }
  ggml_type_id(dtype);
  const size_t row = dtype_row_bytes(dtype, shape[0]);  // throws for partial blocks
  Tensor t{name, std::move(shape), dtype, 0, {}, {}};
  t.nbytes = row * static_cast<size_t>(t.shape.size() > 1 ? elems / static_cast<uint64_t>(t.shape[0]) : 1);
  tensor_names_.insert(name);
  tensors_.push_back(std::move(t));
  return tensors_.back();
}

void GgufWriter::add_tensor(const std::string& name, std::vector<int64_t> shape, DType dtype,
                            std::vector<uint8_t> data) {
  Tensor& t = new_tensor(name, std::move(shape), dtype);
  if (data.size() != t.nbytes) {
    const std::string n = std::to_string(t.nbytes), got = std::to_string(data.size());
    tensors_.pop_back();
    tensor_names_.erase(name);
    throw Error("gguf writer: tensor '" + name + "': " + got + " bytes given, its shape and type need " + n);
  }
  t.data = std::move(data);
}

void GgufWriter::add_tensor(const std::string& name, std::vector<int64_t> shape, DType dtype, TensorFill fill) {
  if (!fill) throw Error("gguf writer: tensor '" + name + "': no data callback");
  new_tensor(name, std::move(shape), dtype).fill = std::move(fill);
}

std::string GgufWriter::header_bytes() const {
  std::string out = "GGUF";
  put<uint32_t>(out, kVersion);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, kv_.size());
  for (const auto& [key, value] : kv_) {
    put_string(out, key);
    out += value;
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    put_string(out, t.name);
    put<uint32_t>(out, static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) put<uint64_t>(out, static_cast<uint64_t>(d));
    put<uint32_t>(out, ggml_type_id(t.dtype));
    put<uint64_t>(out, offset);
    offset += padded(t.nbytes);
  }
  return out;
}

uint64_t GgufWriter::file_size() const {
  uint64_t size = padded(header_bytes().size());
  for (const Tensor& t : tensors_) size += padded(t.nbytes);
  return size;
}

void GgufWriter::write(const std::string& path) const {
  TempFile file(path);
  std::string head = header_bytes();
  head.resize(padded(head.size()), '\0');
  file.write_all(head.data(), head.size());

  // Two buffers: the next tensor is generated while the previous one is written. The buffers are
  // declared before the future so that an exception waits for the write before freeing them.
  std::vector<uint8_t> buffers[2];
  std::future<void> pending;
  const std::vector<uint8_t> zeros(alignment_, 0);
  int cur = 0;
  for (const Tensor& t : tensors_) {
    const uint8_t* data = t.data.data();
    if (t.fill) {
      std::vector<uint8_t>& buf = buffers[cur];
      buf.resize(t.nbytes);
      try {
        t.fill(buf.data(), t.nbytes);
      } catch (const std::exception& e) {
        if (pending.valid()) pending.wait();
        throw Error(path + ": tensor '" + t.name + "': " + e.what());
      }
      data = buf.data();
      cur ^= 1;
    }
    if (pending.valid()) pending.get();
    const size_t pad = padded(t.nbytes) - t.nbytes;
    pending = std::async(std::launch::async, [&file, &zeros, data, n = t.nbytes, pad] {
      file.write_all(data, n);
      file.write_all(zeros.data(), pad);
    });
  }
  if (pending.valid()) pending.get();
  file.commit();
}

}  // namespace tessera
