// Sharded checkpoints (engine/train/checkpoint.h) written by simulated ranks in one process:
// pieces cut anywhere load back into any other cut, a gap or an overlap between the ranks'
// pieces refuses to commit (nothing replaces the last good checkpoint), a corrupt shard, a
// missing tensor or a wrong shape are clear errors, and so is an index.json whose shapes or
// shard names lie.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <limits>

#include "engine/ops.h"
#include "engine/train/checkpoint.h"
#include "test/testing/test_dir.h"

using namespace mammoth;
using engine::Tensor;
using engine::train::CheckpointPiece;
namespace fs = std::filesystem;

namespace {

// Two single-process tensors with distinct values everywhere.
Tensor tensor_a() {
  std::vector<double> v(35);
  for (int i = 0; i < 35; ++i) v[i] = 1.5 * i - 7;
  return Tensor::from_vector(v, {5, 7}, DType::kF32);
}
Tensor tensor_b() {
  std::vector<double> v(11);
  for (int i = 0; i < 11; ++i) v[i] = 100 + i;
  return Tensor::from_vector(v, {11}, DType::kF32);
}

// Elements [lo, hi) of t, flat, as a piece of `name`.
CheckpointPiece cut(const std::string& name, const Tensor& t, int64_t lo, int64_t hi) {
  return {name, lo, t.reshape({-1}).slice(0, lo, hi).contiguous()};
}

engine::train::ShardedLayout layout(int world) {
  engine::train::ShardedLayout l;
  l.world = world;
  l.tensors = {{"a", tensor_a()}, {"a.exp_avg", tensor_a()}, {"b", tensor_b()}};
  l.layout = json::Value::object();
  l.layout.set("dp", json::Value(world));
  return l;
}

json::Value state_json(int64_t step) {
  json::Value s = json::Value::object();
  s.set("step", json::Value(step));
  return s;
}

// Writes one checkpoint from per-rank piece lists and commits it.
std::string save(const std::string& dir, int64_t step,
                 const std::vector<std::vector<CheckpointPiece>>& ranks) {
  engine::train::begin_sharded_checkpoint(dir, step);
  const std::string tmp = engine::train::sharded_checkpoint_tmp(dir, step);
  for (size_t r = 0; r < ranks.size(); ++r)
    engine::train::write_checkpoint_shard(tmp, static_cast<int>(r), ranks[r]);
  return engine::train::commit_sharded_checkpoint(
      dir, step, tmp, layout(static_cast<int>(ranks.size())), state_json(step), 3);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.message();
  }
  return "no error";
}

}  // namespace

TEST_CASE("pieces cut anywhere load back into any other cut") {
  testing::TestDir dir;
  const Tensor a = tensor_a(), b = tensor_b();
  const Tensor ea = engine::mul_scalar(a, 0.5).contiguous();
  // Three ranks; rank 1 cuts through a's rows, rank 2 holds all of b, rank 0 a's start.
  const std::string ckpt = save(dir.path(), 4,
                                {{cut("a", a, 0, 9), cut("a.exp_avg", ea, 0, 20)},
                                 {cut("a", a, 9, 35), cut("a.exp_avg", ea, 20, 35)},
                                 {cut("b", b, 0, 11)}});
  CHECK(ckpt == dir.path() + "/step_00000004");
  CHECK(*engine::train::latest_checkpoint(dir.path()) == ckpt);
  CHECK(fs::exists(ckpt + "/shard_00002.safetensors"));
  CHECK_FALSE(fs::exists(ckpt + "/model.safetensors"));

  // Whole tensors in their shapes (one process).
  Tensor a2 = Tensor::zeros({5, 7}), ea2 = Tensor::zeros({5, 7}), b2 = Tensor::zeros({11});
  const json::Value st = engine::train::load_checkpoint_pieces(
      ckpt, {{"a", 0, a2}, {"a.exp_avg", 0, ea2}, {"b", 0, b2}});
  CHECK(st.at("step").as_int() == 4);
  CHECK(a2.to_vector() == a.to_vector());
  CHECK(ea2.to_vector() == ea.to_vector());
  CHECK(b2.to_vector() == b.to_vector());

  // Another cut (two ranks of another ZeRO layout): ranges straddling the written pieces.
  Tensor lo = Tensor::zeros({17}), hi = Tensor::zeros({4});
  engine::train::load_checkpoint_pieces(ckpt, {{"a", 5, lo}, {"b", 7, hi}});
  for (int i = 0; i < 17; ++i) CHECK(lo.to_vector()[i] == a.reshape({-1}).to_vector()[5 + i]);
  CHECK(hi.to_vector() == std::vector<double>{107, 108, 109, 110});
}

TEST_CASE("a gap or an overlap between the ranks' pieces refuses to commit") {
  testing::TestDir dir;
  const Tensor a = tensor_a(), b = tensor_b(), ea = tensor_a();
  const std::string good = save(
      dir.path(), 2, {{cut("a", a, 0, 35), cut("a.exp_avg", ea, 0, 35)}, {cut("b", b, 0, 11)}});
  // Gap: nobody wrote a[20:35).
  CHECK_THAT(error_of([&] {
               save(dir.path(), 4,
                    {{cut("a", a, 0, 20), cut("a.exp_avg", ea, 0, 35)}, {cut("b", b, 0, 11)}});
             }),
             Catch::Contains("'a'") && Catch::Contains("cover 20 of 35"));
  // Overlap: both ranks wrote b[5:6).
  CHECK_THAT(error_of([&] {
               save(dir.path(), 4,
                    {{cut("a", a, 0, 35), cut("a.exp_avg", ea, 0, 35), cut("b", b, 0, 6)},
                     {cut("b", b, 5, 11)}});
             }),
             Catch::Contains("'b'") && Catch::Contains("overlap"));
  // A tensor nobody wrote.
  CHECK_THAT(error_of([&] {
               save(dir.path(), 4, {{cut("a", a, 0, 35)}, {cut("b", b, 0, 11)}});
             }),
             Catch::Contains("no shard holds 'a.exp_avg'"));
  // A piece whose offset plus size passes INT64_MAX (confirmed on the checkpoint fuzz target:
  // the sum wrapped negative in the coverage check).
  CHECK_THAT(error_of([&] {
               save(dir.path(), 4,
                    {{cut("a", a, 0, 35), cut("a.exp_avg", ea, 0, 35), cut("b", b, 0, 11)},
                     {{"b", std::numeric_limits<int64_t>::max() - 3, b.slice(0, 0, 5)}}});
             }),
             Catch::Contains("piece 'b@9223372036854775804' ends past the largest element index"));
  // The last good checkpoint is still the latest, and no temporary directory is left.
  CHECK(*engine::train::latest_checkpoint(dir.path()) == good);
  CHECK_FALSE(fs::exists(dir.path() + "/step_00000004"));
  for (const auto& e : fs::directory_iterator(dir.path()))
    CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
}

TEST_CASE("a corrupt shard, a missing tensor or a wrong shape are clear errors") {
  testing::TestDir dir;
  const Tensor a = tensor_a(), b = tensor_b();
  const std::string ckpt =
      save(dir.path(), 1, {{cut("a", a, 0, 35), cut("a.exp_avg", a, 0, 35)}, {cut("b", b, 0, 11)}});
  Tensor b2 = Tensor::zeros({11});
  CHECK_THAT(error_of([&] {
               engine::train::load_checkpoint_pieces(ckpt, {{"c", 0, b2}});
             }),
             Catch::Contains("no tensor 'c'"));
  // A whole-model load refuses a checkpoint tensor nothing asks for; a partial load does not.
  Tensor a2 = Tensor::zeros({5, 7}), ea2 = Tensor::zeros({5, 7});
  CHECK_THAT(error_of([&] {
               engine::train::load_checkpoint_pieces(ckpt, {{"a", 0, a2}, {"a.exp_avg", 0, ea2}},
                                                     /*whole=*/true);
             }),
             Catch::Contains("holds 'b', which the model does not have"));
  CHECK_NOTHROW(engine::train::load_checkpoint_pieces(ckpt, {{"a", 0, a2}}));
  Tensor wrong = Tensor::zeros({7, 5});
  CHECK_THAT(error_of([&] {
               engine::train::load_checkpoint_pieces(ckpt, {{"a", 0, wrong}});
             }),
             Catch::Contains("'a' is (5, 7)"));
  Tensor too_far = Tensor::zeros({5});
  CHECK_THAT(error_of([&] {
               engine::train::load_checkpoint_pieces(ckpt, {{"b", 8, too_far}});
             }),
             Catch::Contains("11 elements"));
  Tensor f64 = Tensor::zeros({11}, DType::kF64);
  CHECK_THAT(error_of([&] {
               engine::train::load_checkpoint_pieces(ckpt, {{"b", 0, f64}});
             }),
             Catch::Contains("f32"));
  // Flip one byte near the end of rank 1's shard (in b's data).
  const std::string shard = ckpt + "/shard_00001.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-3, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    f.seekp(-3, std::ios::end);
    c = static_cast<char>(c ^ 0x10);
    f.write(&c, 1);
  }
  CHECK_THAT(error_of([&] {
               engine::train::load_checkpoint_pieces(ckpt, {{"b", 0, b2}});
             }),
             Catch::Contains("shard_00001.safetensors is corrupt"));
  CHECK(b2.to_vector() == std::vector<double>(11, 0.0));  // nothing was written
}

// Found with test/fuzz/checkpoint_fuzz.cc: index.json is read without a CRC check by
// inspect_checkpoint (`mammoth ckpt`), and its shapes and shard names were trusted. A shape whose
// product wraps int64 (to 0 here, matching an empty piece), a negative shape (whose product
// equals the real one), a shard outside the checkpoint and a shard listed twice are refused,
// naming index.json.
TEST_CASE("an index.json that lies about shapes or shards is refused by name") {
  testing::TestDir dir;
  const Tensor a = tensor_a(), b = tensor_b();
  const std::string ckpt =
      save(dir.path(), 1, {{cut("a", a, 0, 35), cut("a.exp_avg", a, 0, 35)}, {cut("b", b, 0, 11)}});
  const std::string ipath = ckpt + "/index.json";
  std::string original;
  {
    std::ifstream in(ipath, std::ios::binary);
    original.assign(std::istreambuf_iterator<char>(in), {});
  }
  CHECK_NOTHROW(engine::train::inspect_checkpoint(ckpt));
  const auto refusal_with = [&](const std::function<void(json::Value&)>& lie) {
    json::Value index = json::parse(original, ipath);
    lie(index);
    std::ofstream(ipath, std::ios::binary | std::ios::trunc) << json::dump(index);
    return error_of([&] { engine::train::inspect_checkpoint(ckpt); });
  };
  const auto shape = [](std::vector<int64_t> dims) {
    json::Value s = json::Value::array();
    for (int64_t d : dims) s.push_back(json::Value(d));
    return s;
  };
  CHECK_THAT(
      refusal_with([&](json::Value& i) {
        i.at("tensors").at("b").set("shape", shape({int64_t{1} << 32, int64_t{1} << 32, 11}));
      }),
      Catch::Contains("index.json: tensor 'b' has shape (4294967296, 4294967296, 11)"));
  CHECK_THAT(
      refusal_with([&](json::Value& i) {
        i.at("tensors").at("a").set("shape", shape({-5, -7}));
      }),
      Catch::Contains("index.json: tensor 'a' has shape (-5, -7), which has a negative size"));
  CHECK_THAT(refusal_with([&](json::Value& i) {
               i.set("shards",
                     json::Value::array()
                         .push_back(json::Value("../" + fs::path(ckpt).filename().string() +
                                                "/shard_00000.safetensors"))
                         .push_back(json::Value("shard_00001.safetensors")));
             }),
             Catch::Contains("lists a shard outside the checkpoint"));
  CHECK_THAT(refusal_with([&](json::Value& i) {
               i.at("shards").push_back(json::Value("shard_00001.safetensors"));
             }),
             Catch::Contains("lists the shard 'shard_00001.safetensors' twice"));
}

// Found by the checkpoint fuzzer (seed test/fuzz/corpus/checkpoint/name_too_long): a manifest
// naming a file longer than the filesystem allows made checkpoint_problems throw
// std::filesystem::filesystem_error ("File name too long") instead of reporting a problem.
TEST_CASE("a manifest naming a file the filesystem refuses is a problem, not a crash") {
  testing::TestDir dir;
  const std::string name(300, 'a');
  {
    std::ofstream m(dir.path() + "/manifest.json");
    m << "{\"step\": 1, \"files\": {\"" << name << "\": {\"bytes\": 4, \"crc32c\": 0}}}";
  }
  std::vector<std::string> problems;
  REQUIRE_NOTHROW(problems = engine::train::checkpoint_problems(dir.path()));
  bool named = false;
  for (const std::string& p : problems)
    named = named || p.find(name + " cannot be read") != std::string::npos;
  CHECK(named);
}
