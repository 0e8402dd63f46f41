// Subcommands of the `mammoth` binary register themselves here.
//
// Each command lives in its own tools/cmd_<name>.cc and defines its Abseil flags there:
//
//   int run_eval(const std::vector<std::string>& args);   // positional args after flags
//   MAMMOTH_COMMAND(eval, "mean cross-entropy of a model on a token file", run_eval);
//
// main() (tools/mammoth.cc) picks the command from argv[1], parses flags with Abseil (an
// unknown flag is an error naming it) and calls it. mammoth::Error is printed without a stack.
#pragma once

#include <string>
#include <vector>

namespace mammoth::tools {

using CommandFn = int (*)(const std::vector<std::string>& args);

// "--micro-batch=4" -> "--micro_batch=4": flags are spelled with dashes on the command line.
std::string normalize_flag(const std::string& arg);
// Removes "--config FILE" from args and returns its JSON object's entries as flags.
std::vector<std::string> config_file_flags(std::vector<std::string>& args);

struct CommandRegistration {
  // raw: the command parses its own arguments (no Abseil flag parsing), e.g. `bench`.
  CommandRegistration(const char* name, const char* help, CommandFn fn, bool raw = false);
};

}  // namespace mammoth::tools

#define MAMMOTH_COMMAND(name, help, fn) \
  static ::mammoth::tools::CommandRegistration mammoth_command_##name(#name, help, fn)
#define MAMMOTH_RAW_COMMAND(name, help, fn) \
  static ::mammoth::tools::CommandRegistration mammoth_command_##name(#name, help, fn, true)
