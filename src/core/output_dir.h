// core/output_dir.h — the one rule every command that writes results follows (prepare, train, export, generate,
// demo): a command never destroys an earlier result unless told to. Before writing anything, a command claims its
// output with claim_output_dir / claim_output_file; an output that already holds a result of that command is
// refused (naming what was found, nothing touched) unless the user passed --resume (continue it) or --overwrite
// (replace it).
// defines: OutputOf, Claim, output_command_name, existing_outputs, claim_output_dir, claim_output_file
//
// What each command owns (the entries that count as its result; a trailing '/' is a directory, '*' any run of
// characters):
//   prepare   manifest.json, shard-*         the whole directory is the result: replaced atomically at commit
//   export    config.json, model.safetensors  the whole directory is the result: replaced atomically at the end
//   train     metrics.jsonl, checkpoints/, export/, profile.txt    other files in the directory are never touched
//   demo      run/, summary.json                                   (data/ is the demo's cache of prepared data:
//                                                                   re-prepared only when its input changed)
//   generate  the output file itself (when it is not empty)
//   capture   the output file itself (a .safetensors; written atomically, so --resume does not apply)
#pragma once
#include <string>
#include <vector>

namespace dflash {

enum class OutputOf { Prepare, Train, Export, Generate, Demo, Capture };

// How the command goes on after its claim.
enum class Claim {
  Fresh,    // nothing of an earlier result is there: write a new one
  Resume,   // an earlier result is there and the user asked to continue it (--resume)
  Replace,  // an earlier result was there and the user asked to replace it (--overwrite)
};

// "prepare", "train", "export", "generate", "demo", "capture".
const char* output_command_name(OutputOf what);

// The entries of `dir` that `what` writes, as found there ("metrics.jsonl", "checkpoints/", ...), sorted. Empty
// when dir does not exist. Generate (a file output) is not a directory kind: Error.
std::vector<std::string> existing_outputs(const std::string& dir, OutputOf what);

// Claims `dir` as the output directory of command `what` (not Generate). Inputs: resume = --resume, overwrite =
// --overwrite. Rules:
//   - dir absent, or holding none of the command's entries: Fresh. Train and demo create dir; prepare and export
//     leave its creation to their atomic writer.
//   - entries found and resume (train, demo): Resume; nothing is touched.
//   - entries found and overwrite: Replace. Train and demo remove exactly the entries found (never another file
//     of dir); prepare and export remove nothing now: their writer replaces the directory only once the new
//     result is complete, so a failed run keeps the old one.
// Errors (Error, and nothing is touched): entries found with neither flag ("<what>: <dir> already holds the result
// of an earlier run (metrics.jsonl, checkpoints/); nothing was changed. Pass --resume to continue it or
// --overwrite to replace it"); prepare / export on a directory that holds anything they did not write (named; their
// result replaces the whole directory, so they need a new or empty one, even with --overwrite); dir exists but is
// not a directory; resume and overwrite together; resume for prepare / export (they cannot continue a result).
Claim claim_output_dir(const std::string& dir, bool resume, bool overwrite, OutputOf what);

// The same rule for a command whose output is one file (generate --out FILE): a non-empty file is a result. Fresh
// when the file is absent or empty; Resume / Replace as above (Replace removes nothing: the command truncates the
// file when it opens it); Error when the file holds a result and neither flag is given, when the path is a
// directory, or when both flags are given.
Claim claim_output_file(const std::string& path, bool resume, bool overwrite, OutputOf what);

}  // namespace dflash
