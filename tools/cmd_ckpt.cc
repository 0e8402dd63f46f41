// `mammoth ckpt export CHECKPOINT --out DIR`: a training checkpoint (either form: one
// process's, or the sharded form of a dp/tp/pp/sp run) as a Hugging Face model directory
// (config.json + model.safetensors with HF names and layouts), loadable by `mammoth eval
// --model DIR` and by transformers. CHECKPOINT is a step directory or a --save-dir (its
// `latest`). The model comes from the checkpoint's own config; the optimizer state is left out.
//
// `mammoth ckpt export ADAPTER --merge-lora --out DIR [--model BASE]`: a PEFT LoRA adapter
// directory (or a LoRA run's --save-dir, whose adapter/ it reads) merged into its base model
// (W + (alpha / r) B A) as a plain Hugging Face directory. The base is --model when given,
// else the adapter's base_model_name_or_path.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "base/error.h"
#include "base/json.h"
#include "engine/train/checkpoint.h"
#include "models/lora.h"
#include "models/registry.h"
#include "tools/command.h"
#include "tools/plan_flags.h"

// --out is defined by `mammoth data` (its output directory); here the model directory to write.
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(std::string, model);
ABSL_FLAG(bool, merge_lora, false,
          "ckpt export: merge a LoRA adapter directory into its base model (see `ckpt export`)");

namespace mammoth::tools {
namespace {

namespace fs = std::filesystem;

int export_merged(std::string adapter, const std::string& out) {
  if (!fs::exists(fs::path(adapter) / "adapter_config.json") &&
      fs::exists(fs::path(adapter) / "adapter" / "adapter_config.json"))
    adapter = (fs::path(adapter) / "adapter").string();
  std::string base;
  models::read_adapter_config(adapter, &base);
  if (flag_changed("model")) base = absl::GetFlag(FLAGS_model);
  MAMMOTH_CHECK(!base.empty()) << "[ckpt] " << adapter
                               << " names no base_model_name_or_path: give --model BASE";
  // A registered name is a fresh initialisation, not the weights the adapter was trained on.
  MAMMOTH_CHECK(fs::is_directory(base))
      << "[ckpt] --merge-lora needs the base model's weights: '" << base
      << "' is not a Hugging Face model directory (a registered config is freshly initialised); "
         "give --model HF_DIR";
  auto model = models::create_model(base);
  const auto lora = models::load_adapter(*model, adapter);
  models::merge_lora(*model, *lora);
  models::save_pretrained(*model, out);
  std::printf("exported %s merged into %s (LoRA r=%lld on %zu layers) to %s\n", adapter.c_str(),
              base.c_str(), static_cast<long long>(lora->options().rank), lora->targets().size(),
              out.c_str());
  return 0;
}

int run_ckpt(const std::vector<std::string>& args) {
  MAMMOTH_CHECK(args.size() == 2 && args[0] == "export")
      << "[ckpt] usage: mammoth ckpt export CHECKPOINT --out DIR (CHECKPOINT: a step directory "
         "or a --save-dir)";
  const std::string out = absl::GetFlag(FLAGS_out);
  MAMMOTH_CHECK(!out.empty()) << "[ckpt] export needs --out DIR";
  std::string dir = args[1];
  MAMMOTH_CHECK(fs::is_directory(dir)) << "[ckpt] " << dir << " is not a directory";
  if (absl::GetFlag(FLAGS_merge_lora)) return export_merged(dir, out);
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
  MAMMOTH_CHECK(config->find("lora") == nullptr)
      << "[ckpt] " << dir << " is a LoRA run's checkpoint (adapters only): export it with "
      << "`mammoth ckpt export SAVE_DIR --merge-lora --out DIR` (SAVE_DIR/adapter, or the step's "
         "adapter/ directory)";
  const models::ModelConfig cfg = models::config_from_hf_json(*hf, spath);
  auto model = models::build_model(cfg);
  std::vector<engine::train::CheckpointPiece> pieces;
  for (const auto& [name, p] : model->named_parameters()) pieces.push_back({name, 0, p});
  const json::Value loaded = engine::train::load_checkpoint_pieces(dir, pieces);
  models::save_pretrained(*model, out);
  std::printf("exported %s (%s, step %lld, %lld parameters) to %s\n", dir.c_str(),
              models::family_name(cfg.family), static_cast<long long>(loaded.at("step").as_int()),
              static_cast<long long>(model->num_parameters()), out.c_str());
  return 0;
}

}  // namespace
}  // namespace mammoth::tools

MAMMOTH_COMMAND(ckpt,
                "checkpoints: `ckpt export CHECKPOINT --out DIR` writes a Hugging Face model; "
                "`ckpt export ADAPTER --merge-lora --out DIR` merges a LoRA adapter into it",
                mammoth::tools::run_ckpt);
