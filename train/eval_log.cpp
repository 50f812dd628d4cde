// eval.jsonl, predictions.jsonl and the console's summary of an evaluation during training.
#include "train/eval_log.h"

#include <fstream>

#include "core/check.h"

namespace hr::train {

void write_eval_line(LogFile& log, int64_t step, const EvalResult& r, const EvalMemory& m) {
  nlohmann::json j = {
      {"step", step}, {"loss", r.loss}, {"accuracy", r.accuracy}, {"samples", r.samples}, {"skipped", r.skipped}};
  j["memory"] = {{"loss_pass", m.loss.json()}, {"generation", m.generation.json()}};
  nlohmann::json by = nlohmann::json::object();
  for (const auto& [type, ct] : r.by_type) by[type] = ct.second ? double(ct.first) / double(ct.second) : 0.0;
  j["accuracy_by_type"] = by;
  log.append(j.dump() + "\n", step);
}

void write_predictions(LogFile& log, int64_t step, const EvalResult& r) {
  std::string lines;
  for (const EvalPrediction& p : r.predictions) lines += prediction_line(p, step) + "\n";
  log.append(lines, step);
}

std::string eval_summary(const EvalResult& r) {
  std::string s = str("eval loss ", r.loss, " | accuracy ", 100.0 * r.accuracy, "% (");
  bool first = true;
  for (const auto& [type, ct] : r.by_type) {
    s += str(first ? "" : ", ", type, " ", ct.second ? 100.0 * double(ct.first) / double(ct.second) : 0.0, "%");
    first = false;
  }
  return s + str(") over ", r.samples, " samples", r.skipped ? str(" (", r.skipped, " bad samples skipped)") : "");
}

}  // namespace hr::train
