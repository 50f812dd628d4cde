// `headroom plan CONFIG [--device NAME | --capacity BYTES] [--world-size N] [--set k=v ...] [--json]
// [--explain] [--max-micro-batch]`: the memory plan of a run before anything is allocated.
#include <chrono>
#include <cstdio>

#include "train/cli_args.h"
#include "train/commands.h"
#include "train/planner.h"

namespace hr::train {

int cmd_plan(const std::vector<std::string>& args) {
  const auto t0 = std::chrono::steady_clock::now();
  Parsed p = parse(args, "plan", {"--device", "--capacity", "--world-size"}, {"--json", "--explain", "--max-micro-batch"});
  const int world = p.options.count("--world-size") ? std::stoi(p.options["--world-size"]) : 1;
  HR_CHECK(world >= 1, "[plan] --world-size must be at least 1");
  RunConfig c = load_config(p.config, p.sets, world);
  use_cpu_threads(c, world);
  DevicePreset dev = p.options.count("--device") ? device_preset(p.options["--device"]) : run_device(c);
  if (p.options.count("--capacity")) {
    if (!p.options.count("--device")) dev = device_preset("cpu");
    dev.name = str(dev.name, " capped at ", p.options["--capacity"]);
    dev.capacity = parse_bytes(p.options["--capacity"], "--capacity");
  }
  const bool json = p.flags.count("--json") > 0;
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  if (p.flags.count("--max-micro-batch")) {
    Plan best = max_micro_batch(c, dev, world);
    if (json) std::printf("%s", plan_json(best).c_str());
    else if (!best.fits) std::printf("not even micro-batch 1 fits:\n%s", plan_table(best).c_str());
    else std::printf("largest micro-batch that fits: %lld\n%s", (long long)best.config.micro_batch_size, plan_table(best).c_str());
    return best.fits ? 0 : 3;
  }
  Search s = search_plans(c, dev, world);
  HR_CHECK(!s.ranked.empty(), "[plan] no valid combination of strategies for this config");
  const Plan& plan = s.ranked.front();
  if (json) {
    std::printf("%s", plan_json(plan).c_str());
    return plan.fits ? 0 : 3;
  }
  std::printf("%s", plan_table(plan).c_str());
  if (s.any_auto || p.flags.count("--explain")) std::printf("%s", search_explanation(s).c_str());
  if (!plan.fits) {
    std::printf("\nthis plan does not fit; the cheapest changes that would:\n");
    const auto fixes = suggest_fixes(plan.config, dev, world);
    if (fixes.empty()) std::printf("  none of the single changes tried fits (more ranks, a larger device?)\n");
    for (const Plan& f : fixes)
      std::printf("  --set %s: peak %s, step %.3g s\n", f.decisions_changed.c_str(), format_bytes(double(f.total_predicted())).c_str(),
                  f.time.total());
  }
  std::printf("planned in %.2f s\n", elapsed());
  return plan.fits ? 0 : 3;
}

}  // namespace hr::train
