// tessera serve: the OpenAI-compatible HTTP server for a pipeline (-p) or a deployment (-d). Settings
// come from the `server:` section; command-line flags override them. SIGTERM or SIGINT stop it
// gracefully (exit 0); a second signal cancels what is still running at once; SIGHUP reloads.
#include <pthread.h>
#include <signal.h>

#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "commands.h"
#include "serve/http_server.h"
#include "tessera/error.h"
#include "tessera/deployment_spec.h"
#include "tessera/read_file.h"

namespace tessera::cli {

namespace {

struct ServeArgs {
  PipelineArgs pipeline;
  std::string deployment;  // -d
  std::optional<std::string> host;
  std::optional<int64_t> port;
  std::optional<std::string> api_key;
  std::optional<std::string> api_key_file;
};

// One key per line, `KEY` or `NAME KEY` (blank lines and lines starting with # are skipped); a key
// without a name is called "key<LINE>".
std::vector<serve::ApiKey> read_api_keys(const std::string& file) {
  std::istringstream in(read_file(file, "API key file"));
  std::vector<serve::ApiKey> keys;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string s; words >> s;) w.push_back(s);
    if (w.empty() || w[0][0] == '#') continue;
    const std::string where = file + ":" + std::to_string(n);
    if (w.size() > 2) throw Error(where + ": expected 'KEY' or 'NAME KEY', got " + std::to_string(w.size()) + " words");
    serve::ApiKey k{w.size() == 2 ? w[0] : "key" + std::to_string(n), w.back()};
    for (const serve::ApiKey& other : keys) {
      if (other.name == k.name) throw Error(where + ": key name '" + k.name + "' is given twice");
      if (other.secret == k.secret) throw Error(where + ": the same key is given twice");
    }
    keys.push_back(std::move(k));
  }
  if (keys.empty()) throw Error(file + ": the API key file holds no key");
  return keys;
}

// The deployment's (or the pipeline's) server section with defaults, then the flags.
serve::ServerConfig server_config(const DeploymentSpec& spec, const ServeArgs& args) {
  const std::string where = (spec.path.empty() ? std::string("(defaults)") : spec.path) + ": server";
  const Params p = validate_params(server_params(), spec.server, where);
  serve::ServerConfig c;
  c.host = p.get_string("host");
  c.port = int(p.get_int("port"));
  c.max_queue = p.get_int("max_queue");
  c.max_body_bytes = p.get_int("max_body_bytes");
  c.shutdown_deadline = p.get_float("shutdown_deadline");
  c.http_threads = p.get_int("http_threads");
  c.request_deadline = p.get_float("request_deadline");
  c.max_connections_per_client = p.get_int("max_connections_per_client");
  // Every admitted request holds an HTTP thread until it is answered; past the threads, requests
  // would wait unseen in the workers' queue (no 429, not in the metrics).
  if (c.http_threads < c.max_queue + serve::kSpareHttpThreads) {
    throw Error(where + ": http_threads " + std::to_string(c.http_threads) + " must be at least max_queue " +
                std::to_string(c.max_queue) + " + " + std::to_string(serve::kSpareHttpThreads) +
                " (requests past the threads would wait unseen and never get their 429; the spare threads "
                "answer /health, /metrics and refusals)");
  }
  c.default_max_tokens = p.get_int("default_max_tokens");
  c.chat_template = p.get_string("chat_template");
  c.admin_key = p.get_string("admin_key");
  std::string key = p.get_string("api_key");
  std::string key_file = p.get_string("api_key_file");
  if (args.host) {
    check_server_value("host", *args.host, "--host");
    c.host = *args.host;
  }
  if (args.port) {
    check_server_value("port", *args.port, "--port");
    c.port = int(*args.port);
  }
  // A flag replaces the file's key, whichever form either takes.
  if (args.api_key) check_server_value("api_key", *args.api_key, "--api-key");
  if (args.api_key_file) check_server_value("api_key_file", *args.api_key_file, "--api-key-file");
  if (args.api_key || args.api_key_file) {
    key = args.api_key.value_or("");
    key_file = args.api_key_file.value_or("");
  }
  if (!key_file.empty()) {
    c.api_keys = read_api_keys(key_file);
  } else if (!key.empty()) {
    c.api_keys = {{"default", key}};
  }
  c.user_from_key = p.get_bool("user_from_key");
  if (c.user_from_key && c.api_keys.empty()) {
    throw Error(where + ": user_from_key needs API keys (api_key or api_key_file) to derive users from");
  }
  return c;
}

void serve_command(const ServeArgs& args) {
  // Signals are taken by one thread with sigwait; every thread started from here inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not a dead server

  Registry registry;
  load_plugins(registry);
  // The deployment file (-d), or the pipeline (-p) as a one-model deployment; read again on a reload.
  auto load_spec = [&args]() {
    if (!args.deployment.empty()) {
      DeploymentSpec spec = load_deployment_spec(args.deployment);
      for (const ModelSpec& m : spec.models) {
        for (const VariantSpec& v : m.variants) {
          if (!v.pipeline.server.empty()) {
            std::cerr << "tessera serve: " << v.where << ": the server section of " << v.pipeline.path
                      << " does not apply; the deployment's does\n";
          }
        }
      }
      return spec;
    }
    PipelineSpec pipeline = load_pipeline_spec(resolve_pipeline_path(args.pipeline.pipeline));
    // The model's name: server.model_name, else the model file's stem (-m replaces the file).
    const Params p = validate_params(server_params(), pipeline.server, pipeline.path + ": server");
    std::string name = p.get_string("model_name");
    if (name.empty()) {
      name = std::filesystem::path(args.pipeline.model.empty() ? pipeline.model : args.pipeline.model).stem().string();
    }
    if (name.empty()) name = "default";  // no model at all: building the pipeline says so
    if (!valid_deployment_name(name)) {
      throw Error(pipeline.path + ": server: model_name '" + name +
                  "' must be 1 to 64 of the characters A-Z a-z 0-9 . _ : / - (set server.model_name)");
    }
    return single_pipeline_deployment(std::move(pipeline), name);
  };
  const DeploymentSpec spec = load_spec();
  const serve::ServerConfig config = server_config(spec, args);
  // Variants of one model file with the same backend and quantizer load its weights once, and so does
  // a reload while the old deployment still holds them.
  ModelShare share;
  // A tensor-parallel rank other than 0 serves nothing: it runs its share of rank 0's steps, then
  // leaves when rank 0's server stops (its pipeline going ends follow()).
  struct Followed {};
  bool tensor_parallel = false;
  auto make = [&](const DeploymentSpec& s) {
    // The other ranks follow the pipelines they built at the start; a reload would build new ones on rank 0 alone.
    if (tensor_parallel) throw Error("reload is not available under tensor parallelism: restart the mpirun job");
    return std::make_shared<serve::Deployment>(
        s,
        [&](const PipelineSpec& p) {
          if (tensor_parallel) throw Error("under tensor parallelism a deployment serves one pipeline (one model, one variant)");
          std::unique_ptr<Pipeline> pipeline = build_pipeline(registry, p, args.pipeline, &share);
          if (pipeline->follow()) throw Followed{};
          tensor_parallel = tensor_parallel || pipeline->comm().size() > 1;
          return pipeline;
        },
        config.chat_template);
  };
  std::shared_ptr<serve::Deployment> first;
  try {
    first = make(spec);
  } catch (const Followed&) {
    return;
  }
  const std::string description = first->describe();
  // A reload reads the models again; the server section (port, keys) stays as it started.
  serve::HttpServer server(std::move(first), config, [&] { return make(load_spec()); });
  const int port = server.bind();
  std::cerr << "tessera serve: " << description << (config.api_keys.empty() ? "" : ", API key required")
            << (config.admin_key.empty() ? "" : ", admin API on") << "\n";
  std::cout << "listening on http://" << config.host << ":" << port << std::endl;

  std::atomic<bool> exiting{false};
  std::thread shutdown_thread;
  std::thread signal_thread([&] {
    int sig = 0;
    // SIGHUP: read the deployment again (a bad file is refused, and the running one keeps serving).
    for (sigwait(&signals, &sig); sig == SIGHUP && !exiting; sigwait(&signals, &sig)) {
      try {
        server.reload();
      } catch (const std::exception& e) {
        std::cerr << "reload refused, the running deployment keeps serving: " << e.what() << "\n";
      }
    }
    if (exiting) return;
    std::cerr << "tessera serve: " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << ", finishing in-flight requests (up to "
              << config.shutdown_deadline << " s)\n";
    shutdown_thread = std::thread([&] { server.shutdown(); });
    do {
      sigwait(&signals, &sig);
    } while (sig == SIGHUP && !exiting);
    if (exiting) return;
    std::cerr << "tessera serve: second signal, cancelling in-flight requests\n";
    server.cancel_all();
  });

  server.run();
  exiting = true;
  pthread_kill(signal_thread.native_handle(), SIGTERM);  // wakes its sigwait, whichever it is in
  signal_thread.join();
  if (shutdown_thread.joinable()) shutdown_thread.join();
  std::cerr << "tessera serve: stopped\n";
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (completions, chat, SSE, metrics)");
  add_pipeline_options(*cmd, args->pipeline);
  cmd->add_option("-d,--deployment", args->deployment,
                  "deployment file: several models, or weighted variants of one (docs/deployments.md)")
      ->excludes(cmd->get_option("--pipeline"))
      ->excludes(cmd->get_option("--model"));
  cmd->add_option("--host", args->host, "address to bind (default 127.0.0.1, or the pipeline's server.host)");
  cmd->add_option("--port", args->port, "TCP port (default 8080; 0 = any free port, printed at start)");
  auto* key = cmd->add_option("--api-key", args->api_key, "require 'Authorization: Bearer KEY'");
  cmd->add_option("--api-key-file", args->api_key_file, "read the API keys from this file (one per line: KEY or NAME KEY)")
      ->excludes(key);
  cmd->callback([args] { serve_command(*args); });
}

}  // namespace tessera::cli
