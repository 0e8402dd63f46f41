#include "plan/cluster.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <set>
#include <tuple>

#include "base/error.h"

namespace mammoth::plan {
namespace {

constexpr double kTera = 1e12;
constexpr double kGiga = 1e9;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMicro = 1e-6;

void refuse_unknown(const json::Value& v, std::initializer_list<const char*> known,
                    const std::string& where) {
  MAMMOTH_CHECK(v.is_object()) << "[cluster] " << where << " must be an object";
  const std::set<std::string> names(known.begin(), known.end());
  for (const json::Value& member : v) {
    if (names.count(member.key())) continue;
    std::string list;
    for (const char* k : known) list += std::string(list.empty() ? "" : ", ") + k;
    MAMMOTH_THROW() << "[cluster] unknown key '" << member.key() << "' in " << where
                    << " (known: " << list << ")";
  }
}

double positive(const json::Value& obj, const char* key, const std::string& where) {
  const json::Value* v = obj.find(key);
  MAMMOTH_CHECK(v != nullptr) << "[cluster] " << where << " lacks \"" << key << "\"";
  MAMMOTH_CHECK(v->is_number()) << "[cluster] " << where << "." << key << " must be a number";
  const double d = v->as_double();
  MAMMOTH_CHECK(d > 0) << "[cluster] " << where << "." << key << " must be > 0, got " << d;
  return d;
}

Link link_from(const json::Value& links, const char* key, const std::string& what) {
  const std::string where = what + ": links." + key;
  const json::Value* v = links.find(key);
  MAMMOTH_CHECK(v != nullptr) << "[cluster] " << what << ": links lacks \"" << key << "\"";
  refuse_unknown(*v, {"GBps", "latency_us"}, where);
  return {positive(*v, "GBps", where) * kGiga, positive(*v, "latency_us", where) * kMicro};
}

json::Value link_json(const Link& l) {
  return json::Value::object()
      .set("GBps", l.bandwidth / kGiga)
      .set("latency_us", l.latency / kMicro);
}

}  // namespace

double Cluster::peak_for(const std::string& amp) const {
  if (amp == "bf16") return peak_bf16;
  if (amp == "fp16") return peak_fp16;
  return peak_tf32 > 0 ? peak_tf32 : peak_fp32;
}

// Log-linear interpolation in x over (x, y) points rising in x, flat beyond the ends.
double interpolate(const std::vector<std::pair<double, double>>& pts, double x) {
  if (x <= pts.front().first) return pts.front().second;
  if (x >= pts.back().first) return pts.back().second;
  for (size_t i = 1; i < pts.size(); ++i) {
    if (x > pts[i].first) continue;
    const auto [x0, y0] = pts[i - 1];
    const auto [x1, y1] = pts[i];
    const double f = std::log(x / x0) / std::log(x1 / x0);
    return y0 + f * (y1 - y0);
  }
  return pts.back().second;
}

double Cluster::GemmTimeModel::padded_flops(double m, double n, double k) const {
  auto up = [](double x, int tile) { return std::ceil(x / tile) * tile; };
  return 2 * up(m, tile_rows) * up(n, tile_cols) * k;
}

double Cluster::gemm_time(double m, double n, double k, const std::string& amp) const {
  const double flops = 2 * m * n * k;
  if (flops <= 0) return 0;
  if (gemm.calibrated())
    return in_step_compute * (gemm.padded_flops(m, n, k) * (gemm.per_flop + gemm.per_flop_k / k +
                                                            gemm.per_flop_mn / std::min(m, n)) +
                              gemm.call);
  return flops / (peak_for(amp) * matmul_efficiency) + gemm_call_overhead;
}

double Cluster::attention_time(double flops, double head_dim, const std::string& amp) const {
  if (!attention_rates.empty())
    return in_step_compute * flops / interpolate(attention_rates, head_dim);
  return flops / (attention_rate > 0 ? attention_rate : peak_for(amp) * matmul_efficiency);
}

namespace {

std::vector<std::pair<double, double>> rates_from(const json::Value& v, const std::string& where) {
  MAMMOTH_CHECK(v.is_array() && !v.empty())
      << "[cluster] " << where << " must be a non-empty array of [dimension, GFLOP/s]";
  std::vector<std::pair<double, double>> out;
  for (const json::Value& p : v) {
    MAMMOTH_CHECK(p.is_array() && p.size() == 2 && p[0].as_double() > 0 && p[1].as_double() > 0)
        << "[cluster] " << where << ": each entry is [dimension > 0, GFLOP/s > 0]";
    MAMMOTH_CHECK(out.empty() || p[0].as_double() > out.back().first)
        << "[cluster] " << where << ": dimensions must rise";
    out.push_back({p[0].as_double(), p[1].as_double() * kGiga});
  }
  return out;
}

json::Value rates_json(const std::vector<std::pair<double, double>>& r) {
  json::Value a = json::Value::array();
  for (const auto& [d, rate] : r)
    a.push_back(json::Value::array().push_back(d).push_back(rate / kGiga));
  return a;
}

}  // namespace

Cluster cluster_from_json(const json::Value& v, const std::string& what) {
  refuse_unknown(v,
                 {"name",
                  "description",
                  "devices_per_node",
                  "nodes",
                  "peak_tflops",
                  "matmul_efficiency",
                  "matmul_efficiency_source",
                  "memory_gib",
                  "device_memory_GBps",
                  "host_memory_GBps",
                  "links",
                  "op_overhead_us",
                  "broadcast_op_ns_per_element",
                  "gemm_call_us",
                  "gemm_time_model",
                  "attention_GFLOPs",
                  "attention_GFLOPs_by_head_dim",
                  "in_step_compute_factor",
                  "overlaps_communication",
                  "calibration"},
                 what);
  Cluster c;
  const json::Value* name = v.find("name");
  MAMMOTH_CHECK(name != nullptr && name->is_string())
      << "[cluster] " << what << " needs a string \"name\"";
  c.name = name->as_string();
  if (const json::Value* d = v.find("description")) {
    MAMMOTH_CHECK(d->is_string()) << "[cluster] " << what << ".description must be a string";
    c.description = d->as_string();
  }
  for (auto [key, out] : {std::pair<const char*, int*>{"devices_per_node", &c.devices_per_node},
                          {"nodes", &c.nodes}}) {
    const json::Value* n = v.find(key);
    MAMMOTH_CHECK(n != nullptr && n->is_int() && n->as_int() >= 1)
        << "[cluster] " << what << "." << key << " must be an integer >= 1";
    *out = static_cast<int>(n->as_int());
  }
  const json::Value& peak = v.at("peak_tflops");
  refuse_unknown(peak, {"fp32", "tf32", "bf16", "fp16"}, what + ": peak_tflops");
  c.peak_fp32 = positive(peak, "fp32", what + ": peak_tflops") * kTera;
  c.peak_tf32 = positive(peak, "tf32", what + ": peak_tflops") * kTera;
  c.peak_bf16 = positive(peak, "bf16", what + ": peak_tflops") * kTera;
  c.peak_fp16 = positive(peak, "fp16", what + ": peak_tflops") * kTera;
  c.matmul_efficiency = positive(v, "matmul_efficiency", what);
  MAMMOTH_CHECK(c.matmul_efficiency <= 1)
      << "[cluster] " << what << ".matmul_efficiency is a share of peak (<= 1), got "
      << c.matmul_efficiency;
  if (const json::Value* s = v.find("matmul_efficiency_source")) {
    MAMMOTH_CHECK(s->is_string()) << "[cluster] " << what
                                  << ".matmul_efficiency_source must be a string";
    c.matmul_efficiency_source = s->as_string();
  }
  const json::Value& mem = v.at("memory_gib");
  refuse_unknown(mem, {"device", "host", "nvme"}, what + ": memory_gib");
  c.device_memory = static_cast<int64_t>(positive(mem, "device", what + ": memory_gib") * kGiB);
  c.host_memory = static_cast<int64_t>(positive(mem, "host", what + ": memory_gib") * kGiB);
  c.nvme_capacity = static_cast<int64_t>(positive(mem, "nvme", what + ": memory_gib") * kGiB);
  c.device_memory_bandwidth = positive(v, "device_memory_GBps", what) * kGiga;
  c.host_memory_bandwidth = positive(v, "host_memory_GBps", what) * kGiga;
  const json::Value& links = v.at("links");
  refuse_unknown(links, {"intra_node", "inter_node", "pcie", "nvme"}, what + ": links");
  c.intra_node = link_from(links, "intra_node", what);
  c.inter_node = link_from(links, "inter_node", what);
  c.pcie = link_from(links, "pcie", what);
  c.nvme = link_from(links, "nvme", what);
  for (auto [key, out, unit] :
       {std::tuple<const char*, double*, double>{"op_overhead_us", &c.op_overhead, kMicro},
        {"broadcast_op_ns_per_element", &c.broadcast_op_per_element, 1e-9},
        {"gemm_call_us", &c.gemm_call_overhead, kMicro},
        {"attention_GFLOPs", &c.attention_rate, kGiga}}) {
    const json::Value* n = v.find(key);
    if (n == nullptr) continue;
    MAMMOTH_CHECK(n->is_number() && n->as_double() >= 0)
        << "[cluster] " << what << "." << key << " must be a number >= 0";
    *out = n->as_double() * unit;
  }
  if (const json::Value* g = v.find("gemm_time_model")) {
    const std::string where = what + ".gemm_time_model";
    refuse_unknown(*g,
                   {"ns_per_flop", "ns_per_flop_times_k", "ns_per_flop_times_mn", "call_us",
                    "tile_rows", "tile_cols"},
                   where);
    c.gemm.per_flop = positive(*g, "ns_per_flop", where) * 1e-9;
    for (auto [key, out, unit] :
         {std::tuple<const char*, double*, double>{"ns_per_flop_times_k", &c.gemm.per_flop_k, 1e-9},
          {"ns_per_flop_times_mn", &c.gemm.per_flop_mn, 1e-9},
          {"call_us", &c.gemm.call, kMicro}}) {
      const json::Value* n = g->find(key);
      MAMMOTH_CHECK(n != nullptr && n->is_number() && n->as_double() >= 0)
          << "[cluster] " << where << "." << key << " must be a number >= 0";
      *out = n->as_double() * unit;
    }
    for (auto [key, out] : {std::pair<const char*, int*>{"tile_rows", &c.gemm.tile_rows},
                            {"tile_cols", &c.gemm.tile_cols}}) {
      const json::Value* n = g->find(key);
      if (n == nullptr) continue;
      MAMMOTH_CHECK(n->is_int() && n->as_int() >= 1 && n->as_int() <= 1024)
          << "[cluster] " << where << "." << key << " must be an integer in [1, 1024]";
      *out = static_cast<int>(n->as_int());
    }
  }
  if (const json::Value* r = v.find("attention_GFLOPs_by_head_dim"))
    c.attention_rates = rates_from(*r, what + ".attention_GFLOPs_by_head_dim");
  if (const json::Value* f = v.find("in_step_compute_factor")) {
    MAMMOTH_CHECK(f->is_number() && f->as_double() > 0)
        << "[cluster] " << what << ".in_step_compute_factor must be a number > 0";
    c.in_step_compute = f->as_double();
  }
  if (const json::Value* o = v.find("overlaps_communication")) {
    MAMMOTH_CHECK(o->is_bool()) << "[cluster] " << what << ".overlaps_communication must be a bool";
    c.overlaps_communication = o->as_bool();
  }
  if (const json::Value* cal = v.find("calibration")) c.calibration = *cal;
  return c;
}

json::Value cluster_to_json(const Cluster& c) {
  json::Value v = json::Value::object();
  v.set("name", c.name);
  if (!c.description.empty()) v.set("description", c.description);
  v.set("devices_per_node", c.devices_per_node).set("nodes", c.nodes);
  v.set("peak_tflops", json::Value::object()
                           .set("fp32", c.peak_fp32 / kTera)
                           .set("tf32", c.peak_tf32 / kTera)
                           .set("bf16", c.peak_bf16 / kTera)
                           .set("fp16", c.peak_fp16 / kTera));
  v.set("matmul_efficiency", c.matmul_efficiency);
  if (!c.matmul_efficiency_source.empty())
    v.set("matmul_efficiency_source", c.matmul_efficiency_source);
  v.set("memory_gib", json::Value::object()
                          .set("device", static_cast<double>(c.device_memory) / kGiB)
                          .set("host", static_cast<double>(c.host_memory) / kGiB)
                          .set("nvme", static_cast<double>(c.nvme_capacity) / kGiB));
  v.set("device_memory_GBps", c.device_memory_bandwidth / kGiga);
  v.set("host_memory_GBps", c.host_memory_bandwidth / kGiga);
  v.set("links", json::Value::object()
                     .set("intra_node", link_json(c.intra_node))
                     .set("inter_node", link_json(c.inter_node))
                     .set("pcie", link_json(c.pcie))
                     .set("nvme", link_json(c.nvme)));
  if (c.op_overhead > 0) v.set("op_overhead_us", c.op_overhead / kMicro);
  if (c.broadcast_op_per_element > 0)
    v.set("broadcast_op_ns_per_element", c.broadcast_op_per_element * 1e9);
  if (c.gemm_call_overhead > 0) v.set("gemm_call_us", c.gemm_call_overhead / kMicro);
  if (c.gemm.calibrated())
    v.set("gemm_time_model", json::Value::object()
                                 .set("ns_per_flop", c.gemm.per_flop * 1e9)
                                 .set("ns_per_flop_times_k", c.gemm.per_flop_k * 1e9)
                                 .set("ns_per_flop_times_mn", c.gemm.per_flop_mn * 1e9)
                                 .set("call_us", c.gemm.call / kMicro)
                                 .set("tile_rows", c.gemm.tile_rows)
                                 .set("tile_cols", c.gemm.tile_cols));
  if (c.attention_rate > 0) v.set("attention_GFLOPs", c.attention_rate / kGiga);
  if (!c.attention_rates.empty())
    v.set("attention_GFLOPs_by_head_dim", rates_json(c.attention_rates));
  if (c.in_step_compute != 1) v.set("in_step_compute_factor", c.in_step_compute);
  if (!c.overlaps_communication) v.set("overlaps_communication", false);
  if (!c.calibration.is_null()) v.set("calibration", c.calibration);
  return v;
}

std::vector<std::string> shipped_cluster_names() {
  return {"dgx_a100_80gb", "h100_cluster", "h200_node"};
}

Cluster load_cluster(const std::string& path_or_name) {
  namespace fs = std::filesystem;
  std::vector<std::string> candidates;
  if (path_or_name.find('/') != std::string::npos || path_or_name.ends_with(".json")) {
    candidates.push_back(path_or_name);
  } else {
    const std::string rel = "plan/clusters/" + path_or_name + ".json";
    if (const char* dir = std::getenv("MAMMOTH_CLUSTER_DIR"))
      candidates.push_back(std::string(dir) + "/" + path_or_name + ".json");
    candidates.push_back(rel);
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) candidates.push_back(exe.string() + ".runfiles/mammoth/" + rel);
    if (const char* src = std::getenv("TEST_SRCDIR"))
      candidates.push_back(std::string(src) + "/mammoth/" + rel);
  }
  for (const std::string& c : candidates) {
    std::error_code ec;
    if (fs::is_regular_file(c, ec)) return cluster_from_json(json::parse_file(c), c);
  }
  std::string tried, names;
  for (const std::string& c : candidates) tried += " " + c;
  for (const std::string& n : shipped_cluster_names()) names += " " + n;
  MAMMOTH_THROW() << "[cluster] no cluster file '" << path_or_name << "' (tried" << tried
                  << "); shipped:" << names;
}

}  // namespace mammoth::plan
