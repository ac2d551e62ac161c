#include "tessera/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <string>

#include "tessera/error.h"

namespace tessera {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint32_t kMaxDims = 4;         // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;        // bounds recursion on hostile nested arrays
constexpr uint64_t kDefaultAlignment = 32;

// Smallest encoding of one element of each type; an array/count that claims more elements than
// the remaining bytes could hold at this size is refused before anything is allocated.
uint64_t min_encoded_size(GgufType t) {
  switch (t) {
    case GgufType::UINT8:
    case GgufType::INT8:
    case GgufType::BOOL: return 1;
    case GgufType::UINT16:
    case GgufType::INT16: return 2;
    case GgufType::UINT32:
    case GgufType::INT32:
    case GgufType::FLOAT32: return 4;
    case GgufType::UINT64:
    case GgufType::INT64:
    case GgufType::FLOAT64:
    case GgufType::STRING: return 8;   // the length prefix
    case GgufType::ARRAY: return 12;   // element type + count
  }
  return 1;
}

bool valid_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::FLOAT64); }

// ggml type ids, for naming the ones we refuse.
std::string_view ggml_type_name(uint32_t id) {
  static constexpr std::string_view kNames[] = {
      "F32",     "F16",    "Q4_0",    "Q4_1",   "Q4_2 (removed)", "Q4_3 (removed)", "Q5_0",
      "Q5_1",    "Q8_0",   "Q8_1",    "Q2_K",   "Q3_K",           "Q4_K",           "Q5_K",
      "Q6_K",    "Q8_K",   "IQ2_XXS", "IQ2_XS", "IQ3_XXS",        "IQ1_S",          "IQ4_NL",
      "IQ3_S",   "IQ2_S",  "IQ4_XS",  "I8",     "I16",            "I32",            "I64",
      "F64",     "IQ1_M",  "BF16",    "Q4_0_4_4 (removed)", "Q4_0_4_8 (removed)",
      "Q4_0_8_8 (removed)", "TQ1_0", "TQ2_0", "IQ4_NL_4_4 (removed)", "IQ4_NL_4_8 (removed)",
      "IQ4_NL_8_8 (removed)", "MXFP4"};
  if (id < std::size(kNames)) return kNames[id];
  return {};
}

std::optional<DType> dtype_from_ggml(uint32_t id) {
  switch (id) {
    case 0: return DType::F32;
    case 1: return DType::F16;
    case 2: return DType::Q4_0;
    case 3: return DType::Q4_1;
    case 6: return DType::Q5_0;
    case 7: return DType::Q5_1;
    case 8: return DType::Q8_0;
    case 10: return DType::Q2_K;
    case 11: return DType::Q3_K;
    case 12: return DType::Q4_K;
    case 13: return DType::Q5_K;
    case 14: return DType::Q6_K;
    case 16: return DType::IQ2_XXS;
    case 17: return DType::IQ2_XS;
    case 18: return DType::IQ3_XXS;
    case 20: return DType::IQ4_NL;
    case 21: return DType::IQ3_S;
    case 22: return DType::IQ2_S;
    case 23: return DType::IQ4_XS;
    case 24: return DType::I8;
    case 26: return DType::I32;
    case 30: return DType::BF16;
    default: return std::nullopt;
  }
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t& out) { return __builtin_mul_overflow(a, b, &out); }

// Sequential little-endian reader over the mapping; every read is checked against the file size.
// `field` names what is being read; `index` >= 0 adds "element #index" (only formatted on failure,
// so reading a 200k-entry array builds no strings).
class Reader {
 public:
  Reader(const std::string& path, const uint8_t* base, size_t size)
      : path_(path), base_(base), size_(size) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  [[noreturn]] void fail(uint64_t at, std::string_view field, const std::string& msg,
                         int64_t index = -1) const {
    std::string where = path_ + ": offset " + std::to_string(at) + ": " + std::string(field);
    if (index >= 0) where += ": element #" + std::to_string(index);
    throw Error(where + ": " + msg);
  }

  void need(uint64_t n, std::string_view field, int64_t index = -1) const {
    if (n > remaining()) {
      fail(pos_, field,
           "needs " + std::to_string(n) + " bytes but only " + std::to_string(remaining()) +
               " remain (file size " + std::to_string(size_) + " bytes; truncated?)",
           index);
    }
  }

  template <typename T>
  T read(std::string_view field, int64_t index = -1) {
    need(sizeof(T), field, index);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string_view read_string(std::string_view field, int64_t index = -1) {
    const size_t at = pos_;
    const uint64_t len = read<uint64_t>(field, index);
    if (len > remaining()) {
      fail(at, field,
           "string length " + std::to_string(len) + " exceeds the file size (" +
               std::to_string(size_) + " bytes; " + std::to_string(remaining()) + " remain)",
           index);
    }
    std::string_view s(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return s;
  }

  // Validates a count against the bytes left before anything is sized from it.
  void check_count(uint64_t at, uint64_t count, uint64_t min_each, std::string_view field,
                   std::string_view what, int64_t index = -1) const {
    if (count > remaining() / min_each) {
      fail(at, field,
           std::string(what) + " " + std::to_string(count) + " is more than the file can hold (" +
               std::to_string(remaining()) + " bytes remain, at least " + std::to_string(min_each) +
               " needed per entry; file size " + std::to_string(size_) + " bytes)",
           index);
    }
  }

 private:
  const std::string& path_;
  const uint8_t* base_;
  size_t size_;
  size_t pos_ = 0;
};

// Reads one integer of type t into int64 (uint64 bit for bit).
int64_t read_int(Reader& r, GgufType t, std::string_view field, int64_t index) {
  switch (t) {
    case GgufType::UINT8: return r.read<uint8_t>(field, index);
    case GgufType::INT8: return r.read<int8_t>(field, index);
    case GgufType::UINT16: return r.read<uint16_t>(field, index);
    case GgufType::INT16: return r.read<int16_t>(field, index);
    case GgufType::UINT32: return r.read<uint32_t>(field, index);
    case GgufType::INT32: return r.read<int32_t>(field, index);
    case GgufType::UINT64: return static_cast<int64_t>(r.read<uint64_t>(field, index));
    case GgufType::INT64: return r.read<int64_t>(field, index);
    default: break;
  }
  return 0;
}

bool is_unsigned(GgufType t) {
  return t == GgufType::UINT8 || t == GgufType::UINT16 || t == GgufType::UINT32 ||
         t == GgufType::UINT64;
}

void read_array(Reader& r, GgufValue& out, const std::string& field, int depth) {
  const size_t type_at = r.pos();
  const uint32_t et = r.read<uint32_t>(field + ": array element type");
  if (!valid_type(et)) {
    r.fail(type_at, field, "array element type " + std::to_string(et) + " is not a GGUF type");
  }
  const auto elem = static_cast<GgufType>(et);
  if (elem == GgufType::ARRAY && depth + 1 >= kMaxArrayDepth) {
    r.fail(type_at, field,
           "arrays nested deeper than " + std::to_string(kMaxArrayDepth) + " levels");
  }
  const size_t count_at = r.pos();
  const uint64_t count = r.read<uint64_t>(field + ": array length");
  r.check_count(count_at, count, min_encoded_size(elem), field, "array length");
  out.elem_type = elem;
  // Vectors grow as elements are actually read (reserve is capped), so memory follows the bytes
  // present in the file, not the count it claims.
  const auto n = static_cast<int64_t>(count);
  const auto reserve = [count](auto& v, uint64_t cap) { v.reserve(static_cast<size_t>(std::min(count, cap))); };
  switch (elem) {
    case GgufType::FLOAT32:
      reserve(out.floats, 1u << 20);
      for (int64_t i = 0; i < n; ++i) out.floats.push_back(r.read<float>(field, i));
      break;
    case GgufType::FLOAT64:
      reserve(out.floats, 1u << 20);
      for (int64_t i = 0; i < n; ++i) out.floats.push_back(r.read<double>(field, i));
      break;
    case GgufType::BOOL:
      reserve(out.ints, 1u << 20);
      for (int64_t i = 0; i < n; ++i) out.ints.push_back(r.read<uint8_t>(field, i) != 0);
      break;
    case GgufType::STRING:
      reserve(out.strings, 1u << 18);
      for (int64_t i = 0; i < n; ++i) out.strings.emplace_back(r.read_string(field, i));
      break;
    case GgufType::ARRAY:
      reserve(out.arrays, 1u << 12);
      for (int64_t i = 0; i < n; ++i) {
        GgufValue& item = out.arrays.emplace_back();
        item.type = GgufType::ARRAY;
        read_array(r, item, field + ": element #" + std::to_string(i), depth + 1);
      }
      break;
    default:  // integer types
      reserve(out.ints, 1u << 20);
      for (int64_t i = 0; i < n; ++i) out.ints.push_back(read_int(r, elem, field, i));
      break;
  }
}

void read_value(Reader& r, GgufType type, GgufValue& out, const std::string& field) {
  out.type = type;
  switch (type) {
    case GgufType::FLOAT32: out.scalar = static_cast<double>(r.read<float>(field)); break;
    case GgufType::FLOAT64: out.scalar = r.read<double>(field); break;
    case GgufType::BOOL: out.scalar = r.read<uint8_t>(field) != 0; break;
    case GgufType::STRING: out.scalar = std::string(r.read_string(field)); break;
    case GgufType::ARRAY: read_array(r, out, field, 0); break;
    default:
      if (is_unsigned(type)) {
        out.scalar = static_cast<uint64_t>(read_int(r, type, field, -1));
      } else {
        out.scalar = read_int(r, type, field, -1);
      }
      break;
  }
}

std::string quoted(std::string_view s) {
  // Keys come from untrusted files: keep messages printable and short.
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < 80; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  }
  if (s.size() > 80) out += "...";
  return out + "'";
}

// Mapped file owned by a GgufFile; unmapped in its destructor.
struct Mapping {
  const uint8_t* base = nullptr;
  size_t size = 0;
};

Mapping map_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer before fstat could refuse it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw Error(path + ": cannot stat: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": not a regular file");
  }
  Mapping m;
  m.size = static_cast<size_t>(st.st_size);
  if (m.size == 0) {
    ::close(fd);
    throw Error(path + ": offset 0: header: the file is empty (0 bytes), not a GGUF file");
  }
  void* p = ::mmap(nullptr, m.size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);  // the mapping keeps its own reference to the file
  if (p == MAP_FAILED) throw Error(path + ": cannot mmap: " + std::strerror(e));
  m.base = static_cast<const uint8_t*>(p);
  return m;
}

}  // namespace

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::UINT8: return "uint8";
    case GgufType::INT8: return "int8";
    case GgufType::UINT16: return "uint16";
    case GgufType::INT16: return "int16";
    case GgufType::UINT32: return "uint32";
    case GgufType::INT32: return "int32";
    case GgufType::FLOAT32: return "float32";
    case GgufType::BOOL: return "bool";
    case GgufType::STRING: return "string";
    case GgufType::ARRAY: return "array";
    case GgufType::UINT64: return "uint64";
    case GgufType::INT64: return "int64";
    case GgufType::FLOAT64: return "float64";
  }
  return "?";
}

bool gguf_type_is_integer(GgufType t) {
  switch (t) {
    case GgufType::UINT8:
    case GgufType::INT8:
    case GgufType::UINT16:
    case GgufType::INT16:
    case GgufType::UINT32:
    case GgufType::INT32:
    case GgufType::UINT64:
    case GgufType::INT64: return true;
    default: return false;
  }
}

size_t GgufValue::array_size() const {
  if (type != GgufType::ARRAY) return 0;
  switch (elem_type) {
    case GgufType::FLOAT32:
    case GgufType::FLOAT64: return floats.size();
    case GgufType::STRING: return strings.size();
    case GgufType::ARRAY: return arrays.size();
    default: return ints.size();
  }
}

std::string GgufValue::type_str() const {
  if (type != GgufType::ARRAY) return std::string(gguf_type_name(type));
  return "array of " + std::string(gguf_type_name(elem_type));
}

int64_t GgufTensor::rows() const {
  int64_t r = 1;
  for (size_t i = 1; i < shape.size(); ++i) r *= shape[i];
  return r;
}

int64_t GgufTensor::row_length() const { return shape.empty() ? 1 : shape[0]; }

int64_t GgufTensor::elements() const { return row_length() * rows(); }

std::shared_ptr<const GgufFile> GgufFile::open(const std::string& path) {
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  const Mapping m = map_file(path);
  f->base_ = m.base;  // owned from here on: a parse error unmaps through the destructor
  f->size_ = m.size;
  f->parse();
  return f;
}

GgufFile::~GgufFile() {
  if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), size_);
}

void GgufFile::parse() {
  Reader r(path_, base_, size_);

  // Header: magic, version, then (v2+) 64-bit tensor and key/value counts.
  const uint32_t magic = r.read<uint32_t>("header: magic");
  if (magic != kMagic) {
    // As text where the four bytes are printable, else in hex (a NUL would end the message).
    unsigned char bytes[4];
    std::memcpy(bytes, &magic, 4);
    const bool printable = std::all_of(bytes, bytes + 4, [](unsigned char c) { return c >= 0x20 && c < 0x7f; });
    std::string found = printable ? "'" + std::string(reinterpret_cast<const char*>(bytes), 4) + "'" : "bytes";
    if (!printable) {
      for (const unsigned char c : bytes) {
        const char digits[] = "0123456789abcdef";
        found += std::string(" ") + digits[c >> 4] + digits[c & 15];
      }
    }
    r.fail(0, "header: magic", "expected 'GGUF', found " + found + " (not a GGUF file?)");
  }
  version_ = r.read<uint32_t>("header: version");
  if (version_ != 2 && version_ != 3) {
    const uint32_t swapped = __builtin_bswap32(version_);
    std::string msg = "unsupported GGUF version " + std::to_string(version_) + " (supported: 2, 3)";
    if (swapped == 2 || swapped == 3) msg += "; this looks like a big-endian GGUF file";
    r.fail(4, "header: version", msg);
  }
  const size_t n_tensors_at = r.pos();
  const uint64_t n_tensors = r.read<uint64_t>("header: n_tensors");
  const size_t n_kv_at = r.pos();
  const uint64_t n_kv = r.read<uint64_t>("header: n_kv");
  // Lower bounds: a tensor info takes at least 8+4+4+8 bytes, a key/value at least 8+4+1.
  r.check_count(n_tensors_at, n_tensors, 24, "header: n_tensors", "tensor count");
  r.check_count(n_kv_at, n_kv, 13, "header: n_kv", "key/value count");

  // Metadata.
  kv_.reserve(std::min<uint64_t>(n_kv, 4096));
  std::optional<size_t> alignment_at;
  for (uint64_t i = 0; i < n_kv; ++i) {
    const size_t key_at = r.pos();
    const std::string key_field = "metadata key #" + std::to_string(i);
    const std::string_view key = r.read_string(key_field + ": key");
    const std::string field = key_field + " (" + quoted(key) + ")";
    if (kv_index_.find(key) != kv_index_.end()) r.fail(key_at, field, "duplicate key");
    const size_t type_at = r.pos();
    const uint32_t t = r.read<uint32_t>(field + ": value type");
    if (!valid_type(t)) {
      r.fail(type_at, field, "value type " + std::to_string(t) + " is not a GGUF type");
    }
    if (key == "general.alignment") alignment_at = r.pos();
    GgufValue v;
    read_value(r, static_cast<GgufType>(t), v, field);
    kv_index_.emplace(std::string(key), kv_.size());
    kv_.emplace_back(std::string(key), std::move(v));
  }

  if (alignment_at) {
    const GgufValue& v = kv_[kv_index_.find("general.alignment")->second].second;
    const std::string field = "metadata 'general.alignment'";
    if (!gguf_type_is_integer(v.type)) {
      r.fail(*alignment_at, field, "type " + v.type_str() + ", expected an integer (uint32)");
    }
    const auto* u = std::get_if<uint64_t>(&v.scalar);
    const auto* s = std::get_if<int64_t>(&v.scalar);
    const uint64_t a = u ? *u : (*s < 0 ? 0 : static_cast<uint64_t>(*s));
    if (a == 0 || (a & (a - 1)) != 0 || a > (1u << 30)) {
      const std::string shown = u ? std::to_string(*u) : std::to_string(*s);  // as stored, sign included
      r.fail(*alignment_at, field, "alignment " + shown + " is not a power of two up to 2^30");
    }
    alignment_ = a;
  } else {
    alignment_ = kDefaultAlignment;
  }

  // Tensor infos: name, n_dims, dims, ggml type, offset relative to the data section.
  std::vector<size_t> offset_field_at;
  tensors_.reserve(std::min<uint64_t>(n_tensors, 4096));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const std::string idx_field = "tensor #" + std::to_string(i);
    const size_t name_at = r.pos();
    GgufTensor t;
    t.name = std::string(r.read_string(idx_field + ": name"));
    const std::string field = idx_field + " (" + quoted(t.name) + ")";
    if (tensor_index_.find(t.name) != tensor_index_.end()) r.fail(name_at, field, "duplicate tensor name");

    const size_t dims_at = r.pos();
    const uint32_t n_dims = r.read<uint32_t>(field + ": n_dims");
    if (n_dims == 0 || n_dims > kMaxDims) {
      r.fail(dims_at, field, "n_dims " + std::to_string(n_dims) + " is outside 1.." + std::to_string(kMaxDims));
    }
    uint64_t elems = 1;
    std::string dims;  // the dimensions read so far, for the error
    for (uint32_t d = 0; d < n_dims; ++d) {
      const size_t at = r.pos();
      const uint64_t ne = r.read<uint64_t>(field + ": dimension " + std::to_string(d));
      dims += (d == 0 ? "" : ", ") + std::to_string(ne);
      if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        r.fail(at, field, "dimension " + std::to_string(d) + " = " + std::to_string(ne) + " is over int64's maximum");
      }
      if (mul_overflows(elems, ne, elems) || elems > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        r.fail(at, field, "dimensions [" + dims + "] make the element count overflow int64");
      }
      t.shape.push_back(static_cast<int64_t>(ne));
    }

    const size_t type_at = r.pos();
    const uint32_t type_id = r.read<uint32_t>(field + ": type");
    const auto dt = dtype_from_ggml(type_id);
    if (!dt) {
      const std::string_view nm = ggml_type_name(type_id);
      r.fail(type_at, field,
             "ggml type " + std::to_string(type_id) + (nm.empty() ? "" : " (" + std::string(nm) + ")") +
                 " is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, "
                 "Q4_K, Q5_K, Q6_K, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, I8, I32)");
    }
    t.dtype = *dt;
    const int64_t block = dtype_block_elems(t.dtype);
    if (t.shape[0] % block != 0) {
      r.fail(type_at, field,
             "row length " + std::to_string(t.shape[0]) + " is not a multiple of the " +
                 std::string(dtype_name(t.dtype)) + " block size (" + std::to_string(block) + ")");
    }
    uint64_t nbytes = 0;
    if (mul_overflows(elems / static_cast<uint64_t>(block), dtype_block_bytes(t.dtype), nbytes) ||
        nbytes > size_) {
      r.fail(type_at, field,
             "data size of " + std::to_string(elems) + " " + std::string(dtype_name(t.dtype)) +
                 " elements exceeds the file size (" + std::to_string(size_) + " bytes)");
    }
    t.nbytes = static_cast<size_t>(nbytes);
    offset_field_at.push_back(r.pos());
    t.offset = r.read<uint64_t>(field + ": data offset");  // relative for now
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment.
  const uint64_t end_of_infos = r.pos();
  data_offset_ = (end_of_infos + alignment_ - 1) / alignment_ * alignment_;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    GgufTensor& t = tensors_[i];
    const std::string field = "tensor #" + std::to_string(i) + " (" + quoted(t.name) + "): data offset";
    const uint64_t rel = t.offset;
    if (rel % alignment_ != 0) {
      r.fail(offset_field_at[i], field,
             "offset " + std::to_string(rel) + " is not a multiple of the alignment (" +
                 std::to_string(alignment_) + ")");
    }
    uint64_t begin = 0, end = 0;
    if (__builtin_add_overflow(data_offset_, rel, &begin) ||
        __builtin_add_overflow(begin, static_cast<uint64_t>(t.nbytes), &end) || end > size_) {
      r.fail(offset_field_at[i], field,
             "data [" + std::to_string(data_offset_) + " + " + std::to_string(rel) + ", +" +
                 std::to_string(t.nbytes) + " bytes) lies outside the file (" + std::to_string(size_) +
                 " bytes; truncated?)");
    }
    t.offset = begin;
    t.data = base_ + begin;
  }
}

const GgufValue* GgufFile::find(std::string_view key) const {
  const auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufValue& GgufFile::require(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) throw Error(path_ + ": metadata key '" + std::string(key) + "' not found");
  return *v;
}

void GgufFile::type_error(std::string_view key, const GgufValue& v, std::string_view expected) const {
  throw Error(path_ + ": metadata key '" + std::string(key) + "' has type " + v.type_str() +
              ", expected " + std::string(expected));
}

namespace {

// Integer scalar as int64; nullopt when a uint64 does not fit.
std::optional<int64_t> scalar_int(const GgufValue& v) {
  if (const auto* u = std::get_if<uint64_t>(&v.scalar)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(*u);
  }
  return std::get<int64_t>(v.scalar);
}

}  // namespace

std::string GgufFile::get_string(std::string_view key) const {
  const GgufValue& v = require(key);
  if (v.type != GgufType::STRING) type_error(key, v, "string");
  return std::get<std::string>(v.scalar);
}

int64_t GgufFile::get_int(std::string_view key) const {
  const GgufValue& v = require(key);
  if (!gguf_type_is_integer(v.type)) type_error(key, v, "an integer");
  const auto i = scalar_int(v);
  if (!i) {
    throw Error(path_ + ": metadata key '" + std::string(key) + "': value " +
                std::to_string(std::get<uint64_t>(v.scalar)) + " does not fit int64");
  }
  return *i;
}

int64_t GgufFile::get_int(std::string_view key, int64_t fallback) const {
  return find(key) ? get_int(key) : fallback;
}

double GgufFile::get_float(std::string_view key) const {
  const GgufValue& v = require(key);
  if (v.type == GgufType::FLOAT32 || v.type == GgufType::FLOAT64) return std::get<double>(v.scalar);
  if (!gguf_type_is_integer(v.type)) type_error(key, v, "a float or an integer");
  if (const auto* u = std::get_if<uint64_t>(&v.scalar)) return static_cast<double>(*u);
  return static_cast<double>(std::get<int64_t>(v.scalar));
}

double GgufFile::get_float(std::string_view key, double fallback) const {
  return find(key) ? get_float(key) : fallback;
}

bool GgufFile::get_bool(std::string_view key, bool fallback) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return fallback;
  if (v->type != GgufType::BOOL) type_error(key, *v, "bool");
  return std::get<bool>(v->scalar);
}

std::vector<std::string> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue& v = require(key);
  if (v.type != GgufType::ARRAY || (v.elem_type != GgufType::STRING && v.array_size() != 0)) {
    type_error(key, v, "array of string");
  }
  return v.strings;
}

std::vector<float> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue& v = require(key);
  if (v.type != GgufType::ARRAY) type_error(key, v, "array of float32");
  if (v.elem_type == GgufType::FLOAT32 || v.elem_type == GgufType::FLOAT64) {
    return std::vector<float>(v.floats.begin(), v.floats.end());
  }
  if (!gguf_type_is_integer(v.elem_type)) {
    if (v.array_size() == 0) return {};
    type_error(key, v, "array of float32");
  }
  std::vector<float> out(v.ints.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = v.elem_type == GgufType::UINT64 ? static_cast<float>(static_cast<uint64_t>(v.ints[i]))
                                             : static_cast<float>(v.ints[i]);
  }
  return out;
}

std::vector<int32_t> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue& v = require(key);
  if (v.type != GgufType::ARRAY) type_error(key, v, "array of int32");
  if (!gguf_type_is_integer(v.elem_type)) {
    if (v.array_size() == 0) return {};
    type_error(key, v, "array of int32");
  }
  std::vector<int32_t> out(v.ints.size());
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t x = v.ints[i];
    const bool big_u64 = v.elem_type == GgufType::UINT64 && x < 0;
    if (big_u64 || x < std::numeric_limits<int32_t>::min() || x > std::numeric_limits<int32_t>::max()) {
      const std::string shown = v.elem_type == GgufType::UINT64 ? std::to_string(static_cast<uint64_t>(x))
                                                                 : std::to_string(x);
      throw Error(path_ + ": metadata key '" + std::string(key) + "': element #" + std::to_string(i) +
                  " = " + shown + " does not fit int32");
    }
    out[i] = static_cast<int32_t>(x);
  }
  return out;
}

}  // namespace tessera
