// core/output_dir.cpp — see output_dir.h.
#include "core/output_dir.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"

namespace dflash {

namespace fs = std::filesystem;

namespace {

struct OutputSpec {
  std::vector<std::string> entries;  // "name", "name/" (a directory) or "prefix*"
  bool whole_dir = false;            // the directory itself is the result (replaced atomically by its writer)
  bool can_resume = false;
};

const OutputSpec& spec_of(OutputOf what) {
  static const OutputSpec prepare{{"manifest.json", "shard-*"}, true, false};
  static const OutputSpec train{{"metrics.jsonl", "checkpoints/", "export/", "profile.txt"}, false, true};
  static const OutputSpec exp{{"config.json", "model.safetensors"}, true, false};
  static const OutputSpec demo{{"run/", "summary.json"}, false, true};
  switch (what) {
    case OutputOf::Prepare: return prepare;
    case OutputOf::Train: return train;
    case OutputOf::Export: return exp;
    case OutputOf::Demo: return demo;
    case OutputOf::Generate:
    case OutputOf::Capture: break;
  }
  DFLASH_FAIL("output_dir: ", output_command_name(what), " writes a file, not a directory (use claim_output_file)");
}

// The entry name as listed ("x/" for a directory) when `name` (of kind is_dir) matches one of the patterns, else "".
std::string owned_name(const OutputSpec& s, const std::string& name, bool is_dir) {
  for (const std::string& p : s.entries) {
    const bool p_dir = !p.empty() && p.back() == '/';
    const std::string base = p_dir ? p.substr(0, p.size() - 1) : p;
    const bool match = !base.empty() && base.back() == '*'
                           ? name.compare(0, base.size() - 1, base, 0, base.size() - 1) == 0
                           : name == base;
    if (match && p_dir == is_dir) return is_dir ? name + "/" : name;
  }
  return "";
}

std::string join_names(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 8; ++i) s += (i ? ", " : "") + v[i];
  if (v.size() > 8) s += cat(", ... (", v.size(), " in all)");
  return s;
}

void check_flags(bool resume, bool overwrite, bool can_resume, OutputOf what) {
  DFLASH_CHECK(!(resume && overwrite), output_command_name(what),
               ": --resume and --overwrite exclude each other (continue the earlier result, or replace it)");
  DFLASH_CHECK(!resume || can_resume, output_command_name(what), ": cannot resume an earlier result");
}

std::string refusal(OutputOf what, const std::string& where, const std::string& found, bool can_resume) {
  return cat(output_command_name(what), ": ", where, " already holds the result of an earlier run (", found,
             "); nothing was changed. Pass ", can_resume ? "--resume to continue it or " : "",
             "--overwrite to replace it", can_resume ? "" : ", or choose another output");
}

}  // namespace

const char* output_command_name(OutputOf what) {
  switch (what) {
    case OutputOf::Prepare: return "prepare";
    case OutputOf::Train: return "train";
    case OutputOf::Export: return "export";
    case OutputOf::Generate: return "generate";
    case OutputOf::Capture: return "capture";
    case OutputOf::Demo: return "demo";
  }
  return "?";
}

std::vector<std::string> existing_outputs(const std::string& dir, OutputOf what) {
  const OutputSpec& s = spec_of(what);
  std::vector<std::string> found;
  if (!dir_exists(dir)) return found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = owned_name(s, e.path().filename().string(), e.is_directory(ec));
    if (!n.empty()) found.push_back(n);
  }
  DFLASH_CHECK(!ec, dir, ": cannot list: ", ec.message());
  std::sort(found.begin(), found.end());
  return found;
}

Claim claim_output_dir(const std::string& dir, bool resume, bool overwrite, OutputOf what) {
  const OutputSpec& s = spec_of(what);
  const char* name = output_command_name(what);
  DFLASH_CHECK(!dir.empty(), name, ": the output directory is not set");
  check_flags(resume, overwrite, s.can_resume, what);
  std::error_code ec;
  const bool exists = fs::exists(dir, ec);
  DFLASH_CHECK(!exists || dir_exists(dir), name, ": ", dir, " exists and is not a directory");
  std::vector<std::string> found;
  if (exists && s.whole_dir) {
    std::vector<std::string> foreign;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string n = e.path().filename().string();
      const std::string o = owned_name(s, n, e.is_directory(ec));
      if (o.empty()) foreign.push_back(e.is_directory(ec) ? n + "/" : n);
      else found.push_back(o);
    }
    DFLASH_CHECK(!ec, dir, ": cannot list: ", ec.message());
    std::sort(found.begin(), found.end());
    std::sort(foreign.begin(), foreign.end());
    DFLASH_CHECK(foreign.empty(), name, ": ", dir, " holds files that ", name, " did not write (",
                 join_names(foreign), "); its result replaces the whole directory, so give a new or empty one. "
                 "Nothing was changed");
  } else {
    found = existing_outputs(dir, what);
  }
  if (found.empty()) {
    if (!s.whole_dir) make_dirs(dir);
    return Claim::Fresh;
  }
  if (resume) return Claim::Resume;
  DFLASH_CHECK(overwrite, refusal(what, dir, join_names(found), s.can_resume));
  if (!s.whole_dir) {
    for (const std::string& f : found) {
      const std::string p = path_join(dir, f.back() == '/' ? f.substr(0, f.size() - 1) : f);
      fs::remove_all(p, ec);
      DFLASH_CHECK(!ec, p, ": cannot remove (--overwrite): ", ec.message());
    }
    fsync_dir(dir);
  }
  log_info(name, " --overwrite: replacing the earlier result in ", dir, " (", join_names(found), ")");
  return Claim::Replace;
}

Claim claim_output_file(const std::string& path, bool resume, bool overwrite, OutputOf what) {
  const char* name = output_command_name(what);
  DFLASH_CHECK(!path.empty(), name, ": the output file is not set");
  check_flags(resume, overwrite, true, what);
  DFLASH_CHECK(!dir_exists(path), name, ": ", path, " is a directory; give a file name");
  std::error_code ec;
  const bool result = file_exists(path) && fs::file_size(path, ec) > 0 && !ec;
  if (!result) return Claim::Fresh;
  if (resume) return Claim::Resume;
  DFLASH_CHECK(overwrite, refusal(what, path, "a non-empty output file", true));
  log_info(name, " --overwrite: replacing ", path);
  return Claim::Replace;
}

}  // namespace dflash
