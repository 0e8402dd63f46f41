// BERT's family spec: BertForMaskedLM's config.json (and the directory's special tokens), its
// registered sizes and its costs.
#include <filesystem>
#include <fstream>
#include <memory>
#include <utility>

#include "base/error.h"
#include "models/bert/bert.h"
#include "models/family.h"

namespace mammoth::models {
namespace {

ModelConfig bert(const std::string& name, int64_t vocab, int64_t layers, int64_t heads, int64_t d,
                 int64_t seq, double dropout, SpecialTokenIds special) {
  ModelConfig c;
  c.special_tokens = special;
  c.name = name;
  c.family = Family::kBert;
  c.vocab_size = vocab;
  c.n_layer = layers;
  c.n_head = c.n_kv_head = heads;
  c.d_model = d;
  c.d_ff = 4 * d;
  c.max_seq = seq;
  c.norm_eps = 1e-12;
  c.tie_embeddings = true;
  c.dropout = c.attn_dropout = dropout;
  c.type_vocab_size = 2;
  c.num_labels = 2;
  return c;
}

constexpr SpecialTokenIds kBertUncased = {
    .pad = 0, .unk = 100, .cls = 101, .sep = 102, .mask = 103};

void from_hf(const json::Value& hf, const std::string& type, const std::string& what,
             ModelConfig& c) {
  hf::read_encoder(hf,
                   {"vocab_size", "max_position_embeddings", "type_vocab_size",
                    "position_embedding_type", "classifier_dropout", "tie_word_embeddings"},
                   type, what, 0.1, c);
  c.vocab_size = hf.at("vocab_size").as_int();
  c.max_seq = hf::get_int(hf, "max_position_embeddings", 512);
  c.type_vocab_size = hf::get_int(hf, "type_vocab_size", 2);
  c.tie_embeddings = true;
  hf::require_bool(hf, "tie_word_embeddings", true, what);  // the MLM decoder is tied
  c.special_tokens = {.pad = hf::get_int(hf, "pad_token_id", -1),
                      .unk = hf::get_int(hf, "unk_token_id", -1),
                      .cls = hf::get_int(hf, "cls_token_id", -1),
                      .sep = hf::get_int(hf, "sep_token_id", -1),
                      .mask = hf::get_int(hf, "mask_token_id", -1)};
  if (const json::Value* pe = hf.find("position_embedding_type"); pe && !pe->is_null()) {
    MAMMOTH_CHECK(pe->as_string() == "absolute")
        << "[config_from_hf_json] " << what << ": position_embedding_type '" << pe->as_string()
        << "' is not supported";
  }
  // The classifier's dropout is hidden_dropout_prob (transformers' default for null).
  const double cd = hf::get_double(hf, "classifier_dropout", c.dropout);
  MAMMOTH_CHECK(cd == c.dropout) << "[config_from_hf_json] " << what << ": classifier_dropout "
                                 << cd << " != hidden_dropout_prob " << c.dropout
                                 << " is not supported";
}

void to_hf(const ModelConfig& c, json::Value& v) {
  hf::write_encoder(c, "BertForMaskedLM", v);
  v.set("vocab_size", c.vocab_size).set("max_position_embeddings", c.max_seq);
  v.set("type_vocab_size", c.type_vocab_size);
  v.set("position_embedding_type", "absolute");
  // pad_token_id is BertConfig's own; the others are kept by PretrainedConfig as extra
  // attributes, so the masked-LM rule's tokens travel with the model directory.
  const SpecialTokenIds& st = c.special_tokens;
  const std::pair<const char*, int64_t> special[] = {{"pad_token_id", st.pad},
                                                     {"unk_token_id", st.unk},
                                                     {"cls_token_id", st.cls},
                                                     {"sep_token_id", st.sep},
                                                     {"mask_token_id", st.mask}};
  for (const auto& [key, id] : special)
    if (id >= 0) v.set(key, id);
}

// The special tokens config.json does not give, by their spelling in the directory's tokenizer
// (tokenizer.json's added_tokens, else WordPiece's vocab.txt, one token per line).
void from_dir(const std::string& dir_name, ModelConfig& c) {
  SpecialTokenIds* st = &c.special_tokens;
  if (st->mask >= 0) return;
  const std::filesystem::path dir = dir_name;
  const std::pair<const char*, int64_t*> names[] = {{"[PAD]", &st->pad},
                                                    {"[UNK]", &st->unk},
                                                    {"[CLS]", &st->cls},
                                                    {"[SEP]", &st->sep},
                                                    {"[MASK]", &st->mask}};
  auto found = [&](const std::string& token, int64_t id) {
    for (const auto& [name, field] : names)
      if (token == name && *field < 0) *field = id;
  };
  const std::filesystem::path tokenizer = dir / "tokenizer.json", vocab = dir / "vocab.txt";
  if (std::filesystem::exists(tokenizer)) {
    const json::Value t = json::parse_file(tokenizer.string());
    if (const json::Value* added = t.find("added_tokens"); added != nullptr && added->is_array()) {
      for (const json::Value& a : *added) {
        const json::Value* id = a.find("id");
        const json::Value* content = a.find("content");
        if (id != nullptr && content != nullptr) found(content->as_string(), id->as_int());
      }
    }
  } else if (std::filesystem::exists(vocab)) {
    std::ifstream in(vocab);
    std::string line;
    for (int64_t id = 0; std::getline(in, line); ++id) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      found(line, id);
    }
  }
}

FamilyCost bert_cost() {
  FamilyCost k = cost::layer_norm_cost();
  k.outside_params = [](const ModelConfig& c) {
    const int64_t d = c.d_model, V = c.vocab_size;
    int64_t n = (V + c.max_seq + c.type_vocab_size) * d + 2 * d;  // embeddings + LayerNorm
    n += d * d + d;                                               // pooler
    n += d * d + d + 2 * d + V;                                   // MLM transform + decoder bias
    if (c.num_labels > 0) n += c.num_labels * d + c.num_labels;
    return n;
  };
  k.embedding_params = [](const ModelConfig& c) {
    return (c.vocab_size + c.max_seq + c.type_vocab_size) * c.d_model;
  };
  k.head_flops = [](const ModelConfig& c, int64_t) {
    const int64_t d = c.d_model;
    return 2.0 * d * d + 2.0 * d * c.vocab_size;  // MLM transform + decoder on every token
  };
  k.tp_split = cost::encoder_tp_split;
  k.activations = [](const ModelConfig&, const ActivationSizes& s) {
    FamilyActivations a = cost::layer_norm_activations(s);
    a.embed = (s.Ns * s.C + 2 * s.Ns) * s.e;  // the embeddings' LayerNorm
    // Transform dense's input and output (gelu's input), gelu's output (the LayerNorm's
    // input), the LayerNorm's output (the decoder's input).
    a.head = 4 * s.N * s.C * s.e + 2 * s.N * s.e;
    return a;
  };
  return k;
}

FamilySpec bert_family() {
  FamilySpec f;
  f.family = Family::kBert;
  f.name = "bert";
  f.hf_model_types = {"bert"};
  f.causal = false;
  f.classifier = true;
  f.classifier_architecture = "BertForSequenceClassification";
  f.classifier_drops_prefix = "cls.";  // the masked-LM head
  f.title = "BERT";
  f.objective = Objective::kMaskedLm;
  f.pipeline = PipelineForm::kOneDeviceOnly;
  f.classifier_sharded = true;
  f.classifier_recompute = true;
  f.classifier_pipeline = true;
  f.build = [](const ModelConfig& c) { return std::make_shared<Bert>(c); };
  f.from_hf = from_hf;
  f.to_hf = to_hf;
  f.from_dir = from_dir;
  f.validate = [](const ModelConfig& c, const std::string& where) {
    MAMMOTH_CHECK(c.type_vocab_size > 0)
        << where << "type_vocab_size must be positive, got " << c.type_vocab_size;
  };
  f.configs = {
      // A small WordPiece vocabulary trained with BERT's special tokens first (what Hugging
      // Face `tokenizers` gives): [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4. In the ids of
      // `mammoth data`'s byte-level BPE these are the control bytes 0x00-0x04, absent from text.
      bert("bert-tiny", 512, 2, 4, 64, 128, 0.0,
           {.pad = 0, .unk = 1, .cls = 2, .sep = 3, .mask = 4}),
      // bert-base-uncased's vocabulary: [PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103.
      bert("bert-base", 30522, 12, 12, 768, 512, 0.1, kBertUncased),
      bert("bert-large", 30522, 24, 16, 1024, 512, 0.1, kBertUncased),
  };
  f.cost = bert_cost();
  return f;
}

[[maybe_unused]] const bool kRegistered = register_family(bert_family());

}  // namespace
}  // namespace mammoth::models
