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

std::string fmt(double v, bool bytes) {
  if (bytes) return format_bytes(v);
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

// One chart: lines (or stacked areas) over steps, axes with round ticks, a legend whose entries toggle.
std::string chart(const std::string& title, const std::vector<Series>& series, bool bytes, bool stacked,
                  const std::string& note = "") {
  const double W = 900, H = 300, L = 90, R = 20, T = 20, B = 40;
  double x0 = INFINITY, x1 = -INFINITY, y1 = 0;
  std::vector<std::vector<double>> tops(series.size());  // stacked: each series' top edge
  for (std::size_t i = 0; i < series.size(); ++i) {
    for (std::size_t k = 0; k < series[i].points.size(); ++k) {
      const auto [x, y] = series[i].points[k];
      double top = std::isnan(y) ? NAN : y;
      if (stacked && i > 0 && !std::isnan(top)) top += tops[i - 1][k];
      tops[i].push_back(top);
      x0 = std::min(x0, x), x1 = std::max(x1, x);
      if (!std::isnan(top)) y1 = std::max(y1, top);
    }
  }
  std::string o = str("<section class=\"chart\"><h2>", esc(title), "</h2>");
  if (!note.empty()) o += str("<p class=\"note\">", esc(note), "</p>");
  if (!(x1 >= x0)) return o + "<p>(no data)</p></section>\n";
  if (x1 == x0) x0 -= 1, x1 += 1;
  if (y1 <= 0) y1 = 1;
  // Round tick step for the y axis: 1, 2 or 5 times a power of ten (of 1024 for bytes above a KiB).
  const double raw = y1 / 5;
  double unit = bytes && raw >= 1024 ? std::pow(1024.0, std::floor(std::log(raw) / std::log(1024.0))) : 1.0;
  double mag = std::pow(10.0, std::floor(std::log10(raw / unit))) * unit, step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) {
      step = m * mag;
      break;
    }
  y1 = std::ceil(y1 / step) * step;
  auto X = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto Y = [&](double y) { return T + (1 - y / y1) * (H - T - B); };
  o += str("<svg viewBox=\"0 0 ", W, " ", H, "\" width=\"", W, "\" height=\"", H,
           "\" xmlns=\"http://www.w3.org/2000/svg\">");
  for (double y = 0; y <= y1 + step / 2; y += step) {
    o += str("<line x1=\"", L, "\" x2=\"", W - R, "\" y1=\"", Y(y), "\" y2=\"", Y(y), "\" class=\"grid\"/>");
    o += str("<text x=\"", L - 6, "\" y=\"", Y(y) + 4, "\" class=\"ytick\">", esc(fmt(y, bytes)), "</text>");
  }
  // Integer steps: at most 6 intervals, never two ticks on one step.
  const int xt = int(std::min(6.0, std::max(1.0, std::floor(x1 - x0))));
  for (int i = 0; i <= xt; ++i) {
    const double x = std::round(x0 + (x1 - x0) * i / xt);
    o += str("<text x=\"", X(x), "\" y=\"", H - B + 16, "\" class=\"xtick\">", int64_t(std::llround(x)), "</text>");
  }
  o += str("<text x=\"", (L + W - R) / 2, "\" y=\"", H - 6, "\" class=\"xtick\">step</text>");
  for (std::size_t n = 0; n < series.size(); ++n) {
    // Stacked: the top layer first, lower ones over it; lines in order, so a prediction is drawn (dashed)
    // over the measurement it equals.
    const std::size_t i = stacked ? series.size() - 1 - n : n;
    const Series& s = series[i];
    std::string d;
    bool pen = false;
    for (std::size_t k = 0; k < s.points.size(); ++k) {
      const double top = tops[i][k];
      if (std::isnan(top)) {
        pen = false;
        continue;
      }
      d += str(pen ? "L" : "M", X(s.points[k].first), " ", Y(top), " ");
      pen = true;
    }
    std::string shape;
    if (stacked && !d.empty()) {
      // Down the series below (or the axis) from right to left.
      std::string back;
      for (std::size_t k = s.points.size(); k-- > 0;) {
        const double below = i > 0 ? tops[i - 1][k] : 0.0;
        if (!std::isnan(below) && !std::isnan(tops[i][k])) back += str("L", X(s.points[k].first), " ", Y(below), " ");
      }
      shape = str("<path d=\"", d, back, "Z\" fill=\"", s.color, "\" fill-opacity=\"0.75\" stroke=\"", s.color, "\"/>");
    } else if (s.dots) {
      for (std::size_t k = 0; k < s.points.size(); ++k)
        if (!std::isnan(tops[i][k]))
          shape += str("<circle cx=\"", X(s.points[k].first), "\" cy=\"", Y(tops[i][k]), "\" r=\"4\" fill=\"", s.color,
                       "\"><title>", esc(s.name), " at step ", s.points[k].first, ": ",
                       esc(fmt(s.points[k].second, bytes)), "</title></circle>");
    } else {
      shape = str("<path d=\"", d, "\" fill=\"none\" stroke=\"", s.color, "\" stroke-width=\"2\"",
                  s.dashed ? " stroke-dasharray=\"6 4\"" : "", "/>");
    }
    o += str("<g data-series=\"", esc(s.name), "\">", shape, "</g>");
  }
  o += "</svg><div class=\"legend\">";
  for (const Series& s : series)
    o += str("<span class=\"key\" data-key=\"", esc(s.name), "\"><i style=\"background:", s.color, "\"></i>",
             esc(s.name), "</span>");
  return o + "</div></section>\n";
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

}  // namespace

std::string run_report_html(const std::string& run_dir) {
  const fs::path dir(run_dir);
  HR_CHECK(fs::is_directory(dir), "[report] ", run_dir, " is not a directory (give a run's output_dir)");
  // One memory log per rank: memory.jsonl (one process) or memory.rank{r}.jsonl.
  std::vector<std::vector<json>> ranks;
  int64_t skipped = 0;  // log lines that are not JSON
  if (fs::exists(dir / "memory.jsonl")) {
    ranks.push_back(read_jsonl(dir / "memory.jsonl", skipped));
  } else {
    for (int r = 0; fs::exists(dir / str("memory.rank", r, ".jsonl")); ++r)
      ranks.push_back(read_jsonl(dir / str("memory.rank", r, ".jsonl"), skipped));
  }
  HR_CHECK(!ranks.empty(), "[report] ", run_dir,
           " has no memory.jsonl or memory.rank0.jsonl: not a training run's output_dir");
  const std::vector<json>& m = ranks.front();
  HR_CHECK(!m.empty(), "[report] ", (dir / (ranks.size() > 1 ? "memory.rank0.jsonl" : "memory.jsonl")).string(),
           " has no steps yet");
  std::vector<json> evals;
  if (fs::exists(dir / "eval.jsonl")) evals = read_jsonl(dir / "eval.jsonl", skipped);
  json plan;
  if (fs::exists(dir / "plan.json")) {
    std::ifstream in(dir / "plan.json");
    try {
      plan = json::parse(in);
    } catch (const json::exception& e) {
      throw Error(str("[report] ", (dir / "plan.json").string(), " is not JSON: ", e.what()));
    }
  }

  std::string body;
  // Memory by category at each step's peak.
  {
    std::vector<Series> s;
    int i = 0;
    for (Category c : kAllCategories) {
      const std::string name = category_name(c);
      Series x{name, kPalette[i++ % 10], pick(m, [&](const json& j) {
                 const char* from = j.contains("at_peak") ? "at_peak" : "by_category";
                 return j.contains(from) && j[from].is_object() ? num(j[from], name.c_str()) : NAN;
               })};
      bool any = false;
      for (auto& p : x.points) any |= p.second > 0;  // NaN compares false
      if (any) s.push_back(std::move(x));
    }
    body += chart(
        "Memory by category at each step's peak", s, true, true,
        "Allocated bytes of each category at the moment the step reached its peak (stacked: the top is the peak).");
  }
  // Predicted against measured.
  {
    std::vector<Series> s = {
        {"measured peak allocated", "#4e79a7", pick(m, [](const json& j) { return num(j, "peak_allocated"); })},
        {"predicted peak allocated", "#f28e2b", pick(m, [](const json& j) { return num(j, "predicted_peak"); }), true},
        {"measured peak reserved", "#59a14f", pick(m, [](const json& j) { return num(j, "peak_reserved"); })},
        {"predicted peak reserved", "#e15759", pick(m, [](const json& j) { return num(j, "predicted_reserved"); }),
         true},
        {"planned worst case", "#9c755f", pick(m, [](const json& j) { return num(j, "planned_peak"); }), true}};
    int64_t off = 0, worst = 0;
    for (const json& j : m) {
      const double d = std::fabs(num(j, "peak_allocated") - num(j, "predicted_peak"));
      if (!std::isnan(d) && d > 0) ++off, worst = std::max(worst, int64_t(d));
    }
    body += chart("Predicted against measured peak per step", s, true, false,
                  off == 0 ? str("Every one of the ", m.size(), " steps peaked exactly where its dry run said.")
                           : str(off, " of ", m.size(), " steps differ from their dry run, by up to ",
                                 format_bytes(double(worst)), "."));
  }
  if (ranks.size() > 1) {
    std::vector<Series> s;
    for (std::size_t r = 0; r < ranks.size(); ++r)
      s.push_back({str("rank ", r, " peak allocated"), kPalette[r % 10],
                   pick(ranks[r], [](const json& j) { return num(j, "peak_allocated"); })});
    body += chart("Every rank's peak", s, true, false);
  }
  {
    std::vector<Series> s = {{"train loss", "#4e79a7",
                              pick(
                                  m, [](const json& j) { return num(j, "loss"); }, Merge::Mean)}};
    if (!evals.empty())
      s.push_back({"eval loss", "#e15759", pick(evals, [](const json& j) { return num(j, "loss"); }), false, true});
    body += chart("Loss", s, false, false);
  }
  if (!evals.empty()) {
    std::vector<Series> s = {
        {"eval accuracy", "#222222", pick(evals, [](const json& j) { return num(j, "accuracy"); }), false, true}};
    std::map<std::string, int> types;
    for (const json& e : evals)
      if (e.contains("accuracy_by_type") && e["accuracy_by_type"].is_object())
        for (const auto& [t, v] : e["accuracy_by_type"].items()) types.emplace(t, 0);
    int i = 0;
    for (const auto& type : types) {
      const std::string& t = type.first;  // a named variable: clang 14 cannot capture a structured binding
      s.push_back({"accuracy " + t, kPalette[(i++ + 3) % 10],
                   pick(evals,
                        [&](const json& j) {
                          return j.contains("accuracy_by_type") && j["accuracy_by_type"].is_object()
                                     ? num(j["accuracy_by_type"], t.c_str())
                                     : NAN;
                        }),
                   false, true});
    }
    body += chart("Eval accuracy", s, false, false);
  }
  body += chart("Throughput",
                {{"tokens/s", "#76b7b2",
                  pick(
                      m, [](const json& j) { return num(j, "tokens_per_s"); }, Merge::Mean)}},
                false, false);
  {
    std::vector<Series> s = {{"step time", "#4e79a7",
                              pick(
                                  m, [](const json& j) { return num(j, "step_s"); }, Merge::Mean)}};
    for (std::size_t r = 0; ranks.size() > 1 && r < ranks.size(); ++r)
      s.push_back({str("rank ", r, " exposed communication"), kPalette[(r + 1) % 10],
                   pick(
                       ranks[r], [](const json& j) { return num(j, "comm_exposed_s"); }, Merge::Mean)});
    body +=
        chart("Step time (seconds)", s, false, false,
              ranks.size() > 1 ? "Exposed communication: the part of a step a rank stood still for collectives." : "");
  }
  body += chart("Host memory",
                {{"host RSS", "#b07aa1", pick(m, [](const json& j) { return num(j, "host_rss"); })},
                 {"host allocated", "#edc948",
                  pick(m, [](const json& j) { return j.contains("host") ? num(j["host"], "allocated") : NAN; })}},
                true, false);

  // The plan's breakdown.
  if (plan.is_object() && plan.contains("ranks") && plan["ranks"].is_array() && !plan["ranks"].empty()) {
    const json& r = plan["ranks"][0];
    body += "<section><h2>The plan</h2><table><tr><th>category at the planned peak</th><th>bytes</th></tr>";
    if (r.contains("by_category"))
      for (const auto& [name, b] : r["by_category"].items())
        if (b.is_number())
          body += str("<tr><td>", esc(name), "</td><td>", esc(format_bytes(b.get<double>())), "</td></tr>");
    for (const char* k : {"peak_allocated", "peak_reserved", "allocator_overhead", "runtime_reserve", "total"})
      if (r.contains(k) && r[k].is_number())
        body += str("<tr><th>", k, "</th><th>", esc(format_bytes(r[k].get<double>())), "</th></tr>");
    body += "</table>";
    if (plan.contains("decisions"))
      body += str("<p class=\"note\">decisions: <code>", esc(plan["decisions"].dump()), "</code></p>");
    if (plan.contains("device"))
      body +=
          str("<p class=\"note\">device: ", esc(text_of(plan["device"])), ", usable ",
              esc(format_bytes(num(plan, "usable"))), ", ",
              plan.contains("fits") && plan["fits"].is_boolean() && plan["fits"].get<bool>() ? "fits" : "does not fit",
              "</p>");
    body += "</section>\n";
  }
  // The leak watch and the prediction check.
  {
    std::string w;
    for (std::size_t r = 0; r < ranks.size(); ++r)
      for (const json& j : ranks[r])
        if (j.contains("warnings") && j["warnings"].is_array())
          for (const json& x : j["warnings"])
            w += str("<li>", ranks.size() > 1 ? str("rank ", r, ", ") : std::string(), "step ",
                     j["step"].get<int64_t>(), ": ", esc(text_of(x)), "</li>");
    body += str("<section><h2>Warnings</h2>",
                w.empty() ? std::string("<p>The leak watch and the prediction check raised none.</p>")
                          : "<ul class=\"warn\">" + w + "</ul>",
                "</section>\n");
  }
  const json& last = m.back();
  const std::size_t per = bucket(m.size());
  const std::string head =
      str("<h1>headroom run report</h1><p class=\"note\">", esc(dir.string()), ": ", m.size(), " steps logged (last ",
          last["step"].get<int64_t>(), "), ", ranks.size(), ranks.size() == 1 ? " rank" : " ranks",
          evals.empty() ? "" : str(", ", evals.size(), " evaluations"),
          plan.contains("model") ? str(", model ", esc(text_of(plan["model"]))) : std::string(),
          skipped ? str(", ", skipped, " log lines that are not JSON skipped") : std::string(),
          per > 1 ? str(". Each point of a chart over steps stands for ", per,
                        " steps: the largest of their memory values, "
                        "the mean of their loss and throughput")
                  : std::string(),
          "</p>\n");
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

}  // namespace hr::train
