// Helpers for the `tessera serve` tests: the real binary on a loopback port, a raw socket for
// streams a test wants to cut off, SSE and Prometheus parsing.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <httplib.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace tessera::test {

// A pipeline file for the server tests: stories260K on the CPU, paged KV cache and continuous
// batching, plus the given `server:` lines (YAML, indented by the caller's text).
inline std::string serve_pipeline(const TempDir& dir, const std::string& server_yaml = "",
                                   const std::string& name = "serve.yaml") {
  std::string text = "extends: " + std::string(TESSERA_SOURCE_DIR) + "/pipelines/paged.yaml\n" +
                     "model: " + kStoriesF32 + "\nbackend: cpu\n";
  if (!server_yaml.empty()) text += "server:\n" + server_yaml;
  return dir.write(name, text);
}

// A synthetic 28M-parameter model (q8_0, context 2048) for tests that need a request to stay in
// flight for a while: a few ms per token where stories260K takes a fraction of one. Written once per
// test process with `tessera synth`, removed when the process exits (each test runs in its own).
inline std::string slow_serve_pipeline(const TempDir& dir, const std::string& server_yaml = "") {
  static const TempDir model_dir;
  static const std::string model = [] {
    const std::string path = model_dir.path() + "/slow.gguf";
    const std::string cmd = std::string("'") + TESSERA_BINARY + "' synth --preset tiny --dim 512 --ffn 1536 " +
                            "--layers 8 --heads 8 --kv-heads 8 --vocab 512 --context 2048 --dtype q8_0 -o '" + path +
                            "' >/dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0) throw Error("tessera synth failed: " + cmd);
    return path;
  }();
  std::string text = "extends: " + std::string(TESSERA_SOURCE_DIR) + "/pipelines/paged.yaml\n" + "model: " + model +
                     "\nbackend: cpu\ncomponents:\n  quantizer: { plugin: gguf }\n";
  if (!server_yaml.empty()) text += "server:\n" + server_yaml;
  return dir.write("slow.yaml", text);
}

// In a forked child: becomes `[LAUNCHER...] tessera serve --port 0 --threads THREADS ARGS` (a
// launcher: mpirun and its arguments).
[[noreturn]] inline void exec_serve(const std::vector<std::string>& args, const std::string& threads,
                                    const std::vector<std::string>& launcher = {}) {
  std::vector<std::string> all = launcher;
  for (const std::string& a : {std::string(TESSERA_BINARY), std::string("serve"), std::string("--port"),
                               std::string("0"), std::string("--threads"), threads}) {
    all.push_back(a);
  }
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv(argv[0], argv.data());
  _exit(127);
}

// `tessera serve ARGS --port 0` as a child process; the port comes from its "listening on" line.
class ServerProcess {
 public:
  explicit ServerProcess(const std::vector<std::string>& args, const std::vector<std::string>& launcher = {},
                         const std::string& threads = "2") {
    int out[2];
    if (pipe(out) != 0) throw Error("pipe failed");
    stderr_path_ = dir_.path() + "/stderr.txt";
    pid_ = fork();
    if (pid_ == 0) {
      if (chdir(TESSERA_SOURCE_DIR) != 0) _exit(127);
      dup2(out[1], 1);
      const int err = open(stderr_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (err >= 0) dup2(err, 2);
      close(out[0]);
      exec_serve(args, threads, launcher);
    }
    close(out[1]);
    out_fd_ = out[0];
    // Wait for "listening on http://HOST:PORT".
    std::string text;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (port_ == 0 && std::chrono::steady_clock::now() < deadline) {
      pollfd p{out_fd_, POLLIN, 0};
      if (poll(&p, 1, 200) <= 0) continue;
      char buf[256];
      const ssize_t n = read(out_fd_, buf, sizeof buf);
      if (n <= 0) break;
      text.append(buf, size_t(n));
      std::smatch m;
      if (std::regex_search(text, m, std::regex(R"(listening on http://[^:]+:(\d+))"))) port_ = std::stoi(m[1]);
    }
    if (port_ == 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
      throw Error("tessera serve did not start: " + text + read_text(stderr_path_));
    }
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) close(out_fd_);
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string log() const { return read_text(stderr_path_); }

  // Sends `sig` and waits up to `timeout` for the exit; returns the exit status (-1: killed, or no exit).
  int stop(int sig = SIGTERM, std::chrono::seconds timeout = std::chrono::seconds(30)) {
    if (pid_ <= 0) return -1;
    kill(pid_, sig);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120);
    c.set_write_timeout(30);
    return c;
  }

 private:
  TempDir dir_;
  std::string stderr_path_;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int port_ = 0;
};

// The `data:` payloads of an SSE body, in order ("[DONE]" included as is).
inline std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  std::stringstream ss(body);
  std::string line;
  while (std::getline(ss, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind("data: ", 0) == 0) out.push_back(line.substr(6));
  }
  return out;
}

// What a stream carried: the text deltas joined, the finish reason, usage, and whether [DONE] ended it.
struct StreamedResponse {
  std::string text;
  std::string role;
  std::string finish_reason;
  nlohmann::json usage;
  nlohmann::json usage_chunk;  // stream_options.include_usage
  nlohmann::json error;
  bool done = false;
  size_t chunks = 0;
};

// POSTs `body` as JSON and returns the parsed answer, expecting `expect_status` and a JSON body.
inline nlohmann::json post_json(httplib::Client& c, const std::string& path, const nlohmann::json& body,
                                int expect_status = 200) {
  auto res = c.Post(path.c_str(), body.dump(), "application/json");
  if (!res) {
    ADD_FAILURE() << "no response from " << path << ": " << httplib::to_string(res.error());
    return nlohmann::json();
  }
  EXPECT_EQ(res->status, expect_status) << res->body;
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
  return nlohmann::json::parse(res->body);
}

inline StreamedResponse parse_stream(const std::string& body) {
  StreamedResponse r;
  for (const std::string& d : sse_data(body)) {
    if (d == "[DONE]") {
      r.done = true;
      continue;
    }
    const auto j = nlohmann::json::parse(d);
    ++r.chunks;
    if (j.contains("error")) {
      r.error = j["error"];
      continue;
    }
    if (j["choices"].empty()) {
      r.usage_chunk = j["usage"];
      continue;
    }
    const auto& c = j["choices"][0];
    if (c.contains("text")) r.text += c["text"].get<std::string>();
    if (c.contains("delta")) {
      if (c["delta"].contains("content")) r.text += c["delta"]["content"].get<std::string>();
      if (c["delta"].contains("role")) r.role = c["delta"]["role"];
    }
    if (!c["finish_reason"].is_null()) r.finish_reason = c["finish_reason"];
    if (j.contains("usage")) r.usage = j["usage"];
  }
  return r;
}

// Prometheus text: the value of one sample ("name" or "name{labels}" exactly as printed).
inline std::optional<double> metric(const std::string& page, const std::string& sample) {
  std::stringstream ss(page);
  std::string line;
  while (std::getline(ss, line)) {
    if (line.rfind(sample + " ", 0) == 0) return std::stod(line.substr(sample.size() + 1));
  }
  return std::nullopt;
}

// A raw HTTP/1.1 connection, for a client that goes away mid-stream.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw Error("connect failed");
  }
  ~RawConnection() { close(); }
  void post(const std::string& path, const std::string& body) {
    send_raw("POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
             "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  }
  void send_raw(const std::string& bytes) {
    if (::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) != ssize_t(bytes.size())) throw Error("send failed");
  }
  // Reads until `needle` has arrived (or the timeout); returns everything read so far.
  std::string read_until(const std::string& needle, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (received_.find(needle) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      const ssize_t n = recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) break;
      received_.append(buf, size_t(n));
    }
    return received_;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Closes with a reset (RST) instead of an orderly shutdown, as a killed client does.
  void reset() {
    const linger abort{1, 0};
    setsockopt(fd_, SOL_SOCKET, SO_LINGER, &abort, sizeof abort);
    close();
  }

 private:
  int fd_ = -1;
  std::string received_;
};

// Polls /metrics until `pred(page)` holds or the timeout passes; returns the last page.
template <class Pred>
std::string wait_for_metrics(httplib::Client& c, Pred pred, std::chrono::seconds timeout = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string page;
  while (std::chrono::steady_clock::now() < deadline) {
    auto res = c.Get("/metrics");
    if (res && res->status == 200) {
      page = res->body;
      if (pred(page)) return page;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return page;
}

}  // namespace tessera::test
