#include "models/weights.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include "base/json.h"
#include "engine/autograd.h"
#include "engine/ops.h"

namespace mammoth::models {

using engine::Shape;
using engine::Tensor;

std::vector<std::string> hf_name_candidates(const HfLayout& layout, const std::string& hf_name) {
  std::vector<std::string> out{hf_name};
  for (const auto& [from, to] : layout.prefix_aliases) {
    if (hf_name.rfind(from, 0) == 0) {
      std::string alt = to + hf_name.substr(from.size());
      if (alt != hf_name) out.push_back(std::move(alt));
    }
  }
  return out;
}

bool hf_is_ignored(const HfLayout& layout, const std::string& name) {
  for (const std::string& p : layout.ignored) {
    if (p.empty()) continue;
    if (p.back() == '*') {
      if (name.rfind(p.substr(0, p.size() - 1), 0) == 0) return true;
    } else if (p.front() == '*') {
      const std::string suffix = p.substr(1);
      if (name.size() >= suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
        return true;
    } else if (name == p) {
      return true;
    }
  }
  return false;
}

bool is_weight_index(const std::string& path) {
  return path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
}

WeightFiles WeightFiles::borrow(const io::SafetensorsFile& file) {
  WeightFiles w;
  w.path_ = file.path();
  w.files_.push_back(&file);
  w.file_names_.push_back(file.path());
  for (const io::TensorView& v : file.tensors()) w.by_name_[v.name] = 0;
  return w;
}

WeightFiles WeightFiles::open(const std::string& path) {
  namespace fs = std::filesystem;
  MAMMOTH_CHECK(fs::is_regular_file(path)) << "[load_weights] " << path << " does not exist";
  if (!is_weight_index(path)) {
    auto file = std::make_unique<io::SafetensorsFile>(io::SafetensorsFile::open(path));
    WeightFiles w = borrow(*file);
    w.owned_.push_back(std::move(file));
    return w;
  }
  WeightFiles w;
  w.path_ = path;
  w.sharded_ = true;
  const json::Value index = json::parse_file(path);
  const json::Value* map = index.is_object() ? index.find("weight_map") : nullptr;
  MAMMOTH_CHECK(map != nullptr && map->is_object() && !map->empty())
      << "[load_weights] " << path
      << ": a sharded checkpoint's index needs a non-empty \"weight_map\" object (tensor name "
         "-> shard file)";
  std::map<std::string, int64_t> count;  // shard -> tensors the index maps to it
  for (const json::Value& m : *map) {
    MAMMOTH_CHECK(m.is_string() && !m.as_string().empty() && !fs::path(m.as_string()).is_absolute())
        << "[load_weights] " << path << ": weight_map[\"" << m.key()
        << "\"] must be a shard file name relative to the index, got " << json::dump(m);
    const std::string& shard = m.as_string();
    w.expected_[m.key()] = shard;
    if (count[shard]++ == 0) w.shard_names_.push_back(shard);
  }
  const fs::path dir = fs::path(path).parent_path();
  for (const std::string& shard : w.shard_names_) {
    const fs::path p = dir / shard;
    if (!fs::is_regular_file(p)) {
      w.problems_.push_back("shard '" + p.string() + "' does not exist (the index maps " +
                            std::to_string(count[shard]) + " tensors to it)");
      continue;
    }
    w.owned_.push_back(std::make_unique<io::SafetensorsFile>(io::SafetensorsFile::open(p)));
    w.files_.push_back(w.owned_.back().get());
    w.file_names_.push_back(shard);
    const size_t at = w.files_.size() - 1;
    for (const io::TensorView& v : w.files_[at]->tensors()) {
      auto [it, fresh] = w.by_name_.emplace(v.name, at);
      if (!fresh) {
        w.problems_.push_back("'" + v.name + "' is in two shards, '" + w.file_names_[it->second] +
                              "' and '" + shard + "'");
      }
    }
  }
  return w;
}

const io::TensorView* WeightFiles::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : files_[it->second]->find(name);
}

std::string WeightFiles::file_of(const std::string& name) const {
  if (auto it = by_name_.find(name); it != by_name_.end()) return file_names_[it->second];
  if (auto it = expected_.find(name); it != expected_.end()) return it->second;
  return "";
}

std::vector<std::pair<const io::TensorView*, std::string>> WeightFiles::tensors() const {
  std::vector<std::pair<const io::TensorView*, std::string>> out;
  for (size_t i = 0; i < files_.size(); ++i)
    for (const io::TensorView& v : files_[i]->tensors()) out.emplace_back(&v, file_names_[i]);
  return out;
}

std::string WeightFiles::describe() const {
  std::ostringstream s;
  s << path_ << " (";
  if (sharded_) s << num_files() << " shards, ";
  s << num_tensors() << " tensors)";
  return s.str();
}

namespace {

struct Planned {
  Tensor param;
  const io::TensorView* view;
  bool transposed;
};

// The file tensor as an engine tensor in its own dtype, copied so that it is aligned.
Tensor tensor_from_view(const io::TensorView& v) {
  Tensor t = Tensor::empty(v.shape, v.dtype);
  if (v.nbytes > 0) std::memcpy(t.raw_data(), v.data, v.nbytes);
  return t;
}

}  // namespace

LoadReport load_named(const engine::nn::NamedTensors& params, const HfLayout& layout,
                      const io::SafetensorsFile& file, const LoadOptions& options) {
  return load_named(params, layout, WeightFiles::borrow(file), options);
}

LoadReport load_named(const engine::nn::NamedTensors& params, const HfLayout& layout,
                      const WeightFiles& file, const LoadOptions& options) {
  std::map<std::string, Tensor> by_name(params.begin(), params.end());
  std::vector<std::string> problems = file.problems();
  // Where a tensor is, in messages about a sharded checkpoint (the header names a single file).
  auto where = [&file](const std::string& name) {
    const std::string f = file.file_of(name);
    return file.sharded() && !f.empty() ? " in " + f : std::string();
  };
  std::vector<Planned> plan;
  std::set<std::string> used;
  LoadReport report;
  std::set<std::string> mapped_params;
  for (const HfParam& p : layout.params) {
    auto it = by_name.find(p.param);
    MAMMOTH_CHECK(it != by_name.end())
        << "[load_weights] layout names parameter '" << p.param << "' that the model lacks";
    mapped_params.insert(p.param);
    const Tensor& param = it->second;
    const io::TensorView* view = nullptr;
    const std::vector<std::string> candidates = hf_name_candidates(layout, p.hf_name);
    for (const std::string& c : candidates) {
      if ((view = file.find(c)) != nullptr) break;
    }
    if (view == nullptr) {
      if (p.optional) {
        report.missing_optional.push_back(p.param);
      } else {
        std::string tried, shard;
        for (const std::string& c : candidates) {
          tried += (tried.empty() ? "'" : " or '") + c + "'";
          if (shard.empty() && file.sharded()) shard = file.file_of(c);
        }
        Shape want = param.shape();
        if (p.transposed && want.size() == 2) std::swap(want[0], want[1]);
        problems.push_back("missing " + tried + " " + engine::shape_str(want) +
                           (shard.empty() ? "" : " (the index maps it to " + shard + ")"));
      }
      continue;
    }
    used.insert(view->name);
    Shape expected = param.shape();
    if (p.transposed) {
      MAMMOTH_CHECK(expected.size() == 2)
          << "[load_weights] '" << p.param << "' is marked transposed but is not 2-D";
      std::swap(expected[0], expected[1]);
    }
    bool ok = true;
    if (view->shape != expected) {
      problems.push_back("'" + view->name + "'" + where(view->name) + ": shape " +
                         engine::shape_str(view->shape) + ", expected " +
                         engine::shape_str(expected) +
                         (p.transposed ? " (Conv1D layout [in, out])" : ""));
      ok = false;
    }
    if (view->dtype != param.dtype()) {
      const bool castable =
          options.allow_cast && is_floating(view->dtype) && is_floating(param.dtype());
      if (!castable) {
        problems.push_back("'" + view->name + "'" + where(view->name) + ": dtype " +
                           dtype_name(view->dtype) + ", expected " + dtype_name(param.dtype()));
        ok = false;
      }
    }
    if (ok) plan.push_back({param, view, p.transposed});
  }
  for (const auto& [name, t] : params) {
    MAMMOTH_CHECK(mapped_params.count(name))
        << "[load_weights] parameter '" << name << "' has no entry in the model's HF layout";
  }
  for (const auto& [v, in_file] : file.tensors()) {
    if (used.count(v->name)) continue;
    if (hf_is_ignored(layout, v->name)) {
      report.ignored.push_back(v->name);
    } else if (options.allow_unexpected) {
      report.unexpected.push_back(v->name);
    } else {
      problems.push_back("unexpected '" + v->name + "' " + engine::shape_str(v->shape) + " " +
                         dtype_name(v->dtype) + (file.sharded() ? " in " + in_file : ""));
    }
  }
  if (!problems.empty()) {
    std::ostringstream msg;
    msg << "[load_weights] " << file.path() << ": " << problems.size() << " problem"
        << (problems.size() > 1 ? "s" : "") << ":";
    for (const std::string& p : problems) msg << "\n  " << p;
    MAMMOTH_THROW() << msg.str();
  }
  engine::NoGradGuard ng;
  for (const Planned& p : plan) {
    Tensor src = tensor_from_view(*p.view);
    engine::copy_(p.param, p.transposed ? src.transpose(0, 1) : src);
  }
  for (const HfParam& p : layout.params) {
    if (std::find(report.missing_optional.begin(), report.missing_optional.end(), p.param) ==
        report.missing_optional.end())
      report.loaded.push_back(p.param);
  }
  return report;
}

LoadReport load_weights(const Model& model, const io::SafetensorsFile& file,
                        const LoadOptions& options) {
  return load_named(model.named_parameters(), model.hf_layout(), file, options);
}

LoadReport load_weights(const Model& model, const WeightFiles& files, const LoadOptions& options) {
  return load_named(model.named_parameters(), model.hf_layout(), files, options);
}

LoadReport load_weights(const Model& model, const std::string& path, const LoadOptions& options) {
  return load_weights(model, WeightFiles::open(path), options);
}

void save_named(const engine::nn::NamedTensors& params, const HfLayout& layout,
                const std::string& path, std::map<std::string, std::string> metadata) {
  std::map<std::string, Tensor> by_name(params.begin(), params.end());
  std::vector<Tensor> keep;
  std::vector<io::TensorView> views;
  for (const HfParam& p : layout.params) {
    auto it = by_name.find(p.param);
    MAMMOTH_CHECK(it != by_name.end())
        << "[save_weights] layout names parameter '" << p.param << "' that the model lacks";
    Tensor t = it->second.detach();
    if (p.transposed) t = t.transpose(0, 1);
    t = t.contiguous();
    keep.push_back(t);
    views.push_back(
        {p.hf_name, t.dtype(), t.shape(), static_cast<const uint8_t*>(t.raw_data()), t.nbytes()});
  }
  metadata.emplace("format", "pt");
  io::write_safetensors(path, views, metadata);
}

void save_weights(const Model& model, const std::string& path,
                  std::map<std::string, std::string> metadata) {
  save_named(model.named_parameters(), model.hf_layout(), path, std::move(metadata));
}

}  // namespace mammoth::models
