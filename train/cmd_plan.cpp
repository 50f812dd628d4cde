// `headroom plan CONFIG [--device NAME | --capacity BYTES] [--world-size N] [--set k=v ...] [--json]
// [--explain] [--max-micro-batch] [--trace FILE] [--snapshot FILE] [--image-size HxW] [--data-steps N]`: the memory
// plan of a run before anything is allocated. --trace writes the dry run's memory timeline (Chrome trace-event JSON,
// its clock the allocator's events), --snapshot the allocator at the dry run's peak in PyTorch's memory_viz format,
// --data-steps dry-runs every rank's first N steps of the run's own data at their shapes.
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/io/atomic_file.h"
#include "core/memory/memviz.h"
#include "core/memory/timeline.h"
#include "train/cli_args.h"
#include "train/commands.h"
#include "train/plan_data.h"
#include "train/planner.h"

namespace hr::train {

namespace {

void write_file(const std::string& path, const std::string& data) {
  core::AtomicFile f(path);
  f.write(data.data(), data.size());
  f.commit();
}

// The chosen plan's step dry-run again with a recording: every micro-batch run, the timeline and the
// allocator's starting state kept.
void write_trace_and_snapshot(const Plan& plan, const std::string& trace, const std::string& snapshot, std::FILE* out) {
  core::Timeline timeline(core::Timeline::Clock::Events);
  StepRecording rec;
  rec.timeline = trace.empty() ? nullptr : &timeline;
  Predictor pred(plan.config, plan.world, 0, sizing_target(plan.device));
  const Prediction p = pred.step(pred.worst_case(), &rec);
  if (!trace.empty()) {
    write_file(trace, timeline.chrome_json(
                          0, str("rank 0 (planned: dry run of the worst-case step on ", plan.device.name, ")")));
    std::fprintf(out, "memory timeline of the dry run (%zu events) in %s: open it in ui.perfetto.dev\n",
                 timeline.events(), trace.c_str());
  }
  if (!snapshot.empty()) {
    const core::PeakState at = core::state_at_peak(rec.start, *p.requests);
    HR_ASSERT(at.peak_allocated == p.peak_allocated, "the replayed peak ", at.peak_allocated,
              " differs from the dry run's ", p.peak_allocated);
    write_file(snapshot, core::memviz_snapshot(at.state, at.history, plan.device.name));
    std::fprintf(
        out,
        "allocator at the dry run's peak (%s allocated in %zu segments) in %s: open it in pytorch.org/memory_viz\n",
        format_bytes(double(at.peak_allocated)).c_str(), at.state.segments.size(), snapshot.c_str());
  }
}

// The exit status of a plan that does not fit (0 when it fits).
constexpr int kDoesNotFit = 3;

int exit_status(const Plan& plan) {
  return plan.fits ? 0 : kDoesNotFit;
}

// How the plan prints: a table (and what follows it), or the JSON alone.
enum class Output { Table, Json };

// An option's value, or "" where it is not given.
std::string option(const Parsed& p, const char* name) {
  return p.options.count(name) ? p.options.at(name) : "";
}

// Without --device the run's own device: a cuda:N config plans for this machine's GPU, measured.
DevicePreset own_device(const RunConfig& c, const Parsed& p) {
  try {
    return run_device(c);
  } catch (const Error& e) {
    if (run_device_of(c).type != core::DeviceType::CUDA || p.options.count("--capacity")) throw;
    std::string names;
    for (const std::string& n : device_preset_names()) names += (names.empty() ? "" : ", ") + n;
    throw Error(str(e.what(), "\n[plan] device.type is ", c.device, ": to plan for a GPU this machine does not have, ",
                    "name one with --device (", names, ")"));
  }
}

// The device to plan for: --device's preset, a CPU for --capacity, or the run's own; --capacity caps it.
DevicePreset plan_device(const RunConfig& c, const Parsed& p) {
  DevicePreset dev = p.options.count("--device")     ? device_preset(p.options.at("--device"))
                     : p.options.count("--capacity") ? device_preset("cpu")
                                                     : own_device(c, p);
  if (p.options.count("--capacity")) {
    dev.name = str(dev.name, " capped at ", p.options.at("--capacity"));
    dev.capacity = parse_bytes(p.options.at("--capacity"), "--capacity");
  }
  return dev;
}

// --max-micro-batch: the largest micro-batch that fits, with its plan.
int print_max_micro_batch(const RunConfig& c, const DevicePreset& dev, int world, Output output) {
  const Plan best = max_micro_batch(c, dev, world);
  if (output == Output::Json)
    std::printf("%s", plan_json(best).c_str());
  else if (!best.fits)
    std::printf("not even micro-batch 1 fits:\n%s", plan_table(best).c_str());
  else
    std::printf("largest micro-batch that fits: %lld\n%s", (long long)best.config.micro_batch_size,
                plan_table(best).c_str());
  return exit_status(best);
}

// Under a plan that does not fit: the cheapest single changes that would make it fit.
void print_fixes(const Plan& plan, const DevicePreset& dev, int world) {
  std::printf("\nthis plan does not fit; the cheapest changes that would:\n");
  const auto fixes = suggest_fixes(plan.config, dev, world);
  if (fixes.empty()) std::printf("  none of the single changes tried fits (more ranks, a larger device?)\n");
  for (const Plan& f : fixes)
    std::printf("  --set %s: peak %s, step %.3g s\n", f.decisions_changed.c_str(),
                format_bytes(double(f.total_predicted())).c_str(), f.time.total());
}

// The plan's JSON with the --data-steps object under "data_steps".
std::string with_data_steps(const std::string& plan, const std::string& steps) {
  nlohmann::json j = nlohmann::json::parse(plan);
  j["data_steps"] = nlohmann::json::parse(steps);
  return j.dump(2) + "\n";
}

// --image-size HxW (height x width, pixels): every image of the worst case that size. AnyRes only.
data::Resolution image_size_option(const RunConfig& c, const std::string& v) {
  HR_CHECK(c.model.config.anyres.on(), "[plan] --image-size plans AnyRes images; this model takes one image of ",
           c.model.config.vision.image_size, " px (set model.image_grid_pinpoints)");
  const std::size_t x = v.find('x');
  data::Resolution r;
  bool whole = x != std::string::npos;
  try {
    std::size_t used_h = 0, used_w = 0;
    if (whole) r.height = std::stoll(v.substr(0, x), &used_h), r.width = std::stoll(v.substr(x + 1), &used_w);
    whole = whole && used_h == x && used_w == v.size() - x - 1;
  } catch (const std::exception&) {
    whole = false;
  }
  HR_CHECK(whole, "[plan] --image-size '", v, "' is not HEIGHTxWIDTH in pixels (such as 1008x336)");
  HR_CHECK(r.height > 0 && r.width > 0 && r.height <= 100000 && r.width <= 100000, "[plan] --image-size '", v,
           "' must be from 1 to 100000 pixels a side");
  return r;
}

}  // namespace

int cmd_plan(const std::vector<std::string>& args) {
  const auto t0 = std::chrono::steady_clock::now();
  Parsed p = parse(args, "plan",
                   {"--device", "--capacity", "--world-size", "--trace", "--snapshot", "--deepspeed", "--image-size",
                    "--data-steps"},
                   {"--json", "--explain", "--max-micro-batch"});
  if (p.options.count("--deepspeed")) p.sets.insert(p.sets.begin(), "deepspeed=" + p.options["--deepspeed"]);
  const int world = int(integer_option(p, "plan", "--world-size", 1, 1, 1 << 20));
  RunConfig c = load_config(p.config, p.sets, world);
  if (p.options.count("--image-size")) c.plan_image = image_size_option(c, p.options["--image-size"]);
  use_cpu_threads(c, world);
  const DevicePreset dev = plan_device(c, p);
  const Output output = p.flags.count("--json") ? Output::Json : Output::Table;
  if (p.flags.count("--max-micro-batch")) return print_max_micro_batch(c, dev, world, output);
  Search s = search_plans(c, dev, world);
  HR_CHECK(!s.ranked.empty(), "[plan] no valid combination of strategies for this config");
  const Plan plan = compare_allocators(s.ranked.front());
  if (p.options.count("--trace") || p.options.count("--snapshot"))
    write_trace_and_snapshot(plan, option(p, "--trace"), option(p, "--snapshot"),
                             output == Output::Json ? stderr : stdout);
  std::optional<DataSteps> steps;
  if (p.options.count("--data-steps"))
    steps = dry_run_data_steps(plan.config, dev, world, integer_option(p, "plan", "--data-steps", 0, 1, 1000000));
  const bool grouped = plan.config.group_by_modality_length;
  if (output == Output::Json) {
    std::printf(
        "%s", steps
                  ? with_data_steps(plan_json(plan), data_steps_json(*steps, plan.rank.peak_allocated, grouped)).c_str()
                  : plan_json(plan).c_str());
    return exit_status(plan);
  }
  std::printf("%s", plan_table(plan).c_str());
  if (steps) std::printf("%s", data_steps_table(*steps, plan.rank.peak_allocated, grouped).c_str());
  if (s.any_auto || p.flags.count("--explain")) std::printf("%s", search_explanation(s).c_str());
  if (!plan.fits) print_fixes(plan, dev, world);
  std::printf("planned in %.2f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return exit_status(plan);
}

}  // namespace hr::train
