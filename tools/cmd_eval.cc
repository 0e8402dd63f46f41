// `mammoth eval`: mean next-token cross-entropy of a causal LM over an llm.c token file
// (--tokens), or over a text file (--text) encoded by the model directory's tokenizer (or
// --tokenizer's) as one sequence with its special tokens (a Llama's bos in front).
//
// The tokens are cut into consecutive, non-overlapping sequences of --seq-len T (a trailing
// remainder is dropped); in each, tokens 2..T are predicted from those before them, and the
// loss is averaged over all n_seq * (T - 1) predictions. Prints one JSON line
// {"loss": L, "tokens": N} where N is that number of predictions (with --text also
// "perplexity": exp(L)). BERT: the masked-LM loss over
// the positions `mammoth train`'s rule chooses (engine/data/masking.h), sequence s masked as
// training's validation masks window s of the same file with the same --seed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "base/error.h"
#include "base/json.h"
#include "engine/autograd.h"
#include "engine/data/image_shard.h"
#include "engine/data/masking.h"
#include "engine/data/token_shard.h"
#include "engine/data/tokenizer.h"
#include "engine/ops.h"
#include "engine/train/device.h"
#include "models/family.h"
#include "models/layers.h"
#include "models/lora.h"
#include "models/registry.h"
#include "models/vit/vit.h"
#include "models/weights.h"
#include "tools/command.h"
#include "tools/masked_lm.h"

// Shared with `mammoth train` (defined in cmd_train.cc), so --seq-len defaults to train's.
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(int64_t, seq_len);
ABSL_DECLARE_FLAG(int64_t, seed);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(bool, fresh_init);
ABSL_FLAG(std::string, weights, "",
          "eval/generate: safetensors file with Hugging Face names, or a sharded checkpoint's "
          "index .json (default: the model directory's weights, or fresh weights for a "
          "registered name)");
ABSL_FLAG(std::string, adapter, "",
          "train/eval/generate: a PEFT LoRA adapter directory (adapter_config.json + "
          "adapter_model.safetensors) applied on top of --model; train continues training it");
ABSL_FLAG(std::string, tokens, "", "eval: llm.c token shard(s): file, directory or glob");
ABSL_FLAG(std::string, text, "",
          "eval: a text file, encoded by the model directory's tokenizer (or --tokenizer); "
          "instead of --tokens");
ABSL_FLAG(int64_t, batch, 8, "eval: sequences per forward pass");
ABSL_FLAG(int64_t, max_sequences, 0, "eval: evaluate at most this many sequences (0: all)");
ABSL_FLAG(std::string, images, "",
          "eval (ViT): labelled image shard (mammoth data --synthetic-images); train (ViT image "
          "classification): that, or a folder of PNG / JPEG files per class "
          "(DIR/<class>/*.png|jpg|jpeg, classes sorted by name; images of another size are "
          "resized to the model's image_size as ViTImageProcessor does)");
ABSL_FLAG(int64_t, mask_token, -1,
          "train/eval (BERT): id of the [MASK] token; -1: the model's (config.json "
          "mask_token_id, else [MASK] in the directory's tokenizer.json or vocab.txt; bert-tiny "
          "4, bert-base/-large 103; on train's embedded corpus the id appended to the BPE)");
ABSL_FLAG(double, mask_prob, 0.15,
          "train/eval (BERT): masked-LM rule: in each sequence of T tokens round(mask-prob x T) "
          "of its non-special positions (at least 1) are chosen by Philox draws keyed on "
          "(--seed, sequence index, epoch, position), so every dp/tp/sp layout and resumed "
          "run sees the same masks (new ones each epoch; eval and validation: epoch 0); a chosen "
          "position becomes [MASK] 80%, a random non-special token "
          "10%, unchanged 10%; the loss covers the chosen positions only, against the original "
          "token there; the model's special tokens are never chosen");

namespace mammoth::tools {

data::Tokenizer text_tokenizer(int64_t model_vocab, const char* command);
// --dtype (cmd_ckpt.cc): here the parameters' dtype in memory.
DType dtype_flag(const char* command);

// Shared by eval and generate: moves a loaded model to --device (printed on stderr; stdout
// carries the result).
void place_on_device(const engine::nn::Module& model, const char* command) {
  const engine::train::DeviceChoice d =
      engine::train::choose_device(absl::GetFlag(FLAGS_device), command);
  std::fprintf(stderr, "[%s] device: %s (%s)\n", command, d.device.str().c_str(), d.why.c_str());
  engine::train::move_to_device(model.named_parameters(), d.device);
  engine::train::move_to_device(model.named_buffers(), d.device);
}

// Shared by eval and generate: the model named by --model with --weights loaded, in --dtype,
// on --device.
std::shared_ptr<models::LanguageModel> load_language_model(const std::string& name,
                                                           const std::string& weights,
                                                           const char* command) {
  models::ModelOptions options;
  options.weights = weights;
  options.fresh_init = absl::GetFlag(FLAGS_fresh_init);
  options.dtype = dtype_flag(command);
  auto m = models::create_language_model(name, options);
  std::fprintf(stderr, "[%s] parameters: %lld in %s (%.1f MB)\n", command,
               static_cast<long long>(m->num_parameters()), dtype_name(m->config().dtype),
               static_cast<double>(m->num_parameters() * dtype_size(m->config().dtype)) / 1e6);
  // The adapters hang on the model's layers (their deltas keep them alive).
  std::shared_ptr<models::LoraAdapters> lora;
  if (!absl::GetFlag(FLAGS_adapter).empty()) {
    lora = models::load_adapter(*m, absl::GetFlag(FLAGS_adapter));
    std::fprintf(stderr, "[%s] adapter: %s (LoRA r=%lld on %zu layers)\n", command,
                 absl::GetFlag(FLAGS_adapter).c_str(), static_cast<long long>(lora->options().rank),
                 lora->targets().size());
  }
  m->eval();
  place_on_device(*m, command);
  if (lora) engine::train::move_to_device(lora->named_parameters(), models::module_device(*m));
  return m;
}

// tools/masked_lm.h: mask token, vocabulary and special tokens from `c`, the flags on top.
data::MaskingOptions masked_lm_options(const models::ModelConfig& c, const char* command) {
  data::MaskingOptions o;
  o.vocab_size = c.vocab_size;
  o.special_tokens = c.special_tokens.ids();
  o.mask_token = absl::GetFlag(FLAGS_mask_token) >= 0 ? absl::GetFlag(FLAGS_mask_token)
                                                      : c.special_tokens.mask;
  MAMMOTH_CHECK(o.mask_token >= 0)
      << "[" << command << "] model '" << c.name
      << "' defines no [MASK] token (no mask_token_id in config.json, no [MASK] in its "
         "tokenizer.json or vocab.txt), so masked-LM batches cannot be built: pass --mask-token ID";
  o.mask_prob = absl::GetFlag(FLAGS_mask_prob);
  MAMMOTH_CHECK(o.mask_prob > 0 && o.mask_prob <= 1)
      << "[" << command << "] --mask-prob must be in (0, 1], got " << o.mask_prob;
  return o;
}

namespace {

// The tokens evaluated: a TokenDataset or ids in memory.
struct TokenSource {
  int64_t size = 0;
  std::function<void(int64_t start, int64_t count, int32_t* out)> read;
};

void print_result(double total_loss, int64_t count, const char* unit, bool perplexity = false) {
  json::Value out = json::Value::object();
  const double loss = total_loss / static_cast<double>(count);
  out.set("loss", loss).set(unit, count);
  if (perplexity) out.set("perplexity", std::exp(loss));
  std::printf("%s\n", json::dump(out).c_str());
}

void check_vocab(const std::vector<int64_t>& ids, int64_t vocab, int64_t first_position) {
  for (size_t i = 0; i < ids.size(); ++i) {
    MAMMOTH_CHECK(ids[i] < vocab) << "[eval] token " << ids[i] << " at position "
                                  << first_position + static_cast<int64_t>(i)
                                  << " is outside the model's vocabulary of " << vocab;
  }
}

// ViT: mean cross-entropy of the classifier over a labelled image shard.
int eval_images(const std::string& path) {
  models::ModelOptions options;
  options.weights = absl::GetFlag(FLAGS_weights);
  options.fresh_init = absl::GetFlag(FLAGS_fresh_init);
  options.dtype = dtype_flag("eval");
  auto model = std::dynamic_pointer_cast<models::Vit>(
      models::create_model(absl::GetFlag(FLAGS_model), options));
  MAMMOTH_CHECK(model != nullptr) << "[eval] --images needs a ViT --model, got "
                                  << absl::GetFlag(FLAGS_model);
  model->eval();
  place_on_device(*model, "eval");
  const Device device = models::module_device(*model);
  const models::ModelConfig& c = model->config();
  const data::ImageShard shard = data::ImageShard::open(path);
  const data::ImageShardInfo& in = shard.info();
  MAMMOTH_CHECK(in.channels == c.num_channels && in.height == c.image_size &&
                in.width == c.image_size)
      << "[eval] " << path << " holds " << in.channels << "x" << in.height << "x" << in.width
      << " images but the model takes " << c.num_channels << "x" << c.image_size << "x"
      << c.image_size;
  MAMMOTH_CHECK(in.num_classes <= c.num_labels)
      << "[eval] " << path << " has " << in.num_classes << " classes but the model's head has "
      << c.num_labels;
  int64_t n = in.count;
  if (absl::GetFlag(FLAGS_max_sequences) > 0) n = std::min(n, absl::GetFlag(FLAGS_max_sequences));
  MAMMOTH_CHECK(n > 0) << "[eval] " << path << " holds no images";
  const int64_t B = absl::GetFlag(FLAGS_batch);
  MAMMOTH_CHECK(B > 0) << "[eval] --batch must be positive, got " << B;
  engine::NoGradGuard ng;
  double total = 0;
  std::vector<float> pixels;
  std::vector<int64_t> labels;
  for (int64_t s = 0; s < n; s += B) {
    const int64_t b = std::min(B, n - s);
    shard.read(s, b, &pixels, &labels);
    std::vector<double> px(pixels.begin(), pixels.end());
    engine::Tensor x =
        engine::Tensor::from_vector(px, {b, in.channels, in.height, in.width}).to(device);
    total += model->loss(x, engine::Tensor::from_ints(labels, {b}).to(device)).item() *
             static_cast<double>(b);
  }
  print_result(total, n, "images");
  return 0;
}

// BERT: masked-LM cross-entropy over the positions the training rule chooses: sequence s is
// masked as `mammoth train` masks window s of the same file in its validation batches
// (data::MaskingRule, --seed, epoch 0), so the figure is reproducible and independent of
// --batch.
int eval_masked_lm(const models::LanguageModel& model_ref, const TokenSource& data, int64_t T,
                   int64_t n_seq) {
  auto& model = const_cast<models::LanguageModel&>(model_ref);
  const models::ModelConfig& c = model.config();
  data::MaskingOptions mo = masked_lm_options(c, "eval");
  mo.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  const data::MaskingRule rule(mo);
  const int64_t B = absl::GetFlag(FLAGS_batch);
  const Device device = models::module_device(model);
  engine::NoGradGuard ng;
  double total = 0;
  int64_t masked_total = 0;
  std::vector<int32_t> buf, labels;
  for (int64_t s = 0; s < n_seq; s += B) {
    const int64_t b = std::min(B, n_seq - s);
    buf.resize(static_cast<size_t>(b * T));
    labels.resize(buf.size());
    data.read(s * T, b * T, buf.data());
    check_vocab(std::vector<int64_t>(buf.begin(), buf.end()), c.vocab_size, s * T);
    int64_t masked = 0;
    for (int64_t r = 0; r < b; ++r) {
      masked += rule.apply(static_cast<uint64_t>(s + r), /*epoch=*/0, buf.data() + r * T,
                           labels.data() + r * T, T);
    }
    if (masked == 0) continue;
    const std::vector<int64_t> ids(buf.begin(), buf.end()), targets(labels.begin(), labels.end());
    total += model
                 .loss(engine::Tensor::from_ints(ids, {b, T}).to(device),
                       engine::Tensor::from_ints(targets, {b, T}).to(device))
                 .item() *
             static_cast<double>(masked);
    masked_total += masked;
  }
  MAMMOTH_CHECK(masked_total > 0)
      << "[eval] no position was chosen for masking (every token is a special token)";
  print_result(total, masked_total, "tokens");
  return 0;
}

int run_eval(const std::vector<std::string>& args) {
  MAMMOTH_CHECK(args.empty()) << "[eval] unexpected argument '" << args[0] << "'";
  if (!absl::GetFlag(FLAGS_images).empty()) return eval_images(absl::GetFlag(FLAGS_images));
  const std::string tokens = absl::GetFlag(FLAGS_tokens);
  const std::string text_file = absl::GetFlag(FLAGS_text);
  MAMMOTH_CHECK(tokens.empty() != text_file.empty())
      << "[eval] give --tokens (llm.c token shards) or --text (a text file), one of them";
  auto model =
      load_language_model(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_weights), "eval");
  const models::ModelConfig& c = model->config();
  const Device device = models::module_device(*model);
  const int64_t T = absl::GetFlag(FLAGS_seq_len);
  MAMMOTH_CHECK(T >= 2 && T <= c.max_seq)
      << "[eval] --seq-len must be in [2, max_seq = " << c.max_seq << "], got " << T;
  const int64_t B = absl::GetFlag(FLAGS_batch);
  MAMMOTH_CHECK(B > 0) << "[eval] --batch must be positive, got " << B;

  TokenSource data;
  data::TokenDataset shards;
  std::vector<int32_t> text_ids;
  const std::string source = tokens.empty() ? text_file : tokens;
  if (!tokens.empty()) {
    shards = data::TokenDataset::open(tokens);
    data.size = shards.size();
    data.read = [&](int64_t start, int64_t count, int32_t* out) { shards.read(start, count, out); };
  } else {
    const data::Tokenizer tok = text_tokenizer(c.vocab_size, "eval");
    std::ifstream in(text_file, std::ios::binary);
    MAMMOTH_CHECK(in.good()) << "[eval] cannot open --text file '" << text_file << "'";
    std::ostringstream ss;
    ss << in.rdbuf();
    text_ids = tok.encode(ss.str(), /*add_special_tokens=*/true);
    data.size = static_cast<int64_t>(text_ids.size());
    data.read = [&](int64_t start, int64_t count, int32_t* out) {
      std::copy(text_ids.begin() + start, text_ids.begin() + start + count, out);
    };
  }
  int64_t n_seq = data.size / T;
  if (absl::GetFlag(FLAGS_max_sequences) > 0)
    n_seq = std::min(n_seq, absl::GetFlag(FLAGS_max_sequences));
  MAMMOTH_CHECK(n_seq > 0) << "[eval] " << source << " holds " << data.size
                           << " tokens, fewer than one sequence of " << T;
  if (models::family_spec(c.family).objective == models::Objective::kMaskedLm)
    return eval_masked_lm(*model, data, T, n_seq);
  engine::NoGradGuard ng;
  double total = 0;
  std::vector<int32_t> buf;
  for (int64_t s = 0; s < n_seq; s += B) {
    const int64_t b = std::min(B, n_seq - s);
    buf.resize(static_cast<size_t>(b * T));
    data.read(s * T, b * T, buf.data());
    std::vector<int64_t> ids(buf.begin(), buf.end());
    check_vocab(ids, c.vocab_size, s * T);
    const double loss = model->loss(engine::Tensor::from_ints(ids, {b, T}).to(device)).item();
    total += loss * static_cast<double>(b * (T - 1));
  }
  print_result(total, n_seq * (T - 1), "tokens", !text_file.empty());
  return 0;
}

}  // namespace

MAMMOTH_COMMAND(eval,
                "mean loss on a file: next-token (GPT-2, LLaMA), masked-LM (BERT) on --tokens "
                "or --text, classification (ViT) on --images",
                run_eval);

}  // namespace mammoth::tools
