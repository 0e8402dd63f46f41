// Encodes each line of stdin with engine/data/wordpiece.h's WordPiece of DIR and prints its ids
// space-separated, one line each (the C++ side of the BertTokenizer comparison):
//   wordpiece_tool DIR < texts.txt
#include <cstdio>
#include <iostream>
#include <string>

#include "engine/data/wordpiece.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: wordpiece_tool DIR < texts\n");
    return 2;
  }
  try {
    const mammoth::data::WordPiece wp = mammoth::data::WordPiece::from_directory(argv[1]);
    std::string line;
    while (std::getline(std::cin, line)) {
      std::string out;
      for (int32_t id : wp.encode(line)) out += (out.empty() ? "" : " ") + std::to_string(id);
      std::printf("%s\n", out.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
