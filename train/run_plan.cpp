// A training run's plan and pre-flight check, made alike on every rank.
#include "train/run_plan.h"

#include "core/io/atomic_file.h"
#include "train/devices.h"

namespace hr::train {

using namespace hr::core;

namespace {

void write_plan_json(const Plan& plan) {
  AtomicFile f(plan.config.output_dir + "/plan.json");
  const std::string text = plan_json(plan);
  f.write(text.data(), text.size());
  f.commit();
}

// Why a plan does not fit, and the cheapest single changes that would.
std::string does_not_fit(const Plan& plan, const DevicePreset& device, int world, int tightest) {
  const RunConfig& c = plan.config;
  std::string fixes;
  for (const Plan& f : suggest_fixes(c, device, world))
    fixes += str("\n  --set ", f.decisions_changed, ": peak ", format_bytes(double(f.total_predicted())), ", step ",
                 f.time.total(), " s");
  const bool step_fits = plan.train_predicted() <= plan.usable + plan.runtime_reserve;
  const std::string what = plan.evaluates && !plan.eval_fits && step_fits
                               ? str("the training step fits but evaluation does not (loss pass ",
                                     format_bytes(double(plan.eval.peak_allocated)), ", generation ",
                                     format_bytes(double(plan.generation.peak_allocated)),
                                     " allocated at train.eval_batch_size ", c.eval_batch_size, ")")
                               : std::string("the run does not fit");
  return str("[plan] ", what, ": predicted ", format_bytes(double(plan.total_predicted())), " per rank against ",
             format_bytes(double(plan.usable + plan.runtime_reserve)), " (", int(c.budget * 100 + 0.5f), "% of ",
             format_bytes(double(plan.capacity)),
             world > 1 ? str(", rank ", tightest, "'s room: every rank plans with the least") : "",
             "). The cheapest changes that fit:",
             fixes.empty() ? std::string("\n  (none of the single changes tried)") : fixes);
}

}  // namespace

PlannedRun plan_run(const RunConfig& requested, parallel::Communicator& comm, Console& console) {
  // A rank that runs out of memory would redo its step alone while the others wait in the step's collectives.
  if (requested.shrink_on_oom && comm.world() > 1)
    throw parallel::EveryRankError(
        "[config] memory.on_oom: shrink_micro_batch redoes a step in one process only: with "
        "several ranks the one that ran out would redo it alone while the others wait in "
        "its collectives. Use memory.on_oom: fail and let the planner size the step "
        "(train.micro_batch_size: auto)");
  PlannedRun run;
  RunConfig given = requested;
  run.device = choose_run_device(given, comm);
  const DevicePreset& device = run.device.preset;
  const Search search = search_plans(given, device, comm.world());
  // memory.allocator: auto takes the allocator whose dry run of the step reserves the least.
  run.plan = chosen_plan(search, given);
  console.deepspeed(run.plan.config);
  console.plan(run.plan, search);
  if (console.lead()) write_plan_json(run.plan);
  if (run.plan.fits) return run;
  const std::string why = does_not_fit(run.plan, device, comm.world(), run.device.tightest_rank);
  if (run.plan.config.preflight) throw parallel::EveryRankError(why + "\n(memory.preflight: false starts it anyway)");
  console.starting_anyway(why);
  return run;
}

}  // namespace hr::train
