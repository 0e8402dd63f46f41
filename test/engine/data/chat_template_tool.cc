// Command-line access to engine/data/chat_template for chat_template_interop_test.py:
//
//   chat_template_tool DIR CASES_JSON
//
// CASES_JSON is a list of {"messages": [{"role", "content"}...], "add_generation_prompt": bool};
// prints a JSON list with, per case, {"text": rendered} or {"error": message}.
#include <iostream>

#include "base/error.h"
#include "base/json.h"
#include "engine/data/chat_template.h"

int main(int argc, char** argv) {
  using mammoth::json::Value;
  if (argc != 3) {
    std::cerr << "usage: chat_template_tool DIR CASES_JSON\n";
    return 2;
  }
  try {
    const auto tmpl = mammoth::data::ChatTemplate::from_model_dir(argv[1]);
    const Value cases = mammoth::json::parse_file(argv[2]);
    Value out = Value::array();
    for (const Value& c : cases) {
      std::vector<mammoth::data::ChatMessage> messages;
      for (const Value& m : c.at("messages"))
        messages.push_back({m.at("role").as_string(), m.at("content").as_string()});
      Value result = Value::object();
      try {
        result.set("text", tmpl.render(messages, c.at("add_generation_prompt").as_bool()));
      } catch (const mammoth::Error& e) {
        result.set("error", e.what());
      }
      out.push_back(std::move(result));
    }
    std::cout << mammoth::json::dump(out) << "\n";
  } catch (const mammoth::Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
