// Proves that //third_party/absl links: defines a flag, parses argv, prints the value.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(int, steps, 3, "number of steps");
ABSL_FLAG(std::string, name, "mammoth", "a name to print");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("flags_smoke --steps=N --name=S");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  std::printf("%s\n", absl::StrCat(absl::GetFlag(FLAGS_name), " ", absl::GetFlag(FLAGS_steps), " ",
                                   rest.size())
                          .c_str());
  return 0;
}
