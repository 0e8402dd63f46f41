// Tests for engine/io/safetensors: round trips, the reference's byte layout, every malformed
// header, and a mutation fuzz test that checks the reader never reads outside the file.
#include "engine/io/safetensors.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"

namespace io = mammoth::io;
using mammoth::DType;
using mammoth::Error;

namespace {

// A fresh directory under $TEST_TMPDIR (Bazel) or /tmp, removed at scope exit.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string pattern = std::string(base ? base : "/tmp") + "/safetensors_test.XXXXXX";
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// A file image: 8-byte little-endian length of `header`, `header`, then `data_size` bytes.
std::vector<uint8_t> image(const std::string& header, size_t data_size) {
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(uint64_t{header.size()} >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  for (size_t i = 0; i < data_size; ++i) out.push_back(static_cast<uint8_t>(i * 7 + 1));
  return out;
}

// The Error message from parsing `bytes`, or "" when it parsed.
std::string parse_error(const std::vector<uint8_t>& bytes) {
  try {
    io::SafetensorsFile::from_memory(bytes.data(), bytes.size(), "bad.safetensors");
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Deterministic contents for a tensor of `nbytes`, different per seed.
std::vector<uint8_t> pattern_bytes(size_t nbytes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(nbytes);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

struct Owned {
  io::TensorView view;
  std::vector<uint8_t> bytes;
};

Owned make_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape, uint32_t seed) {
  size_t n = mammoth::dtype_size(dtype);
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  Owned t;
  t.bytes = pattern_bytes(n, seed);
  if (dtype == DType::kBool) {
    for (auto& b : t.bytes) b &= 1;
  }
  t.view = {name, dtype, std::move(shape), t.bytes.data(), n};
  return t;
}

}  // namespace

TEST_CASE("safetensors round trip of all dtypes, scalars and empty tensors", "[safetensors]") {
  TempDir dir;
  std::vector<Owned> owned;
  uint32_t seed = 1;
  for (DType t : mammoth::kAllDTypes) {
    const std::string name = std::string("t.") + mammoth::dtype_name(t);
    owned.push_back(make_tensor(name, t, {2, 3, 5}, seed++));
    owned.push_back(make_tensor(name + ".scalar", t, {}, seed++));
    owned.push_back(make_tensor(name + ".empty", t, {4, 0, 3}, seed++));
  }
  std::vector<io::TensorView> views;
  for (const Owned& o : owned) views.push_back(o.view);
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"step", "12"}, {"note", "quote \" and \xc3\xa9"}};
  const std::string path = dir.file("all.safetensors");
  io::write_safetensors(path, views, metadata);
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));

  const std::vector<uint8_t> raw = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | raw[i];
  CHECK((8 + n) % 8 == 0);  // header padded so the data section is 8-aligned
  CHECK(raw[8] == '{');

  io::SafetensorsFile f = io::SafetensorsFile::open(path);
  CHECK(f.metadata() == metadata);
  CHECK(f.data_offset() == 8 + n);
  CHECK(f.file_size() == raw.size());
  REQUIRE(f.size() == owned.size());
  for (size_t i = 0; i < owned.size(); ++i) {
    const io::TensorView& want = owned[i].view;
    INFO(want.name);
    CHECK(f.names()[i] == want.name);  // file order is write order
    const io::TensorView& got = f.get(want.name);
    CHECK(got.name == want.name);
    CHECK(got.dtype == want.dtype);
    CHECK(got.shape == want.shape);
    REQUIRE(got.nbytes == want.nbytes);
    if (want.nbytes > 0) CHECK(std::memcmp(got.data, want.data, want.nbytes) == 0);
    CHECK(f.find(want.name) == &got);
  }
  CHECK(f.find("missing") == nullptr);
  try {
    f.get("missing");
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(contains(e.message(), "missing"));
    CHECK(contains(e.message(), path));
  }
}

TEST_CASE("safetensors writer matches the reference byte layout", "[safetensors]") {
  TempDir dir;
  // The reference implementation's own test vectors (safetensors/src/tensor.rs).
  {
    const std::string path = dir.file("empty.safetensors");
    io::write_safetensors(path, {});
    CHECK(read_bytes(path) ==
          std::vector<uint8_t>{8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '});
    CHECK(io::SafetensorsFile::open(path).size() == 0);
  }
  {
    const std::string path = dir.file("meta.safetensors");
    io::write_safetensors(path, {}, {{"framework", "pt"}});
    CHECK(read_bytes(path) ==
          image(R"({"__metadata__":{"framework":"pt"}})" + std::string(5, ' '), 0));
  }
  {
    const float values[] = {0, 1, 2, 3, 4, 5};
    const std::string path = dir.file("attn.safetensors");
    io::write_safetensors(path, {{"attn0",
                                  DType::kF32,
                                  {1, 1, 2, 3},
                                  reinterpret_cast<const uint8_t*>(values),
                                  sizeof(values)}});
    std::vector<uint8_t> want =
        image(R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})" +
                  std::string(7, ' '),
              0);
    want.insert(want.end(), reinterpret_cast<const uint8_t*>(values),
                reinterpret_cast<const uint8_t*>(values) + sizeof(values));
    CHECK(read_bytes(path) == want);
  }
}

TEST_CASE("safetensors reader accepts files other writers produce", "[safetensors]") {
  // Tensors listed out of offset order, extra whitespace, null metadata, unknown extra fields.
  const std::string header =
      R"({ "b": {"dtype": "U8", "shape": [3], "data_offsets": [4, 7], "extra": 1},
           "a": {"dtype": "I32", "shape": [], "data_offsets": [0, 4]},
           "__metadata__": null })";
  const std::vector<uint8_t> bytes = image(header, 7);
  io::SafetensorsFile f = io::SafetensorsFile::from_memory(bytes.data(), bytes.size(), "mem");
  REQUIRE(f.names() == std::vector<std::string>{"a", "b"});
  CHECK(f.get("a").data == bytes.data() + 8 + header.size());
  CHECK(f.get("b").data == f.get("a").data + 4);
  CHECK(f.get("b").nbytes == 3);
  CHECK(f.metadata().empty());

  // Moving keeps the views valid and empties the source.
  io::SafetensorsFile g = std::move(f);
  CHECK(g.get("b").nbytes == 3);
  CHECK(f.size() == 0);  // NOLINT(bugprone-use-after-move): documented moved-from state
}

TEST_CASE("safetensors malformed files give Error naming file and tensor", "[safetensors]") {
  struct Case {
    std::string label;
    std::vector<uint8_t> bytes;
    std::string expect;  // substring of the message
  };
  auto tensor = [](const std::string& body) { return R"({"w": )" + body + "}"; };
  std::vector<uint8_t> huge_length = image("{}", 0);
  huge_length[4] = 0x10;  // 2^36 + 2 bytes
  std::vector<uint8_t> max_length(8, 0xff);
  std::vector<uint8_t> past_end = image("{}", 0);
  past_end[0] = 3;
  const std::vector<Case> cases = {
      {"empty file", {}, "too short"},
      {"7 bytes", {2, 0, 0, 0, 0, 0, 0}, "too short"},
      {"header over 100MB", huge_length, "limit"},
      {"header length 2^64-1", max_length, "limit"},
      {"header past end", past_end, "past the end"},
      {"not json", image("{\"w\": ", 0), "bad.safetensors (header):1:7"},
      {"invalid utf-8", image("{\"w\xff\": 1}", 0), "UTF-8"},
      {"array header", image("[]", 0), "must be a JSON object"},
      {"number header", image("12", 0), "must be a JSON object"},
      {"tensor not object", image(tensor("[1]"), 0), "\"w\""},
      {"missing dtype", image(tensor(R"({"shape": [], "data_offsets": [0, 4]})"), 4), "dtype"},
      {"missing offsets", image(tensor(R"({"dtype": "F32", "shape": []})"), 4), "data_offsets"},
      {"unknown dtype", image(tensor(R"({"dtype":"Q7","shape":[1],"data_offsets":[0,1]})"), 1),
       "Q7"},
      {"unsupported dtype", image(tensor(R"({"dtype":"I8","shape":[1],"data_offsets":[0,1]})"), 1),
       "I8"},
      {"dtype not string", image(tensor(R"({"dtype":4,"shape":[1],"data_offsets":[0,4]})"), 4),
       "dtype"},
      {"negative dim", image(tensor(R"({"dtype":"U8","shape":[-1],"data_offsets":[0,0]})"), 0),
       "non-negative"},
      {"fractional dim", image(tensor(R"({"dtype":"U8","shape":[1.5],"data_offsets":[0,1]})"), 1),
       "non-negative"},
      {"shape not array", image(tensor(R"({"dtype":"U8","shape":3,"data_offsets":[0,3]})"), 3),
       "shape"},
      {"shape overflow",
       image(tensor(R"({"dtype":"F64","shape":[4294967296,4294967296,2],"data_offsets":[0,0]})"),
             0),
       "overflow"},
      {"shape overflow by dtype",
       image(tensor(R"({"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]})"), 0),
       "overflow"},
      {"three offsets", image(tensor(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1,2]})"), 2),
       "[begin, end]"},
      {"negative offset", image(tensor(R"({"dtype":"U8","shape":[1],"data_offsets":[-1,0]})"), 1),
       "non-negative"},
      {"reversed offsets", image(tensor(R"({"dtype":"U8","shape":[0],"data_offsets":[4,0]})"), 4),
       "end before"},
      {"size mismatch", image(tensor(R"({"dtype":"F32","shape":[2],"data_offsets":[0,4]})"), 4),
       "needs 8 bytes"},
      {"out of range", image(tensor(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})"), 4),
       "run past"},
      {"huge offsets",
       image(tensor(R"({"dtype":"U8","shape":[1],"data_offsets":[9223372036854775806,)"
                    R"(9223372036854775807]})"),
             1),
       "run past"},
      {"overlap",
       image(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
             R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
             6),
       "overlaps tensor \"a\""},
      {"gap",
       image(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
             R"("b":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}})",
             10),
       "unused bytes before tensor \"b\""},
      {"hole at start", image(tensor(R"({"dtype":"U8","shape":[2],"data_offsets":[2,4]})"), 4),
       "unused bytes"},
      {"trailing bytes", image(tensor(R"({"dtype":"U8","shape":[2],"data_offsets":[0,2]})"), 5),
       "trailing"},
      {"duplicate names",
       image(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
             R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
             2),
       "duplicate key \"a\""},
      {"metadata not object", image(R"({"__metadata__": [1]})", 0), "__metadata__"},
      {"metadata value not string", image(R"({"__metadata__": {"step": 3}})", 0), "step"},
  };
  TempDir dir;
  for (const Case& c : cases) {
    INFO(c.label);
    const std::string m = parse_error(c.bytes);
    INFO(m);
    REQUIRE_FALSE(m.empty());
    CHECK(contains(m, "bad.safetensors"));
    CHECK(contains(m, c.expect));
    // The same through a real file and mmap.
    const std::string path = dir.file("bad.safetensors");
    write_bytes(path, c.bytes);
    CHECK_THROWS_AS(io::SafetensorsFile::open(path), Error);
  }
  CHECK_THROWS_AS(io::SafetensorsFile::open(dir.file("does_not_exist")), Error);
  CHECK_THROWS_AS(io::SafetensorsFile::open(dir.file("")), Error);  // a directory
}

TEST_CASE("safetensors writer rejects bad input and leaves no file", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  const uint8_t bytes[16] = {};
  auto write = [&](std::vector<io::TensorView> tensors) { io::write_safetensors(path, tensors); };
  CHECK_THROWS_AS(write({{"a", DType::kF32, {3}, bytes, 8}}), Error);  // size mismatch
  CHECK_THROWS_AS(write({{"a", DType::kU8, {1}, bytes, 1}, {"a", DType::kU8, {1}, bytes, 1}}),
                  Error);
  CHECK_THROWS_AS(write({{"__metadata__", DType::kU8, {1}, bytes, 1}}), Error);
  CHECK_THROWS_AS(write({{"a", DType::kU8, {-2}, bytes, 0}}), Error);
  CHECK_THROWS_AS(write({{"a", DType::kU8, {2}, nullptr, 2}}), Error);
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
  CHECK_THROWS_AS(io::write_safetensors(dir.file("no/such/dir/x.safetensors"), {}), Error);

  // Overwriting replaces the old file atomically.
  write({{"a", DType::kU8, {2}, bytes, 2}});
  write({{"b", DType::kI64, {2}, bytes, 16}});
  io::SafetensorsFile f = io::SafetensorsFile::open(path);
  CHECK(f.names() == std::vector<std::string>{"b"});
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST_CASE("safetensors reader survives random mutations", "[safetensors][fuzz]") {
  std::vector<Owned> owned;
  owned.push_back(make_tensor("embed.weight", DType::kF32, {4, 3}, 1));
  owned.push_back(make_tensor("ln.bias", DType::kBF16, {3}, 2));
  owned.push_back(make_tensor("step", DType::kI64, {}, 3));
  owned.push_back(make_tensor("none", DType::kF16, {0}, 4));
  owned.push_back(make_tensor("mask", DType::kBool, {5}, 5));
  std::vector<io::TensorView> views;
  for (const Owned& o : owned) views.push_back(o.view);
  TempDir dir;
  const std::string path = dir.file("valid.safetensors");
  io::write_safetensors(path, views, {{"k", "v"}});
  const std::vector<uint8_t> valid = read_bytes(path);

  // Fixed by default; MAMMOTH_FUZZ_SEED / MAMMOTH_FUZZ_ITERATIONS allow longer explorations.
  const char* seed_env = std::getenv("MAMMOTH_FUZZ_SEED");
  const char* iter_env = std::getenv("MAMMOTH_FUZZ_ITERATIONS");
  const int iterations = iter_env ? std::atoi(iter_env) : 5000;
  std::mt19937 rng(seed_env ? static_cast<uint32_t>(std::atoll(seed_env)) : 20240601u);
  const std::string interesting = "0123456789{}[],:\" -.eE";
  int parsed = 0, rejected = 0;
  for (int iter = 0; iter < iterations; ++iter) {
    std::vector<uint8_t> bytes = valid;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < edits; ++k) {
      // Mostly hit the length and header, where the parsing logic is.
      const size_t limit = (rng() % 4 == 0 || bytes.empty()) ? bytes.size() + 1
                                                             : std::min(bytes.size(), size_t{200});
      const size_t pos = limit == 0 ? 0 : rng() % limit;
      const uint8_t byte = rng() % 2 ? static_cast<uint8_t>(interesting[rng() % interesting.size()])
                                     : static_cast<uint8_t>(rng());
      switch (rng() % 5) {
        case 0:
          if (pos < bytes.size()) bytes[pos] ^= static_cast<uint8_t>(1u << (rng() % 8));
          break;
        case 1:
          if (pos < bytes.size()) bytes[pos] = byte;
          break;
        case 2:
          bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(pos), byte);
          break;
        case 3:
          if (pos < bytes.size()) bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(pos));
          break;
        default:
          bytes.resize(std::min(bytes.size(), pos));
          break;  // truncate
      }
    }
    // An exactly sized heap copy, so AddressSanitizer catches any read past the end.
    std::unique_ptr<uint8_t[]> exact(new uint8_t[bytes.size() + (bytes.empty() ? 1 : 0)]);
    if (!bytes.empty()) std::memcpy(exact.get(), bytes.data(), bytes.size());
    try {
      io::SafetensorsFile f = io::SafetensorsFile::from_memory(exact.get(), bytes.size(), "fuzz");
      uint64_t checksum = 0;
      for (const io::TensorView& t : f.tensors()) {
        REQUIRE(t.data >= exact.get() + f.data_offset());
        REQUIRE(t.data + t.nbytes <= exact.get() + bytes.size());
        size_t n = mammoth::dtype_size(t.dtype);
        for (int64_t d : t.shape) n *= static_cast<size_t>(d);
        REQUIRE(n == t.nbytes);
        for (size_t i = 0; i < t.nbytes; ++i) checksum += t.data[i];  // touch every byte
      }
      CHECK(checksum < (uint64_t{1} << 40));
      ++parsed;
    } catch (const Error&) {
      ++rejected;
    }
    // Every 50th case also goes through a real file and mmap.
    if (iter % 50 == 0) {
      const std::string p = dir.file("mutated.safetensors");
      write_bytes(p, bytes);
      try {
        io::SafetensorsFile f = io::SafetensorsFile::open(p);
        // Reading outside the mapping would crash; touch every byte.
        uint64_t sum = 0;
        for (const io::TensorView& t : f.tensors()) {
          for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
        }
        CHECK(sum < (uint64_t{1} << 40));
      } catch (const Error&) {
      }
    }
  }
  INFO("parsed " << parsed << ", rejected " << rejected);
  CHECK(parsed > 0);  // some mutations (e.g. inside tensor data) keep the file valid
  CHECK(rejected > iterations / 2);
}
