// ViT's family spec: ViTForImageClassification's config.json, its registered sizes and costs.
#include <memory>

#include "base/error.h"
#include "models/family.h"
#include "models/vit/vit.h"

namespace mammoth::models {
namespace {

ModelConfig vit(const std::string& name, int64_t image, int64_t patch, int64_t layers,
                int64_t heads, int64_t d, int64_t labels) {
  ModelConfig c;
  c.name = name;
  c.family = Family::kVit;
  c.n_layer = layers;
  c.n_head = c.n_kv_head = heads;
  c.d_model = d;
  c.d_ff = 4 * d;
  c.norm_eps = 1e-12;
  c.tie_embeddings = false;
  c.image_size = image;
  c.patch_size = patch;
  c.num_channels = 3;
  c.num_labels = labels;
  return c;
}

void from_hf(const json::Value& hf, const std::string& type, const std::string& what,
             ModelConfig& c) {
  // encoder_stride: ViTForMaskedImageModeling's decoder only.
  hf::read_encoder(hf,
                   {"image_size", "patch_size", "num_channels", "qkv_bias", "encoder_stride",
                    "tie_word_embeddings"},
                   type, what, 0.0, c);
  c.image_size = hf::get_int(hf, "image_size", 224);
  c.patch_size = hf::get_int(hf, "patch_size", 16);
  c.num_channels = hf::get_int(hf, "num_channels", 3);
  c.tie_embeddings = false;  // no LM head: tie_word_embeddings means nothing here
  hf::require_bool(hf, "qkv_bias", true, what);
}

void to_hf(const ModelConfig& c, json::Value& v) {
  hf::write_encoder(c, "ViTForImageClassification", v);
  v.set("image_size", c.image_size).set("patch_size", c.patch_size);
  v.set("num_channels", c.num_channels).set("qkv_bias", true);
}

FamilyCost vit_cost() {
  FamilyCost k = cost::layer_norm_cost();
  k.outside_params = [](const ModelConfig& c) {
    const int64_t d = c.d_model;
    int64_t n = d + (c.num_patches() + 1) * d;                  // cls, positions
    n += d * c.num_channels * c.patch_size * c.patch_size + d;  // patch projection
    n += 2 * d + c.num_labels * d + c.num_labels;               // layernorm, classifier
    return n;
  };
  k.embedding_params = [](const ModelConfig& c) { return (c.num_patches() + 1) * c.d_model; };
  k.head_flops = [](const ModelConfig& c, int64_t T) {
    // Patch projection on every patch token; the classifier once per image, amortised.
    const int64_t d = c.d_model;
    return 2.0 * d * c.num_channels * c.patch_size * c.patch_size *
               (static_cast<double>(c.num_patches()) / T) +
           2.0 * d * c.num_labels / T;
  };
  k.default_seq_len = [](const ModelConfig& c) { return c.num_patches() + 1; };
  k.tp_split = cost::encoder_tp_split;
  return k;
}

FamilySpec vit_family() {
  FamilySpec f;
  f.family = Family::kVit;
  f.name = "vit";
  f.hf_model_types = {"vit"};
  f.language_model = false;
  f.token_vocabulary = false;
  f.classifier = true;
  f.title = "ViT";
  f.objective = Objective::kImageClassifier;
  f.classifier_sharded = true;
  f.classifier_pipeline = true;
  f.build = [](const ModelConfig& c) { return std::make_shared<Vit>(c); };
  f.from_hf = from_hf;
  f.to_hf = to_hf;
  f.validate = [](const ModelConfig& c, const std::string& where) {
    MAMMOTH_CHECK(c.patch_size > 0 && c.image_size > 0 && c.image_size % c.patch_size == 0)
        << where << "image_size " << c.image_size << " must be a positive multiple of patch_size "
        << c.patch_size;
    MAMMOTH_CHECK(c.num_channels > 0)
        << where << "num_channels must be positive, got " << c.num_channels;
  };
  f.configs = {
      vit("vit-tiny", 32, 8, 2, 4, 64, 10),
      vit("vit-base-patch16-224", 224, 16, 12, 12, 768, 1000),
      vit("vit-large-patch16-224", 224, 16, 24, 16, 1024, 1000),
      vit("vit-huge-patch16-224", 224, 16, 32, 16, 1280, 1000),
      vit("vit-huge-patch14-224", 224, 14, 32, 16, 1280, 1000),
  };
  f.cost = vit_cost();
  return f;
}

[[maybe_unused]] const bool kRegistered = register_family(vit_family());

}  // namespace
}  // namespace mammoth::models
