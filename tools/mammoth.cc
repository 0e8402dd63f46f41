// The `mammoth` binary: one entry point with subcommands (train, eval, bench, plan, ...).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "base/error.h"
#include "tools/command.h"

namespace mammoth::tools {
namespace {

struct Command {
  const char* help;
  CommandFn fn;
};

std::map<std::string, Command>& commands() {
  static std::map<std::string, Command> c;
  return c;
}

void print_usage() {
  std::fprintf(stderr, "usage: mammoth <command> [--flags] [args]\n\ncommands:\n");
  for (const auto& [name, c] : commands())
    std::fprintf(stderr, "  %-10s %s\n", name.c_str(), c.help);
  std::fprintf(stderr, "\n`mammoth <command> --help` lists a command's flags.\n");
}

}  // namespace

CommandRegistration::CommandRegistration(const char* name, const char* help, CommandFn fn) {
  commands()[name] = {help, fn};
}

}  // namespace mammoth::tools

int main(int argc, char** argv) {
  using mammoth::tools::commands;
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "help") == 0) {
    mammoth::tools::print_usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string name = argv[1];
  auto it = commands().find(name);
  if (it == commands().end()) {
    std::fprintf(stderr, "mammoth: unknown command '%s'\n\n", name.c_str());
    mammoth::tools::print_usage();
    return 2;
  }
  // Abseil sees "mammoth <command>" as the program name and the rest as flags.
  std::string program = std::string(argv[0]) + " " + name;
  std::vector<char*> args{program.data()};
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  absl::SetProgramUsageMessage(std::string("mammoth ") + name + ": " + it->second.help);
  try {
    std::vector<char*> rest = absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
    std::vector<std::string> positional(rest.begin() + 1, rest.end());
    return it->second.fn(positional);
  } catch (const mammoth::Error& e) {
    std::fprintf(stderr, "mammoth %s: error: %s\n", name.c_str(), e.message().c_str());
    return 1;
  }
}
