// `headroom plan --data-steps N`: every rank's first N steps of the run's data, dry-run at their own shapes.
#include "train/plan_data.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "train/planner.h"
#include "train/run_data.h"

namespace hr::train {

using json = nlohmann::json;

namespace {

// Each rank's steps, each the shapes of its micro-batches, as the trainer's loader draws them.
std::vector<std::vector<std::vector<MicroShape>>> steps_of_data(const RunConfig& c, int world, int64_t steps,
                                                                DataSteps& d) {
  auto comm = parallel::make_single_process();
  const DataPaths paths = resolve_data_paths(c, *comm, stderr);  // stdout holds the plan (its JSON with --json)
  d.data = paths.train_json;
  const data::LlavaDataset set(data_options(c, paths.train_json, paths.image_folder),
                               models::input_spec(c.model.config));
  data::LoaderOptions o = loader_options(c, 0, world);  // the trainer's order; every rank's batches are drawn here
  o.prefetch = std::max<int>(o.prefetch, int(c.micro_batch_size) * world);
  data::DataLoader loader(set, o);
  using Steps = std::vector<std::vector<MicroShape>>;
  std::vector<Steps> out(static_cast<std::size_t>(world), Steps(static_cast<std::size_t>(steps)));
  for (int64_t s = 0; s < steps; ++s)
    for (int64_t a = 0; a < c.gradient_accumulation_steps; ++a) {
      const std::vector<data::LoadedBatch> every = loader.next_for_every_rank();
      for (int r = 0; r < world; ++r) {
        out[std::size_t(r)][std::size_t(s)].push_back(shape_of(every[std::size_t(r)].batch, c));
        for (const data::Example& e : every[std::size_t(r)].examples)
          for (int64_t t : e.image_tokens) d.largest_image_tokens = std::max(d.largest_image_tokens, t);
      }
    }
  return out;
}

// The nearest-rank percentile `fraction` of `sorted` (ascending): its ceil(fraction x n)-th smallest.
int64_t ranked(const std::vector<int64_t>& sorted, double fraction) {
  const std::size_t k = std::size_t(std::ceil(fraction * double(sorted.size())));
  return sorted[std::min(sorted.size() - 1, k == 0 ? 0 : k - 1)];
}

struct Spread {
  int64_t min = 0, median = 0, p90 = 0, max = 0, at_plan = 0, within_10 = 0, count = 0;
};

Spread spread(const DataSteps& d, int64_t planned) {
  std::vector<int64_t> all;
  for (const auto& rank : d.peaks) all.insert(all.end(), rank.begin(), rank.end());
  std::sort(all.begin(), all.end());
  Spread s;
  s.count = int64_t(all.size());
  if (all.empty()) return s;
  s.min = all.front(), s.max = all.back(), s.median = ranked(all, 0.5), s.p90 = ranked(all, 0.9);
  for (int64_t p : all) {
    s.at_plan += p >= planned;
    s.within_10 += double(p) >= 0.9 * double(planned);
  }
  return s;
}

}  // namespace

DataSteps dry_run_data_steps(const RunConfig& c, const DevicePreset& device, int world, int64_t steps) {
  HR_CHECK(steps >= 1, "[plan] --data-steps must be at least 1");
  DataSteps d;
  d.world = world;
  d.steps = steps;
  const auto shapes = steps_of_data(c, world, steps, d);
  for (int r = 0; r < world; ++r) {
    Predictor pred(c, world, r, sizing_target(device));
    std::map<std::vector<MicroShape>, int64_t> seen;
    std::vector<int64_t> peaks;
    for (const std::vector<MicroShape>& step : shapes[std::size_t(r)]) {
      auto it = seen.find(step);
      if (it == seen.end()) {
        it = seen.emplace(step, pred.step(step).peak_allocated).first;
        ++d.dry_runs;
      }
      peaks.push_back(it->second);
    }
    d.peaks.push_back(std::move(peaks));
  }
  return d;
}

std::string data_steps_table(const DataSteps& d, int64_t planned, bool grouped) {
  const Spread s = spread(d, planned);
  auto b = [](int64_t v) { return format_bytes(double(v)); };
  std::string out = str("\nthe first ", d.steps, " step", d.steps == 1 ? "" : "s", " of ", d.data, " on ", d.world,
                        " rank", d.world == 1 ? "" : "s", " (length grouping ", grouped ? "on" : "off",
                        "), each dry-run at its own shapes (", d.dry_runs, " dry runs):\n");
  out += str("  peak per rank and step: min ", b(s.min), ", median ", b(s.median), ", 90th percentile ", b(s.p90),
             ", max ", b(s.max), "\n");
  out += str("  planned worst case ", b(planned), ": reached by ", s.at_plan, " of ", s.count, ", within 10% by ",
             s.within_10, "; the largest image made ", d.largest_image_tokens, " tokens\n");
  return out;
}

std::string data_steps_json(const DataSteps& d, int64_t planned, bool grouped) {
  const Spread s = spread(d, planned);
  json j = {{"data", d.data},
            {"world", d.world},
            {"steps", d.steps},
            {"group_by_modality_length", grouped},
            {"dry_runs", d.dry_runs},
            {"planned_peak", planned},
            {"peaks", d.peaks},
            {"min", s.min},
            {"median", s.median},
            {"p90", s.p90},
            {"max", s.max},
            {"reaching_plan", s.at_plan},
            {"within_10_percent", s.within_10},
            {"largest_image_tokens", d.largest_image_tokens}};
  return j.dump();
}

}  // namespace hr::train
