#include "parallel/pipeline/partition.h"

#include <algorithm>
#include <limits>

#include "base/error.h"

namespace mammoth::parallel::pipeline {

Partition partition_by_count(int64_t layers, int stages) {
  MAMMOTH_CHECK(stages >= 1 && layers >= stages)
      << "[partition] " << layers << " layers cannot fill " << stages << " stages";
  Partition p{0};
  for (int s = 0; s < stages; ++s) p.push_back(p.back() + layers / stages + (s < layers % stages));
  return p;
}

double max_stage_cost(const Partition& p, const std::vector<double>& layer_cost, double first_extra,
                      double last_extra) {
  double worst = 0;
  const int stages = static_cast<int>(p.size()) - 1;
  for (int s = 0; s < stages; ++s) {
    double c = (s == 0 ? first_extra : 0) + (s == stages - 1 ? last_extra : 0);
    for (int64_t l = p[s]; l < p[s + 1]; ++l) c += layer_cost[static_cast<size_t>(l)];
    worst = std::max(worst, c);
  }
  return worst;
}

Partition balanced_partition(const std::vector<double>& layer_cost, double first_extra,
                             double last_extra, int stages) {
  const int64_t L = static_cast<int64_t>(layer_cost.size());
  MAMMOTH_CHECK(stages >= 1 && L >= stages)
      << "[partition] " << L << " layers cannot fill " << stages << " stages";
  MAMMOTH_CHECK(first_extra >= 0 && last_extra >= 0)
      << "[partition] negative extra cost (" << first_extra << ", " << last_extra << ")";
  std::vector<double> prefix(static_cast<size_t>(L) + 1, 0.0);
  for (int64_t l = 0; l < L; ++l) {
    MAMMOTH_CHECK(layer_cost[static_cast<size_t>(l)] >= 0)
        << "[partition] layer " << l << " has negative cost " << layer_cost[static_cast<size_t>(l)];
    prefix[static_cast<size_t>(l) + 1] =
        prefix[static_cast<size_t>(l)] + layer_cost[static_cast<size_t>(l)];
  }
  auto cost = [&](int s, int64_t a, int64_t b) {
    return prefix[static_cast<size_t>(b)] - prefix[static_cast<size_t>(a)] +
           (s == 0 ? first_extra : 0) + (s == stages - 1 ? last_extra : 0);
  };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[s][e]: the smallest bottleneck of stages 0..s covering layers [0, e); cut[s][e] the
  // start of stage s in it (on ties, the earliest cut point).
  std::vector<std::vector<double>> best(static_cast<size_t>(stages),
                                        std::vector<double>(static_cast<size_t>(L) + 1, kInf));
  std::vector<std::vector<int64_t>> cut(static_cast<size_t>(stages),
                                        std::vector<int64_t>(static_cast<size_t>(L) + 1, 0));
  for (int64_t e = 1; e <= L; ++e) best[0][static_cast<size_t>(e)] = cost(0, 0, e);
  for (int s = 1; s < stages; ++s) {
    for (int64_t e = s + 1; e <= L; ++e) {
      for (int64_t a = s; a < e; ++a) {
        const double v =
            std::max(best[static_cast<size_t>(s) - 1][static_cast<size_t>(a)], cost(s, a, e));
        if (v < best[static_cast<size_t>(s)][static_cast<size_t>(e)]) {
          best[static_cast<size_t>(s)][static_cast<size_t>(e)] = v;
          cut[static_cast<size_t>(s)][static_cast<size_t>(e)] = a;
        }
      }
    }
  }
  Partition p(static_cast<size_t>(stages) + 1);
  p[static_cast<size_t>(stages)] = L;
  for (int s = stages - 1; s >= 1; --s) {
    p[static_cast<size_t>(s)] =
        cut[static_cast<size_t>(s)][static_cast<size_t>(p[static_cast<size_t>(s) + 1])];
  }
  p[0] = 0;
  return p;
}

bool partition_is_balanced(const std::string& name) {
  MAMMOTH_CHECK(name == "count" || name == "balanced")
      << "[partition] --pp-partition must be count or balanced, got '" << name << "'";
  return name == "balanced";
}

}  // namespace mammoth::parallel::pipeline
