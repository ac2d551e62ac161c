#include "tessera/host_arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>

// Linux 6.1's value, for C libraries whose headers predate it.
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

namespace tessera {

namespace {

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

void* map_huge_pages(size_t bytes) {
  const size_t size = round_up(bytes == 0 ? 1 : bytes, kHugePageBytes);
  // Map one huge page more than needed and trim both ends to a 2 MiB boundary.
  void* raw = mmap(nullptr, size + kHugePageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = round_up(start, kHugePageBytes);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + size + kHugePageBytes;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - (aligned + size));
  // Advice, not a requirement: with huge pages disabled the mapping still works on small pages.
  madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(aligned);
}

bool back_with_huge_pages(const void* p, size_t bytes) noexcept {
  const uintptr_t begin = round_up(reinterpret_cast<uintptr_t>(p), kHugePageBytes);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) / kHugePageBytes * kHugePageBytes;
  if (end <= begin) return false;
  void* at = reinterpret_cast<void*>(begin);
  // Advice only: where the kernel refuses either call the range keeps working on small pages.
  madvise(at, end - begin, MADV_HUGEPAGE);
  return madvise(at, end - begin, MADV_COLLAPSE) == 0;
}

void unmap_huge_pages(void* p, size_t bytes) noexcept {
  if (p != nullptr) munmap(p, round_up(bytes == 0 ? 1 : bytes, kHugePageBytes));
}

HostArena::HostArena(size_t slab_bytes, size_t min_bytes)
    : slab_bytes_(round_up(slab_bytes, kHugePageBytes)), min_bytes_(min_bytes) {}

HostArena::~HostArena() {
  for (auto& [base, slab] : slabs_) unmap_huge_pages(reinterpret_cast<void*>(base), slab_bytes_);
}

void* HostArena::carve(uintptr_t base, Slab& r, size_t bytes) {
  for (auto it = r.free.begin(); it != r.free.end(); ++it) {
    const auto [offset, length] = *it;
    if (length < bytes) continue;
    r.free.erase(it);
    if (length > bytes) r.free.emplace(offset + bytes, length - bytes);
    r.used.emplace(offset, bytes);
    return reinterpret_cast<void*>(base + offset);
  }
  return nullptr;
}

void* HostArena::allocate(size_t bytes) {
  if (bytes < min_bytes_ || bytes > slab_bytes_ / 2) return std::aligned_alloc(64, round_up(bytes == 0 ? 1 : bytes, 64));
  const size_t size = round_up(bytes, 64);
  std::lock_guard lock(mu_);
  for (auto& [base, slab] : slabs_) {
    if (void* p = carve(base, slab, size)) return p;
  }
  void* mapping = map_huge_pages(slab_bytes_);
  if (mapping == nullptr) return nullptr;
  // Fault the slab in now: a huge page's first touch costs from 0.2 to several ms inside a virtual
  // machine, which must not land on a request's first step (scratch buffers share the slabs).
  auto* bytes_of = static_cast<volatile char*>(mapping);
  for (size_t o = 0; o < slab_bytes_; o += 4096) bytes_of[o] = 0;
  const auto base = reinterpret_cast<uintptr_t>(mapping);
  Slab& slab = slabs_[base];
  slab.free.emplace(0, slab_bytes_);
  return carve(base, slab, size);
}

void HostArena::deallocate(void* p) noexcept {
  if (p == nullptr) return;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::lock_guard lock(mu_);
  auto it = slabs_.upper_bound(addr);
  if (it == slabs_.begin() || addr >= std::prev(it)->first + slab_bytes_) {
    std::free(p);  // a small or a large block, from malloc
    return;
  }
  --it;
  Slab& slab = it->second;
  const auto used = slab.used.find(addr - it->first);
  if (used == slab.used.end()) return;  // not a block start: nothing this arena handed out
  size_t offset = used->first, length = used->second;
  slab.used.erase(used);
  // Coalesce with the free neighbours.
  auto next = slab.free.lower_bound(offset);
  if (next != slab.free.end() && next->first == offset + length) {
    length += next->second;
    next = slab.free.erase(next);
  }
  if (next != slab.free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      length += prev->second;
      slab.free.erase(prev);
    }
  }
  slab.free.emplace(offset, length);
  if (!slab.used.empty()) return;
  // An empty slab is unmapped unless it is the only empty one, kept for the next allocation.
  const bool another_empty = std::any_of(slabs_.begin(), slabs_.end(), [&](const auto& e) {
    return e.first != it->first && e.second.used.empty();
  });
  if (another_empty) {
    unmap_huge_pages(reinterpret_cast<void*>(it->first), slab_bytes_);
    slabs_.erase(it);
  }
}

size_t HostArena::mapped_bytes() const {
  std::lock_guard lock(mu_);
  return slabs_.size() * slab_bytes_;
}

}  // namespace tessera
