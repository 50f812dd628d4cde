// `headroom report RUN_DIR [--out FILE.html] [--png FILE.png]`: the run's HTML report, and a static picture
// of it rendered by a headless Chromium where a page cannot be opened.
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/io/atomic_file.h"
#include "train/cli_args.h"
#include "train/commands.h"
#include "train/report.h"

namespace hr::train {

namespace {

std::string shell_quote(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

// file:// and the path, percent-encoded outside the characters a path keeps as they are.
std::string file_url(const std::string& path) {
  std::string o = "file://";
  for (unsigned char c : path) {
    if (std::isalnum(c) || std::strchr("/-._~", c)) {
      o += char(c);
    } else {
      char b[4];
      std::snprintf(b, sizeof(b), "%%%02X", c);
      o += b;
    }
  }
  return o;
}

// A Chromium on PATH (Debian's chromium, or another build of it), "" if none.
std::string find_chromium() {
  for (const char* name : {"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"})
    if (std::system(str("command -v ", name, " >/dev/null 2>&1").c_str()) == 0) return name;
  return "";
}

}  // namespace

int cmd_report(const std::vector<std::string>& args) {
  Parsed p = parse(args, "report", {"--out", "--png"}, {});
  HR_CHECK(!p.config.empty(), "[report] usage: headroom report RUN_DIR [--out FILE.html] [--png FILE.png]");
  HR_CHECK(p.sets.empty(), "[report] takes no --set");
  const std::string html = run_report_html(p.config);
  const std::string out = p.options.count("--out") ? p.options["--out"] : p.config + "/report.html";
  core::AtomicFile f(out);
  f.write(html.data(), html.size());
  f.commit();
  std::printf("report: %s\n", out.c_str());
  if (p.options.count("--png")) {
    const std::string png = p.options["--png"];
    const std::string browser = find_chromium();
    HR_CHECK(!browser.empty(),
             "[report] --png renders the page with a headless Chromium, and none is on PATH "
             "(Debian: apt-get install chromium); the HTML report is in ",
             out);
    std::filesystem::remove(png);  // an old picture must not pass for a new one
    // The window as tall as the page: about 330 px a section, 200 for the title and the margins.
    int64_t sections = 0;
    for (std::size_t at = html.find("<section"); at != std::string::npos; at = html.find("<section", at + 1))
      ++sections;
    const std::string cmd =
        str(browser, " --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1000,",
            200 + 330 * sections, " --screenshot=", shell_quote(std::filesystem::absolute(png).string()), " ",
            shell_quote(file_url(std::filesystem::absolute(out).string())), " >/dev/null 2>&1");
    HR_CHECK(std::system(cmd.c_str()) == 0 && std::filesystem::exists(png), "[report] ", browser, " could not render ",
             out, " to ", png);
    std::printf("picture: %s\n", png.c_str());
  }
  return 0;
}

}  // namespace hr::train
