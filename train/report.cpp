// The HTML run report: logs in, inline SVG charts out.
#include "train/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/check.h"
#include "core/memory/category.h"

namespace hr::train {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace hr::core;

// The lines of a JSON-lines log, one per step: a resumed run logs again the steps after its checkpoint, and
// the later line of a step is the one that counts. A line that is not JSON (a run killed mid-write) is
// skipped and counted in `skipped`; a JSON line without a numeric "step" is an error naming the line.
std::vector<json> read_jsonl(const fs::path& path, int64_t& skipped) {
  std::error_code ec;  // a device (a log pointed at /dev/full) reads without end
  HR_CHECK(fs::is_regular_file(path, ec), "[report] ", path.string(), " is not a regular file");
  std::ifstream in(path);
  HR_CHECK(in, "[report] cannot read ", path.string());
  std::map<int64_t, json> by_step;
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception&) {
      ++skipped;
      continue;
    }
    HR_CHECK(j.is_object() && j.contains("step") && j["step"].is_number_integer(), "[report] ", path.string(),
             ": line ", n, " has no integer \"step\"");
    const int64_t step = j["step"].get<int64_t>();
    by_step[step] = std::move(j);
  }
  std::vector<json> out;
  for (auto& [step, j] : by_step) out.push_back(std::move(j));
  return out;
}

std::string text_of(const json& j) {
  return j.is_string() ? j.get<std::string>() : j.dump();
}

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '&':
        o += "&amp;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

double num(const json& j, const char* k) {
  return j.contains(k) && j[k].is_number() ? j[k].get<double>() : NAN;
}

// How a chart's values read: plain numbers, or bytes (KiB, MiB, ... and an axis in steps of powers of 1024).
enum class Unit { Plain, Bytes };
// Lines over one another, or areas stacked so that the top one's edge is the sum.
enum class Layout { Lines, Stacked };

std::string fmt(double v, Unit unit) {
  if (unit == Unit::Bytes) return format_bytes(v);
  char b[32];
  std::snprintf(b, sizeof(b), std::fabs(v) >= 1000 || v == std::floor(v) ? "%.0f" : "%.3g", v);
  return b;
}

struct Series {
  std::string name, color;
  std::vector<std::pair<double, double>> points;  // (step, value); NaN values are gaps
  bool dashed = false, dots = false;
};

const char* kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                          "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};

// Each series' top edge at each of its points: its value, or (stacked) its value over the series below it;
// NaN where the series has a gap.
using Tops = std::vector<std::vector<double>>;

Tops tops_of(const std::vector<Series>& series, Layout layout) {
  Tops tops(series.size());
  for (std::size_t i = 0; i < series.size(); ++i)
    for (std::size_t k = 0; k < series[i].points.size(); ++k) {
      double top = series[i].points[k].second;
      if (layout == Layout::Stacked && i > 0 && !std::isnan(top)) top += tops[i - 1][k];
      tops[i].push_back(top);
    }
  return tops;
}

// The drawing's frame (SVG units: width, height and the margins left, right, top, bottom around the plot) and
// the steps [x0, x1] and values [0, y1] it spans, with the y axis' tick step.
struct Axes {
  static constexpr double W = 900, H = 300, L = 90, R = 20, T = 20, B = 40;
  double x0 = INFINITY, x1 = -INFINITY, y1 = 0, step = 0;

  double X(double x) const { return L + (x - x0) / (x1 - x0) * (W - L - R); }
  double Y(double y) const { return T + (1 - y / y1) * (H - T - B); }
  bool empty() const { return !(x1 >= x0); }
};

// What the data spans: every point's step, and the highest top.
Axes data_range(const std::vector<Series>& series, const Tops& tops) {
  Axes a;
  for (std::size_t i = 0; i < series.size(); ++i)
    for (std::size_t k = 0; k < series[i].points.size(); ++k) {
      const double x = series[i].points[k].first, top = tops[i][k];
      a.x0 = std::min(a.x0, x), a.x1 = std::max(a.x1, x);
      if (!std::isnan(top)) a.y1 = std::max(a.y1, top);
    }
  return a;
}

// Widens a single step to a range and rounds the y axis up to a tick: the tick step 1, 2 or 5 times a power of
// ten (of 1024 for bytes above a KiB).
void round_axes(Axes& a, Unit unit) {
  if (a.x1 == a.x0) a.x0 -= 1, a.x1 += 1;
  if (a.y1 <= 0) a.y1 = 1;
  const double raw = a.y1 / 5;
  const double base =
      unit == Unit::Bytes && raw >= 1024 ? std::pow(1024.0, std::floor(std::log(raw) / std::log(1024.0))) : 1.0;
  const double mag = std::pow(10.0, std::floor(std::log10(raw / base))) * base;
  a.step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) {
      a.step = m * mag;
      break;
    }
  a.y1 = std::ceil(a.y1 / a.step) * a.step;
}

// A grid line and a label at every tick of the y axis.
std::string y_ticks(const Axes& a, Unit unit) {
  std::string o;
  for (double y = 0; y <= a.y1 + a.step / 2; y += a.step) {
    o += str("<line x1=\"", a.L, "\" x2=\"", a.W - a.R, "\" y1=\"", a.Y(y), "\" y2=\"", a.Y(y), "\" class=\"grid\"/>");
    o += str("<text x=\"", a.L - 6, "\" y=\"", a.Y(y) + 4, "\" class=\"ytick\">", esc(fmt(y, unit)), "</text>");
  }
  return o;
}

// Integer steps: at most 6 intervals, never two ticks on one step; the axis' name below them.
std::string x_ticks(const Axes& a) {
  std::string o;
  const int xt = int(std::min(6.0, std::max(1.0, std::floor(a.x1 - a.x0))));
  for (int i = 0; i <= xt; ++i) {
    const double x = std::round(a.x0 + (a.x1 - a.x0) * i / xt);
    o += str("<text x=\"", a.X(x), "\" y=\"", a.H - a.B + 16, "\" class=\"xtick\">", int64_t(std::llround(x)),
             "</text>");
  }
  return o + str("<text x=\"", (a.L + a.W - a.R) / 2, "\" y=\"", a.H - 6, "\" class=\"xtick\">step</text>");
}

// The path through a series' tops, lifting the pen over its gaps.
std::string line_path(const Series& s, const std::vector<double>& top, const Axes& a) {
  std::string d;
  bool pen = false;
  for (std::size_t k = 0; k < s.points.size(); ++k) {
    if (std::isnan(top[k])) {
      pen = false;
      continue;
    }
    d += str(pen ? "L" : "M", a.X(s.points[k].first), " ", a.Y(top[k]), " ");
    pen = true;
  }
  return d;
}

// The area between a stacked series' line `d` and the series below it (`below` null: the axis), closed by
// going down that edge from right to left.
std::string stacked_area(const Series& s, const std::string& d, const std::vector<double>& top,
                         const std::vector<double>* below, const Axes& a) {
  std::string back;
  for (std::size_t k = s.points.size(); k-- > 0;) {
    const double under = below ? (*below)[k] : 0.0;
    if (!std::isnan(under) && !std::isnan(top[k])) back += str("L", a.X(s.points[k].first), " ", a.Y(under), " ");
  }
  return str("<path d=\"", d, back, "Z\" fill=\"", s.color, "\" fill-opacity=\"0.75\" stroke=\"", s.color, "\"/>");
}

// A dot per point, its value in the tooltip.
std::string dots(const Series& s, const std::vector<double>& top, const Axes& a, Unit unit) {
  std::string o;
  for (std::size_t k = 0; k < s.points.size(); ++k)
    if (!std::isnan(top[k]))
      o += str("<circle cx=\"", a.X(s.points[k].first), "\" cy=\"", a.Y(top[k]), "\" r=\"4\" fill=\"", s.color,
               "\"><title>", esc(s.name), " at step ", s.points[k].first, ": ", esc(fmt(s.points[k].second, unit)),
               "</title></circle>");
  return o;
}

// Series i drawn as its layout and kind say: a stacked area, dots, or a (dashed) line.
std::string shape(const std::vector<Series>& series, const Tops& tops, std::size_t i, const Axes& a, Unit unit,
                  Layout layout) {
  const Series& s = series[i];
  const std::string d = line_path(s, tops[i], a);
  if (layout == Layout::Stacked && !d.empty()) return stacked_area(s, d, tops[i], i > 0 ? &tops[i - 1] : nullptr, a);
  if (s.dots) return dots(s, tops[i], a, unit);
  return str("<path d=\"", d, "\" fill=\"none\" stroke=\"", s.color, "\" stroke-width=\"2\"",
             s.dashed ? " stroke-dasharray=\"6 4\"" : "", "/>");
}

// The legend: an entry per series, which the page's script turns into a toggle.
std::string legend(const std::vector<Series>& series) {
  std::string o = "<div class=\"legend\">";
  for (const Series& s : series)
    o += str("<span class=\"key\" data-key=\"", esc(s.name), "\"><i style=\"background:", s.color, "\"></i>",
             esc(s.name), "</span>");
  return o + "</div>";
}

// One chart: lines (or stacked areas) over steps, axes with round ticks, a legend whose entries toggle.
std::string chart(const std::string& title, const std::vector<Series>& series, Unit unit, Layout layout,
                  const std::string& note = "") {
  const Tops tops = tops_of(series, layout);
  Axes a = data_range(series, tops);
  std::string o = str("<section class=\"chart\"><h2>", esc(title), "</h2>");
  if (!note.empty()) o += str("<p class=\"note\">", esc(note), "</p>");
  if (a.empty()) return o + "<p>(no data)</p></section>\n";
  round_axes(a, unit);
  o += str("<svg viewBox=\"0 0 ", a.W, " ", a.H, "\" width=\"", a.W, "\" height=\"", a.H,
           "\" xmlns=\"http://www.w3.org/2000/svg\">");
  o += y_ticks(a, unit) + x_ticks(a);
  for (std::size_t n = 0; n < series.size(); ++n) {
    // Stacked: the top layer first, lower ones over it; lines in order, so a prediction is drawn (dashed)
    // over the measurement it equals.
    const std::size_t i = layout == Layout::Stacked ? series.size() - 1 - n : n;
    o += str("<g data-series=\"", esc(series[i].name), "\">", shape(series, tops, i, a, unit, layout), "</g>");
  }
  return o + "</svg>" + legend(series) + "</section>\n";
}

// Charts of long runs draw at most this many points per series: consecutive steps are merged, each point
// the largest value of its steps (memory: a peak stays visible) or their mean (loss, throughput).
constexpr std::size_t kMaxPoints = 500;
enum class Merge { Max, Mean };

// Steps per point for `n` lines.
std::size_t bucket(std::size_t n) {
  return (n + kMaxPoints - 1) / kMaxPoints;
}

std::vector<std::pair<double, double>> pick(const std::vector<json>& lines, const std::function<double(const json&)>& f,
                                            Merge merge = Merge::Max) {
  std::vector<std::pair<double, double>> v;
  const std::size_t per = std::max<std::size_t>(1, bucket(lines.size()));
  for (std::size_t i = 0; i < lines.size(); i += per) {
    double acc = NAN, sum = 0, last_step = 0;
    int n = 0;
    for (std::size_t k = i; k < std::min(lines.size(), i + per); ++k) {
      const double y = f(lines[k]);
      last_step = lines[k]["step"].get<double>();
      if (std::isnan(y)) continue;
      acc = std::isnan(acc) ? y : std::max(acc, y);
      sum += y, ++n;
    }
    v.emplace_back(last_step, merge == Merge::Max || n == 0 ? acc : sum / n);
  }
  return v;
}

// What a run directory holds for the report: a memory log per rank (rank 0's first), the evaluations, the plan.
struct RunLogs {
  std::vector<std::vector<json>> ranks;
  std::vector<json> evals;
  json plan;
  int64_t skipped = 0;  // log lines that are not JSON
};

// One memory log per rank: memory.jsonl (one process) or memory.rank{r}.jsonl.
std::vector<std::vector<json>> read_memory_logs(const fs::path& dir, const std::string& run_dir, int64_t& skipped) {
  std::vector<std::vector<json>> ranks;
  if (fs::exists(dir / "memory.jsonl")) {
    ranks.push_back(read_jsonl(dir / "memory.jsonl", skipped));
  } else {
    for (int r = 0; fs::exists(dir / str("memory.rank", r, ".jsonl")); ++r)
      ranks.push_back(read_jsonl(dir / str("memory.rank", r, ".jsonl"), skipped));
  }
  HR_CHECK(!ranks.empty(), "[report] ", run_dir,
           " has no memory.jsonl or memory.rank0.jsonl: not a training run's output_dir");
  HR_CHECK(!ranks.front().empty(), "[report] ",
           (dir / (ranks.size() > 1 ? "memory.rank0.jsonl" : "memory.jsonl")).string(), " has no steps yet");
  return ranks;
}

// plan.json, when the run wrote one (null otherwise).
json read_plan(const fs::path& dir) {
  json plan;
  if (!fs::exists(dir / "plan.json")) return plan;
  std::ifstream in(dir / "plan.json");
  try {
    plan = json::parse(in);
  } catch (const json::exception& e) {
    throw Error(str("[report] ", (dir / "plan.json").string(), " is not JSON: ", e.what()));
  }
  return plan;
}

RunLogs read_run(const std::string& run_dir) {
  const fs::path dir(run_dir);
  HR_CHECK(fs::is_directory(dir), "[report] ", run_dir, " is not a directory (give a run's output_dir)");
  RunLogs logs;
  logs.ranks = read_memory_logs(dir, run_dir, logs.skipped);
  if (fs::exists(dir / "eval.jsonl")) logs.evals = read_jsonl(dir / "eval.jsonl", logs.skipped);
  logs.plan = read_plan(dir);
  return logs;
}

// A value of each line's object `key` (NaN where the line has no such object).
double num_in(const json& j, const char* key, const char* k) {
  return j.contains(key) && j[key].is_object() ? num(j[key], k) : NAN;
}

// Memory by category at each step's peak; a category that never holds a byte is left out.
std::string memory_by_category(const std::vector<json>& m) {
  std::vector<Series> s;
  int i = 0;
  for (Category c : kAllCategories) {
    const std::string name = category_name(c);
    Series x{name, kPalette[i++ % 10], pick(m, [&](const json& j) {
               return num_in(j, j.contains("at_peak") ? "at_peak" : "by_category", name.c_str());
             })};
    bool any = false;
    for (auto& p : x.points) any |= p.second > 0;  // NaN compares false
    if (any) s.push_back(std::move(x));
  }
  return chart(
      "Memory by category at each step's peak", s, Unit::Bytes, Layout::Stacked,
      "Allocated bytes of each category at the moment the step reached its peak (stacked: the top is the peak).");
}

// How many steps peaked elsewhere than their dry run said, and by how much at most.
std::string prediction_note(const std::vector<json>& m) {
  int64_t off = 0, worst = 0;
  for (const json& j : m) {
    const double d = std::fabs(num(j, "peak_allocated") - num(j, "predicted_peak"));
    if (!std::isnan(d) && d > 0) ++off, worst = std::max(worst, int64_t(d));
  }
  return off == 0 ? str("Every one of the ", m.size(), " steps peaked exactly where its dry run said.")
                  : str(off, " of ", m.size(), " steps differ from their dry run, by up to ",
                        format_bytes(double(worst)), ".");
}

std::string predicted_against_measured(const std::vector<json>& m) {
  std::vector<Series> s = {
      {"measured peak allocated", "#4e79a7", pick(m, [](const json& j) { return num(j, "peak_allocated"); })},
      {"predicted peak allocated", "#f28e2b", pick(m, [](const json& j) { return num(j, "predicted_peak"); }), true},
      {"measured peak reserved", "#59a14f", pick(m, [](const json& j) { return num(j, "peak_reserved"); })},
      {"predicted peak reserved", "#e15759", pick(m, [](const json& j) { return num(j, "predicted_reserved"); }), true},
      {"planned worst case", "#9c755f", pick(m, [](const json& j) { return num(j, "planned_peak"); }), true}};
  return chart("Predicted against measured peak per step", s, Unit::Bytes, Layout::Lines, prediction_note(m));
}

std::string every_rank(const std::vector<std::vector<json>>& ranks) {
  std::vector<Series> s;
  for (std::size_t r = 0; r < ranks.size(); ++r)
    s.push_back({str("rank ", r, " peak allocated"), kPalette[r % 10],
                 pick(ranks[r], [](const json& j) { return num(j, "peak_allocated"); })});
  return chart("Every rank's peak", s, Unit::Bytes, Layout::Lines);
}

std::string loss(const std::vector<json>& m, const std::vector<json>& evals) {
  std::vector<Series> s = {{"train loss", "#4e79a7",
                            pick(
                                m, [](const json& j) { return num(j, "loss"); }, Merge::Mean)}};
  if (!evals.empty())
    s.push_back({"eval loss", "#e15759", pick(evals, [](const json& j) { return num(j, "loss"); }), false, true});
  return chart("Loss", s, Unit::Plain, Layout::Lines);
}

// Every question type any evaluation scored, in name order.
std::vector<std::string> question_types(const std::vector<json>& evals) {
  std::map<std::string, int> types;
  for (const json& e : evals)
    if (e.contains("accuracy_by_type") && e["accuracy_by_type"].is_object())
      for (const auto& [t, v] : e["accuracy_by_type"].items()) types.emplace(t, 0);
  std::vector<std::string> names;
  for (const auto& type : types) names.push_back(type.first);
  return names;
}

std::string eval_accuracy(const std::vector<json>& evals) {
  std::vector<Series> s = {
      {"eval accuracy", "#222222", pick(evals, [](const json& j) { return num(j, "accuracy"); }), false, true}};
  int i = 0;
  for (const std::string& t : question_types(evals))
    s.push_back({"accuracy " + t, kPalette[(i++ + 3) % 10],
                 pick(evals, [&](const json& j) { return num_in(j, "accuracy_by_type", t.c_str()); }), false, true});
  return chart("Eval accuracy", s, Unit::Plain, Layout::Lines);
}

std::string throughput(const std::vector<json>& m) {
  return chart("Throughput",
               {{"tokens/s", "#76b7b2",
                 pick(
                     m, [](const json& j) { return num(j, "tokens_per_s"); }, Merge::Mean)}},
               Unit::Plain, Layout::Lines);
}

std::string step_time(const std::vector<std::vector<json>>& ranks) {
  std::vector<Series> s = {{"step time", "#4e79a7",
                            pick(
                                ranks.front(), [](const json& j) { return num(j, "step_s"); }, Merge::Mean)}};
  for (std::size_t r = 0; ranks.size() > 1 && r < ranks.size(); ++r)
    s.push_back({str("rank ", r, " exposed communication"), kPalette[(r + 1) % 10],
                 pick(
                     ranks[r], [](const json& j) { return num(j, "comm_exposed_s"); }, Merge::Mean)});
  return chart("Step time (seconds)", s, Unit::Plain, Layout::Lines,
               ranks.size() > 1 ? "Exposed communication: the part of a step a rank stood still for collectives." : "");
}

std::string host_memory(const std::vector<json>& m) {
  return chart("Host memory",
               {{"host RSS", "#b07aa1", pick(m, [](const json& j) { return num(j, "host_rss"); })},
                {"host allocated", "#edc948",
                 pick(m, [](const json& j) { return j.contains("host") ? num(j["host"], "allocated") : NAN; })}},
               Unit::Bytes, Layout::Lines);
}

// Rank 0's bytes by category at the planned peak, then its totals.
std::string plan_rows(const json& r) {
  std::string o;
  if (r.contains("by_category"))
    for (const auto& [name, b] : r["by_category"].items())
      if (b.is_number()) o += str("<tr><td>", esc(name), "</td><td>", esc(format_bytes(b.get<double>())), "</td></tr>");
  for (const char* k : {"peak_allocated", "peak_reserved", "allocator_overhead", "runtime_reserve", "total"})
    if (r.contains(k) && r[k].is_number())
      o += str("<tr><th>", k, "</th><th>", esc(format_bytes(r[k].get<double>())), "</th></tr>");
  return o;
}

// The plan's breakdown: rank 0's table, the decisions, the device and whether the plan fits it.
std::string plan_section(const json& plan) {
  if (!(plan.is_object() && plan.contains("ranks") && plan["ranks"].is_array() && !plan["ranks"].empty())) return "";
  std::string o = "<section><h2>The plan</h2><table><tr><th>category at the planned peak</th><th>bytes</th></tr>" +
                  plan_rows(plan["ranks"][0]) + "</table>";
  if (plan.contains("decisions"))
    o += str("<p class=\"note\">decisions: <code>", esc(plan["decisions"].dump()), "</code></p>");
  if (plan.contains("device")) {
    const bool fits = plan.contains("fits") && plan["fits"].is_boolean() && plan["fits"].get<bool>();
    o += str("<p class=\"note\">device: ", esc(text_of(plan["device"])), ", usable ",
             esc(format_bytes(num(plan, "usable"))), ", ", fits ? "fits" : "does not fit", "</p>");
  }
  return o + "</section>\n";
}

// The leak watch's and the prediction check's warnings, every rank's, by step.
std::string warnings_section(const std::vector<std::vector<json>>& ranks) {
  std::string w;
  for (std::size_t r = 0; r < ranks.size(); ++r)
    for (const json& j : ranks[r])
      if (j.contains("warnings") && j["warnings"].is_array())
        for (const json& x : j["warnings"])
          w += str("<li>", ranks.size() > 1 ? str("rank ", r, ", ") : std::string(), "step ", j["step"].get<int64_t>(),
                   ": ", esc(text_of(x)), "</li>");
  return str("<section><h2>Warnings</h2>",
             w.empty() ? std::string("<p>The leak watch and the prediction check raised none.</p>")
                       : "<ul class=\"warn\">" + w + "</ul>",
             "</section>\n");
}

// The title and the line under it: the run, how much it logged, and how many steps a chart's point stands for.
std::string heading(const std::string& run_dir, const RunLogs& logs) {
  const std::vector<json>& m = logs.ranks.front();
  const std::size_t per = bucket(m.size()), ranks = logs.ranks.size();
  return str("<h1>headroom run report</h1><p class=\"note\">", esc(fs::path(run_dir).string()), ": ", m.size(),
             " steps logged (last ", m.back()["step"].get<int64_t>(), "), ", ranks, ranks == 1 ? " rank" : " ranks",
             logs.evals.empty() ? "" : str(", ", logs.evals.size(), " evaluations"),
             logs.plan.contains("model") ? str(", model ", esc(text_of(logs.plan["model"]))) : std::string(),
             logs.skipped ? str(", ", logs.skipped, " log lines that are not JSON skipped") : std::string(),
             per > 1 ? str(". Each point of a chart over steps stands for ", per,
                           " steps: the largest of their memory values, "
                           "the mean of their loss and throughput")
                     : std::string(),
             "</p>\n");
}

// The charts and sections in page order.
std::string body(const RunLogs& logs) {
  const std::vector<json>& m = logs.ranks.front();
  std::string o = memory_by_category(m) + predicted_against_measured(m);
  if (logs.ranks.size() > 1) o += every_rank(logs.ranks);
  o += loss(m, logs.evals);
  if (!logs.evals.empty()) o += eval_accuracy(logs.evals);
  o += throughput(m) + step_time(logs.ranks) + host_memory(m);
  return o + plan_section(logs.plan) + warnings_section(logs.ranks);
}

// The self-contained page: styles, then the heading and body, then the script that makes legend entries toggle.
std::string page(const std::string& head, const std::string& body) {
  return str(R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>headroom run report</title>
<style>
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:960px}
h1{font-size:22px}h2{font-size:16px;margin:18px 0 4px}
.note{color:#555;font-size:13px;margin:2px 0 6px}
.grid{stroke:#e4e4e4}.ytick{font-size:11px;text-anchor:end;fill:#555}.xtick{font-size:11px;text-anchor:middle;fill:#555}
.legend{font-size:12px;margin:2px 0 10px 90px}.key{margin-right:14px;cursor:pointer;user-select:none}
.key i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}.key.off{opacity:.35}
code{white-space:normal;word-break:break-word}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
.warn li{color:#a33;font-size:13px}
</style></head><body>
)",
             head, body, R"(<script>
// Clicking a legend entry hides or shows its series.
for (const sec of document.querySelectorAll('section.chart')) {
  for (const key of sec.querySelectorAll('.key')) {
    key.addEventListener('click', () => {
      key.classList.toggle('off');
      for (const g of sec.querySelectorAll('g[data-series]'))
        if (g.dataset.series === key.dataset.key) g.style.display = key.classList.contains('off') ? 'none' : '';
    });
  }
}
document.body.dataset.ready = "1";
</script></body></html>
)");
}

}  // namespace

std::string run_report_html(const std::string& run_dir) {
  const RunLogs logs = read_run(run_dir);
  return page(heading(run_dir, logs), body(logs));
}

}  // namespace hr::train
