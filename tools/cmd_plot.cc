// `mammoth plot METRICS.jsonl [--out FILE.svg]`: loss and throughput curves of a training run
// as a standalone SVG (two panels: training loss with validation loss, and tokens/s), drawn
// by hand so nothing beyond the binary is needed to look at a run.
// `mammoth plot --trace DIR [--out FILE.svg]`: the merged timeline of `train --profile DIR`
// (a lane group per rank: compute, pipeline, communication, I/O; memory counters as lines).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "base/error.h"
#include "base/json.h"
#include "tools/command.h"

ABSL_DECLARE_FLAG(std::string, out);    // defined by `mammoth data`
ABSL_DECLARE_FLAG(std::string, trace);  // defined by `mammoth plan`
ABSL_FLAG(std::string, title, "", "plot title (default: the metrics file name)");

namespace mammoth::tools {
namespace {

struct Series {
  std::vector<double> x, y;
  void add(double a, double b) {
    if (!std::isfinite(b)) return;  // skipped fp16 steps log inf/NaN losses
    x.push_back(a);
    y.push_back(b);
  }
};

struct Metrics {
  Series loss, val_loss, tokens_per_s;
};

Metrics read_metrics(const std::string& path) {
  std::ifstream in(path);
  MAMMOTH_CHECK(in.good()) << "[plot] cannot read metrics file '" << path << "'";
  Metrics m;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json::Value v = json::parse(line, path + ":" + std::to_string(line_no));
    const json::Value* step = v.is_object() ? v.find("step") : nullptr;
    MAMMOTH_CHECK(step != nullptr && step->is_number())
        << "[plot] " << path << ":" << line_no << " has no numeric \"step\"";
    const double s = step->as_double();
    auto take = [&](const char* key, Series& out) {
      const json::Value* f = v.find(key);
      if (f != nullptr && f->is_number()) out.add(s, f->as_double());
    };
    take("loss", m.loss);
    take("val_loss", m.val_loss);
    take("tokens_per_s", m.tokens_per_s);
  }
  MAMMOTH_CHECK(!m.loss.x.empty()) << "[plot] " << path << " holds no step with a finite loss";
  return m;
}

// About `target` round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (hi <= lo) hi = lo + 1;
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double f : {1.0, 2.0, 5.0, 10.0}) {
    step = f * mag;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  return ticks;
}

std::string fmt(double v) {
  char buf[32];
  const double a = std::abs(v);
  if (a >= 1e6)
    std::snprintf(buf, sizeof(buf), "%.3gM", v / 1e6);
  else if (a >= 1e4)
    std::snprintf(buf, sizeof(buf), "%.4gk", v / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%.4g", v);
  return buf;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

struct Line {
  const Series* series;
  const char* color;
  const char* label;
};

// One panel: frame, grid, ticks with labels, axis titles, polylines and a legend.
void panel(std::ostringstream& svg, double left, double top, double width, double height,
           const std::string& y_title, const std::vector<Line>& lines, double x_lo, double x_hi) {
  double y_lo = INFINITY, y_hi = -INFINITY;
  for (const Line& l : lines)
    for (double y : l.series->y) y_lo = std::min(y_lo, y), y_hi = std::max(y_hi, y);
  const double pad = (y_hi - y_lo) * 0.05 + (y_hi == y_lo ? std::abs(y_hi) * 0.1 + 1 : 0);
  y_lo -= pad;
  y_hi += pad;
  if (x_hi <= x_lo) x_hi = x_lo + 1;
  auto px = [&](double x) { return left + (x - x_lo) / (x_hi - x_lo) * width; };
  auto py = [&](double y) { return top + height - (y - y_lo) / (y_hi - y_lo) * height; };

  svg << "<g class=\"panel\">\n";
  svg << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << width << "\" height=\""
      << height << "\" fill=\"white\" stroke=\"#333\"/>\n";
  svg << "<g class=\"y-axis\" font-size=\"11\" text-anchor=\"end\">\n";
  for (double t : nice_ticks(y_lo, y_hi, 5)) {
    if (t < y_lo || t > y_hi) continue;
    svg << "<line x1=\"" << left << "\" x2=\"" << left + width << "\" y1=\"" << py(t) << "\" y2=\""
        << py(t) << "\" stroke=\"#e5e5e5\"/>";
    svg << "<line x1=\"" << left - 4 << "\" x2=\"" << left << "\" y1=\"" << py(t) << "\" y2=\""
        << py(t) << "\" stroke=\"#333\"/>";
    svg << "<text x=\"" << left - 6 << "\" y=\"" << py(t) + 4 << "\">" << fmt(t) << "</text>\n";
  }
  svg << "</g>\n<g class=\"x-axis\" font-size=\"11\" text-anchor=\"middle\">\n";
  for (double t : nice_ticks(x_lo, x_hi, 8)) {
    svg << "<line x1=\"" << px(t) << "\" x2=\"" << px(t) << "\" y1=\"" << top + height << "\" y2=\""
        << top + height + 4 << "\" stroke=\"#333\"/>";
    svg << "<text x=\"" << px(t) << "\" y=\"" << top + height + 16 << "\">" << fmt(t)
        << "</text>\n";
  }
  svg << "</g>\n";
  svg << "<text class=\"x-title\" x=\"" << left + width / 2 << "\" y=\"" << top + height + 34
      << "\" font-size=\"12\" text-anchor=\"middle\">step</text>\n";
  svg << "<text class=\"y-title\" transform=\"translate(" << left - 52 << " " << top + height / 2
      << ") rotate(-90)\" font-size=\"12\" text-anchor=\"middle\">" << escape(y_title)
      << "</text>\n";
  double legend_y = top + 16;
  for (const Line& l : lines) {
    if (l.series->x.empty()) continue;
    svg << "<polyline class=\"series\" data-label=\"" << l.label << "\" fill=\"none\" stroke=\""
        << l.color << "\" stroke-width=\"1.5\" points=\"";
    for (size_t i = 0; i < l.series->x.size(); ++i) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%s%.2f,%.2f", i ? " " : "", px(l.series->x[i]),
                    py(l.series->y[i]));
      svg << buf;
    }
    svg << "\"/>\n";
    svg << "<line x1=\"" << left + width - 130 << "\" x2=\"" << left + width - 110 << "\" y1=\""
        << legend_y - 4 << "\" y2=\"" << legend_y - 4 << "\" stroke=\"" << l.color
        << "\" stroke-width=\"2\"/><text class=\"legend\" x=\"" << left + width - 104 << "\" y=\""
        << legend_y << "\" font-size=\"11\">" << l.label << "</text>\n";
    legend_y += 16;
  }
  svg << "</g>\n";
}

void write_svg(const std::string& out, const std::string& svg) {
  std::ofstream file(out, std::ios::trunc);
  MAMMOTH_CHECK(file.good()) << "[plot] cannot write '" << out << "'";
  file << svg;
  file.flush();
  MAMMOTH_CHECK(file.good()) << "[plot] writing '" << out << "' failed";
}

// One rank's events from the merged trace.
struct RankLanes {
  struct Span {
    double ts, dur;
    std::string name;
  };
  std::vector<Span> lanes[4];  // by tid: compute, communication, pipeline, io
  std::map<std::string, Series> counters;
};

// The timeline of DIR/merged.trace.json: per rank four rows of boxes on a common time axis
// and, below them, the rank's memory counters scaled to their maximum.
int plot_trace(const std::string& dir) {
  const std::string path = dir + "/merged.trace.json";
  const json::Value trace = json::parse_file(path);
  std::map<int64_t, RankLanes> ranks;
  double t_lo = 1e300, t_hi = -1e300;
  for (const json::Value& e : trace.at("traceEvents")) {
    const std::string ph = e.at("ph").as_string();
    if (ph != "X" && ph != "C") continue;
    RankLanes& r = ranks[e.at("pid").as_int()];
    const double ts = e.at("ts").as_double();
    if (ph == "C") {
      r.counters[e.at("name").as_string()].add(ts, e.at("args").at("bytes").as_double());
      continue;
    }
    const int64_t tid = e.at("tid").as_int();
    if (tid < 0 || tid > 3 || e.at("name").as_string() == "step") continue;
    const double dur = e.at("dur").as_double();
    r.lanes[tid].push_back({ts, dur, e.at("name").as_string()});
    t_lo = std::min(t_lo, ts);
    t_hi = std::max(t_hi, ts + dur);
  }
  MAMMOTH_CHECK(!ranks.empty() && t_hi > t_lo) << "[plot] " << path << " holds no timed events";
  std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) out = dir + "/timeline.svg";
  MAMMOTH_CHECK(out.size() > 4 && out.substr(out.size() - 4) == ".svg")
      << "[plot] --out must name an .svg file, got '" << out << "'";

  // Rows per rank: 4 lanes of 14 px and a 50 px memory strip.
  const double W = 1100, left = 150, width = 920, lane_h = 14, mem_h = 50, gap = 26;
  const double group_h = 4 * (lane_h + 2) + mem_h + gap;
  const double H = 70 + group_h * static_cast<double>(ranks.size()) + 30;
  const char* kLaneNames[] = {"compute", "communication", "pipeline", "I/O"};
  const char* kLaneColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd"};
  const int kLaneOrder[] = {0, 2, 1, 3};  // compute, pipeline, communication, I/O
  auto px = [&](double t) { return left + (t - t_lo) / (t_hi - t_lo) * width; };
  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
      << "\" viewBox=\"0 0 " << W << " " << H << "\" font-family=\"sans-serif\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"#fafafa\"/>\n";
  const std::string title = absl::GetFlag(FLAGS_title).empty() ? path : absl::GetFlag(FLAGS_title);
  svg << "<text class=\"title\" x=\"" << W / 2 << "\" y=\"22\" font-size=\"15\" "
      << "text-anchor=\"middle\">" << escape(title) << "</text>\n";
  // The time axis (ms since the profile began), on top.
  svg << "<g class=\"x-axis\" font-size=\"11\" text-anchor=\"middle\">\n";
  for (double t : nice_ticks(0, (t_hi - t_lo) / 1e3, 10)) {
    const double x = px(t_lo + t * 1e3);
    svg << "<line x1=\"" << x << "\" x2=\"" << x << "\" y1=\"48\" y2=\"" << H - 30
        << "\" stroke=\"#e0e0e0\"/>\n<text x=\"" << x << "\" y=\"44\">" << fmt(t) << "</text>\n";
  }
  svg << "<text x=\"" << left + width / 2 << "\" y=\"" << H - 10 << "\">time (ms)</text>\n</g>\n";
  double top = 60;
  for (const auto& [rank, r] : ranks) {
    svg << "<g class=\"rank\" data-rank=\"" << rank << "\">\n<text x=\"8\" y=\"" << top + 11
        << "\" font-size=\"13\" font-weight=\"bold\">rank " << rank << "</text>\n";
    double y = top;
    for (int tid : kLaneOrder) {
      svg << "<g class=\"lane\" data-lane=\"" << kLaneNames[tid] << "\">\n<text x=\"" << left - 6
          << "\" y=\"" << y + 11 << "\" font-size=\"11\" text-anchor=\"end\">" << kLaneNames[tid]
          << "</text>\n";
      for (const RankLanes::Span& s : r.lanes[tid]) {
        char buf[256];
        std::snprintf(buf, sizeof(buf),
                      "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.0f\" "
                      "fill=\"%s\" fill-opacity=\"0.7\"><title>%s %.1f us</title></rect>\n",
                      px(s.ts), y, std::max(0.3, px(s.ts + s.dur) - px(s.ts)), lane_h,
                      kLaneColors[tid], escape(s.name).c_str(), s.dur);
        svg << buf;
      }
      svg << "</g>\n";
      y += lane_h + 2;
    }
    // Memory: each counter as a step line scaled to the largest value any of them takes.
    double peak = 0;
    for (const auto& [name, c] : r.counters)
      for (double v : c.y) peak = std::max(peak, v);
    svg << "<text x=\"" << left - 6 << "\" y=\"" << y + mem_h / 2 << "\" font-size=\"11\" "
        << "text-anchor=\"end\">memory (peak " << fmt(peak / 1048576.0) << " MiB)</text>\n";
    const char* kMemColors[] = {"#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f"};
    size_t k = 0;
    for (const auto& [name, c] : r.counters) {
      svg << "<polyline class=\"memory\" data-counter=\"" << escape(name)
          << "\" fill=\"none\" stroke-width=\"1\" stroke=\"" << kMemColors[k++ % 4]
          << "\" points=\"";
      double last_y = y + mem_h;
      for (size_t i = 0; i < c.x.size(); ++i) {
        const double vy = y + mem_h - (peak > 0 ? c.y[i] / peak : 0) * mem_h;
        char buf[64];
        std::snprintf(buf, sizeof(buf), "%.2f,%.1f %.2f,%.1f ", px(c.x[i]), last_y, px(c.x[i]), vy);
        svg << buf;
        last_y = vy;
      }
      svg << "\"><title>" << escape(name) << "</title></polyline>\n";
    }
    svg << "</g>\n";
    top += group_h;
  }
  svg << "</svg>\n";
  write_svg(out, svg.str());
  std::printf("%s: %zu rank(s), %.3f ms\n", out.c_str(), ranks.size(), (t_hi - t_lo) / 1e3);
  return 0;
}

int run_plot(const std::vector<std::string>& args) {
  if (!absl::GetFlag(FLAGS_trace).empty()) {
    MAMMOTH_CHECK(args.empty()) << "[plot] --trace DIR takes no metrics file (got '" << args[0]
                                << "')";
    return plot_trace(absl::GetFlag(FLAGS_trace));
  }
  MAMMOTH_CHECK(args.size() == 1) << "[plot] usage: mammoth plot METRICS.jsonl [--out FILE.svg]"
                                  << " (got " << args.size() << " arguments)";
  const std::string& path = args[0];
  std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    const size_t dot = path.rfind('.');
    out = (dot == std::string::npos || path.find('/', dot) != std::string::npos
               ? path
               : path.substr(0, dot)) +
          ".svg";
  }
  MAMMOTH_CHECK(out.size() > 4 && out.substr(out.size() - 4) == ".svg")
      << "[plot] --out must name an .svg file, got '" << out << "'";
  const Metrics m = read_metrics(path);
  double x_lo = m.loss.x.front(), x_hi = m.loss.x.back();
  for (const Series* s : {&m.loss, &m.val_loss, &m.tokens_per_s})
    for (double x : s->x) x_lo = std::min(x_lo, x), x_hi = std::max(x_hi, x);

  const double W = 900, left = 80, width = 790, height = 260;
  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"700\" "
      << "viewBox=\"0 0 " << W << " 700\" font-family=\"sans-serif\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"#fafafa\"/>\n";
  const std::string title = absl::GetFlag(FLAGS_title).empty() ? path : absl::GetFlag(FLAGS_title);
  svg << "<text class=\"title\" x=\"" << W / 2 << "\" y=\"24\" font-size=\"15\" "
      << "text-anchor=\"middle\">" << escape(title) << "</text>\n";
  panel(svg, left, 44, width, height, "loss",
        {{&m.loss, "#1f77b4", "train loss"}, {&m.val_loss, "#d62728", "val loss"}}, x_lo, x_hi);
  if (!m.tokens_per_s.x.empty()) {
    panel(svg, left, 44 + height + 70, width, height, "tokens/s",
          {{&m.tokens_per_s, "#2ca02c", "tokens/s"}}, x_lo, x_hi);
  }
  svg << "</svg>\n";
  write_svg(out, svg.str());
  std::printf("%s: %zu steps, loss %.4g -> %.4g%s\n", out.c_str(), m.loss.x.size(),
              m.loss.y.front(), m.loss.y.back(),
              m.val_loss.x.empty() ? "" : (", val " + fmt(m.val_loss.y.back())).c_str());
  return 0;
}

}  // namespace

MAMMOTH_COMMAND(plot,
                "SVG of loss, validation loss and tokens/s from a --metrics file, or (--trace DIR) "
                "the timeline of train --profile DIR",
                run_plot);

}  // namespace mammoth::tools
