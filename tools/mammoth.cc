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
#include "base/json.h"
#include "parallel/comm/mpi_communicator.h"
#include "tools/command.h"

namespace mammoth::tools {
namespace {

struct Command {
  const char* help;
  CommandFn fn;
  bool raw;
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

std::string normalize_flag(const std::string& arg) {
  if (arg.rfind("--", 0) != 0 || arg == "--") return arg;
  const size_t eq = arg.find('=');
  std::string flag = arg.substr(0, eq);
  std::replace(flag.begin() + 2, flag.end(), '-', '_');
  return eq == std::string::npos ? flag : flag + arg.substr(eq);
}

std::vector<std::string> config_file_flags(std::vector<std::string>& args) {
  std::string path;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") break;  // what follows belongs to another program (`launch -- train`)
    if (args[i] == "--config" && i + 1 < args.size()) {
      path = args[i + 1];
      args.erase(args.begin() + static_cast<long>(i), args.begin() + static_cast<long>(i) + 2);
      break;
    }
    if (args[i].rfind("--config=", 0) == 0) {
      path = args[i].substr(9);
      args.erase(args.begin() + static_cast<long>(i));
      break;
    }
  }
  std::vector<std::string> out;
  if (path.empty()) return out;
  const json::Value config = json::parse_file(path);
  MAMMOTH_CHECK(config.is_object()) << "[config] " << path << " must hold a JSON object of flags";
  for (const json::Value& v : config) {
    const std::string& key = v.key();
    std::string value = v.is_string() ? v.as_string() : json::dump(v);
    MAMMOTH_CHECK(!v.is_array() && !v.is_object())
        << "[config] " << path << ": option '" << key << "' must be a string, number or bool";
    out.push_back(normalize_flag("--" + key + "=" + value));
  }
  return out;
}

CommandRegistration::CommandRegistration(const char* name, const char* help, CommandFn fn,
                                         bool raw) {
  commands()[name] = {help, fn, raw};
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
  absl::SetProgramUsageMessage(std::string("mammoth ") + name + ": " + it->second.help);
  try {
    if (it->second.raw) return it->second.fn(std::vector<std::string>(argv + 2, argv + argc));
    // Abseil sees "mammoth <command>" as the program name and the rest as flags; values from
    // --config come first so that the command line overrides them.
    std::vector<std::string> raw(argv + 2, argv + argc);
    std::vector<std::string> owned{std::string(argv[0]) + " " + name};
    for (std::string& a : mammoth::tools::config_file_flags(raw)) owned.push_back(std::move(a));
    bool passthrough = false;  // after "--": another program's arguments, kept as given
    for (const std::string& a : raw) {
      // Abseil's --help lists only the flags of the file holding main(); every command's flags
      // live in tools/ (cmd_<command>.cc, some shared between commands), listed file by file.
      owned.push_back(passthrough     ? a
                      : a == "--help" ? "--helpmatch=tools/"
                                      : mammoth::tools::normalize_flag(a));
      passthrough = passthrough || a == "--";
    }
    std::vector<char*> args;
    for (std::string& a : owned) args.push_back(a.data());
    std::vector<char*> rest = absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
    std::vector<std::string> positional(rest.begin() + 1, rest.end());
    return it->second.fn(positional);
  } catch (const mammoth::Error& e) {
    const auto [rank, world] = mammoth::parallel::running_world_rank();
    if (world > 1) {
      std::fprintf(stderr, "mammoth %s: error on rank %d of %d: %s\n", name.c_str(), rank, world,
                   e.message().c_str());
      mammoth::parallel::abort_job_if_distributed(1);
    }
    std::fprintf(stderr, "mammoth %s: error: %s\n", name.c_str(), e.message().c_str());
    return 1;
  }
}
