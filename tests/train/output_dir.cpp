// tests/train/output_dir.cpp — the rule every command's output follows (core/output_dir.h): an
// earlier result is refused with its entries named and left byte for byte as it was; --resume keeps it; --overwrite
// removes exactly the command's entries (train, demo) or leaves the replacement to the atomic writer (prepare,
// export); prepare / export never take a directory holding anything else; a generate output file likewise.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "core/error.h"
#include "core/fs.h"
#include "core/output_dir.h"

using namespace dflash;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) {
  const std::string d = cat(fs::temp_directory_path().string(), "/dflash_test_outdir_", name, "_", getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string error_of(const std::string& dir, bool resume, bool overwrite, OutputOf what) {
  try {
    claim_output_dir(dir, resume, overwrite, what);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(OutputDir, TrainRefusesAnEarlierRunAndTouchesNothing) {
  const std::string d = fresh_dir("train");
  make_dirs(d + "/checkpoints/step-00000004");
  write_file_atomic(d + "/checkpoints/LATEST", "step-00000004\n");
  write_file_atomic(d + "/metrics.jsonl", "{\"step\": 1}\n{\"step\": 2}\n");
  write_file_atomic(d + "/notes.txt", "mine");
  EXPECT_EQ(existing_outputs(d, OutputOf::Train), (std::vector<std::string>{"checkpoints/", "metrics.jsonl"}));

  const std::string msg = error_of(d, false, false, OutputOf::Train);
  EXPECT_TRUE(has(msg, "train: " + d + " already holds the result of an earlier run (checkpoints/, metrics.jsonl)"))
      << msg;
  EXPECT_TRUE(has(msg, "nothing was changed")) << msg;
  EXPECT_TRUE(has(msg, "--resume to continue it")) << msg;
  EXPECT_TRUE(has(msg, "--overwrite to replace it")) << msg;
  EXPECT_EQ(read_file(d + "/metrics.jsonl"), "{\"step\": 1}\n{\"step\": 2}\n");
  EXPECT_EQ(read_file(d + "/checkpoints/LATEST"), "step-00000004\n");
  EXPECT_TRUE(dir_exists(d + "/checkpoints/step-00000004"));

  EXPECT_EQ(claim_output_dir(d, true, false, OutputOf::Train), Claim::Resume);
  EXPECT_EQ(read_file(d + "/metrics.jsonl"), "{\"step\": 1}\n{\"step\": 2}\n");
  EXPECT_TRUE(has(error_of(d, true, true, OutputOf::Train), "exclude each other"));

  // --overwrite removes exactly train's entries; another file of the directory stays
  EXPECT_EQ(claim_output_dir(d, false, true, OutputOf::Train), Claim::Replace);
  EXPECT_FALSE(fs::exists(d + "/metrics.jsonl"));
  EXPECT_FALSE(fs::exists(d + "/checkpoints"));
  EXPECT_EQ(read_file(d + "/notes.txt"), "mine");
  // now nothing of a run is there: a plain claim goes ahead, and creates a missing directory
  EXPECT_EQ(claim_output_dir(d, false, false, OutputOf::Train), Claim::Fresh);
  EXPECT_EQ(claim_output_dir(d + "/new/run", false, false, OutputOf::Train), Claim::Fresh);
  EXPECT_TRUE(dir_exists(d + "/new/run"));
  fs::remove_all(d);
}

TEST(OutputDir, ExportAndPrepareOwnTheirWholeDirectory) {
  const std::string d = fresh_dir("export");
  // absent or empty: fresh (the writer creates / replaces it)
  EXPECT_EQ(claim_output_dir(d + "/x", false, false, OutputOf::Export), Claim::Fresh);
  EXPECT_FALSE(fs::exists(d + "/x"));
  EXPECT_EQ(claim_output_dir(d, false, false, OutputOf::Export), Claim::Fresh);
  // an earlier export: refused, or left for the atomic writer to replace with --overwrite
  write_file_atomic(d + "/config.json", "{}");
  write_file_atomic(d + "/model.safetensors", "w");
  const std::string msg = error_of(d, false, false, OutputOf::Export);
  EXPECT_TRUE(has(msg, "(config.json, model.safetensors)")) << msg;
  EXPECT_TRUE(has(msg, "--overwrite to replace it")) << msg;
  EXPECT_FALSE(has(msg, "--resume")) << msg;
  EXPECT_EQ(claim_output_dir(d, false, true, OutputOf::Export), Claim::Replace);
  EXPECT_EQ(read_file(d + "/config.json"), "{}");  // still there until the new export is complete
  EXPECT_TRUE(has(error_of(d, true, false, OutputOf::Export), "cannot resume"));
  // a directory holding anything else is never taken, even with --overwrite (the result replaces it whole)
  write_file_atomic(d + "/README.md", "mine");
  const std::string msg2 = error_of(d, false, true, OutputOf::Export);
  EXPECT_TRUE(has(msg2, "holds files that export did not write (README.md)")) << msg2;
  EXPECT_EQ(read_file(d + "/README.md"), "mine");
  // prepare: a data set's entries are its own; a train run directory is not a data set
  const std::string p = fresh_dir("prepare");
  write_file_atomic(p + "/manifest.json", "{}");
  write_file_atomic(p + "/shard-00000.tokens", "");
  EXPECT_TRUE(has(error_of(p, false, false, OutputOf::Prepare), "(manifest.json, shard-00000.tokens)"));
  EXPECT_EQ(claim_output_dir(p, false, true, OutputOf::Prepare), Claim::Replace);
  write_file_atomic(p + "/metrics.jsonl", "");
  EXPECT_TRUE(has(error_of(p, false, true, OutputOf::Prepare), "did not write (metrics.jsonl)"));
  fs::remove_all(d);
  fs::remove_all(p);
}

TEST(OutputDir, GenerateOutputFile) {
  const std::string d = fresh_dir("generate");
  const std::string f = d + "/out.jsonl";
  EXPECT_EQ(claim_output_file(f, false, false, OutputOf::Generate), Claim::Fresh);
  write_file_atomic(f, "");
  EXPECT_EQ(claim_output_file(f, false, false, OutputOf::Generate), Claim::Fresh);  // empty: nothing to lose
  write_file_atomic(f, "{\"index\": 0}\n");
  try {
    claim_output_file(f, false, false, OutputOf::Generate);
    ADD_FAILURE() << "a non-empty output must be refused";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "generate: " + f + " already holds the result")) << e.what();
    EXPECT_TRUE(has(e.what(), "--resume")) << e.what();
  }
  EXPECT_EQ(claim_output_file(f, true, false, OutputOf::Generate), Claim::Resume);
  EXPECT_EQ(claim_output_file(f, false, true, OutputOf::Generate), Claim::Replace);
  EXPECT_EQ(read_file(f), "{\"index\": 0}\n");
  EXPECT_THROW(claim_output_file(d, false, true, OutputOf::Generate), Error);  // a directory
  fs::remove_all(d);
}

TEST(OutputDir, DemoRefusesAnEarlierDemoAndOverwriteKeepsItsDataCache) {
  const std::string d = fresh_dir("demo");
  make_dirs(d + "/run/checkpoints");
  make_dirs(d + "/data/train");
  write_file_atomic(d + "/data/train/manifest.json", "{}");
  write_file_atomic(d + "/summary.json", "{\"tau\": 1}\n");
  const std::string log = d + ".log";
  const int rc = std::system(cat(DFLASH_BINARY, " demo --out ", d, " > ", log, " 2>&1").c_str());
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 1) << rc;
  const std::string out = read_file(log);
  EXPECT_TRUE(has(out, "demo: " + d + " already holds the result of an earlier run (run/, summary.json)")) << out;
  EXPECT_EQ(read_file(d + "/summary.json"), "{\"tau\": 1}\n");
  EXPECT_TRUE(dir_exists(d + "/run/checkpoints"));
  EXPECT_EQ(claim_output_dir(d, true, false, OutputOf::Demo), Claim::Resume);
  EXPECT_EQ(claim_output_dir(d, false, true, OutputOf::Demo), Claim::Replace);
  EXPECT_FALSE(fs::exists(d + "/run"));
  EXPECT_FALSE(fs::exists(d + "/summary.json"));
  EXPECT_TRUE(file_exists(d + "/data/train/manifest.json"));  // the prepared data: a cache the demo reuses
  fs::remove_all(d);
  fs::remove(log);
}
