// Host memory backed by transparent huge pages, for buffers that kernels stream (a model's
// matrices). With 4 KiB pages, streaming 100 MB of weights per token walks 25,000 pages a token,
// each a TLB miss (a two-level page walk inside a virtual machine): 110m decode on this project's
// 2-core VM ran 4-8% faster on 2 MiB pages, in interleaved runs. Linux gives huge pages to
// anonymous memory only where madvise(MADV_HUGEPAGE) asks for them ("madvise" mode, the common
// default) and only for 2 MiB-aligned ranges, which separate allocations of a model's many small
// matrices never are: the arena packs them into shared 2 MiB-aligned slabs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace tessera {

inline constexpr size_t kHugePageBytes = size_t(2) << 20;

// A 2 MiB-aligned anonymous mapping of `bytes` rounded up to whole huge pages, advised to use
// them; nullptr when the mapping fails. Pages are faulted in on first touch, as with malloc.
void* map_huge_pages(size_t bytes);
void unmap_huge_pages(void* p, size_t bytes) noexcept;

// Moves the 2 MiB-aligned part of [p, p + bytes), contents kept, onto huge pages now (madvise
// MADV_COLLAPSE, Linux 6.1 and later): for large buffers that came from malloc on small pages but
// will be streamed, like a model's output matrix. False where there was no such part or the kernel
// refused (too old, no free huge pages); the memory then works as before.
bool back_with_huge_pages(const void* p, size_t bytes) noexcept;

// A thread-safe allocator of 64-byte aligned blocks. Blocks from `min_bytes` to half a slab (a
// model's matrices, activations) are carved first-fit from huge-page slabs of `slab_bytes`,
// faulted in when mapped. Smaller blocks, and larger ones, come from malloc on small pages: a
// small one shares its pages with everything else anyway, and a large one is usually a KV pool
// that is touched a little at a time, where the first touch of each huge page (0.2 to several ms
// inside a virtual machine) would land on requests' steps. A slab whose blocks are all freed is
// unmapped, except one kept for the next allocation (a buffer made again each step must not
// fault its pages in again).
class HostArena {
 public:
  explicit HostArena(size_t slab_bytes = size_t(32) << 20, size_t min_bytes = size_t(64) << 10);
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  void* allocate(size_t bytes);  // nullptr when out of memory
  void deallocate(void* p) noexcept;

  // Bytes of huge-page slabs held now (malloc'd blocks excluded).
  size_t mapped_bytes() const;

 private:
  struct Slab {
    std::map<size_t, size_t> used;  // offset -> bytes
    std::map<size_t, size_t> free;  // offset -> bytes, coalesced
  };
  void* carve(uintptr_t base, Slab& slab, size_t bytes);

  const size_t slab_bytes_;
  const size_t min_bytes_;
  mutable std::mutex mu_;
  std::map<uintptr_t, Slab> slabs_;  // by base address
};

}  // namespace tessera
