#!/usr/bin/env python3
"""`vortex serve --device cuda` on the GPU machine: several requests on one resident model.

    python3 tools/service/serve_smoke.py VORTEX_BINARY OUT_DIR [--preset h3] [--device cuda] [--recipe bf16]

Starts the server (synthetic weights made on the device; --media wav with the synthetic h3 audio
VAE), then runs in order: the canonical request with 100 synthetic text tokens and 3 grid points; a
smaller geometry; the canonical request with int8fp8 attention; the first request again; a 50-step
request cancelled while running; a request with more rows than the arena holds; a 50-step request
running when the server gets SIGTERM. Checks: the first and fourth jobs' latents are the bits, and
their WAVs the bytes, that `vortex generate --device cuda --media` writes for that request (run
first, same binary); every job ends in the state expected; the oversized request is a 400; SIGTERM
ends the server with exit code 0; a server restarted on the folder runs the interrupted job again.
Prints one line per check and exits non-zero when any fails.

The GPU machine has no cpp-httplib, so the binary is one built where it is (CUDA + service) and
carried in with its libcpp-httplib.so (LD_LIBRARY_PATH); nothing here needs more than the standard
library.
"""

import json
import pathlib
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

CANONICAL = {"steps": 3, "seed": 1, "text_tokens": 100}


def call(port, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def wait_state(port, job_id, states, limit_s=400):
    deadline = time.time() + limit_s
    while time.time() < deadline:
        _, job = call(port, "GET", f"/v1/jobs/{job_id}")
        if job.get("state") in states:
            return job
        time.sleep(0.05)
    return job


def main():
    binary, out = sys.argv[1], pathlib.Path(sys.argv[2])
    options = dict(zip(sys.argv[3::2], sys.argv[4::2]))
    preset, device = options.get("--preset", "h3"), options.get("--device", "cuda")
    recipe = ["--recipe", options.get("--recipe", "bf16")]
    out.mkdir(parents=True, exist_ok=True)
    failures = 0

    def check(ok, what):
        nonlocal failures
        failures += not ok
        print(("PASS " if ok else "FAIL ") + what, flush=True)

    vae = ["--synthetic-audio-vae", preset]
    gen = subprocess.run([binary, "generate", "--synthetic", preset, "--device", device, "--steps", "3", "--seed", "1",
                          "--text-tokens", "100", "--out", str(out / "generated"), "--media",
                          str(out / "generated.wav")] + vae + recipe, capture_output=True, text=True)
    check(gen.returncode == 0, f"generate --device {device}: rc {gen.returncode}" +
          ("" if gen.returncode == 0 else " " + gen.stderr.strip()[-300:]))
    want = json.loads((out / "generated.json").read_text())["checksums"] if gen.returncode == 0 else None

    def start_server(log):
        stdout, stderr = open(out / f"{log}.out", "w"), open(out / f"{log}.err", "w")
        server = subprocess.Popen([binary, "serve", "--synthetic", preset, "--device", device, "--port", "0",
                                   "--results", str(out / "results"), "--media", "wav"] + vae + recipe,
                                  stdout=stdout, stderr=stderr)
        port, start = None, time.time()
        while port is None and time.time() - start < 300 and server.poll() is None:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", (out / f"{log}.out").read_text())
            port = int(m.group(1)) if m else None
            time.sleep(0.2)
        check(port is not None, f"{log} started in {time.time() - start:.1f} s")
        return server, port

    def stop_server(server, what):
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
            code = None
        check(code == 0, f"{what}: exit code {code}")

    server, port = start_server("serve")
    if port is None:
        server.kill()
        return 1
    _, health = call(port, "GET", "/healthz")
    print("healthz", json.dumps(health), flush=True)

    jobs = [("canonical", CANONICAL, "succeeded"),
            ("smaller geometry", {"height": 384, "width": 672, "frames": 39, "steps": 3, "seed": 2, "text_tokens": 50},
             "succeeded"),
            ("canonical, int8fp8", dict(CANONICAL, attention="int8fp8"), "succeeded"),
            ("canonical again", CANONICAL, "succeeded")]
    results = {}
    for name, body, expected in jobs:
        t0 = time.time()
        status, job = call(port, "POST", "/v1/jobs", body)
        if status != 202:
            check(False, f"{name}: submit answered {status} {job}")
            continue
        job = wait_state(port, job["id"], ("succeeded", "failed", "cancelled"))
        results[name] = job
        seconds = job.get("result", {}).get("seconds", {}).get("denoise")
        check(job.get("state") == expected,
              f"{name}: {job.get('state')} in {time.time() - t0:.1f} s (denoise {seconds}) {job.get('error', '')}")
    if want is not None:
        for name in ("canonical", "canonical again"):
            got = results.get(name, {}).get("result", {}).get("checksums")
            check(got == want, f"{name}: latents checksums equal generate's ({(got or {}).get('video', {}).get('sha256')})")
            job_id = results.get(name, {}).get("id")
            wav = (out / "results" / f"{job_id}.wav")
            check(wav.exists() and wav.read_bytes() == (out / "generated.wav").read_bytes(),
                  f"{name}: the WAV is generate --media's bytes")

    status, job = call(port, "POST", "/v1/jobs", dict(CANONICAL, steps=50))
    if status == 202:
        running = wait_state(port, job["id"], ("running",))
        while running.get("progress", {}).get("step", 0) < 1 and running.get("state") == "running":
            time.sleep(0.05)
            _, running = call(port, "GET", f"/v1/jobs/{job['id']}")
        call(port, "DELETE", f"/v1/jobs/{job['id']}")
        stopped = wait_state(port, job["id"], ("cancelled", "succeeded", "failed"))
        check(stopped.get("state") == "cancelled", f"50-step job cancelled while running: {stopped.get('state')} "
                                                   f"at step {stopped.get('progress', {}).get('step')}")
    else:
        check(False, f"50-step job: submit answered {status}")

    status, job = call(port, "POST", "/v1/jobs", dict(CANONICAL, text_tokens=2000))
    check(status == 400 and "rows" in job.get("error", ""), f"oversized request: {status} {job.get('error')}")

    status, job = call(port, "POST", "/v1/jobs", dict(CANONICAL, steps=50))
    running = wait_state(port, job.get("id"), ("running",)) if status == 202 else {}
    stop_server(server, "SIGTERM with a job running")
    server, port = start_server("restarted")
    if port is None:
        server.kill()
        return 1
    again = wait_state(port, job.get("id"), ("running",))
    check(running.get("state") == "running" and again.get("state") == "running",
          f"the interrupted job runs again after the restart: {again.get('state')}")
    call(port, "DELETE", f"/v1/jobs/{job.get('id')}")
    stopped = wait_state(port, job.get("id"), ("cancelled", "succeeded", "failed"))
    check(stopped.get("state") == "cancelled", f"and is cancelled there: {stopped.get('state')}")
    stop_server(server, "SIGTERM")
    print(f"{failures} checks failed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
