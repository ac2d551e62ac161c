// Jinja2 chat templates (GGUF tokenizer.chat_template), rendered as Hugging Face transformers renders
// them: Jinja2 with trim_blocks and lstrip_blocks, the globals raise_exception(msg) and
// strftime_now(fmt), and transformers' tojson (json.dumps, ensure_ascii=False, keys in the order
// given). The interpreter is tessera's own (core/src/jinja); tests compare it byte for byte with
// Jinja2 on real templates.
//
// Values are Python's: {{ 1.0 }} prints "1.0", {{ none }} "None", a list its repr; an undefined
// variable prints as "" and is falsy, but an attribute of it, arithmetic or a call on it is an error.
// Inputs are nlohmann::ordered_json so that dicts keep their order (tool parameters print in the
// order the client sent them).
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace tessera {

namespace jinja {
struct Program;
}

struct JinjaRenderOptions {
  // The time strftime_now() formats, as UTC; unset: the local clock now (tests fix it).
  std::optional<std::time_t> now;
};

class JinjaTemplate {
 public:
  // Throws Error naming the template, the line and the construct when the source is not valid
  // Jinja or uses a tag this interpreter lacks (extends, include, import, recursive loops...).
  static JinjaTemplate parse(std::string_view source, std::string name = "chat_template");

  // `context`: an object whose members are the template's variables. Throws Error naming the
  // template, the line and the problem when rendering fails, and for raise_exception(msg) with msg
  // in the message.
  std::string render(const nlohmann::ordered_json& context, const JinjaRenderOptions& options = {}) const;

  const std::string& name() const;

 private:
  std::shared_ptr<const jinja::Program> program_;
};

struct ChatTemplateInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // [{"role", "content", ...}]
  nlohmann::ordered_json tools;  // null: the `tools` variable is left undefined
  bool add_generation_prompt = true;
  std::string bos_token, eos_token;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // more variables (date_string...)
  JinjaRenderOptions options;
};

// The variables transformers passes (messages, tools when given, add_generation_prompt, bos_token,
// eos_token, then `extra`'s members) as one context object.
nlohmann::ordered_json chat_template_context(const ChatTemplateInputs& inputs);

std::string render_chat_template(const JinjaTemplate& tmpl, const ChatTemplateInputs& inputs);

}  // namespace tessera
