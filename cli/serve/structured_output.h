// The request fields that constrain what the model writes, parsed and checked: response_format (both
// endpoints), vLLM's guided_json / guided_regex / guided_grammar / guided_choice, and chat's tools,
// tool_choice and parallel_tool_calls. Every refusal is a 400 naming the field's path.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "openai_request.h"

namespace tessera::serve {

// The fields below, as the body has them.
inline constexpr const char* kStructuredFields[] = {"response_format", "guided_json",  "guided_regex",
                                                    "guided_grammar",  "guided_choice", "tools",
                                                    "tool_choice",     "parallel_tool_calls"};

// The body parsed again keeping the order of object members (a schema's properties are generated in
// the order given; templates print tools as sent), with only kStructuredFields kept.
nlohmann::ordered_json ordered_structured_fields(std::string_view body);

// r.constraint from response_format and the guided_* fields; at most one of them may constrain.
void read_structured_output(const nlohmann::ordered_json& fields, OpenAiRequest& r);
// r.tools, r.tool_choice, r.tool_name and r.parallel_tool_calls (chat only).
void read_tools(const nlohmann::ordered_json& fields, OpenAiRequest& r);
// An assistant message's `tool_calls` (field: "messages[i].tool_calls"), with each call's
// function.arguments parsed from its JSON text to an object, as chat templates expect.
nlohmann::ordered_json read_message_tool_calls(const nlohmann::json& calls, const std::string& field);

// The request's constraint compiled by the pipeline's component (in the HTTP thread: a big schema
// takes milliseconds), or null for free text: its response_format / guided_* field, or for
// tool_choice required and named the call schema (tool_calls.h). A refusal is a 400 naming the field
// (for tools, the tool whose parameters are refused). `kind` receives the constraint's type for the
// metrics ("tools" for tool calls).
std::shared_ptr<const CompiledConstraint> compile_request_constraint(const Constraint& constraint,
                                                                     const OpenAiRequest& r, std::string* kind);

}  // namespace tessera::serve
