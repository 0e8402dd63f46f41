#include "tools/train_classify.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "base/error.h"
#include "base/json.h"
#include "engine/data/image_folder.h"
#include "engine/data/text_classification.h"
#include "engine/data/wordpiece.h"
#include "engine/ops.h"
#include "models/bert/bert.h"
#include "models/family.h"
#include "models/policies/policy.h"
#include "models/registry.h"
#include "models/vit/vit.h"
#include "tools/plan_flags.h"

ABSL_DECLARE_FLAG(std::string, images);  // tools/cmd_eval.cc: eval reads it too
ABSL_FLAG(std::string, task, "",
          "what the model learns: empty (its family's own: causal LM, BERT masked LM, ViT image "
          "classification with --images) or classify (BERT sequence classification from "
          "--train-file)");
ABSL_FLAG(std::string, train_file, "",
          "--task classify: labelled rows, .jsonl ({\"text\" or \"ids\", \"label\"} per line) or "
          ".tsv (a header row naming the columns text or ids, and label)");
ABSL_FLAG(std::string, val_file, "",
          "--task classify: validation rows in --train-file's format (empty: hold out "
          "--val-fraction of --train-file)");
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, tokenizer);
ABSL_DECLARE_FLAG(double, dropout);
ABSL_DECLARE_FLAG(int64_t, seed);
ABSL_DECLARE_FLAG(bool, fresh_init);
ABSL_DECLARE_FLAG(std::string, plan);

namespace mammoth::tools {
namespace {

namespace fs = std::filesystem;

// Refuses each flag of `names` that holds something other than its default, naming `why`.
void refuse_flags(const std::vector<const char*>& names, const std::string& why) {
  for (const char* name : names) {
    std::string dashed = name;
    for (char& c : dashed)
      if (c == '_') c = '-';
    MAMMOTH_CHECK(!flag_changed(name)) << "[train] --" << dashed << " " << why;
  }
}

// (mean loss, correct predictions) of logits [B, K] against labels [B].
std::pair<double, int64_t> loss_and_correct(const engine::Tensor& logits,
                                            const engine::Tensor& labels) {
  const double loss = engine::cross_entropy(logits, labels).item();
  const std::vector<double> l = logits.to(Device::cpu()).to_vector();
  const std::vector<int64_t> y = labels.to(Device::cpu()).to_int_vector();
  const int64_t K = logits.size(1);
  int64_t correct = 0;
  for (size_t b = 0; b < y.size(); ++b) {
    int64_t best = 0;
    for (int64_t k = 1; k < K; ++k)
      if (l[b * K + k] > l[b * K + best]) best = k;
    correct += best == y[b];
  }
  return {loss, correct};
}

// BERT's attention mask: 1 where a token is, 0 at padding (pad id), on the ids' device.
engine::Tensor attention_mask(const engine::Tensor& ids, int64_t pad) {
  std::vector<int64_t> m = ids.to(Device::cpu()).to_int_vector();
  for (int64_t& v : m) v = v != pad;
  return engine::Tensor::from_ints(m, ids.shape()).to(ids.device());
}

std::string class_list(const std::vector<std::string>& classes) {
  std::string s;
  for (size_t k = 0; k < classes.size(); ++k)
    s += (k ? ", " : "") + std::to_string(k) + " = " + classes[k];
  return s;
}

}  // namespace

bool classification_requested() {
  const std::string task = absl::GetFlag(FLAGS_task);
  MAMMOTH_CHECK(task.empty() || task == "classify")
      << "[train] --task must be empty (the model family's own objective) or classify, got '"
      << task << "'";
  const bool images = !absl::GetFlag(FLAGS_images).empty();
  if (images || task == "classify") return true;
  refuse_flags({"train_file", "val_file"}, "needs --task classify");
  const models::FamilySpec& spec =
      models::family_spec(models::resolve_config(absl::GetFlag(FLAGS_model)).family);
  MAMMOTH_CHECK(spec.objective != models::Objective::kImageClassifier)
      << "[train] --model " << absl::GetFlag(FLAGS_model) << " is a " << spec.title
      << ": it trains image classification, give --images DIR|FILE.shard";
  return false;
}

int run_classification(runtime::TrainingRuntime& rt, const engine::train::DeviceChoice& device,
                       engine::train::TrainOptions o) {
  const bool lead = rt.lead();
  const std::string model_name = absl::GetFlag(FLAGS_model);
  const models::ModelConfig base = models::resolve_config(model_name);
  const bool images = !absl::GetFlag(FLAGS_images).empty();
  refuse_flags({"data", "val_data", "loss_on", "lora_rank", "lora_alpha", "lora_dropout",
                "lora_targets", "adapter", "dump_batches", "log_grad_norms", "profile", "mask_prob",
                "mask_token", "vocab_size", "cluster", "global_batch"},
               "does not apply to classification (--images / --task classify)");
  MAMMOTH_CHECK(absl::GetFlag(FLAGS_plan) != "auto")
      << "[train] --plan auto plans language models; give classification's layout with --dp "
         "(and --zero) or a --plan FILE";

  models::ModelOptions mo;
  mo.dropout = absl::GetFlag(FLAGS_dropout);
  mo.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  mo.fresh_init = absl::GetFlag(FLAGS_fresh_init);
  std::optional<data::ImageExamples> image_data;
  std::optional<data::WordPiece> wordpiece;
  std::optional<data::TextExamples> text_data, text_val;
  const data::LabelledExamples* train_examples = nullptr;
  const data::LabelledExamples* val_examples = nullptr;
  std::vector<std::string> classes;
  std::shared_ptr<models::Model> model;
  int64_t pad = 0;
  if (images) {
    MAMMOTH_CHECK(absl::GetFlag(FLAGS_task).empty())
        << "[train] --images trains ViT image classification; --task classify is BERT's "
           "(--train-file)";
    MAMMOTH_CHECK(models::family_spec(base.family).objective == models::Objective::kImageClassifier)
        << "[train] --images trains ViT image classification; --model " << model_name << " is a "
        << models::family_name(base.family) << " model";
    refuse_flags({"seq_len", "tokenizer", "train_file", "val_file"},
                 "does not apply to --images (the model's image_size and patch_size set the "
                 "sequence)");
    const std::string src = absl::GetFlag(FLAGS_images);
    image_data.emplace(
        fs::is_directory(src)
            ? data::ImageExamples::open_folder(
                  src, base.num_channels, base.image_size,
                  !fs::is_directory(model_name) ||
                      data::image_processor_resizes(model_name, base.num_channels, base.image_size))
            : data::ImageExamples::open_shard(src, base.num_channels, base.image_size));
    train_examples = &*image_data;
    classes = image_data->classes();
  } else {
    // A classifier of tokens: its family's own objective is a language model's.
    MAMMOTH_CHECK(models::family_spec(base.family).classifier &&
                  models::family_spec(base.family).language_model)
        << "[train] --task classify trains BERT sequence classification; --model " << model_name
        << " is a " << models::family_name(base.family) << " model";
    refuse_flags({"images"}, "is ViT's; --task classify reads --train-file");
    const std::string train_file = absl::GetFlag(FLAGS_train_file);
    MAMMOTH_CHECK(!train_file.empty())
        << "[train] --task classify needs --train-file FILE.jsonl|.tsv";
    std::string vocab_dir = absl::GetFlag(FLAGS_tokenizer);
    if (vocab_dir.empty() && fs::exists(model_name + "/vocab.txt")) vocab_dir = model_name;
    if (!vocab_dir.empty()) wordpiece.emplace(data::WordPiece::from_directory(vocab_dir));
    data::TextClassificationOptions to;
    to.seq_len = rt.plan().seq_len;
    MAMMOTH_CHECK(to.seq_len <= base.max_seq)
        << "[train] --seq-len " << to.seq_len << " exceeds " << model_name << "'s " << base.max_seq
        << " positions";
    to.tokenizer = wordpiece ? &*wordpiece : nullptr;
    to.vocab_size = base.vocab_size;
    to.pad_id = base.special_tokens.pad;
    MAMMOTH_CHECK(wordpiece || to.pad_id >= 0)
        << "[train] " << model_name << " defines no pad_token_id to pad rows of ids with";
    MAMMOTH_CHECK(!wordpiece || wordpiece->vocab_size() <= base.vocab_size)
        << "[train] " << wordpiece->describe() << " has more tokens than " << model_name << "'s "
        << base.vocab_size;
    text_data.emplace(data::TextExamples::open(train_file, to));
    if (!absl::GetFlag(FLAGS_val_file).empty()) {
      to.classes = &text_data->classes();
      to.integer_labels = text_data->integer_labels();
      text_val.emplace(data::TextExamples::open(absl::GetFlag(FLAGS_val_file), to));
      val_examples = &*text_val;
    }
    train_examples = &*text_data;
    classes = text_data->classes();
    pad = text_data->pad_id();
    // Pipeline stages rebuild the attention mask from the config's pad id (Bert::pipeline_batch).
    MAMMOTH_CHECK(rt.plan().pp == 1 || pad == base.special_tokens.pad)
        << "[train] --pp: the rows' padding id " << pad << " ("
        << (wordpiece ? wordpiece->describe() : std::string("rows of ids")) << ") is not "
        << model_name << "'s pad_token_id " << base.special_tokens.pad;
    if (lead)
      std::fprintf(
          stderr, "[train] tokens: %s; %lld row(s) truncated to --seq-len %lld\n",
          wordpiece ? wordpiece->describe().c_str() : "ids as given",
          static_cast<long long>(text_data->truncated() + (text_val ? text_val->truncated() : 0)),
          static_cast<long long>(to.seq_len));
  }
  mo.num_labels = static_cast<int64_t>(classes.size());
  model = models::create_model(model_name, mo);
  // BERT's masked-LM head takes no part in classification: frozen, and not trained or saved.
  engine::nn::NamedTensors trained;
  if (!images) {
    for (auto& [name, p] : model->named_parameters()) {
      if (name.rfind("cls.", 0) == 0) {
        p.requires_grad_(false);
      } else {
        trained.emplace_back(name, p);
      }
    }
    o.trained_params = &trained;
  }
  engine::train::move_to_device(model->named_parameters(), device.device);
  engine::train::move_to_device(model->named_buffers(), device.device);
  o.objective = "classify";
  rt.assemble_classifier(model, o);
  const models::ModelConfig& cfg = model->config();
  // A ViT sequence is its patches and the class token.
  if (images) o.seq_len = cfg.num_patches() + 1;
  if (lead) {
    std::fprintf(stderr, "[train] data: %s%s\n[train] classes: %s\n",
                 train_examples->describe().c_str(),
                 val_examples ? ("; validation " + val_examples->describe()).c_str() : "",
                 class_list(classes).c_str());
    std::fprintf(stderr,
                 "[train] model %s: %lld parameters, %zu classes | batch %lld x %lld "
                 "accumulation x %d dp, %lld steps\n",
                 model_name.c_str(), static_cast<long long>(model->num_parameters()),
                 classes.size(), static_cast<long long>(o.micro_batch),
                 static_cast<long long>(o.grad_accum), rt.plan().dp,
                 static_cast<long long>(o.steps));
  }
  json::Value labels = json::Value::array();
  for (const std::string& c : classes) labels.push_back(json::Value(c));
  json::Value config = json::Value::object();
  config.set("model", json::Value(model_name));
  config.set("model_config", models::config_to_hf_json(cfg));
  config.set("labels", labels);  // id -> class name, in every checkpoint's state.json
  if (lead && !o.save_dir.empty()) {
    fs::create_directories(o.save_dir);
    std::ofstream(o.save_dir + "/labels.json") << json::dump(labels) << "\n";
  }

  // Each checkpoint carries the classifier as a transformers directory (hf/: config.json with
  // the class names, and model.safetensors; BERT as BertForSequenceClassification).
  // Under tp / sp the sharded form trains and `model` keeps its first weights; under pp each
  // rank updates only its stages' part of it.
  models::Model& learner = rt.trained_classifier();
  const bool whole = &learner == model.get() && rt.plan().pp == 1;
  if (rt.plan().zero < 3 && whole) {
    o.after_checkpoint = [&model, &classes](const std::string& dir) {
      models::save_pretrained(*model, dir + "/hf", {.labels = classes});
    };
  } else if (lead) {
    std::fprintf(stderr,
                 "[train] %s: checkpoints carry no hf/ directory (each rank holds a shard of "
                 "the parameters); `mammoth ckpt export` writes one\n",
                 whole              ? "--zero 3"
                 : rt.plan().pp > 1 ? "--pp"
                                    : "--tp / --sp");
  }
  // The class logits of a batch, from the form that trains; loss and accuracy follow from them.
  std::function<engine::Tensor(const engine::Tensor&)> logits;
  if (images) {
    auto vit = std::dynamic_pointer_cast<models::Vit>(model);
    MAMMOTH_CHECK(vit != nullptr) << "[train] " << model_name << " did not build a ViT";
    if (auto* sharded = dynamic_cast<models::ShardedVit*>(&learner)) {
      logits = [sharded](const engine::Tensor& pixels) { return sharded->forward(pixels); };
    } else {
      logits = [vit](const engine::Tensor& pixels) { return vit->forward(pixels); };
    }
  } else {
    auto bert = std::dynamic_pointer_cast<models::Bert>(model);
    MAMMOTH_CHECK(bert != nullptr) << "[train] " << model_name << " did not build a BERT";
    if (auto* sharded = dynamic_cast<models::ShardedSequenceClassifier*>(&learner)) {
      logits = [sharded, pad](const engine::Tensor& ids) {
        return sharded->classify(ids, attention_mask(ids, pad));
      };
    } else {
      logits = [bert, pad](const engine::Tensor& ids) {
        return bert->classify(bert->encode(ids, engine::Tensor(), attention_mask(ids, pad)));
      };
    }
  }
  const engine::train::LossFn loss_fn = [logits](const engine::Tensor& in,
                                                 const engine::Tensor& tg) {
    return engine::cross_entropy(logits(in), tg);
  };
  o.eval_fn = [logits](const engine::Tensor& in, const engine::Tensor& tg) {
    return loss_and_correct(logits(in), tg);
  };
  const engine::train::TrainResult r =
      engine::train::train(learner, loss_fn, *train_examples, val_examples, o, config);
  if (lead && !r.losses.empty()) {
    std::fprintf(stderr, "[train] done: steps %lld..%lld, loss %.4f -> %.4f",
                 static_cast<long long>(r.first_step), static_cast<long long>(r.last_step),
                 r.losses.front(), r.losses.back());
    if (r.last_val_accuracy == r.last_val_accuracy)
      std::fprintf(stderr, ", validation loss %.4f, accuracy %.4f", r.last_val_loss,
                   r.last_val_accuracy);
    std::fprintf(stderr, "%s\n", r.interrupted ? " (interrupted; checkpoint saved)" : "");
  }
  return r.interrupted ? 130 : 0;
}

}  // namespace mammoth::tools
