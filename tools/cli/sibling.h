// The sibling executables behind `kvtier bench|replay|stress|supervise|trace`:
// each is its own binary (kvtier-bench, kvtier-replay, kvtier-stress,
// kvtier-supervise, kvtier-trace)
// so that the admin commands link neither RocksDB, liburing nor Google
// Benchmark. `kvtier` finds a sibling next to itself (the build tree) or in
// the private executable directory of an install (KVTIER_SIBLING_DIR, a path
// relative to the installed kvtier), and replaces itself with it.
#pragma once

#include <string>
#include <vector>

namespace kvtier::tools {

// Whether `command` (argv[1] of kvtier) is run by a sibling executable.
bool IsSiblingCommand(const std::string& command);

// Where to look for `program` (e.g. "kvtier-bench"), in order: the directory
// of `self` (the running kvtier, as /proc/self/exe names it), then
// `self`'s directory joined with `install_dir` (relative, e.g.
// "../libexec/kvtier"; skipped when empty). Pure.
std::vector<std::string> SiblingCandidates(const std::string& self, const std::string& program,
                                           const std::string& install_dir);

// Runs `kvtier-<argv[1]>` with argv[2..] unchanged, replacing this process
// (execv), so its exit status is kvtier's. Returns only when no candidate can
// be run: prints to stderr which paths were tried and returns 127 (the
// shell's "command not found"). Called from main's thread only.
int ExecSibling(int argc, char** argv);

}  // namespace kvtier::tools
