#include "tools/cli/sibling.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <unistd.h>

#ifndef KVTIER_SIBLING_DIR
#define KVTIER_SIBLING_DIR ""
#endif

namespace kvtier::tools {

bool IsSiblingCommand(const std::string& command) {
  return command == "bench" || command == "replay" || command == "stress" || command == "trace" ||
         command == "supervise";
}

std::vector<std::string> SiblingCandidates(const std::string& self, const std::string& program,
                                           const std::string& install_dir) {
  const std::filesystem::path dir = std::filesystem::path(self).parent_path();
  std::vector<std::string> out = {(dir / program).lexically_normal().string()};
  if (!install_dir.empty()) out.push_back((dir / install_dir / program).lexically_normal().string());
  return out;
}

int ExecSibling(int argc, char** argv) {
  const std::string program = std::string("kvtier-") + argv[1];
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) {
    std::fprintf(stderr, "kvtier: cannot run `kvtier %s`: /proc/self/exe: %s\n", argv[1], ec.message().c_str());
    return 127;
  }
  std::string tried;
  for (const std::string& path : SiblingCandidates(self.string(), program, KVTIER_SIBLING_DIR)) {
    std::vector<char*> args = {const_cast<char*>(path.c_str())};
    for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
    args.push_back(nullptr);
    ::execv(path.c_str(), args.data());
    tried += "\n  " + path + ": " + std::strerror(errno);
  }
  std::fprintf(stderr,
               "kvtier: cannot run `kvtier %s`: %s is not installed beside kvtier (build the %s target, or "
               "install kvtier); tried:%s\n",
               argv[1], program.c_str(), program.c_str(), tried.c_str());
  return 127;
}

}  // namespace kvtier::tools
