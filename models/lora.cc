#include "models/lora.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>

#include "engine/autograd.h"
#include "engine/nn/rng.h"
#include "engine/ops.h"
#include "models/weights.h"

namespace mammoth::models {

using engine::Tensor;

namespace {

namespace fs = std::filesystem;

// PEFT's key prefix: the adapter wraps the causal-LM model as base_model.model.
constexpr const char* kPeftPrefix = "base_model.model.";

// One factor of the update: A (Kaiming-uniform as PEFT draws it) or B (zero).
class LoraFactor : public engine::nn::Module {
 public:
  LoraFactor(int64_t rows, int64_t cols, bool kaiming, DType dtype) : kaiming_(kaiming) {
    weight = register_parameter("weight", Tensor::zeros({rows, cols}, dtype));
  }
  Tensor weight;

 protected:
  void init_own(uint64_t seed, const std::string& prefix) override {
    if (!kaiming_) {
      engine::fill_(weight, 0.0);
      return;
    }
    // kaiming_uniform_(a = sqrt(5)): gain sqrt(2 / (1 + 5)), bound gain * sqrt(3 / fan_in).
    const double bound = 1.0 / std::sqrt(static_cast<double>(weight.size(1)));
    engine::copy_(weight, Tensor::rand(weight.shape(), seed, -bound, bound, weight.dtype(),
                                       engine::nn::name_stream(prefix + "weight")));
  }

 private:
  bool kaiming_;
};

Tensor factor(const std::shared_ptr<engine::nn::Module>& m) {
  return static_cast<const LoraFactor&>(*m).weight;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// PEFT's shorthand for every Linear layer but the output head.
constexpr const char* kAllLinear = "all-linear";

// PEFT's target_modules rule for a list: the path itself or its last dotted components.
bool matches(const std::string& path, const std::string& target) {
  if (target == kAllLinear) return !(path == "lm_head" || ends_with(path, ".lm_head"));
  return path == target || ends_with(path, "." + target);
}

}  // namespace

LoraLinear::LoraLinear(int64_t in, int64_t out, const LoraOptions& o, DType dtype)
    : scale_(o.alpha / static_cast<double>(o.rank)), dropout_(o.dropout) {
  a_ = register_module("lora_A", std::make_shared<LoraFactor>(o.rank, in, true, dtype));
  b_ = register_module("lora_B", std::make_shared<LoraFactor>(out, o.rank, false, dtype));
}

Tensor LoraLinear::lora_a() const { return factor(a_); }
Tensor LoraLinear::lora_b() const { return factor(b_); }

Tensor LoraLinear::forward(const Tensor& x, bool training) const {
  Tensor h = x;
  if (training && dropout_ > 0) {
    h = engine::dropout(h, dropout_, engine::nn::rng_state().seed,
                        engine::nn::rng_reserve(h.numel()), true);
  }
  return engine::linear(engine::linear(h, lora_a()), lora_b()) * scale_;
}

Tensor LoraLinear::delta_weight() const {
  return engine::matmul(lora_b().detach(), lora_a().detach()) * scale_;
}

void LoraAdapters::add(Target t) {
  // Our module path: the parameter name without ".weight", so the adapter tensors read
  // "<our module>.lora_A.weight".
  const std::string ours = t.param.substr(0, t.param.size() - std::string(".weight").size());
  register_module(ours, t.lora);
  t.layer->delta = t.lora;
  targets_.push_back(std::move(t));
}

HfLayout LoraAdapters::peft_layout(const HfLayout& base) const {
  HfLayout layout;
  for (const Target& t : targets_) {
    const std::string ours = t.param.substr(0, t.param.size() - std::string(".weight").size());
    for (const char* f : {"lora_A", "lora_B"}) {
      layout.params.push_back(
          {ours + "." + f + ".weight", kPeftPrefix + t.path + "." + f + ".weight", false, false});
    }
  }
  // The base layout's other spellings of a module path, both ways (our canonical path is the
  // longest spelling; a file may use a shorter one).
  for (const auto& [from, to] : base.prefix_aliases) {
    layout.prefix_aliases.emplace_back(kPeftPrefix + from, kPeftPrefix + to);
    layout.prefix_aliases.emplace_back(kPeftPrefix + to, kPeftPrefix + from);
  }
  return layout;
}

json::Value LoraAdapters::peft_config(const std::string& base_model) const {
  bool conv1d = false;
  for (const Target& t : targets_) conv1d = conv1d || t.conv1d;
  json::Value targets;
  if (options_.regex || options_.targets == std::vector<std::string>{kAllLinear}) {
    targets = json::Value(options_.targets.front());
  } else {
    targets = json::Value::array();
    for (const std::string& t : options_.targets) targets.push_back(json::Value(t));
  }
  json::Value c = json::Value::object();
  c.set("peft_type", "LORA")
      .set("task_type", "CAUSAL_LM")
      .set("base_model_name_or_path", base_model)
      .set("r", options_.rank)
      .set("lora_alpha", options_.alpha)
      .set("lora_dropout", options_.dropout)
      .set("target_modules", std::move(targets))
      .set("fan_in_fan_out", conv1d)
      .set("bias", "none")
      .set("use_rslora", false)
      .set("use_dora", false)
      .set("modules_to_save", nullptr)
      .set("init_lora_weights", true)
      .set("layers_to_transform", nullptr)
      .set("layers_pattern", nullptr)
      .set("rank_pattern", json::Value::object())
      .set("alpha_pattern", json::Value::object())
      .set("inference_mode", true)
      .set("revision", nullptr);
  return c;
}

std::vector<std::string> parse_lora_targets(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream s(list);
  std::string item;
  while (std::getline(s, item, ',')) {
    const size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    MAMMOTH_CHECK(a != std::string::npos)
        << "[lora] --lora-targets has an empty entry in '" << list
        << "' (give module names as PEFT writes them, e.g. q_proj,v_proj or c_attn)";
    out.push_back(item.substr(a, b - a + 1));
  }
  MAMMOTH_CHECK(!out.empty()) << "[lora] --lora-targets is empty";
  return out;
}

std::shared_ptr<LoraAdapters> apply_lora(Model& model, const LoraOptions& o) {
  MAMMOTH_CHECK(o.rank > 0) << "[lora] --lora-rank must be > 0, got " << o.rank;
  MAMMOTH_CHECK(o.alpha > 0) << "[lora] --lora-alpha must be > 0, got " << o.alpha;
  MAMMOTH_CHECK(o.dropout >= 0 && o.dropout < 1)
      << "[lora] --lora-dropout must be in [0, 1), got " << o.dropout;
  MAMMOTH_CHECK(!o.targets.empty()) << "[lora] --lora-targets names no module";
  MAMMOTH_CHECK(!o.regex || o.targets.size() == 1)
      << "[lora] a regular-expression target_modules is one pattern";
  const HfLayout layout = model.hf_layout();
  std::map<std::string, const HfParam*> hf;
  for (const HfParam& p : layout.params) hf[p.param] = &p;
  std::optional<std::regex> re;
  if (o.regex) re.emplace(o.targets.front());
  auto adapters = std::make_shared<LoraAdapters>(o);
  std::vector<bool> used(o.targets.size(), false);
  std::string linear_paths;  // for the error when a pattern matches nothing
  for (const auto& [name, m] : model.named_modules()) {
    auto layer = std::dynamic_pointer_cast<engine::nn::Linear>(m);
    if (!layer) continue;
    const std::string param = name + ".weight";
    auto it = hf.find(param);
    MAMMOTH_CHECK(it != hf.end()) << "[lora] Linear '" << name << "' has no HF layout entry";
    // The causal-LM class's spelling: the longest alias (it prefixes the base model's names).
    std::string hf_name;
    for (const std::string& c : hf_name_candidates(layout, it->second->hf_name)) {
      if (c.size() > hf_name.size()) hf_name = c;
    }
    MAMMOTH_CHECK(ends_with(hf_name, ".weight"))
        << "[lora] '" << param << "' maps to HF '" << hf_name << "', not a module's weight";
    const std::string path = hf_name.substr(0, hf_name.size() - 7);
    if (linear_paths.size() < 400) linear_paths += (linear_paths.empty() ? "" : ", ") + path;
    bool hit = false;
    for (size_t i = 0; i < o.targets.size(); ++i) {
      const bool m_i = re ? std::regex_match(path, *re) : matches(path, o.targets[i]);
      used[i] = used[i] || m_i;
      hit = hit || m_i;
    }
    if (!hit) continue;
    MAMMOTH_CHECK(layer->delta == nullptr) << "[lora] '" << path << "' is already wrapped";
    LoraAdapters::Target t;
    t.param = param;
    t.path = path;
    t.conv1d = it->second->transposed;
    t.layer = layer;
    t.lora = std::make_shared<LoraLinear>(layer->in_features, layer->out_features, o,
                                          layer->weight.dtype());
    adapters->add(std::move(t));
  }
  for (size_t i = 0; i < o.targets.size(); ++i) {
    MAMMOTH_CHECK(used[i]) << "[lora] target '" << o.targets[i] << "' matches no Linear layer of "
                           << model.config().name << " (its Linear modules: " << linear_paths
                           << ")";
  }
  for (auto& [name, p] : model.named_parameters()) p.requires_grad_(false);
  adapters->init(o.seed);
  return adapters;
}

void detach_lora(const LoraAdapters& adapters) {
  for (const LoraAdapters::Target& t : adapters.targets()) t.layer->delta = nullptr;
}

void merge_lora(Model&, const LoraAdapters& adapters) {
  engine::NoGradGuard ng;
  for (const LoraAdapters::Target& t : adapters.targets()) {
    const Tensor& w = t.layer->weight;
    engine::copy_(w, w + t.lora->delta_weight().to(w.device()));
  }
  detach_lora(adapters);
}

void save_adapter(const LoraAdapters& adapters, const Model& model, const std::string& dir,
                  const std::string& base_model, const engine::nn::NamedTensors* values) {
  fs::create_directories(dir);
  const std::string config_path = (fs::path(dir) / "adapter_config.json").string();
  {
    std::ofstream out(config_path);
    out << json::dump(adapters.peft_config(base_model), 2) << "\n";
    MAMMOTH_CHECK(out.good()) << "[lora] cannot write " << config_path;
  }
  engine::nn::NamedTensors host;
  for (const auto& [name, t] : adapters.named_parameters()) {
    if (values == nullptr) {
      host.emplace_back(name, t.detach().to(Device::cpu()));
      continue;
    }
    auto it = std::find_if(values->begin(), values->end(),
                           [&name](const auto& v) { return v.first == name; });
    MAMMOTH_CHECK(it != values->end()) << "[lora] no value for adapter tensor '" << name << "'";
    MAMMOTH_CHECK(it->second.shape() == t.shape())
        << "[lora] adapter tensor '" << name << "' has shape "
        << engine::shape_str(it->second.shape()) << ", expected " << engine::shape_str(t.shape());
    host.emplace_back(name, it->second.detach().to(Device::cpu()));
  }
  save_named(host, adapters.peft_layout(model.hf_layout()),
             (fs::path(dir) / "adapter_model.safetensors").string());
}

LoraOptions read_adapter_config(const std::string& dir, std::string* base_model) {
  const std::string path = (fs::path(dir) / "adapter_config.json").string();
  MAMMOTH_CHECK(fs::is_regular_file(path))
      << "[lora] --adapter " << dir << " has no adapter_config.json (a PEFT adapter directory)";
  const json::Value c = json::parse_file(path);
  MAMMOTH_CHECK(c.is_object()) << "[lora] " << path << " is not a JSON object";
  auto str = [&](const char* key, const std::string& fallback) {
    const json::Value* v = c.find(key);
    return v == nullptr || v->is_null() ? fallback : v->as_string();
  };
  MAMMOTH_CHECK(str("peft_type", "") == "LORA")
      << "[lora] " << path << ": peft_type '" << str("peft_type", "") << "' is not LORA";
  const std::string task = str("task_type", "CAUSAL_LM");
  MAMMOTH_CHECK(task == "CAUSAL_LM")
      << "[lora] " << path << ": task_type '" << task << "' is not supported (CAUSAL_LM is)";
  MAMMOTH_CHECK(str("bias", "none") == "none")
      << "[lora] " << path << ": bias '" << str("bias", "") << "' is not supported (none is)";
  for (const char* flag : {"use_rslora", "use_dora"}) {
    const json::Value* v = c.find(flag);
    MAMMOTH_CHECK(v == nullptr || v->is_null() || !v->as_bool())
        << "[lora] " << path << ": " << flag << " is not supported";
  }
  for (const char* key : {"modules_to_save", "layers_to_transform", "layers_pattern",
                          "rank_pattern", "alpha_pattern", "layer_replication"}) {
    const json::Value* v = c.find(key);
    MAMMOTH_CHECK(v == nullptr || v->is_null() || ((v->is_object() || v->is_array()) && v->empty()))
        << "[lora] " << path << ": " << key << " " << json::dump(*v) << " is not supported";
  }
  LoraOptions o;
  const json::Value* r = c.find("r");
  MAMMOTH_CHECK(r != nullptr && r->is_int()) << "[lora] " << path << " has no integer \"r\"";
  o.rank = r->as_int();
  const json::Value* alpha = c.find("lora_alpha");
  MAMMOTH_CHECK(alpha != nullptr && alpha->is_number())
      << "[lora] " << path << " has no numeric \"lora_alpha\"";
  o.alpha = alpha->as_double();
  if (const json::Value* p = c.find("lora_dropout"); p != nullptr && !p->is_null())
    o.dropout = p->as_double();
  const json::Value* t = c.find("target_modules");
  MAMMOTH_CHECK(t != nullptr && (t->is_string() || t->is_array()))
      << "[lora] " << path
      << ": target_modules must be a list of module names or one regular expression";
  if (t->is_string()) {
    o.regex = t->as_string() != kAllLinear;
    o.targets = {t->as_string()};
  } else {
    for (const json::Value& v : *t) o.targets.push_back(v.as_string());
  }
  if (base_model != nullptr) *base_model = str("base_model_name_or_path", "");
  return o;
}

std::shared_ptr<LoraAdapters> load_adapter(Model& model, const std::string& dir) {
  const LoraOptions o = read_adapter_config(dir);
  const std::string weights = (fs::path(dir) / "adapter_model.safetensors").string();
  MAMMOTH_CHECK(fs::is_regular_file(weights))
      << "[lora] --adapter " << dir << " has no adapter_model.safetensors"
      << (fs::exists(fs::path(dir) / "adapter_model.bin")
              ? " (only adapter_model.bin, a pickle: save it with safe_serialization=True)"
              : "");
  std::shared_ptr<LoraAdapters> adapters = apply_lora(model, o);
  load_named(adapters->named_parameters(), adapters->peft_layout(model.hf_layout()),
             WeightFiles::open(weights));
  return adapters;
}

}  // namespace mammoth::models
