// Owning handle to backend memory. The backend must outlive the buffer.
#pragma once

#include <cstddef>
#include <utility>

#include "tessera/backend.h"

namespace tessera {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend& backend, size_t bytes)
      : backend_(&backend), ptr_(bytes ? backend.allocate(bytes) : nullptr), bytes_(bytes) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : backend_(o.backend_), ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      backend_ = o.backend_;
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void reset() noexcept {
    if (ptr_ != nullptr) backend_->deallocate(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  // Grows to at least `bytes` (contents are not kept).
  void ensure(Backend& backend, size_t bytes) {
    if (bytes_ >= bytes && backend_ == &backend) return;
    reset();
    backend_ = &backend;
    ptr_ = backend.allocate(bytes);
    bytes_ = bytes;
  }
  void upload(const void* src, size_t bytes) { backend_->copy_to_device(ptr_, src, bytes); }

  void* get() const { return ptr_; }
  template <class T> T* as() const { return static_cast<T*>(ptr_); }
  size_t size() const { return bytes_; }

 private:
  Backend* backend_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace tessera
