// Tensor basics: creation, views without copies, broadcasting, non-contiguous inputs, casts and
// the errors a user gets for misuse.
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "engine/ops.h"
#include "memory/allocator.h"
#include "test/testing/gradcheck.h"

using namespace mammoth;
using engine::Tensor;

namespace {
std::vector<double> vals(const Tensor& t) { return t.to_vector(); }
Tensor iota(const engine::Shape& s) {
  std::vector<double> v(static_cast<size_t>(engine::shape_numel(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  return Tensor::from_vector(v, s);
}
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}
}  // namespace

TEST_CASE("views share storage and read the right elements") {
  Tensor x = iota({2, 3, 4});
  Tensor p = x.permute({2, 0, 1});
  CHECK(p.shape() == engine::Shape{4, 2, 3});
  CHECK(!p.is_contiguous());
  CHECK(p.storage() == x.storage());
  // p[i][j][k] = x[j][k][i]
  CHECK(p.contiguous().to_vector()[1 * 6 + 1 * 3 + 2] == 1 * 12 + 2 * 4 + 1);
  Tensor s = x.slice(2, 1, 4, 2);  // columns 1 and 3
  CHECK(s.shape() == engine::Shape{2, 3, 2});
  CHECK(vals(s.select(0, 1).select(0, 2)) == std::vector<double>{21, 23});
  Tensor t = x.transpose(0, 1);
  CHECK(t.reshape({3, 8}).shape() == engine::Shape{3, 8});
  CHECK(vals(t.reshape({-1}))[4] == 12);  // t[0][1][0] = x[1][0][0]
  Tensor e = Tensor::from_vector({1, 2}, {2, 1}).expand({2, 3});
  CHECK(e.strides()[1] == 0);
  CHECK(vals(e) == std::vector<double>{1, 1, 1, 2, 2, 2});
  CHECK(x.view({6, 4}).storage() == x.storage());
  CHECK(x.unsqueeze(1).shape() == engine::Shape{2, 1, 3, 4});
  CHECK(x.unsqueeze(1).squeeze(1).shape() == x.shape());
  CHECK(x.flatten(1).shape() == engine::Shape{2, 12});
}

TEST_CASE("view of a non-contiguous tensor works when strides allow and fails clearly otherwise") {
  Tensor x = iota({4, 6});
  Tensor s = x.slice(1, 0, 4);  // [4, 4] rows still stride 6
  CHECK(s.view({4, 2, 2}).storage() == x.storage());
  CHECK(vals(s.view({4, 2, 2}).select(0, 1).select(0, 1)) == std::vector<double>{8, 9});
  const std::string err = error_of([&] { (void)s.view({16}); });
  CHECK(err.find("[view]") != std::string::npos);
  CHECK(err.find("reshape") != std::string::npos);
  CHECK(vals(s.reshape({16}))[4] == 6);  // reshape copies instead
}

TEST_CASE("broadcasting binary ops") {
  Tensor a = iota({2, 1, 3});
  Tensor b = Tensor::from_vector({10, 20}, {2, 1});
  Tensor y = engine::add(a, b);
  CHECK(y.shape() == engine::Shape{2, 2, 3});
  CHECK(vals(y) == std::vector<double>{10, 11, 12, 20, 21, 22, 13, 14, 15, 23, 24, 25});
  Tensor z = engine::mul(Tensor::scalar(2.0), a);
  CHECK(vals(z) == std::vector<double>{0, 2, 4, 6, 8, 10});
}

TEST_CASE("ops accept non-contiguous inputs") {
  Tensor a = Tensor::randn({5, 7}, 1, 0, 1, DType::kF64);
  Tensor b = Tensor::randn({7, 5}, 2, 0, 1, DType::kF64);
  Tensor at = a.transpose(0, 1);  // [7, 5] strided
  CHECK(testing::compare(engine::add(at, b), engine::add(at.contiguous(), b), 0, 0).empty());
  CHECK(testing::compare(engine::matmul(at, a), engine::matmul(at.contiguous(), a), 1e-12, 1e-12)
            .empty());
  CHECK(testing::compare(engine::softmax(at, 0), engine::softmax(at.contiguous(), 0), 1e-12, 1e-12)
            .empty());
  CHECK(testing::compare(engine::sum(at, {1}), engine::sum(at.contiguous(), {1}), 1e-12, 1e-12)
            .empty());
}

TEST_CASE("matmul matches a hand computation, including batch broadcast") {
  Tensor a = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::from_vector({7, 8, 9, 10, 11, 12}, {3, 2});
  CHECK(vals(engine::matmul(a, b)) == std::vector<double>{58, 64, 139, 154});
  Tensor batch = engine::matmul(a.unsqueeze(0).expand({3, 2, 3}), b);
  CHECK(batch.shape() == engine::Shape{3, 2, 2});
  CHECK(vals(batch.select(0, 2)) == std::vector<double>{58, 64, 139, 154});
}

TEST_CASE("reductions") {
  Tensor x = iota({2, 3});
  CHECK(vals(engine::sum(x, {0})) == std::vector<double>{3, 5, 7});
  CHECK(vals(engine::sum(x, {1}, true)) == std::vector<double>{3, 12});
  CHECK(engine::sum(x, {1}, true).shape() == engine::Shape{2, 1});
  CHECK(engine::sum(x).item() == 15);
  CHECK(vals(engine::mean(x, {-1})) == std::vector<double>{1, 4});
  CHECK(vals(engine::max(Tensor::from_vector({3, 9, 1, 4, 2, 8}, {2, 3}), 0)) ==
        std::vector<double>{4, 9, 8});
}

TEST_CASE("casts cover every dtype pair") {
  Tensor x = Tensor::from_vector({1.5, -2.0, 3.25, 0.0}, {4}, DType::kF64);
  for (DType t : kAllDTypes) {
    if (t == DType::kU8) continue;  // negative float -> u8 is undefined in C; checked below
    Tensor y = x.to(t).to(DType::kF64);
    INFO(dtype_name(t));
    std::vector<double> expect{1.5, -2.0, 3.25, 0.0};
    if (t == DType::kI32 || t == DType::kI64) expect = {1, -2, 3, 0};
    if (t == DType::kBool) expect = {1, 1, 1, 0};
    CHECK(vals(y) == expect);
  }
  CHECK(vals(Tensor::from_vector({7, 200}, {2}).to(DType::kU8)) == std::vector<double>{7, 200});
  // bf16 keeps 8 mantissa bits: 1 + 2^-8 is a tie and rounds to even (1.0).
  CHECK(Tensor::from_vector({1.0 + 1.0 / 256}, {1}).to(DType::kBF16).item() == 1.0);
}

TEST_CASE("clear errors for misuse") {
  Tensor a = Tensor::zeros({4, 8});
  Tensor b = Tensor::zeros({7, 3});
  std::string err = error_of([&] { engine::matmul(a, b); });
  CHECK(err == "[matmul] inner dimensions differ: (4, 8) x (7, 3)");
  err = error_of([&] { engine::add(a, Tensor::zeros({3})); });
  CHECK(err.find("cannot be broadcast") != std::string::npos);
  err = error_of([&] { engine::add(a, Tensor::zeros({4, 8}, DType::kF64)); });
  CHECK(err == "[add] dtype mismatch: f32 vs f64");
  err = error_of([&] { engine::embedding(Tensor::from_ints({0, 9}, {2}), Tensor::zeros({5, 2})); });
  CHECK(err.find("index 9 is out of range") != std::string::npos);
  err = error_of([&] { a.slice(5, 0, 1); });
  CHECK(err.find("dim 5 is out of range") != std::string::npos);
  err = error_of([&] { a.view({5, -1}); });
  CHECK(err.find("[view]") != std::string::npos);
  err = error_of([&] {
    engine::cross_entropy(Tensor::zeros({2, 3}), Tensor::from_ints({0, 3}, {2}));
  });
  CHECK(err.find("target 3") != std::string::npos);
  err = error_of([&] { Tensor::zeros({2}, DType::kI64).requires_grad_(); });
  CHECK(err.find("floating-point") != std::string::npos);
}

TEST_CASE("storage comes from the allocator and is returned") {
  auto& alloc = memory::cpu_allocator();
  const int64_t before = alloc.stats().allocated_bytes;
  {
    Tensor t = Tensor::zeros({1024});
    CHECK(alloc.stats().allocated_bytes == before + 4096);
    CHECK(reinterpret_cast<uintptr_t>(t.raw_data()) % 64 == 0);
  }
  CHECK(alloc.stats().allocated_bytes == before);
}

namespace {

// The /proc/self/smaps entry of the mapping holding `p`: its "THPeligible:" value, or -1 when no
// mapping holds p (an unmapped block) or the kernel does not report it.
int thp_eligible(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto a = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find('-') < 16) {
      inside = a >= lo && a < hi;
    } else if (inside && line.rfind("THPeligible:", 0) == 0) {
      return std::atoi(line.c_str() + 12);
    }
  }
  return -1;
}

// The kernel's THP mode ("always", "madvise", "never"), or "" when it has none.
std::string thp_mode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(f, line);
  const size_t a = line.find('['), b = line.find(']');
  return a == std::string::npos || b == std::string::npos ? "" : line.substr(a + 1, b - a - 1);
}

}  // namespace

TEST_CASE("the CPU allocator maps blocks of 2 MiB and more at 2 MiB for huge pages") {
  memory::CpuAllocator alloc;  // its own instance: the process-wide one keeps its cache
  alloc.set_cache_limit(0);
  REQUIRE(alloc.huge_pages());  // the default (MAMMOTH_CPU_HUGE_PAGES unset under Bazel)
  const size_t big = (size_t{5} << 20) + 12345;
  auto* p = static_cast<unsigned char*>(alloc.allocate(big));
  CHECK(reinterpret_cast<uintptr_t>(p) % memory::CpuAllocator::kHugePage == 0);
  std::memset(p, 0x5a, big);  // the whole block is writable
  CHECK(p[big - 1] == 0x5a);
  const std::string mode = thp_mode();
  if (mode == "always" || mode == "madvise") CHECK(thp_eligible(p) == 1);
  alloc.deallocate(p, big);  // cache limit 0: unmapped at once
  CHECK(thp_eligible(p) == -1);
  // Small blocks stay on the heap at 64 bytes; a block of exactly 2 MiB is huge.
  void* s = alloc.allocate(4096);
  CHECK(reinterpret_cast<uintptr_t>(s) % 64 == 0);
  alloc.deallocate(s, 4096);
  void* h = alloc.allocate(memory::CpuAllocator::kHugePage);
  CHECK(reinterpret_cast<uintptr_t>(h) % memory::CpuAllocator::kHugePage == 0);
  alloc.deallocate(h, memory::CpuAllocator::kHugePage);
  CHECK(alloc.stats().allocated_bytes == 0);
}

TEST_CASE("MAMMOTH_CPU_HUGE_PAGES=0 keeps large blocks off huge pages") {
  ::setenv("MAMMOTH_CPU_HUGE_PAGES", "0", 1);
  memory::CpuAllocator alloc;
  ::unsetenv("MAMMOTH_CPU_HUGE_PAGES");
  alloc.set_cache_limit(0);
  CHECK_FALSE(alloc.huge_pages());
  const size_t big = size_t{8} << 20;
  void* p = alloc.allocate(big);
  std::memset(p, 1, big);
  if (thp_mode() == "madvise") CHECK(thp_eligible(p) == 0);  // not advised: 4 KiB pages
  alloc.deallocate(p, big);
}

TEST_CASE("the CPU allocator reuses freed large blocks and never counts them as allocated") {
  auto& alloc = memory::cpu_allocator();
  const int64_t limit = alloc.cache_limit();
  alloc.set_cache_limit(int64_t{64} << 20);
  alloc.release_cached();
  const memory::AllocatorStats before = alloc.stats();
  const size_t big = (size_t{3} << 20) + 100;  // rounds up to a cache granule
  void* a = alloc.allocate(big);
  alloc.deallocate(a, big);
  CHECK(alloc.stats().allocated_bytes == before.allocated_bytes);
  CHECK(alloc.stats().cached_bytes >= static_cast<int64_t>(big));
  void* b = alloc.allocate(big + 50);  // the same rounded size: the same block
  CHECK(b == a);
  CHECK(alloc.stats().cache_hits == before.cache_hits + 1);
  CHECK(alloc.stats().cached_bytes == 0);
  alloc.deallocate(b, big + 50);
  // From 128 KiB (a tp rank's activations, a small model's weight gradients): cached too, in
  // the finer granule below 1 MiB, so a block one granule larger is a different one.
  alloc.release_cached();
  const size_t mid = (size_t{256} << 10) + 100;
  void* m1 = alloc.allocate(mid);
  alloc.deallocate(m1, mid);
  CHECK(alloc.stats().cached_bytes >= static_cast<int64_t>(mid));
  CHECK(alloc.stats().cached_bytes <= static_cast<int64_t>(mid + (size_t{16} << 10)));
  void* m2 = alloc.allocate(mid + 1000);
  CHECK(m2 == m1);
  alloc.deallocate(m2, mid + 1000);
  void* m3 = alloc.allocate(mid + (size_t{16} << 10));
  CHECK(m3 != m1);
  alloc.deallocate(m3, mid + (size_t{16} << 10));
  alloc.release_cached();
  // Small blocks are not cached; the limit bounds the cache; release empties it.
  void* s = alloc.allocate(1000);
  alloc.deallocate(s, 1000);
  CHECK(alloc.stats().cached_bytes < (int64_t{4} << 20));
  alloc.set_cache_limit(int64_t{2} << 20);  // below the cached block: released
  CHECK(alloc.stats().cached_bytes == 0);
  void* c = alloc.allocate(big);
  alloc.deallocate(c, big);  // over the limit: freed, not cached
  CHECK(alloc.stats().cached_bytes == 0);
  alloc.set_cache_limit(limit);
  CHECK_THROWS_WITH(alloc.set_cache_limit(-1), Catch::Contains("cache limit"));
}

TEST_CASE("a kernel launch refuses a paged argument that another's page-in moved out") {
  Tensor a = Tensor::from_vector({1, 2, 3}, {3});
  Tensor b = Tensor::from_vector({4, 5, 6}, {3});
  // Paged storage whose hooks keep the bytes where they are...
  void* a_data = a.storage()->data;
  a.storage()->ensure_resident = [s = a.storage().get(), a_data](bool) { s->data = a_data; };
  b.storage()->ensure_resident = [](bool) {};
  CHECK(engine::add(a, b).to_vector() == std::vector<double>{5, 7, 9});
  // ...until b's page-in evicts a, as a device cache too small for both would.
  b.storage()->ensure_resident = [s = a.storage().get()](bool) { s->data = nullptr; };
  try {
    engine::add(a, b);
    FAIL("the launch read a paged-out argument");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("was paged out by another argument's page-in") !=
          std::string::npos);
    CHECK(std::string(e.what()).find("of shape " + engine::shape_str({3})) != std::string::npos);
  }
  a.storage()->data = a_data;  // the storage frees its own bytes
  a.storage()->ensure_resident = nullptr;
  b.storage()->ensure_resident = nullptr;
}
