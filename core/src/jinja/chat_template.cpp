#include "tessera/chat_template.h"

#include "jinja_eval.h"
#include "tessera/error.h"

namespace tessera {

JinjaTemplate JinjaTemplate::parse(std::string_view source, std::string name) {
  JinjaTemplate t;
  t.program_ = jinja::parse_template(source, name);
  return t;
}

std::string JinjaTemplate::render(const nlohmann::ordered_json& context, const JinjaRenderOptions& options) const {
  if (!program_) throw Error("JinjaTemplate::render on a template that was never parsed");
  if (!context.is_object()) throw Error("template '" + program_->name + "': the render context must be a JSON object");
  jinja::Evaluator ev(*program_, jinja::EvalOptions{options.now});
  return ev.render(jinja::Value::from_json(context));
}

const std::string& JinjaTemplate::name() const {
  static const std::string empty;
  return program_ ? program_->name : empty;
}

nlohmann::ordered_json chat_template_context(const ChatTemplateInputs& in) {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = in.messages;
  if (!in.tools.is_null()) ctx["tools"] = in.tools;
  ctx["add_generation_prompt"] = in.add_generation_prompt;
  ctx["bos_token"] = in.bos_token;
  ctx["eos_token"] = in.eos_token;
  if (in.extra.is_object()) {
    for (const auto& [k, v] : in.extra.items()) ctx[k] = v;
  }
  return ctx;
}

std::string render_chat_template(const JinjaTemplate& tmpl, const ChatTemplateInputs& inputs) {
  return tmpl.render(chat_template_context(inputs), inputs.options);
}

}  // namespace tessera
