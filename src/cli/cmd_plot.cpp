// cli/cmd_plot.cpp — `dflash plot RUN_DIR... [--out FILE.png] [--x step|seconds]`: the training curves of one or
// more runs (metrics.jsonl) as one PNG of four panels — loss, EAL, learning rate, throughput (context and draft
// tokens/s) — drawn by gnuplot (Debian's gnuplot-nox, installed by scripts/setup.sh). Several runs share the axes,
// one colour each, so recipes can be compared at equal step or equal training time.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/fs.h"
#include "core/log.h"

namespace dflash::cli {

namespace {

struct PlotOptions {
  std::vector<std::string> runs;
  std::string out;
  std::string x = "step";
};

// One row per step with a loss: x, loss, eal, lr, ctx tok/s, draft tok/s (NaN where absent).
std::string metrics_table(const std::string& run, const std::string& x) {
  const std::string path = path_join(run, "metrics.jsonl");
  DFLASH_CHECK(file_exists(path), path, ": no such file (is ", run, " a training run directory?)");
  std::istringstream in(read_file(path));
  std::string line, out;
  double seconds = 0;
  int64_t lineno = 0, rows = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      DFLASH_FAIL(path, ": line ", lineno, " is not JSON (", e.what(), ")");
    }
    seconds += j.value("step_s", 0.0);
    auto num = [&](const char* k) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : NAN; };
    char b[256];
    std::snprintf(b, sizeof b, "%.6g\t%.6g\t%.6g\t%.6g\t%.6g\t%.6g\n", x == "seconds" ? seconds : num("step"),
                  num("loss"), num("eal"), num("lr"), num("ctx_tokens_per_s"), num("draft_tokens_per_s"));
    out += b;
    ++rows;
  }
  DFLASH_CHECK(rows > 0, path, ": no steps recorded yet");
  return out;
}

std::string gp_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("''") : std::string(1, c);
  return q + "'";
}

void plot(const PlotOptions& o) {
  DFLASH_CHECK(o.x == "step" || o.x == "seconds", "--x must be step or seconds");
  const std::string out = o.out.empty() ? path_join(o.runs[0], "curves.png") : o.out;
  const std::string tmp = cat(out, ".tmp-", getpid());
  make_dirs(tmp);
  std::vector<std::string> tables;
  for (size_t i = 0; i < o.runs.size(); ++i) {
    tables.push_back(path_join(tmp, cat("run", i, ".tsv")));
    write_file_atomic(tables.back(), metrics_table(o.runs[i], o.x));
  }
  auto series = [&](int col, const char* extra) {
    std::string s;
    for (size_t i = 0; i < tables.size(); ++i)
      s += cat(i ? ", " : "", gp_quote(tables[i]), " using 1:", col, " with lines lw 1.5 title ",
               gp_quote(o.runs.size() > 1 ? o.runs[i] : std::string(extra)));
    return s;
  };
  const char* xl = o.x == "seconds" ? "training seconds" : "step";
  std::string gp = cat("set terminal pngcairo size 1400,900 noenhanced\nset output ", gp_quote(out + ".part"),
                       "\nset multiplot layout 2,2 title ", gp_quote("dflash: " + o.runs[0]), "\n",
                       "set grid\nset key top right\nset xlabel '", xl, "'\n");
  gp += cat("set title 'loss'\nplot ", series(2, "loss"), "\n");
  gp += cat("set title 'expected acceptance length (EAL)'\nplot ", series(3, "EAL"), "\n");
  gp += cat("set title 'learning rate'\nplot ", series(4, "lr"), "\n");
  std::string thr;
  for (size_t i = 0; i < tables.size(); ++i)
    thr += cat(i ? ", " : "", gp_quote(tables[i]), " using 1:5 with lines title ",
               gp_quote(cat(o.runs.size() > 1 ? o.runs[i] + " " : "", "context tok/s")), ", ", gp_quote(tables[i]),
               " using 1:6 with lines dt 2 title ", gp_quote(cat(o.runs.size() > 1 ? o.runs[i] + " " : "", "draft tok/s")));
  gp += cat("set title 'throughput (tokens/s)'\nplot ", thr, "\nunset multiplot\n");
  const std::string script = path_join(tmp, "curves.gp");
  write_file_atomic(script, gp);
  const std::string cmd = cat("gnuplot ", gp_quote(script), " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  DFLASH_CHECK(p, "plot: cannot run gnuplot");
  std::string msg;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) msg += buf;
  const int rc = pclose(p);
  std::error_code ec;
  if (rc != 0) {
    std::filesystem::remove_all(tmp, ec);
    DFLASH_FAIL("plot: gnuplot failed (", rc, ")", msg.empty() ? "" : ": ", msg,
                rc == 32512 ? " (gnuplot is not installed: scripts/setup.sh installs gnuplot-nox)" : "");
  }
  std::filesystem::rename(out + ".part", out, ec);
  DFLASH_CHECK(!ec, out, ": ", ec.message());
  std::filesystem::remove_all(tmp, ec);
  log_info("wrote ", out);
}

}  // namespace

void register_plot(CLI::App& app) {
  auto* sub = app.add_subcommand("plot", "draw loss, EAL, lr and throughput of training runs to a PNG (gnuplot)");
  auto o = std::make_shared<PlotOptions>();
  sub->add_option("runs", o->runs, "training run directories (holding metrics.jsonl)")->required();
  sub->add_option("--out", o->out, "PNG file (default: <first run>/curves.png)");
  sub->add_option("--x", o->x, "x axis: step or seconds (cumulative step time)")->capture_default_str();
  sub->callback([o] { plot(*o); });
}

}  // namespace dflash::cli
