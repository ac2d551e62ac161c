// Parts of `tessera serve` in-process: the pipeline's server: section, chat templates, request
// parsing details and the helpers streaming relies on.
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "serve/api_error.h"
#include "serve/chat_template.h"
#include "serve/metrics.h"
#include "serve/openai_request.h"
#include "serve/openai_response.h"
#include "tessera/error.h"
#include "tessera/gguf.h"
#include "tessera/pipeline_spec.h"
#include "tessera/tokenizer.h"
#include "test_util.h"

namespace tessera {
namespace {

using nlohmann::json;
using serve::ChatFormat;
using serve::ChatMessage;
using serve::ChatTemplate;

std::string load_error(const test::TempDir& dir, const std::string& yaml) {
  const std::string path = dir.write("p.yaml", yaml);
  try {
    load_pipeline_spec(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ServerSection, KeysAreTypedAndMergedOverExtends) {
  test::TempDir dir;
  dir.write("base.yaml", "server:\n  port: 9000\n  host: 0.0.0.0\n  api_key: base-key\n");
  const std::string path = dir.write("p.yaml",
                                     "extends: base.yaml\nserver:\n  port: 9001\n  max_body_bytes: 2MiB\n"
                                     "  api_key_file: key.txt\n");
  dir.write("key.txt", "k\n");
  const PipelineSpec spec = load_pipeline_spec(path);
  EXPECT_EQ(spec.server["port"], 9001);
  EXPECT_EQ(spec.server["host"], "0.0.0.0");
  EXPECT_EQ(spec.server["max_body_bytes"], 2 * 1024 * 1024);
  // The key file replaces the base's key, and is found beside the pipeline.
  EXPECT_FALSE(spec.server.contains("api_key"));
  EXPECT_EQ(spec.server["api_key_file"], dir.path() + "/key.txt");
  EXPECT_EQ(spec.server_where.at("port"), path + ":3");
  const Params p = validate_params(server_params(), spec.server, "test");
  EXPECT_EQ(p.get_int("max_queue"), 256);
  EXPECT_EQ(p.get_string("chat_template"), "auto");
}

TEST(ServerSection, BadKeysAndValuesNameTheFileLineAndKey) {
  test::TempDir dir;
  const std::string unknown = load_error(dir, "backend: cpu\nserver:\n  prot: 80\n");
  EXPECT_NE(unknown.find("p.yaml:3"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("unknown parameter 'prot'"), std::string::npos) << unknown;

  const std::string range = load_error(dir, "server:\n  port: 70000\n");
  EXPECT_NE(range.find("p.yaml:2"), std::string::npos) << range;
  EXPECT_NE(range.find("'port' is 70000"), std::string::npos) << range;

  const std::string type = load_error(dir, "server:\n  max_queue: many\n");
  EXPECT_NE(type.find("p.yaml:2"), std::string::npos) << type;
  EXPECT_NE(type.find("max_queue"), std::string::npos) << type;

  const std::string both = load_error(dir, "server:\n  api_key: a\n  api_key_file: b\n");
  EXPECT_NE(both.find("api_key or api_key_file, not both"), std::string::npos) << both;

  // An empty key would mean "no key": a server open to anyone, from what reads like a secured one.
  const std::string empty_key = load_error(dir, "server:\n  api_key: ''\n");
  EXPECT_NE(empty_key.find("p.yaml:2"), std::string::npos) << empty_key;
  EXPECT_NE(empty_key.find("'api_key' is empty"), std::string::npos) << empty_key;

  const std::string choice = load_error(dir, "server:\n  chat_template: vicuna\n");
  EXPECT_NE(choice.find("expected one of: auto, jinja, chatml"), std::string::npos) << choice;

  const std::string not_map = load_error(dir, "server: 8080\n");
  EXPECT_NE(not_map.find("p.yaml:1"), std::string::npos) << not_map;
  EXPECT_NE(not_map.find("'server' must be a map"), std::string::npos) << not_map;
}

TEST(ServerSection, CommandLineValuesAreRangeChecked) {
  EXPECT_THROW(check_server_value("port", -1, "--port"), Error);
  EXPECT_THROW(check_server_value("max_queue", 0, "server"), Error);
  EXPECT_NO_THROW(check_server_value("port", 0, "--port"));
  // A deadline under a second would cut off ordinary clients; no connection at all would refuse everyone.
  const std::string deadline = test::message_of([] { check_server_value("request_deadline", 0.5, "server"); });
  EXPECT_NE(deadline.find("'request_deadline' is 0.5; expected 1..86400"), std::string::npos) << deadline;
  EXPECT_THROW(check_server_value("max_connections_per_client", 0, "server"), Error);
  EXPECT_NO_THROW(check_server_value("max_connections_per_client", 1, "server"));
  const std::string empty = test::message_of([] { check_server_value("api_key", "", "--api-key"); });
  EXPECT_NE(empty.find("--api-key: server: 'api_key' is empty"), std::string::npos) << empty;
  EXPECT_THROW(check_server_value("api_key_file", "", "--api-key-file"), Error);
  EXPECT_NO_THROW(check_server_value("api_key", "k", "--api-key"));
}

const std::vector<ChatMessage> kConversation = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};

TEST(ChatTemplates, DetectedByTheirMarkers) {
  EXPECT_EQ(ChatTemplate::detect("{% for message in messages %}<|im_start|>{{ message.role }}"), ChatFormat::chatml);
  EXPECT_EQ(ChatTemplate::detect("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>' }}"),
            ChatFormat::llama3);
  EXPECT_EQ(ChatTemplate::detect("{{ bos_token + '[INST] ' + content + ' [/INST]' }}"), ChatFormat::llama2);
  EXPECT_EQ(ChatTemplate::detect("{{ '<|user|>\n' + message['content'] + eos_token }}"), ChatFormat::zephyr);
  EXPECT_EQ(ChatTemplate::detect("{{ something else }}"), ChatFormat::fallback);
  std::string note;
  EXPECT_EQ(ChatTemplate::choose("auto", "", &note).format(), ChatFormat::fallback);
  EXPECT_NE(note.find("no tokenizer.chat_template"), std::string::npos);
  // With auto, a template that renders is used as Jinja, whatever its markers.
  EXPECT_EQ(ChatTemplate::choose("auto", "<|im_start|>", &note).format(), ChatFormat::jinja);
  EXPECT_EQ(ChatTemplate::choose("llama2", "<|im_start|>", &note).format(), ChatFormat::llama2);
  EXPECT_THROW(ChatTemplate::choose("jinja", "", &note), Error);
}

TEST(ChatTemplates, RenderTheConversationUpToTheAnswer) {
  EXPECT_EQ(ChatTemplate(ChatFormat::chatml).render_text(kConversation),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(ChatTemplate(ChatFormat::llama3).render_text({{"user", "Hi"}}),
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(ChatTemplate(ChatFormat::llama2).render_text(kConversation),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye [/INST]");
  EXPECT_EQ(ChatTemplate(ChatFormat::zephyr).render_text({{"user", "Hi"}}), "<|user|>\nHi</s>\n<|assistant|>\n");
  EXPECT_EQ(ChatTemplate(ChatFormat::fallback).render_text(kConversation),
            "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\nHello!\n<|user|>\nBye\n<|assistant|>\n");
}

TEST(ChatTemplates, MarkersInTheVocabularyBecomeTheirTokens) {
  auto tok = Tokenizer::create(load_vocabulary(*GgufFile::open(test::kStoriesF32)));
  // llama2 on a SentencePiece vocabulary: </s> and <s> between turns are EOS and BOS, not text.
  const std::vector<int32_t> ids = ChatTemplate(ChatFormat::llama2).encode(*tok, kConversation);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), tok->bos());
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok->eos()), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok->bos()), 2);
  // Without markers in the vocabulary (stories260K has no <|im_end|>), the turn ends at a stop string.
  EXPECT_TRUE(ChatTemplate(ChatFormat::chatml).stop_tokens(*tok).empty());
  EXPECT_EQ(ChatTemplate(ChatFormat::chatml).stop_strings(*tok), std::vector<std::string>{"<|im_end|>"});
  // The default template is one text after BOS.
  EXPECT_EQ(ChatTemplate(ChatFormat::fallback).encode(*tok, kConversation),
            tok->encode(ChatTemplate(ChatFormat::fallback).render_text(kConversation), true));
}

const char* const kChatmlJinja =
    "{{ bos_token }}{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

TEST(ChatTemplates, TheModelsJinjaTemplateIsRendered) {
  std::string note;
  const ChatTemplate t = ChatTemplate::choose("auto", kChatmlJinja, &note);
  ASSERT_EQ(t.format(), ChatFormat::jinja);
  EXPECT_NE(note.find("tokenizer.chat_template (Jinja)"), std::string::npos) << note;
  EXPECT_EQ(t.describe(), json({{"source", "gguf"}, {"format", "jinja"}}));
  EXPECT_EQ(t.render_text({{"user", "Hi"}}), "<s><|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");

  auto tok = Tokenizer::create(load_vocabulary(*GgufFile::open(test::kStoriesF32)));
  const std::string text = t.render_jinja(*tok, kConversation);
  EXPECT_EQ(text.rfind("<s><|im_start|>system\nBe brief.<|im_end|>", 0), 0u) << text;
  // The template prints bos_token: the prompt has one BOS, the text's, and the rest is the text.
  const std::vector<int32_t> ids = t.encode(*tok, kConversation);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), tok->bos());
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok->bos()), 1);
  EXPECT_EQ(ids, tok->encode(text, false, true));
  // A template without bos_token gets the tokenizer's BOS in front.
  const ChatTemplate plain = ChatTemplate::choose("auto", "{% for m in messages %}{{ m.content }}{% endfor %}", &note);
  EXPECT_EQ(plain.encode(*tok, {{"user", "Hi"}}).front(), tok->bos());
  // End-of-turn markers the template prints: tokens when the vocabulary has them, else stop strings.
  EXPECT_TRUE(t.stop_tokens(*tok).empty());
  EXPECT_EQ(t.stop_strings(*tok), std::vector<std::string>{"<|im_end|>"});
}

TEST(ChatTemplates, AnUnusableTemplateFallsBackToTheDefaultWithAWarning) {
  for (const char* broken : {"{% if messages %}never closed", "{{ messages | no_such_filter }}",
                             "{{ raise_exception('unsupported') }}"}) {
    SCOPED_TRACE(broken);
    std::string note;
    const ChatTemplate t = ChatTemplate::choose("auto", broken, &note);
    EXPECT_EQ(t.format(), ChatFormat::fallback);
    EXPECT_EQ(note.rfind("warning: the model's tokenizer.chat_template cannot be used", 0), 0u) << note;
    EXPECT_NE(note.find("line 1"), std::string::npos) << note;
    const json d = t.describe();
    EXPECT_EQ(d["source"], "fallback");
    EXPECT_EQ(d["format"], "default");
    EXPECT_NE(d["warning"].get<std::string>().find("line 1"), std::string::npos) << d.dump();
    // `jinja` insists on the model's template: the server does not start.
    EXPECT_THROW(ChatTemplate::choose("jinja", broken, &note), Error);
  }
  std::string note;
  EXPECT_EQ(ChatTemplate::choose("jinja", kChatmlJinja, &note).format(), ChatFormat::jinja);
  EXPECT_EQ(ChatTemplate::choose("chatml", kChatmlJinja, &note).describe(),
            json({{"source", "builtin:chatml"}, {"format", "chatml"}}));
  EXPECT_EQ(ChatTemplate::choose("auto", "", &note).describe()["source"], "builtin:default");
}

TEST(ChatTemplates, AConversationTheTemplateRefusesIsAnError) {
  std::string note;
  const ChatTemplate t = ChatTemplate::choose(
      "auto", "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}ok",
      &note);
  ASSERT_EQ(t.format(), ChatFormat::jinja);
  auto tok = Tokenizer::create(load_vocabulary(*GgufFile::open(test::kStoriesF32)));
  const std::string err = test::message_of([&] { t.encode(*tok, kConversation); });
  EXPECT_NE(err.find("System role not supported"), std::string::npos) << err;
}

serve::ApiError parse_error(serve::Endpoint e, const std::string& body) {
  try {
    serve::parse_openai_request(e, body);
  } catch (const serve::ApiError& err) {
    return err;
  }
  return serve::ApiError(0, "no error");
}

TEST(OpenAiRequests, FieldsAreReadWithOpenAiConventions) {
  using serve::Endpoint;
  const auto r = serve::parse_openai_request(
      Endpoint::chat,
      R"({"model": "m", "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
          "max_completion_tokens": 9, "top_k": -1, "stop": ["x", "y"], "logprobs": true, "top_logprobs": 2,
          "seed": -1, "tool_choice": "none"})");
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content, "ab");
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_EQ(r.top_k, 0);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(r.seed, uint64_t(-1));
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 2);
  EXPECT_EQ(r.priority, 0);
  EXPECT_EQ(serve::parse_openai_request(Endpoint::completions, R"({"prompt": "a", "priority": -3})").priority, -3);
  EXPECT_EQ(parse_error(Endpoint::completions, R"({"prompt": "a", "priority": 1.5})").param(), "priority");
  EXPECT_EQ(parse_error(Endpoint::completions, R"({"prompt": "a", "priority": 10000000})").param(), "priority");
  const auto big = parse_error(Endpoint::completions, R"({"prompt": "a", "max_tokens": 18446744073709551615})");
  EXPECT_EQ(big.status(), 400);
  EXPECT_EQ(big.param(), "max_tokens");
  const auto part = parse_error(Endpoint::chat, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})");
  EXPECT_EQ(part.param(), "messages[0].content[0].type");
  const auto field = parse_error(Endpoint::chat, R"({"messages": [{"role": "user", "content": "x", "mood": 1}]})");
  EXPECT_EQ(field.param(), "messages[0].mood");
}

// Logprobs name tokens as OpenAI does: text_offset counts characters of the text (Python string
// indices), a byte token that is part of a character is "bytes:\xNN" with its raw bytes (two of
// them never share one U+FFFD key in top_logprobs), and EOS shows its vocabulary text.
TEST(OpenAiResponses, LogprobsNameByteTokensAndCountOffsetsInCharacters) {
  const auto tok = Tokenizer::create(load_vocabulary(*GgufFile::open(test::kStoriesF32)));
  const std::vector<std::string>& vocab = tok->vocabulary().tokens;
  auto byte_token = [&](const char* text) {
    return int32_t(std::find(vocab.begin(), vocab.end(), text) - vocab.begin());
  };
  GenerationResult r;
  r.tokens = tok->encode("\xE6\x97\xA5\xE6\x97\xA5 x", false);  // " ", 日 and 日 as three byte tokens each, " ", "x"
  ASSERT_EQ(r.tokens.size(), 9u);
  ASSERT_EQ(r.tokens[1], byte_token("<0xE6>"));
  r.tokens.push_back(tok->eos());
  r.text = tok->decode(r.tokens);
  r.reason = FinishReason::eos;
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    r.logprobs.push_back(-0.25f * float(i));
    r.top_logprobs.push_back({{r.tokens[i], r.logprobs.back()}, {byte_token("<0xC4>"), -3.0f}});
  }
  serve::OpenAiRequest req;
  req.logprobs = true;
  const json c = serve::response_json({}, r, req, *tok)["choices"][0]["logprobs"];
  EXPECT_EQ(c["text_offset"], json({0, 1, 2, 2, 2, 3, 3, 3, 4, 5})) << c.dump();  // " 日日 x": 日 at 1 and 2
  EXPECT_EQ(c["tokens"][1], "bytes:\\xe6");
  EXPECT_EQ(c["tokens"][2], "bytes:\\x97");
  EXPECT_EQ(c["tokens"][9], "</s>");
  for (size_t i = 0; i < r.tokens.size(); ++i) EXPECT_EQ(c["top_logprobs"][i].size(), 2u) << c.dump();
  EXPECT_EQ(c["top_logprobs"][1]["bytes:\\xc4"], -3.0f);
  EXPECT_TRUE(json::accept(serve::dump_json(c))) << "names must be valid UTF-8";

  const serve::ResponseMeta chat{serve::Endpoint::chat};
  const json content = serve::response_json(chat, r, req, *tok)["choices"][0]["logprobs"]["content"];
  EXPECT_EQ(content[1]["token"], "bytes:\\xe6");
  EXPECT_EQ(content[1]["bytes"], json({0xE6}));
  EXPECT_EQ(content[1]["top_logprobs"][1]["bytes"], json({0xC4}));
  EXPECT_EQ(content[9]["token"], "</s>");
}

TEST(StreamingHelpers, Utf8PrefixHoldsBackAnUnfinishedCharacter) {
  EXPECT_EQ(serve::complete_utf8_prefix("abc"), 3u);
  EXPECT_EQ(serve::complete_utf8_prefix("ab\xC3"), 2u);             // first byte of é
  EXPECT_EQ(serve::complete_utf8_prefix("ab\xC3\xA9"), 4u);         // é
  EXPECT_EQ(serve::complete_utf8_prefix("a\xE2\x82"), 1u);          // 2 of 3 bytes of €
  EXPECT_EQ(serve::complete_utf8_prefix("a\xF0\x9F\x98\x80"), 5u);  // 😀
  EXPECT_EQ(serve::complete_utf8_prefix(""), 0u);
}

TEST(StreamingHelpers, MetricsEscapeLabelValuesAndCapUsers) {
  EXPECT_EQ(serve::prom_escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  serve::ServerMetrics m;
  for (size_t i = 0; i < serve::ServerMetrics::kMaxUsers + 10; ++i) m.count_user("u" + std::to_string(i), 200);
  const std::string page = m.render({}, 0);
  EXPECT_NE(page.find("tessera_user_requests_total{user=\"_other\",status=\"200\"} 10"), std::string::npos);
}

TEST(StreamingHelpers, MetricsCarryDraftAcceptanceWhereThePipelineSpeculates) {
  serve::EngineSnapshot snap;
  snap.engine.speculation.verifications = 5;
  snap.engine.speculation.proposed = 20;
  snap.engine.speculation.accepted = 15;
  serve::ServerMetrics m;
  const auto as_variant = [&](bool speculates) {
    return std::vector<serve::VariantSnapshot>{{"m", "default", 1, snap, speculates, {}}};
  };
  const std::string page = m.render(as_variant(true), 0);
  for (const char* line : {"tessera_draft_tokens_total 20\n", "tessera_draft_accepted_total 15\n",
                           "tessera_draft_verifications_total 5\n", "tessera_draft_acceptance_rate 0.75\n"}) {
    EXPECT_NE(page.find(line), std::string::npos) << line << page;
  }
  EXPECT_EQ(m.render(as_variant(false), 0).find("tessera_draft_"), std::string::npos);
}

}  // namespace
}  // namespace tessera
