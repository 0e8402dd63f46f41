// `mammoth ckpt export CHECKPOINT --out DIR`: a training checkpoint (either form: one
// process's, or the sharded form of a dp/tp/pp/sp run) as a Hugging Face model directory
// (config.json + model.safetensors with HF names and layouts), loadable by `mammoth eval
// --model DIR` and by transformers. CHECKPOINT is a step directory or a --save-dir (its
// `latest`). The model comes from the checkpoint's own config; the optimizer state is left out.
// Weights above --max-shard-mb are written in transformers' sharded form (shards + the
// model.safetensors.index.json). When the run trained a model directory that still exists, its
// tokenizer files (and chat template) are copied beside the weights, so the export is complete.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "base/error.h"
#include "base/json.h"
#include "engine/train/checkpoint.h"
#include "models/registry.h"
#include "tools/command.h"

// --out is defined by `mammoth data` (its output directory); here the model directory to write.
ABSL_DECLARE_FLAG(std::string, out);
ABSL_FLAG(std::string, dtype, "f32",
          "ckpt export: the weights' dtype in the files: f32, bf16 or f16 (keeps a bf16 model "
          "bf16; training itself keeps f32 master weights)");
ABSL_FLAG(double, max_shard_mb, 5000.0,
          "ckpt export: weights above this many MB (10^6 bytes) are sharded, at most this much "
          "per file (transformers' save_pretrained default: 5GB)");

namespace mammoth::tools {
namespace {

namespace fs = std::filesystem;

int run_ckpt(const std::vector<std::string>& args) {
  MAMMOTH_CHECK(args.size() == 2 && args[0] == "export")
      << "[ckpt] usage: mammoth ckpt export CHECKPOINT --out DIR (CHECKPOINT: a step directory "
         "or a --save-dir)";
  const std::string out = absl::GetFlag(FLAGS_out);
  MAMMOTH_CHECK(!out.empty()) << "[ckpt] export needs --out DIR";
  std::string dir = args[1];
  MAMMOTH_CHECK(fs::is_directory(dir)) << "[ckpt] " << dir << " is not a directory";
  if (!fs::exists(dir + "/manifest.json")) {
    const auto latest = engine::train::latest_checkpoint(dir);
    MAMMOTH_CHECK(latest.has_value())
        << "[ckpt] " << dir << " is neither a checkpoint (no manifest.json) nor a --save-dir "
        << "(no latest)";
    dir = *latest;
  }
  const std::string spath = dir + "/state.json";
  MAMMOTH_CHECK(fs::exists(spath)) << "[ckpt] " << spath << " is missing";
  const json::Value state = json::parse_file(spath);
  const json::Value* config = state.find("config");
  const json::Value* hf = config ? config->find("model_config") : nullptr;
  MAMMOTH_CHECK(hf != nullptr) << "[ckpt] " << spath
                               << " has no config.model_config: not written by mammoth train";
  const models::ModelConfig cfg = models::config_from_hf_json(*hf, spath);
  auto model = models::build_model(cfg);
  std::vector<engine::train::CheckpointPiece> pieces;
  for (const auto& [name, p] : model->named_parameters()) pieces.push_back({name, 0, p});
  const json::Value loaded = engine::train::load_checkpoint_pieces(dir, pieces);
  const double shard_mb = absl::GetFlag(FLAGS_max_shard_mb);
  MAMMOTH_CHECK(shard_mb > 0) << "[ckpt] --max-shard-mb must be positive, got " << shard_mb;
  const DType dtype = dtype_from_name(absl::GetFlag(FLAGS_dtype));
  MAMMOTH_CHECK(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16)
      << "[ckpt] --dtype must be f32, bf16 or f16, got " << absl::GetFlag(FLAGS_dtype);
  models::save_pretrained(
      *model, out, {.max_shard_bytes = static_cast<int64_t>(shard_mb * 1e6), .dtype = dtype});
  // The trained directory's tokenizer, when there is one.
  const json::Value* source = config->find("model");
  if (source != nullptr && source->is_string() && fs::is_directory(source->as_string())) {
    for (const char* f :
         {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
          "merges.txt", "tokenizer.model", "chat_template.jinja", "generation_config.json"}) {
      const fs::path from = fs::path(source->as_string()) / f;
      if (fs::exists(from) && !fs::equivalent(from.parent_path(), out))
        fs::copy_file(from, fs::path(out) / f, fs::copy_options::overwrite_existing);
    }
  }
  std::printf("exported %s (%s, step %lld, %lld parameters) to %s\n", dir.c_str(),
              models::family_name(cfg.family), static_cast<long long>(loaded.at("step").as_int()),
              static_cast<long long>(model->num_parameters()), out.c_str());
  return 0;
}

}  // namespace
}  // namespace mammoth::tools

MAMMOTH_COMMAND(ckpt, "checkpoints: `ckpt export CHECKPOINT --out DIR` writes a Hugging Face model",
                mammoth::tools::run_ckpt);
