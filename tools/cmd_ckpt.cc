// `mammoth ckpt`: training checkpoints (engine/train/checkpoint.h) without training.
//
//   ckpt inspect CHECKPOINT [--json]   form, step, model, layout, files, every tensor
//   ckpt verify CHECKPOINT             every file's size and CRC-32C, a corrupt file narrowed to
//                                      its damaged tensors, the shards' coverage; exit 1 if bad
//   ckpt convert CHECKPOINT --out OUT --to single|sharded|hf [--shards N]
//   ckpt export CHECKPOINT --out DIR   (= convert --to hf)
//
// CHECKPOINT is a step directory or a --save-dir (its `latest`). `single` and `sharded` write a
// --save-dir (OUT/step_N and OUT/latest) that `train --resume --save-dir OUT` continues from in
// any layout; `sharded` cuts every tensor's flat range into N equal pieces, one per shard.
// Both read the source through the resharding loader (load_checkpoint_pieces), so any layout a
// run wrote (dp, ZeRO, tp, pp, offload) converts. `hf` writes a Hugging Face model directory
// (config.json + model.safetensors with HF names and layouts), loadable by `mammoth eval
// --model DIR` and by transformers; the optimizer state is left out.
// Weights above --max-shard-mb are written in transformers' sharded form (shards + the
// model.safetensors.index.json). When the run trained a model directory that still exists, its
// tokenizer files (and chat template) are copied beside the weights, so the export is complete.
//
// `mammoth ckpt export ADAPTER --merge-lora --out DIR [--model BASE]`: a PEFT LoRA adapter
// directory (or a LoRA run's --save-dir, whose adapter/ it reads) merged into its base model
// (W + (alpha / r) B A) as a plain Hugging Face directory. The base is --model when given,
// else the adapter's base_model_name_or_path.
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "base/error.h"
#include "base/json.h"
#include "engine/train/checkpoint.h"
#include "models/family.h"
#include "models/lora.h"
#include "models/registry.h"
#include "tools/command.h"
#include "tools/plan_flags.h"

// --out is defined by `mammoth data` (its output directory); here the directory to write.
ABSL_DECLARE_FLAG(std::string, out);
// --json is defined by `mammoth analyze`; here: inspect prints one JSON object.
ABSL_DECLARE_FLAG(bool, json);
ABSL_FLAG(std::string, to, "", "ckpt convert: the form to write: single, sharded or hf");
ABSL_FLAG(int, shards, 1, "ckpt convert --to sharded: the number of shard files");
ABSL_DECLARE_FLAG(std::string, model);
ABSL_FLAG(bool, merge_lora, false,
          "ckpt export: merge a LoRA adapter directory into its base model (see `ckpt export`)");
ABSL_FLAG(std::string, dtype, "f32",
          "ckpt export: the weights' dtype in the files; eval/generate: the parameters' dtype "
          "in memory (a bf16 Hugging Face directory stays bf16 with --dtype bf16; the default "
          "converts to f32, as transformers' from_pretrained does). f32, bf16 or f16; training "
          "keeps f32 master weights");
ABSL_FLAG(double, max_shard_mb, 5000.0,
          "ckpt export: weights above this many MB (10^6 bytes) are sharded, at most this much "
          "per file (transformers' save_pretrained default: 5GB)");

namespace mammoth::tools {

// --dtype, for ckpt export, eval and generate: f32, bf16 or f16; anything else is refused.
DType dtype_flag(const char* command) {
  const std::string name = absl::GetFlag(FLAGS_dtype);
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    if (name == dtype_name(d)) return d;
  }
  MAMMOTH_THROW() << "[" << command << "] --dtype must be f32, bf16 or f16, got '" << name << "'";
}

namespace {

namespace fs = std::filesystem;
namespace train = engine::train;
namespace nn = engine::nn;

constexpr const char* kUsage =
    "[ckpt] usage: mammoth ckpt inspect|verify CHECKPOINT, mammoth ckpt convert CHECKPOINT --out "
    "OUT --to single|sharded|hf [--shards N], or mammoth ckpt export CHECKPOINT --out DIR "
    "(CHECKPOINT: a step directory or a --save-dir)";

// A step directory as given, or a --save-dir's latest.
std::string checkpoint_dir(const std::string& arg) {
  MAMMOTH_CHECK(fs::is_directory(arg)) << "[ckpt] " << arg << " is not a directory";
  if (fs::exists(arg + "/manifest.json")) return arg;
  const auto latest = train::latest_checkpoint(arg);
  MAMMOTH_CHECK(latest.has_value()) << "[ckpt] " << arg
                                    << " is neither a checkpoint (no manifest.json) nor a "
                                       "--save-dir (no latest)";
  return *latest;
}

// The model the checkpoint's run trained, from its state.json.
models::ModelConfig model_config(const json::Value& state, const std::string& dir) {
  const json::Value* config = state.find("config");
  const json::Value* hf = config ? config->find("model_config") : nullptr;
  MAMMOTH_CHECK(hf != nullptr) << "[ckpt] " << dir
                               << "/state.json has no config.model_config: not written by "
                                  "mammoth train";
  return models::config_from_hf_json(*hf, dir + "/state.json");
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int inspect(const std::string& dir) {
  const train::CheckpointInfo info = train::inspect_checkpoint(dir);
  const json::Value* config = info.state.find("config");
  const json::Value* model = config ? config->find("model") : nullptr;
  const std::string model_name = model && model->is_string() ? model->as_string() : "unknown";
  int64_t total = 0;
  for (const auto& t : info.tensors) total += t.bytes;
  if (absl::GetFlag(FLAGS_json)) {
    json::Value out = json::Value::object();
    out.set("dir", json::Value(info.dir));
    out.set("form", json::Value(info.sharded ? "sharded" : "single"));
    out.set("format", json::Value(info.format));
    out.set("step", json::Value(info.step));
    out.set("model", json::Value(model_name));
    out.set("layout", info.layout);
    out.set("files", info.files);
    json::Value tensors = json::Value::object();
    for (const auto& t : info.tensors) {
      json::Value e = json::Value::object();
      e.set("dtype", json::Value(dtype_name(t.dtype)));
      json::Value shape = json::Value::array();
      for (int64_t d : t.shape) shape.push_back(json::Value(d));
      e.set("shape", shape);
      e.set("bytes", json::Value(t.bytes));
      e.set("pieces", json::Value(static_cast<int64_t>(t.pieces)));
      json::Value files = json::Value::array();
      for (const auto& f : t.files) files.push_back(json::Value(f));
      e.set("files", files);
      tensors.set(t.name, e);
    }
    out.set("tensors", tensors);
    std::printf("%s\n", json::dump(out).c_str());
    return 0;
  }
  std::printf("checkpoint %s\n", info.dir.c_str());
  std::printf("  form    %s (%s)\n", info.sharded ? "sharded" : "single", info.format.c_str());
  std::printf("  step    %lld\n", static_cast<long long>(info.step));
  std::printf("  model   %s\n", model_name.c_str());
  std::printf("  layout  %s\n", info.sharded ? json::dump(info.layout).c_str() : "one process");
  std::printf("  files   %zu\n", info.files.size());
  for (const json::Value& f : info.files) {
    std::printf("    %-28s %12lld bytes  crc32c %08llx\n", f.key().c_str(),
                static_cast<long long>(f.at("bytes").as_int()),
                static_cast<unsigned long long>(f.at("crc32c").as_int()));
  }
  std::printf("  tensors %zu, %lld bytes\n", info.tensors.size(), static_cast<long long>(total));
  for (const auto& t : info.tensors) {
    std::string files;
    for (const auto& f : t.files) files += (files.empty() ? "" : ",") + f;
    std::printf("    %-44s %-4s %-16s %10lld bytes  %d piece%s in %s\n", t.name.c_str(),
                dtype_name(t.dtype), shape_text(t.shape).c_str(), static_cast<long long>(t.bytes),
                t.pieces, t.pieces == 1 ? "" : "s", files.c_str());
  }
  return 0;
}

int verify(const std::string& dir) {
  std::vector<std::string> problems = train::checkpoint_problems(dir);
  if (problems.empty()) {
    // Sizes and CRCs hold; the index and the shards' headers must also describe every tensor
    // exactly once.
    try {
      train::inspect_checkpoint(dir);
    } catch (const Error& e) {
      problems.push_back(e.message());
    }
  }
  for (const std::string& p : problems) std::fprintf(stderr, "%s\n", p.c_str());
  if (!problems.empty()) {
    std::fprintf(stderr, "[ckpt] %s: %zu problem%s\n", dir.c_str(), problems.size(),
                 problems.size() == 1 ? "" : "s");
    return 1;
  }
  std::printf("%s: OK (every file's size and CRC-32C, every tensor covered once)\n", dir.c_str());
  return 0;
}

// Writes `whole` (the single-process tensors) as a sharded checkpoint of `shards` files under
// the --save-dir `out`: each tensor's flat range cut into equal pieces, piece r in shard r.
std::string write_sharded(const std::string& out, int64_t step, const nn::NamedTensors& whole,
                          const json::Value& state, const json::Value& source_layout, int shards) {
  train::begin_sharded_checkpoint(out, step);
  const std::string tmp = train::sharded_checkpoint_tmp(out, step);
  for (int r = 0; r < shards; ++r) {
    std::vector<train::CheckpointPiece> pieces;
    for (const auto& [name, t] : whole) {
      const int64_t n = t.numel(), lo = n * r / shards, hi = n * (r + 1) / shards;
      if (lo < hi) pieces.push_back({name, lo, t.reshape({-1}).slice(0, lo, hi).contiguous()});
    }
    train::write_checkpoint_shard(tmp, r, pieces);
  }
  train::ShardedLayout layout;
  layout.world = shards;
  layout.tensors = whole;
  layout.layout = json::Value::object();
  layout.layout.set("converted_by", json::Value("mammoth ckpt convert"));
  layout.layout.set("shards", json::Value(static_cast<int64_t>(shards)));
  layout.layout.set("source_layout", source_layout);
  return train::commit_sharded_checkpoint(out, step, tmp, layout, state, /*keep_last=*/0);
}

int export_merged(std::string adapter, const std::string& out) {
  MAMMOTH_CHECK(fs::is_directory(adapter)) << "[ckpt] " << adapter << " is not a directory";
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

int export_hf(const std::string& dir, const std::string& out) {
  const json::Value state = train::inspect_checkpoint(dir).state;
  const json::Value* config = state.find("config");
  MAMMOTH_CHECK(config == nullptr || config->find("lora") == nullptr)
      << "[ckpt] " << dir << " is a LoRA run's checkpoint (adapters only): export it with "
      << "`mammoth ckpt export SAVE_DIR --merge-lora --out DIR` (SAVE_DIR/adapter, or the step's "
         "adapter/ directory)";
  const models::ModelConfig cfg = model_config(state, dir);
  auto model = models::build_model(cfg);
  // A classifier's checkpoint (train --images / --task classify) names its classes; what the
  // family's classifier drops (BERT's masked-LM head) is not trained there, not saved, and not
  // exported.
  std::vector<std::string> labels;
  if (const json::Value* l = config ? config->find("labels") : nullptr) {
    for (size_t i = 0; i < l->size(); ++i) labels.push_back((*l)[i].as_string());
  }
  const std::string& dropped = models::family_spec(cfg.family).classifier_drops_prefix;
  std::vector<train::CheckpointPiece> pieces;
  for (const auto& [name, p] : model->named_parameters()) {
    const bool drop = !dropped.empty() && name.rfind(dropped, 0) == 0;
    if (!(drop && !labels.empty())) pieces.push_back({name, 0, p});
  }
  const json::Value loaded = train::load_checkpoint_pieces(dir, pieces);
  const double shard_mb = absl::GetFlag(FLAGS_max_shard_mb);
  MAMMOTH_CHECK(shard_mb > 0) << "[ckpt] --max-shard-mb must be positive, got " << shard_mb;
  const DType dtype = dtype_flag("ckpt");
  models::save_pretrained(
      *model, out,
      {.max_shard_bytes = static_cast<int64_t>(shard_mb * 1e6), .dtype = dtype, .labels = labels});
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

int convert(const std::string& dir, const std::string& out, const std::string& to) {
  MAMMOTH_CHECK(to == "single" || to == "sharded" || to == "hf")
      << "[ckpt] --to " << (to.empty() ? "(not given)" : to)
      << ": convert writes --to single, --to sharded or --to hf";
  const int shards = absl::GetFlag(FLAGS_shards);
  MAMMOTH_CHECK(to == "sharded" || shards == 1)
      << "[ckpt] --shards " << shards << " is for --to sharded, not --to " << to;
  MAMMOTH_CHECK(shards >= 1) << "[ckpt] --shards " << shards << ": at least 1";
  if (to == "hf") return export_hf(dir, out);
  // A --save-dir of its own: never mixed into one that holds checkpoints already.
  std::error_code ec;
  MAMMOTH_CHECK(!fs::exists(out) || fs::is_empty(out, ec))
      << "[ckpt] --out " << out << " exists and is not empty; convert writes a new --save-dir";
  const train::CheckpointInfo info = train::inspect_checkpoint(dir);
  json::Value state;
  const nn::NamedTensors whole = train::load_whole_checkpoint(dir, &state);
  std::string written;
  if (to == "single") {
    std::set<std::string> names;
    for (const auto& t : whole) names.insert(t.first);
    nn::NamedTensors params, optimizer;
    for (const auto& t : whole) {
      (train::is_optimizer_state(t.first, names) ? optimizer : params).push_back(t);
    }
    written = train::save_checkpoint(out, info.step, {&params, &optimizer, state}, 0);
  } else {
    written = write_sharded(out, info.step, whole, state,
                            info.sharded ? info.layout : json::Value("single"), shards);
  }
  std::printf("converted %s (%s, step %lld, %zu tensors) to %s (%s)\n", dir.c_str(),
              info.sharded ? "sharded" : "single", static_cast<long long>(info.step), whole.size(),
              written.c_str(), to.c_str());
  return 0;
}

int run_ckpt(const std::vector<std::string>& args) {
  MAMMOTH_CHECK(args.size() == 2) << kUsage;
  const std::string& what = args[0];
  MAMMOTH_CHECK(what == "inspect" || what == "verify" || what == "convert" || what == "export")
      << "[ckpt] unknown subcommand '" << what << "'. " << kUsage;
  if (what == "export" && absl::GetFlag(FLAGS_merge_lora)) {
    MAMMOTH_CHECK(!absl::GetFlag(FLAGS_out).empty()) << "[ckpt] export needs --out DIR";
    return export_merged(args[1], absl::GetFlag(FLAGS_out));
  }
  MAMMOTH_CHECK(!absl::GetFlag(FLAGS_merge_lora))
      << "[ckpt] --merge-lora is for `ckpt export`, not `ckpt " << what << "`";
  const std::string dir = checkpoint_dir(args[1]);
  if (what == "inspect") return inspect(dir);
  if (what == "verify") return verify(dir);
  const std::string out = absl::GetFlag(FLAGS_out);
  MAMMOTH_CHECK(!out.empty()) << "[ckpt] " << what << " needs --out DIR";
  if (what == "export") return export_hf(dir, out);
  return convert(dir, out, absl::GetFlag(FLAGS_to));
}

}  // namespace
}  // namespace mammoth::tools

MAMMOTH_COMMAND(ckpt,
                "checkpoints: `ckpt inspect|verify CHECKPOINT`, `ckpt convert CHECKPOINT --out "
                "OUT --to single|sharded|hf`, `ckpt export CHECKPOINT --out DIR`",
                mammoth::tools::run_ckpt);
