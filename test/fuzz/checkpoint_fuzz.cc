// libFuzzer target: the checkpoint readers (engine/train/checkpoint.cc) that interpret
// manifest.json, index.json and state.json: checkpoint_problems (sizes, CRC-32C, the files a
// manifest lists), inspect_checkpoint (index tensors, dtypes, shapes, shard lists, state step)
// and load_whole_checkpoint (coverage of every tensor by pieces, then the copies out of them).
//
// The input is a checkpoint directory, its files separated by a line "--next--":
//
//   manifest.json  --next--  state.json  --next--  index.json  --next--  blob 0  --next--  blob 1
//
// An empty index.json part means the single-process form (blob 0 is model.safetensors, blob 1
// optimizer.safetensors); otherwise the sharded form (blobs are shard_00000 and shard_00001).
// An empty manifest part means "a manifest that tells the truth": the target writes one with the
// right sizes and CRC-32C of the other files, so that the fuzzer, which cannot forge CRCs, still
// reaches the code interpreting the index, the state and the shards. A non-empty part is written
// as it is (a lying manifest).
//
// Every input must either load or be refused with mammoth::Error; whatever loads must be
// consistent (each tensor's bytes as its dtype and shape say, its pieces in the listed files).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "base/crc32c.h"
#include "base/error.h"
#include "base/json.h"
#include "engine/ops.h"
#include "engine/train/checkpoint.h"
#include "kernels/registry.h"
#include "test/fuzz/fuzz_util.h"

namespace {

namespace fs = std::filesystem;
namespace train = mammoth::engine::train;
namespace json = mammoth::json;
using mammoth::fuzz::invariant_failed;

// MAMMOTH_FUZZ_VERBOSE=1 prints each refusal (to see which check a seed reaches).
void refused(const char* reader, const mammoth::Error& e) {
  static const bool verbose = std::getenv("MAMMOTH_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "%s refused: %s\n", reader, e.what());
}

// Recreates the checkpoint directory for this input; returns it.
std::string write_checkpoint(std::string_view data) {
  std::vector<std::string_view> parts;
  constexpr std::string_view kSep = "\n--next--\n";
  std::string_view rest = data;
  for (size_t at; parts.size() < 4 && (at = rest.find(kSep)) != std::string_view::npos;) {
    parts.push_back(rest.substr(0, at));
    rest.remove_prefix(at + kSep.size());
  }
  parts.push_back(rest);
  parts.resize(5);
  static const std::string dir = [] {
    const std::string d = mammoth::fuzz::scratch_dir() + "/ckpt";
    std::error_code ec;
    fs::create_directory(d, ec);
    if (ec) invariant_failed("checkpoint: cannot create the scratch checkpoint");
    return d;
  }();
  const bool sharded = !parts[2].empty();
  std::vector<std::pair<std::string, std::string_view>> files = {{"state.json", parts[1]}};
  // The other form's files are removed (cheaper than recreating the directory).
  const char* other[3] = {"model.safetensors", "optimizer.safetensors", nullptr};
  if (sharded) {
    files.push_back({"index.json", parts[2]});
    files.push_back({"shard_00000.safetensors", parts[3]});
    files.push_back({"shard_00001.safetensors", parts[4]});
  } else {
    files.push_back({"model.safetensors", parts[3]});
    files.push_back({"optimizer.safetensors", parts[4]});
    other[0] = "index.json";
    other[1] = "shard_00000.safetensors";
    other[2] = "shard_00001.safetensors";
  }
  for (const char* f : other) {
    if (f != nullptr) ::unlink((dir + "/" + f).c_str());
  }
  json::Value entries = json::Value::object();
  for (const auto& [name, bytes] : files) {
    mammoth::fuzz::write_scratch("ckpt/" + name, bytes.data(), bytes.size());
    json::Value e = json::Value::object();
    e.set("bytes", json::Value(static_cast<int64_t>(bytes.size())));
    e.set("crc32c", json::Value(static_cast<int64_t>(mammoth::crc32c(bytes.data(), bytes.size()))));
    entries.set(name, e);
  }
  if (parts[0].empty()) {
    json::Value manifest = json::Value::object();
    manifest.set("step", json::Value(int64_t{1}));
    manifest.set("files", entries);
    const std::string text = json::dump(manifest);
    mammoth::fuzz::write_scratch("ckpt/manifest.json", text.data(), text.size());
  } else {
    mammoth::fuzz::write_scratch("ckpt/manifest.json", parts[0].data(), parts[0].size());
  }
  return dir;
}

}  // namespace

// The readers only allocate tensors and copy bytes into them; they never compute. Instead of
// linking every op and CPU kernel (with their ISA-specific builds) into the fuzzer, the ops the
// engine's objects refer to are defined here to fail loudly: if a reader ever dispatched one,
// the fuzzer would record that input as a finding rather than run a kernel on hostile data.
namespace mammoth::engine {
namespace {
[[noreturn]] void no_op(const char* name) {
  std::fprintf(stderr, "checkpoint fuzz: a reader called the op %s\n", name);
  std::abort();
}
}  // namespace
Tensor add(const Tensor&, const Tensor&) { no_op("add"); }
Tensor cast(const Tensor&, DType) { no_op("cast"); }
Tensor sum_to_shape(const Tensor&, const Shape&) { no_op("sum_to_shape"); }
Tensor linear(const Tensor&, const Tensor&, const Tensor&) { no_op("linear"); }
Tensor layer_norm(const Tensor&, const Tensor&, const Tensor&, double) { no_op("layer_norm"); }
Tensor rms_norm(const Tensor&, const Tensor&, double) { no_op("rms_norm"); }
Tensor embedding(const Tensor&, const Tensor&) { no_op("embedding"); }
Tensor dropout(const Tensor&, double, uint64_t, uint64_t, bool) { no_op("dropout"); }
void copy_(const Tensor&, const Tensor&) { no_op("copy_"); }
void fill_(const Tensor&, double) { no_op("fill_"); }
bool all_finite(const Tensor&) { no_op("all_finite"); }
namespace detail {
void describe_launch(kernels::Kernel, const Tensor&, const std::vector<kernels::TensorArg>&,
                     const std::vector<kernels::TensorArg>&, const void*, char*) {
  no_op("a kernel launch under the profiler");
}
}  // namespace detail
}  // namespace mammoth::engine
// No kernels: any dispatch is refused by the registry before it reaches memory.
namespace mammoth::kernels::cpu {
void register_kernels(Registry&) {}
}  // namespace mammoth::kernels::cpu

// Whether checkpoint_problems finds nothing (it throws Error for a manifest it cannot read).
bool intact(const std::string& dir) {
  try {
    const std::vector<std::string> problems = train::checkpoint_problems(dir);
    if (!problems.empty() && std::getenv("MAMMOTH_FUZZ_VERBOSE") != nullptr) {
      std::fprintf(stderr, "checkpoint_problems: %s\n", problems.front().c_str());
    }
    return problems.empty();
  } catch (const mammoth::Error& e) {
    refused("checkpoint_problems", e);
  }
  return false;
}

// Each reader runs once per input where it can make a difference: loading inspects first, so
// it runs only after inspection succeeded, and checkpoint_problems (which loading also runs
// first) runs on its own otherwise, or to confirm that a checkpoint that loaded is intact.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir =
      write_checkpoint(std::string_view(reinterpret_cast<const char*>(data), size));
  train::CheckpointInfo info;
  try {
    info = train::inspect_checkpoint(dir);
    for (const train::CheckpointTensorInfo& t : info.tensors) {
      if (t.pieces < 1 || t.files.empty() || t.bytes < 0) {
        invariant_failed("checkpoint: an inspected tensor without pieces or with negative bytes");
      }
    }
  } catch (const mammoth::Error& e) {
    refused("inspect_checkpoint", e);
    intact(dir);
    return 0;
  }
  mammoth::engine::nn::NamedTensors whole;
  try {
    json::Value state;
    whole = train::load_whole_checkpoint(dir, &state);
  } catch (const mammoth::Error& e) {
    refused("load_whole_checkpoint", e);
    return 0;
  }
  if (!intact(dir) || whole.size() != info.tensors.size()) {
    invariant_failed("checkpoint: loaded a checkpoint that verification refused");
  }
  for (size_t i = 0; i < whole.size(); ++i) {
    const auto& [name, t] = whole[i];
    if (name != info.tensors[i].name || t.shape() != info.tensors[i].shape ||
        static_cast<int64_t>(t.nbytes()) != info.tensors[i].bytes) {
      invariant_failed("checkpoint: a loaded tensor differs from its inspected entry");
    }
    mammoth::fuzz::touch(static_cast<const uint8_t*>(t.raw_data()), t.nbytes());
  }
  return 0;
}
