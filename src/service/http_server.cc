#include "service/http_server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/quote.h"
#include "formats/safetensors.h"

namespace vortex::service {

namespace {

void send_json(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_content(body.dump(2) + "\n", "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& message) {
  send_json(res, status, {{"error", message}});
}

// The status a check's failure is answered with: the request's fault unless vortex itself broke.
int http_status_of(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInternal: return 500;
    case StatusCode::kIoError: return 500;
    default: return 400;
  }
}

std::string prometheus_text(const QueueMetrics& m) {
  std::ostringstream out;
  out << "# HELP vortex_jobs Jobs the server holds, by state.\n# TYPE vortex_jobs gauge\n";
  for (const auto& [state, count] : m.jobs) out << "vortex_jobs{state=\"" << job_state_name(state) << "\"} " << count << "\n";
  out << "# HELP vortex_jobs_submitted_total Jobs accepted.\n# TYPE vortex_jobs_submitted_total counter\n"
      << "vortex_jobs_submitted_total " << m.submitted << "\n"
      << "# HELP vortex_jobs_rejected_total Jobs refused because the queue was full.\n"
      << "# TYPE vortex_jobs_rejected_total counter\nvortex_jobs_rejected_total " << m.rejected_full << "\n"
      << "# HELP vortex_steps_total Denoising steps finished.\n# TYPE vortex_steps_total counter\n"
      << "vortex_steps_total " << m.steps << "\n"
      << "# HELP vortex_run_seconds_total Seconds spent running finished jobs.\n"
      << "# TYPE vortex_run_seconds_total counter\nvortex_run_seconds_total " << m.run_seconds << "\n"
      << "# HELP vortex_last_step_seconds Duration of the newest step.\n# TYPE vortex_last_step_seconds gauge\n"
      << "vortex_last_step_seconds " << m.last_step_seconds << "\n";
  return out.str();
}

}  // namespace

struct HttpServer::Impl {
  JobQueue& jobs;
  ServerHooks hooks;
  httplib::Server server;
  std::atomic<int64_t> uploads{0};

  Impl(JobQueue& j, ServerHooks h) : jobs(j), hooks(std::move(h)) {}

  // A fresh path for an uploaded part; unique across restarts (the time in ms, then a counter).
  std::string upload_path(const std::string& part, const std::string& extension) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
    return (std::filesystem::path(hooks.upload_dir) /
            (part + "-" + std::to_string(ms) + "-" + std::to_string(uploads++) + extension))
        .string();
  }

  // "request, text, first_frame": the parts a submission may have, for the errors.
  std::string part_names() const {
    std::string names = "request";
    for (const auto& [name, extension] : hooks.upload_parts) names += ", " + name;
    return names;
  }

  void submit(const httplib::Request& req, httplib::Response& res) {
    nlohmann::json body = nlohmann::json::object();
    std::string body_text, what = "request body";
    Uploads saved;
    const auto remove_saved = [&saved] {
      std::error_code ec;
      for (const auto& [name, path] : saved) std::filesystem::remove(path, ec);
    };
    if (req.is_multipart_form_data()) {
      for (const auto& [name, part] : req.files) {
        if (name != "request" && !hooks.upload_parts.contains(name)) {
          return send_error(res, 400, "multipart part " + quote(name) + ": unknown (parts: " + part_names() + ")");
        }
      }
      if (req.has_file("request")) body_text = req.get_file_value("request").content;
      what = "multipart part 'request'";
      for (const auto& [name, extension] : hooks.upload_parts) {
        if (!req.has_file(name)) continue;
        const std::string path = upload_path(name, extension);
        const Status written = write_file_atomically(path, req.get_file_value(name).content);
        if (!written.ok()) {
          remove_saved();
          return send_error(res, 500, "saving multipart part " + quote(name) + ": " + written.to_string());
        }
        saved[name] = path;
      }
    } else if (req.get_header_value("Content-Type").starts_with("application/json")) {
      body_text = req.body;
    } else {
      return send_error(res, 415,
                        "Content-Type " + quote(req.get_header_value("Content-Type")) +
                            ": send application/json, or multipart/form-data with parts " + part_names());
    }
    const auto refuse = [&](int status, const std::string& message) {
      remove_saved();
      send_error(res, status, message);
    };
    if (!body_text.empty()) {
      try {
        body = nlohmann::json::parse(body_text);
      } catch (const nlohmann::json::parse_error& e) {
        return refuse(400, what + ": not JSON (byte " + std::to_string(e.byte) + ")");
      }
      if (!body.is_object()) return refuse(400, what + ": a JSON object is expected, got " + body.type_name());
    }
    Result<nlohmann::json> checked = hooks.check(body, saved);
    if (!checked.ok()) return refuse(http_status_of(checked.status()), checked.status().message());
    const std::optional<JobSnapshot> job = jobs.submit(std::move(*checked));
    if (!job) {
      res.set_header("Retry-After", "60");
      return refuse(429, "the queue is full; retry later");
    }
    res.set_header("Location", "/v1/jobs/" + job->id);
    send_json(res, 202, job->to_json());
  }

  // A file a succeeded job wrote (`what`: "latents" or "media").
  void send_job_file(const std::string& id, const char* what, const std::string& path, const std::string& type,
                     httplib::Response& res) {
    const std::optional<JobSnapshot> job = jobs.get(id);
    if (!job) return send_error(res, 404, "no job " + quote(id));
    if (job->state != JobState::kSucceeded) {
      return send_error(res, 409, "job " + id + " is " + job_state_name(job->state) + ": no " + what);
    }
    std::ifstream file(path, std::ios::binary);
    if (!file) return send_error(res, 500, "job " + id + ": its " + what + " file " + path + " cannot be read");
    std::ostringstream bytes;
    bytes << file.rdbuf();
    res.set_header("Content-Disposition",
                   "attachment; filename=\"" + std::filesystem::path(path).filename().string() + "\"");
    res.set_content(bytes.str(), type);
  }

  void add_routes() {
    server.Post("/v1/jobs", [this](const httplib::Request& req, httplib::Response& res) { submit(req, res); });
    server.Get("/v1/jobs", [this](const httplib::Request&, httplib::Response& res) {
      nlohmann::json all = nlohmann::json::array();
      for (const JobSnapshot& job : jobs.list()) all.push_back(job.to_json());
      send_json(res, 200, {{"jobs", all}});
    });
    server.Get(R"(/v1/jobs/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
      const std::optional<JobSnapshot> job = jobs.get(req.matches[1]);
      if (!job) return send_error(res, 404, "no job " + quote(req.matches[1]));
      send_json(res, 200, job->to_json());
    });
    server.Delete(R"(/v1/jobs/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
      Result<JobSnapshot> job = jobs.cancel(req.matches[1]);
      if (!job.ok()) {
        return send_error(res, job.status().code() == StatusCode::kNotFound ? 404 : 409, job.status().message());
      }
      send_json(res, 200, job->to_json());
    });
    server.Get(R"(/v1/jobs/([^/]+)/latents)", [this](const httplib::Request& req, httplib::Response& res) {
      const std::string id = req.matches[1];
      send_job_file(id, "latents", hooks.latents_path(id), "application/octet-stream", res);
    });
    server.Get(R"(/v1/jobs/([^/]+)/media)", [this](const httplib::Request& req, httplib::Response& res) {
      if (!hooks.media_path) return send_error(res, 404, "this server decodes no media (start it with --media)");
      const std::string id = req.matches[1];
      send_job_file(id, "media", hooks.media_path(id), hooks.media_content_type, res);
    });
    server.Get("/v1/loras", [this](const httplib::Request&, httplib::Response& res) {
      if (!hooks.loras) {
        return send_error(res, 404, "this server takes no per-request LoRA adapters (start it with --lora-dir)");
      }
      send_json(res, 200, {{"loras", hooks.loras()}});
    });
    server.Get("/healthz", [this](const httplib::Request&, httplib::Response& res) {
      nlohmann::json body = hooks.info;
      body["status"] = "ok";
      for (const auto& [state, count] : jobs.metrics().jobs) body["jobs"][job_state_name(state)] = count;
      send_json(res, 200, body);
    });
    server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(prometheus_text(jobs.metrics()), "text/plain; version=0.0.4");
    });
    // Whatever httplib answers by itself (an unknown route 404, a body over the limit 413) gets
    // the same JSON error shape as the handlers' answers.
    server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      const std::string what = res.status == 404   ? "no route " + req.method + " " + req.path
                               : res.status == 413 ? "the request body exceeds the server's limit"
                                                   : "HTTP " + std::to_string(res.status);
      send_error(res, res.status, what);
    });
    server.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr e) {
      std::string what = "unknown";
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        what = ex.what();
      } catch (...) {
      }
      send_error(res, 500, "internal error: " + what);
    });
  }
};

HttpServer::HttpServer(JobQueue& jobs, ServerHooks hooks, int64_t max_body_bytes)
    : impl_(std::make_unique<Impl>(jobs, std::move(hooks))) {
  impl_->server.set_payload_max_length(static_cast<size_t>(max_body_bytes));
  impl_->add_routes();
}

HttpServer::~HttpServer() { stop(); }

Result<int> HttpServer::bind(const std::string& host, int port) {
  if (port < 0 || port > 65535) return invalid_argument("--port " + std::to_string(port) + ": not in [0, 65535]");
  if (port == 0) {
    const int bound = impl_->server.bind_to_any_port(host);
    if (bound < 0) return io_error("cannot bind " + host + " to a free port");
    return bound;
  }
  if (!impl_->server.bind_to_port(host, port)) {
    return io_error("cannot bind " + host + ":" + std::to_string(port) + " (in use, or not an address of this machine)");
  }
  return port;
}

Status HttpServer::serve() {
  if (!impl_->server.listen_after_bind()) return io_error("the HTTP server stopped with an error");
  return ok_status();
}

void HttpServer::stop() {
  if (impl_) impl_->server.stop();
}

}  // namespace vortex::service
