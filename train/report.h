// `headroom report RUN_DIR`: one self-contained HTML page of a run (inline SVG, no network) from its
// memory.jsonl (or memory.rank{r}.jsonl), eval.jsonl and plan.json: memory by category at each step's peak
// (stacked), predicted against measured peaks, loss and eval accuracy, tokens/s, every rank's peak, the
// plan's breakdown and the leak watch's warnings.
#pragma once

#include <string>

namespace hr::train {

// The page for the run in `run_dir`; throws naming the file when a log is missing or malformed.
std::string run_report_html(const std::string& run_dir);

}  // namespace hr::train
