// models/weights: HF names and layouts in safetensors, every mismatch reported at once.
#include "models/weights.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/ops.h"
#include "models/registry.h"

namespace mammoth::models {
namespace {

namespace fs = std::filesystem;
using engine::Tensor;

std::string temp_path(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return (fs::path(base ? base : fs::temp_directory_path().string()) / name).string();
}

// Every tensor of `src` under a renamed name (rename returns "" to drop it), plus `extra`.
void rewrite(const std::string& src, const std::string& dst,
             const std::function<std::string(const std::string&)>& rename,
             std::vector<io::TensorView> extra = {}) {
  io::SafetensorsFile f = io::SafetensorsFile::open(src);
  std::vector<io::TensorView> views;
  for (io::TensorView v : f.tensors()) {
    v.name = rename(v.name);
    if (!v.name.empty()) views.push_back(v);
  }
  for (auto& v : extra) views.push_back(v);
  io::write_safetensors(dst, views);
}

double max_diff(const Model& a, const Model& b) {
  double d = 0;
  auto pa = a.named_parameters(), pb = b.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    d = std::max(d, engine::max_abs(pa[i].second - pb[i].second));
  return d;
}

TEST_CASE("GPT-2 Conv1D weights are stored transposed, others as they are") {
  auto m = create_model("gpt2-tiny", {.seed = 1});
  const std::string path = temp_path("gpt2_layout.safetensors");
  save_weights(*m, path);
  io::SafetensorsFile f = io::SafetensorsFile::open(path);
  CHECK(f.metadata().at("format") == "pt");
  const int64_t d = m->config().d_model;
  const io::TensorView& w = f.get("h.0.attn.c_attn.weight");
  REQUIRE(w.shape == std::vector<int64_t>{d, 3 * d});  // [in, out]
  Tensor ours;
  for (auto& [n, t] : m->named_parameters())
    if (n == "h.0.attn.c_attn.weight") ours = t;
  std::vector<float> file(w.nbytes / 4);
  std::memcpy(file.data(), w.data, w.nbytes);
  const std::vector<double> o = ours.to_vector();  // [3d, d]
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < 3 * d; ++j) REQUIRE(file[i * 3 * d + j] == float(o[j * d + i]));
  CHECK(f.get("wte.weight").shape == std::vector<int64_t>{m->config().vocab_size, d});
}

TEST_CASE("GPT-2 loads bare and transformer.-prefixed names, skipping HF buffers") {
  auto a = create_model("gpt2-tiny", {.seed = 1});
  const std::string bare = temp_path("gpt2_bare.safetensors");
  const std::string prefixed = temp_path("gpt2_prefixed.safetensors");
  save_weights(*a, bare);
  const std::vector<float> mask(16, 1.0f);
  rewrite(bare, prefixed, [](const std::string& n) { return "transformer." + n; },
          {{"transformer.h.0.attn.bias",
            DType::kF32,
            {1, 1, 4, 4},
            reinterpret_cast<const uint8_t*>(mask.data()),
            64}});
  for (const std::string& path : {bare, prefixed}) {
    INFO(path);
    auto b = create_model("gpt2-tiny", {.seed = 2});
    REQUIRE(max_diff(*a, *b) > 0);
    LoadReport r = load_weights(*b, path);
    CHECK(max_diff(*a, *b) == 0.0);
    CHECK(r.loaded.size() == b->named_parameters().size());
  }
}

TEST_CASE("loading reports every mismatch at once and changes nothing") {
  auto a = create_model("gpt2-tiny", {.seed = 1});
  const std::string good = temp_path("gpt2_good.safetensors");
  const std::string bad = temp_path("gpt2_bad.safetensors");
  save_weights(*a, good);
  const std::vector<float> junk(64, 0.5f);
  const std::vector<int64_t> ints(128, 1);
  rewrite(
      good, bad,
      [](const std::string& n) {
        if (n == "ln_f.weight" || n == "h.1.ln_2.bias" || n == "wpe.weight") return std::string();
        return n;
      },
      {{"ln_f.weight", DType::kF32, {64}, reinterpret_cast<const uint8_t*>(junk.data()), 256},
       {"h.1.ln_2.bias", DType::kI64, {128}, reinterpret_cast<const uint8_t*>(ints.data()), 1024},
       {"mystery.weight",
        DType::kF32,
        {8, 8},
        reinterpret_cast<const uint8_t*>(junk.data()),
        256}});
  auto b = create_model("gpt2-tiny", {.seed = 2});
  auto before = b->named_parameters()[0].second.clone();
  try {
    load_weights(*b, bad);
    FAIL("expected an error");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("4 problems"));
    CHECK_THAT(msg, Catch::Contains("missing 'wpe.weight' or 'transformer.wpe.weight'"));
    CHECK_THAT(msg, Catch::Contains("'ln_f.weight': shape (64,), expected (128,)"));
    CHECK_THAT(msg, Catch::Contains("'h.1.ln_2.bias': dtype i64"));
    CHECK_THAT(msg, Catch::Contains("unexpected 'mystery.weight'"));
  }
  CHECK(engine::max_abs(b->named_parameters()[0].second - before) == 0.0);
  LoadOptions lenient;
  lenient.allow_unexpected = true;
  CHECK_THROWS(load_weights(*b, bad, lenient));  // still missing/shape/dtype problems
}

TEST_CASE("a bf16 checkpoint loads into an f32 model, or is refused without casting") {
  auto a = create_model("llama-tiny", {.dtype = DType::kBF16, .seed = 3});
  const std::string path = temp_path("llama_bf16.safetensors");
  save_weights(*a, path);
  auto b = create_model("llama-tiny", {.seed = 4});
  load_weights(*b, path);
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    CHECK(engine::max_abs(pa[i].second.to(DType::kF32) - pb[i].second) == 0.0);
  LoadOptions strict;
  strict.allow_cast = false;
  CHECK_THROWS_WITH(load_weights(*b, path, strict), Catch::Contains("dtype bf16, expected f32"));
}

TEST_CASE("BERT and ViT: missing task heads stay initialised, bare HF names load") {
  auto a = create_model("bert-tiny", {.seed = 1});
  const std::string full = temp_path("bert_full.safetensors");
  const std::string bare = temp_path("bert_bare.safetensors");
  save_weights(*a, full);
  // A BertModel-style file: no "bert." prefix, no heads.
  rewrite(full, bare, [](const std::string& n) {
    if (n.rfind("bert.", 0) == 0) return n.substr(5);
    return std::string();
  });
  auto b = create_model("bert-tiny", {.seed = 2});
  // No head at all (BertModel): the masked-LM head and the classifier both stay initialised.
  LoadReport none = load_weights(*b, bare);
  CHECK(none.missing_optional ==
        std::vector<std::string>{
            "cls.predictions.bias", "cls.predictions.transform.dense.weight",
            "cls.predictions.transform.dense.bias", "cls.predictions.transform.LayerNorm.weight",
            "cls.predictions.transform.LayerNorm.bias", "classifier.weight", "classifier.bias"});
  rewrite(full, bare, [](const std::string& n) {
    if (n.rfind("bert.", 0) == 0) return n.substr(5);
    return n.rfind("classifier", 0) == 0 ? std::string() : n;
  });
  LoadReport r = load_weights(*b, bare);
  CHECK(r.missing_optional == std::vector<std::string>{"classifier.weight", "classifier.bias"});
}

TEST_CASE("a truncated file is a clear error") {
  auto a = create_model("gpt2-tiny", {.seed = 1});
  const std::string path = temp_path("gpt2_trunc.safetensors");
  save_weights(*a, path);
  fs::resize_file(path, fs::file_size(path) - 100);
  CHECK_THROWS_AS(load_weights(*a, path), Error);
}

}  // namespace
}  // namespace mammoth::models
