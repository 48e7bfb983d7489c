// cli/cmd_plot.cpp — `dflash plot RUN_DIR... [--out FILE.png] [--x step|seconds] [--tail F]`: the training curves of
// one or more runs (metrics.jsonl) as one PNG of six panels — loss, EAL, learning rate, throughput (context and draft
// tokens/s), and along the block: the per-slot accuracy acc_i and the prefix acceptance prod_{k<=i} acc_k (the
// chance that a block is accepted through slot i), each averaged over the last F of the steps (metrics "acc") —
// drawn by gnuplot (Debian's gnuplot-nox, installed by scripts/setup.sh). Several runs share the axes, one colour
// each in every panel, named once in a legend below the panels, so recipes (or objectives: their effect on the late
// slots) can be compared at equal step or time.
#include <unistd.h>

#include <algorithm>
#include <cmath>
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
  double tail = 0.1;  // the fraction of the last steps the per-slot panels average
};

struct RunTables {
  std::string curves;  // one row per step: x, loss, eal, lr, ctx tok/s, draft tok/s, DFlash2's selector loss and
                       // recall (NaN where absent)
  std::string slots;   // one row per slot i >= 1: i, mean acc_i, prod_{k<=i} of the means
  bool selector = false;  // a DFlash2 run: its rows have sel_loss / sel_recall
};

// The per-slot table: acc_i averaged over the last `tail` of the rows that have one (at least one row).
std::string slot_table(const std::vector<std::vector<double>>& accs, double tail) {
  if (accs.empty()) return "";
  const size_t n = std::max<size_t>(1, static_cast<size_t>(std::ceil(tail * static_cast<double>(accs.size()))));
  size_t B = 0;
  for (size_t r = accs.size() - n; r < accs.size(); ++r) B = std::max(B, accs[r].size());
  std::string out;
  double prefix = 1;
  for (size_t i = 1; i < B; ++i) {  // slot 0 (the anchor) is never trained
    double sum = 0;
    for (size_t r = accs.size() - n; r < accs.size(); ++r) sum += i < accs[r].size() ? accs[r][i] : 0.0;
    const double mean = sum / static_cast<double>(n);
    prefix *= mean;
    char b[96];
    std::snprintf(b, sizeof b, "%zu\t%.6g\t%.6g\n", i, mean, prefix);
    out += b;
  }
  return out;
}

RunTables metrics_table(const std::string& run, const std::string& x, double tail) {
  const std::string path = path_join(run, "metrics.jsonl");
  DFLASH_CHECK(file_exists(path), path, ": no such file (is ", run, " a training run directory?)");
  std::istringstream in(read_file(path));
  std::string line, out;
  std::vector<std::vector<double>> accs;
  bool selector = false;
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
    std::snprintf(b, sizeof b, "%.6g\t%.6g\t%.6g\t%.6g\t%.6g\t%.6g\t%.6g\t%.6g\n",
                  x == "seconds" ? seconds : num("step"), num("loss"), num("eal"), num("lr"), num("ctx_tokens_per_s"),
                  num("draft_tokens_per_s"), num("sel_loss"), num("sel_recall"));
    selector |= j.contains("sel_loss");
    out += b;
    ++rows;
    if (j.contains("acc") && j["acc"].is_array()) {
      std::vector<double> a;
      for (const auto& v : j["acc"]) a.push_back(v.is_number() ? v.get<double>() : NAN);
      accs.push_back(std::move(a));
    }
  }
  DFLASH_CHECK(rows > 0, path, ": no steps recorded yet");
  return {out, slot_table(accs, tail), selector};
}

std::string gp_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("''") : std::string(1, c);
  return q + "'";
}

void plot(const PlotOptions& o) {
  DFLASH_CHECK(o.x == "step" || o.x == "seconds", "--x must be step or seconds");
  DFLASH_CHECK(o.tail > 0 && o.tail <= 1, "--tail ", o.tail, ": the fraction of the last steps must lie in (0, 1]");
  const std::string out = o.out.empty() ? path_join(o.runs[0], "curves.png") : o.out;
  const std::string tmp = cat(out, ".tmp-", getpid());
  make_dirs(tmp);
  std::vector<std::string> tables, slots;
  std::vector<size_t> selector_runs;  // the DFlash2 runs among them
  for (size_t i = 0; i < o.runs.size(); ++i) {
    const RunTables t = metrics_table(o.runs[i], o.x, o.tail);
    if (t.selector) selector_runs.push_back(i);
    tables.push_back(path_join(tmp, cat("run", i, ".tsv")));
    write_file_atomic(tables.back(), t.curves);
    slots.push_back(path_join(tmp, cat("slots", i, ".tsv")));
    write_file_atomic(slots.back(), t.slots.empty() ? std::string("1\tNaN\tNaN\n") : t.slots);
    std::istringstream in(t.slots);  // the per-slot numbers also as text: "slot acc_i prefix" per line
    std::string line, txt;
    while (std::getline(in, line)) txt += cat("\n  ", line);
    log_info(o.runs[i], ": per-slot accuracy along the block (last ", std::round(o.tail * 1000) / 10,
             "% of the steps; slot, acc_i, prod_{k<=i} acc_k):", txt);
  }
  // One colour per run, the same in every panel (20 colours; from the 21st run on they repeat). One run: each panel
  // keys its own series. Several: no key in the panels (9 runs' keys would cover the curves) but one legend below
  // them, in as many columns (up to 3) as the longest name leaves room for.
  const size_t n = o.runs.size();
  const bool shared_key = n > 1;
  auto style = [](size_t i, int dash) {
    static const char* const kColours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                                           "#7f7f7f", "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896",
                                           "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5"};
    return cat("lc rgb '", kColours[i % 20], "' dt ", dash);
  };
  auto series_of = [&](const std::vector<std::string>& files, int col, const char* what, const char* with,
                       int dash = 1) {
    std::string s;
    for (size_t i = 0; i < files.size(); ++i)
      s += cat(i ? ", " : "", gp_quote(files[i]), " using 1:", col, " with ", with, " ", style(i, dash),
               " lw 1.5 ", shared_key ? std::string("notitle") : "title " + gp_quote(what));
    return s;
  };
  const char* xl = o.x == "seconds" ? "training seconds" : "step";
  const std::string title = n == 1 ? "dflash: " + o.runs[0] : cat("dflash: ", n, " runs");
  size_t longest = 0;
  for (const auto& r : o.runs) longest = std::max(longest, r.size());
  // a legend entry: the name plus its sample line, at most ~10 px a character of the default 12-point font
  const size_t key_cols = std::clamp<size_t>(1360 / ((longest + 10) * 10), 1, std::min<size_t>(n, 3));
  const size_t key_rows = shared_key ? (n + key_cols - 1) / key_cols : 0;
  const int panels_px = 1250, key_px = key_rows ? static_cast<int>(24 * key_rows + 16) : 0;
  const double key_h = static_cast<double>(key_px) / (panels_px + key_px), top = 0.97, panel_h = (top - key_h) / 3;
  std::string gp = cat("set terminal pngcairo size 1400,", panels_px + key_px, " noenhanced\nset output ",
                       gp_quote(out + ".part"), "\nset multiplot title ", gp_quote(title), "\n",
                       "set grid\nset key top right\nset xlabel '", xl, "'\n");
  int panel = 0;
  auto at = [&]() {  // the next panel: row-major, 2 columns, from the top
    const int r = panel / 2, c = panel % 2;
    ++panel;
    return cat("set origin ", 0.5 * c, ",", top - panel_h * (r + 1), "\nset size 0.5,", panel_h, "\n");
  };
  // DFlash2 runs add their selector's loss (dashed, in the loss panel) and the share of labels among its candidates
  // (dashed, on the EAL panel's right axis); only theirs, so that no series is all NaN
  std::vector<std::string> sel_tables;
  for (size_t i : selector_runs) sel_tables.push_back(tables[i]);
  auto sel_series = [&](int col, const char* what, const char* axes) {
    std::string s;
    for (size_t k = 0; k < selector_runs.size(); ++k)
      s += cat(", ", gp_quote(sel_tables[k]), " using 1:", col, " axes ", axes, " with lines ",
               style(selector_runs[k], 2), " lw 1.5 ", shared_key ? std::string("notitle") : "title " + gp_quote(what));
    return s;
  };
  gp += at() + cat("set title ", gp_quote(selector_runs.empty() ? "loss" : "loss (dashed: the selector's)"), "\nplot ",
                   series_of(tables, 2, "loss", "lines"), sel_series(7, "selector loss", "x1y1"), "\n");
  if (!selector_runs.empty()) gp += "set y2tics\nset y2range [0:1]\n";
  gp += at() + cat("set title ", gp_quote(selector_runs.empty() ? "expected acceptance length (EAL)"
                                                              : "EAL (dashed, right axis: label among the candidates)"),
                   "\nplot ", series_of(tables, 3, "EAL", "lines"), sel_series(8, "selector recall", "x1y2"), "\n");
  if (!selector_runs.empty()) gp += "unset y2tics\nset autoscale y2\n";
  gp += at() + cat("set title 'learning rate'\nplot ", series_of(tables, 4, "lr", "lines"), "\n");
  gp += at() + cat("set title 'throughput (tokens/s; solid: context, dashed: draft)'\nplot ",
                   series_of(tables, 5, "context tok/s", "lines"), ", ", series_of(tables, 6, "draft tok/s", "lines", 2),
                   "\n");
  const std::string last = cat("last ", std::round(o.tail * 1000) / 10, "% of the steps");
  gp += cat("set xlabel 'slot i in the block'\nset xtics 1\nset yrange [0:1]\n");
  gp += at() + cat("set title ", gp_quote("per-slot accuracy acc_i (" + last + ")"), "\nplot ",
                   series_of(slots, 2, "acc_i", "linespoints"), "\n");
  gp += at() + cat("set title ", gp_quote("prefix acceptance prod_{k<=i} acc_k (" + last + ")"), "\nplot ",
                   series_of(slots, 3, "prefix", "linespoints"), "\n");
  if (shared_key) {  // the legend: a plot of nothing but its key, below the panels
    gp += cat("set origin 0,0\nset size 1,", key_h, "\nunset border\nunset tics\nunset grid\nunset title\n",
              "unset xlabel\nunset ylabel\nset xrange [0:1]\nset yrange [0:1]\n",
              "set key center center horizontal maxcols ", key_cols, " maxrows ", key_rows, " width 2 samplen 4\nplot ");
    for (size_t i = 0; i < n; ++i)  // a constant outside the y range: only its key entry shows
      gp += cat(i ? ", " : "", "2 with lines ", style(i, 1), " lw 3 title ", gp_quote(o.runs[i]));
    gp += "\n";
  }
  gp += "unset multiplot\n";
  const std::string script = path_join(tmp, "curves.gp");
  write_file_atomic(script, gp);
  const std::string cmd = cat("gnuplot ", shell_quote(script), " 2>&1");
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
  auto* sub = app.add_subcommand("plot", "draw loss, EAL, lr, throughput and per-slot accuracy along the block of "
                                 "training runs to a PNG (gnuplot)");
  auto o = std::make_shared<PlotOptions>();
  sub->add_option("runs", o->runs, "training run directories (holding metrics.jsonl)")->required();
  sub->add_option("--out", o->out, "PNG file (default: <first run>/curves.png)");
  sub->add_option("--x", o->x, "x axis: step or seconds (cumulative step time)")->capture_default_str();
  sub->add_option("--tail", o->tail, "the fraction of the last steps the per-slot panels average")
      ->capture_default_str();
  sub->callback([o] { plot(*o); });
}

}  // namespace dflash::cli
