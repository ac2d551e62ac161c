// tessera tokenize: the token ids (and each token's text) a GGUF file's tokenizer gives a text.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "tessera/error.h"
#include "tessera/gguf.h"
#include "tessera/tokenizer.h"

namespace tessera::cli {

namespace {

struct TokenizeArgs {
  std::string model;
  std::string format = "text";
  std::string text;
  bool add_special = false;
  bool parse_special = false;
};

// One line per token in text output: a piece's newlines, tabs, backslashes, other control bytes
// and bytes that are no complete UTF-8 character (a token may hold part of one) are escaped.
std::string escape_piece(const std::string& piece) {
  std::string out;
  auto hex = [&](unsigned char c) {
    char buf[5];
    std::snprintf(buf, sizeof buf, "\\x%02X", c);
    out += buf;
  };
  for (size_t i = 0; i < piece.size();) {
    const auto c = static_cast<unsigned char>(piece[i]);
    const char* named = c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : nullptr;
    size_t len = c < 0x80 ? 1 : c < 0xC2 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF5 ? 4 : 0;
    if (len == 0 || i + len > piece.size()) len = 0;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(piece[i + k]) & 0xC0) != 0x80) len = 0;
    }
    if (named != nullptr) {
      out += named;
    } else if (len == 0 || c < 0x20 || c == 0x7F) {
      hex(c);
    } else {
      out.append(piece, i, len);
      i += len;
      continue;
    }
    ++i;
  }
  return out;
}

void tokenize(const TokenizeArgs& a) {
  const auto file = GgufFile::open(a.model);
  const auto tok = Tokenizer::create(load_vocabulary(*file));
  const std::vector<int32_t> ids = tok->encode(a.text, a.add_special, a.parse_special);
  if (a.format == "json") {
    nlohmann::json out = {{"ids", ids}, {"pieces", nlohmann::json::array()}};
    for (const int32_t id : ids) out["pieces"].push_back(tok->token_to_piece(id));
    // A piece that is part of a UTF-8 character is shown with U+FFFD where its bytes are.
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return;
  }
  for (const int32_t id : ids) std::cout << id << '\t' << escape_piece(tok->token_to_piece(id)) << '\n';
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Print the token ids of a text under a GGUF file's tokenizer");
  cmd->add_option("-m,--model", args->model, "GGUF file (a model, or a vocabulary-only file)")->required();
  cmd->add_flag("--add-special", args->add_special, "add BOS/EOS where the vocabulary asks for them");
  cmd->add_flag("--parse-special", args->parse_special,
                "texts of control tokens (\"<|endoftext|>\", \"<s>\") become those tokens");
  cmd->add_option("--format", args->format, "text (one 'id<TAB>piece' a line, the piece escaped) or json")
      ->check(CLI::IsMember({"text", "json"}));
  cmd->add_option("text", args->text, "the text to tokenize")->required();
  cmd->callback([args] { tokenize(*args); });
}

}  // namespace tessera::cli
