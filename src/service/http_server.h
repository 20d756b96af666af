// The HTTP face of a JobQueue (cpp-httplib): routes, status codes and JSON errors. No model logic:
// the owner's hooks check a request and name the files a job wrote.
//
//   POST   /v1/jobs               a request: JSON (application/json), or multipart/form-data with a
//                                 "request" part (JSON) and the file parts the hooks accept (text
//                                 states, keyframes) → 202 and the job; 400 naming the field or
//                                 part; 413; 415; 429 when full
//   GET    /v1/jobs               every job held, in submission order
//   GET    /v1/jobs/{id}          one job: state, queue position, progress and ETA, result or error
//   DELETE /v1/jobs/{id}          cancel: at once when queued, at the next step when running
//   GET    /v1/jobs/{id}/latents  the latents (safetensors) of a succeeded job; 409 before that
//   GET    /v1/jobs/{id}/media    its WAV or MP4, on a server that decodes media
//   GET    /v1/loras              the LoRA adapters requests may name, on a server that takes them
//   GET    /healthz               the hooks' info and the queue's counts
//   GET    /metrics               the same counts in the Prometheus text format
//
// Every error is {"error": "<one line>"} with a 4xx status (5xx only for a bug or a lost file).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "service/job_queue.h"
#include "vortex/status.h"

namespace vortex::service {

// The file parts of a multipart submission, each saved under ServerHooks::upload_dir: part name →
// the saved file's path.
using Uploads = std::map<std::string, std::string>;

struct ServerHooks {
  // Turns a submitted body (a JSON object) and its saved file parts into the request the queue
  // holds, or a status whose message names the field or part (answered 400; the files are then
  // removed again).
  std::function<Result<nlohmann::json>(const nlohmann::json& body, const Uploads& uploads)> check;
  // The file parts a submission may carry besides "request": part name → the saved file's
  // extension (".safetensors", ".png").
  std::map<std::string, std::string> upload_parts;
  // The latents file a succeeded job wrote.
  std::function<std::string(const std::string& id)> latents_path;
  // Its media file and that file's content type; null when the server decodes no media.
  std::function<std::string(const std::string& id)> media_path;
  std::string media_content_type;
  // The LoRA adapters requests may name (a JSON array); null when requests name none.
  std::function<nlohmann::json()> loras;
  std::string upload_dir;  // where uploaded files are kept (the jobs read them later)
  nlohmann::json info;     // shown by /healthz
};

class HttpServer {
 public:
  HttpServer(JobQueue& jobs, ServerHooks hooks, int64_t max_body_bytes);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port (port 0: any free port) and returns the port bound.
  Result<int> bind(const std::string& host, int port);
  // Answers requests until stop(); call after bind().
  Status serve();
  // From any thread: serve() returns once the requests in flight are answered.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;  // keeps httplib out of this header
};

}  // namespace vortex::service
