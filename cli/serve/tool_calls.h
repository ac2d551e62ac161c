// Tool calling at run time: the constraint that makes a model call a tool (tool_choice required or
// named), the text that lists the tools for a chat template that does not render them, and the
// model's output read back as OpenAI tool calls.
//
// A call is the JSON object {"name": NAME, "arguments": {...}} ("parameters" is read as "arguments",
// as Llama 3.1 writes it); the output may hold one, an array of them, or them inside
// <tool_call>...</tool_call> (Hermes, Qwen) or after [TOOL_CALLS] (Mistral).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "openai_request.h"

namespace tessera::serve {

struct ToolCall {
  std::string id;         // call_ + 24 random letters and digits (9 of them alone: kShortCallIds)
  std::string name;
  std::string arguments;  // the arguments object's JSON text
};

// The JSON Schema of a call to one of `tools` (or only to `only` when not empty): an anyOf over the
// tools of {"type": "object", "properties": {"name": {"const": NAME}, "arguments": PARAMETERS},
// "required": ["name", "arguments"], "additionalProperties": false}. `where` is "tools".
ConstraintSpec tool_call_constraint(const std::vector<ToolDef>& tools, const std::string& only = "");

// The system text that lists the tools (name, description, parameters) and says how to call one.
std::string tools_prompt(const std::vector<ToolDef>& tools);

// The conversation for a template that does not render tools: the tools listed in the system message
// (added first when there is none), an assistant's tool calls written into its content as call
// objects, and tool results as user messages.
std::vector<ChatMessage> messages_with_tools_as_text(const std::vector<ChatMessage>& messages,
                                                     const std::vector<ToolDef>& tools);

// The calls in the model's output, when all of it (trimmed) is calls to known tools; nullopt
// otherwise (the output is content). With `parallel` false, only the first call is kept. With
// `short_ids` the ids are 9 letters and digits, the only ids Mistral's templates take back.
std::optional<std::vector<ToolCall>> parse_tool_calls(const std::string& text, const std::vector<ToolDef>& tools,
                                                      bool parallel = true, bool short_ids = false);

// While streaming with tool_choice auto: whether the output so far begins like a call (it is held
// back until it ends), cannot begin one (it streams as content), or cannot tell yet.
enum class OutputStart { undecided, call, text };
OutputStart classify_output_start(const std::string& text);

// The message's (or a stream delta's, with "index" on each) "tool_calls" array.
nlohmann::json tool_calls_json(const std::vector<ToolCall>& calls, bool delta = false);

}  // namespace tessera::serve
