#!/usr/bin/env python3
"""npumoe serve as an HTTP client meets it (issue 15), with the Python
standard library (http.client, sockets), and curl for the raw shapes
(status line, headers, the bytes of an answer and of a stream).

Usage: test_serve.py NPUMOE --model GGUF (models/npumoe-tiny-moe.gguf)

Starts servers on free ports (--port 0; the port is read from stderr) and
checks: greedy and seeded answers equal `npumoe run`'s for the same prompt
and settings (chat and plain), usage and finish_reason (length, stop),
streamed chunks that join into the non-streamed text and end with [DONE],
every bad request with its status and OpenAI-shaped error (the server
answering a good request after them), the API key, the refusal of a
non-loopback host without a key, a clean exit on SIGTERM and SIGINT, a
model file name that is not UTF-8 (U+FFFD in the model id); with
slots: the queue bound (503), clients that leave (cancelled, the slot free),
SIGTERM with a stream in flight and one waiting, two streams sharing decode
steps, 8 clients at once on 2 slots equal to one at a time, /metrics against
what was sent, a plan-backed server equal to `npumoe run --plan`, and a
bounded load after which the server exits 0 with no sanitizer report; a
client sending its body slowly cut off at --timeout, a connection beyond
--max-connections unanswered until others close.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import test_cli  # its check() counts passes and failures
from test_cli import check


class Server:
    def __init__(self, binary, model, extra):
        self.proc = subprocess.Popen([binary, "serve", "-m", model, "--port", "0"] + extra,
                                     stderr=subprocess.PIPE)
        self.lines = []
        port = None
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace")
            self.lines.append(line)
            if line.startswith("npumoe: serving "):
                port = int(line.split("http://")[1].split(" ")[0].rsplit(":", 1)[1])
                break
        if port is None:
            raise RuntimeError("the server did not start: " + "".join(self.lines))
        self.port = port
        # the rest of stderr is drained so that the server never blocks on it
        self.drain = threading.Thread(target=self._drain, daemon=True)
        self.drain.start()

    def _drain(self):
        for raw in self.proc.stderr:
            self.lines.append(raw.decode("utf-8", "replace"))

    def request(self, method, path, body=None, headers=None, raw=None):
        """(status, headers, parsed JSON or text)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        text = r.read().decode("utf-8")
        c.close()
        try:
            payload = json.loads(text)
        except ValueError:
            payload = text
        return r.status, dict(r.getheaders()), payload

    def stop(self, sig):
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = None
        self.drain.join(timeout=10)
        return rc


def run_json(binary, model, args):
    r = subprocess.run([binary, "run", "-m", model, "--json"] + args, capture_output=True,
                       timeout=300)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.decode())
    return json.loads(r.stdout)


def events(text):
    """The data: payloads of an event stream."""
    out = []
    for block in text.split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            out.append(block[len("data: "):])
    return out


def stream_text(srv, path, body):
    status, headers, text = srv.request("POST", path, dict(body, stream=True))
    ev = events(text) if status == 200 else []
    chunks = [json.loads(e) for e in ev if e != "[DONE]"]
    key = "delta" if path.endswith("chat/completions") else None
    joined = "".join(c["choices"][0]["delta"].get("content", "") if key else c["choices"][0]["text"]
                     for c in chunks if c["choices"])
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    return status, headers, ev, chunks, joined, finishes


def is_error(payload, code):
    e = payload.get("error") if isinstance(payload, dict) else None
    return (isinstance(e, dict) and isinstance(e.get("message"), str) and e.get("type")
            and e.get("code") == code)


def test_answers(b, model, srv):
    msg = "Who begat Enos?"
    ref = run_json(b, model, ["--chat", "--chat-template", "chatml", "-p", msg, "--temp", "0",
                              "-n", "16"])
    chat = {"model": os.path.basename(model), "messages": [{"role": "user", "content": msg}],
            "temperature": 0, "max_tokens": 16}
    st, _, out = srv.request("POST", "/v1/chat/completions", chat)
    ok = st == 200 and out.get("object") == "chat.completion"
    check(ok and out["choices"][0]["message"]["content"] == ref["text"],
          "greedy chat completion = npumoe run --chat --temp 0", f"{out!r} vs {ref['text']!r}")
    check(ok and out["usage"] == {"prompt_tokens": ref["prompt_tokens"],
                                  "completion_tokens": ref["generated_tokens"],
                                  "total_tokens": ref["prompt_tokens"] + ref["generated_tokens"]},
          "chat usage counts = run's prompt and generated tokens", repr(out))
    check(ok and out["choices"][0]["finish_reason"] == "length" and ref["stop"] == "length",
          "finish_reason length at max_tokens", repr(out))

    prompt = "In the beginning God created"
    ref = run_json(b, model, ["-p", prompt, "--temp", "0.8", "--seed", "7", "-n", "12"])
    st, _, out = srv.request("POST", "/v1/completions",
                             {"prompt": prompt, "seed": 7, "max_tokens": 12})
    check(st == 200 and out["object"] == "text_completion" and
          out["choices"][0]["text"] == ref["text"] and
          out["usage"]["prompt_tokens"] == ref["prompt_tokens"] and
          out["usage"]["completion_tokens"] == 12,
          "seeded completion (default sampling) = npumoe run --seed 7", f"{out!r} vs {ref!r}")
    sampled = {"prompt": prompt, "seed": 3, "max_tokens": 12, "temperature": 1.2, "top_k": 20,
               "top_p": 0.9, "min_p": 0.01}
    ref = run_json(b, model, ["-p", prompt, "--temp", "1.2", "--top-k", "20", "--top-p", "0.9",
                              "--min-p", "0.01", "--seed", "3", "-n", "12"])
    st, _, out = srv.request("POST", "/v1/completions", sampled)
    check(st == 200 and out["choices"][0]["text"] == ref["text"],
          "temperature, top_k, top_p, min_p, seed as npumoe run's options", f"{out!r} vs {ref!r}")

    # a stop string cuts the text before it, finish_reason stop
    greedy = {"prompt": prompt, "temperature": 0, "max_tokens": 24}
    st, _, full = srv.request("POST", "/v1/completions", greedy)
    text = full["choices"][0]["text"]
    words = text.split(" ")
    stop = " " + words[len(words) // 2] if len(words) > 2 else text[2:4]
    cut = text[:text.find(stop)]
    st, _, out = srv.request("POST", "/v1/completions",
                             dict(greedy, stop=[stop, "never in this text"]))
    check(st == 200 and out["choices"][0]["text"] == cut and
          out["choices"][0]["finish_reason"] == "stop" and
          out["usage"]["completion_tokens"] < 24,
          "a stop string: text cut before it, finish_reason stop", f"{out!r}, stop {stop!r}")
    st, _, ev, chunks, joined, fin = stream_text(srv, "/v1/completions", dict(greedy, stop=stop))
    check(st == 200 and joined == cut and fin[-1] == "stop" and ev[-1] == "[DONE]",
          "streamed with a stop string: the same cut text", f"{joined!r} vs {cut!r}, {fin}")

    # streaming: chunks join into the non-streamed text, then [DONE]
    st, _, out = srv.request("POST", "/v1/chat/completions", chat)
    st2, headers, ev, chunks, joined, fin = stream_text(
        srv, "/v1/chat/completions", dict(chat, stream_options={"include_usage": True}))
    check(st2 == 200 and headers.get("Content-Type") == "text/event-stream" and
          ev[-1] == "[DONE]" and all(c["object"] == "chat.completion.chunk" for c in chunks) and
          chunks[0]["choices"][0]["delta"].get("role") == "assistant",
          "a stream: text/event-stream chunks, role first, ending with data: [DONE]", repr(ev[:3]))
    check(joined == out["choices"][0]["message"]["content"] and fin[-1] == "length" and
          all(f is None for f in fin[:-1]),
          "streamed chat chunks join into the non-streamed text; finish_reason on the last",
          f"{joined!r} vs {out!r}")
    check(chunks[-1]["choices"] == [] and chunks[-1]["usage"] == out["usage"],
          "stream_options.include_usage: a last chunk with the usage", repr(chunks[-1]))
    st, _, ev, chunks, joined, fin = stream_text(srv, "/v1/completions", greedy)
    check(st == 200 and joined == text and ev[-1] == "[DONE]" and fin[-1] == "length",
          "streamed completion joins into the non-streamed text", f"{joined!r} vs {text!r}")


def test_curl(srv):
    """curl, a client written by others, for the raw shapes: the status line,
    the headers and the bytes of a whole answer and of a stream."""
    url = f"http://127.0.0.1:{srv.port}/v1/completions"
    body = json.dumps({"prompt": "In the beginning", "max_tokens": 4, "temperature": 0})
    r = subprocess.run(["curl", "-sS", "-i", "-H", "Content-Type: application/json", "-d", body,
                        url], capture_output=True, timeout=120)
    head, _, payload = r.stdout.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    out = json.loads(payload) if r.returncode == 0 and payload else {}
    check(r.returncode == 0 and lines[0].startswith("HTTP/1.1 200") and
          "content-type: application/json" in [l.lower() for l in lines] and
          set(out) >= {"id", "object", "created", "model", "choices", "usage"} and
          out["object"] == "text_completion" and out["choices"][0]["index"] == 0 and
          out["choices"][0]["finish_reason"] == "length" and
          out["usage"]["completion_tokens"] == 4,
          "curl: a completion's status line, Content-Type and OpenAI fields", repr(r.stdout[:400]))
    stream = json.dumps({"prompt": "In the beginning", "max_tokens": 4, "temperature": 0,
                         "stream": True})
    r = subprocess.run(["curl", "-sS", "-N", "-i", "-H", "Content-Type: application/json", "-d",
                        stream, url], capture_output=True, timeout=120)
    head, _, payload = r.stdout.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    text = payload.decode()
    events = [e for e in text.split("\n\n") if e]
    ok = (r.returncode == 0 and lines[0].startswith("HTTP/1.1 200") and
          "content-type: text/event-stream" in [l.lower() for l in lines] and
          text.endswith("data: [DONE]\n\n") and all(e.startswith("data: ") for e in events))
    chunks = [json.loads(e[6:]) for e in events[:-1]] if ok else []
    check(ok and len(chunks) >= 2 and all(c["object"] == "text_completion" for c in chunks) and
          chunks[-1]["choices"][0]["finish_reason"] == "length",
          "curl: a stream is text/event-stream, 'data: {...}' events ending with data: [DONE]",
          repr(r.stdout[:400]))


def read_metrics(srv, auth=None):
    """GET /metrics parsed: {(name, ((label, value), ...)): float}; None when a
    line is not Prometheus text (then a failed check says which)."""
    st, headers, text = srv.request("GET", "/metrics", headers=auth)
    out = {}
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$')
    for line in text.splitlines() if st == 200 and isinstance(text, str) else ["<no text>"]:
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        m = line_re.match(line)
        if not m:
            check(False, "/metrics: every line is Prometheus text", repr(line))
            return None
        labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")))
        out[(m.group(1), labels)] = float(m.group(3))
    out[("content-type", ())] = headers.get("Content-Type", "")
    return out


def metric(values, name, **labels):
    return (values or {}).get((name, tuple(sorted(labels.items()))), 0.0)


def wait_for(srv, cond, auth=None, limit_s=120):
    """Polls /metrics until cond(values) holds (True) or limit_s passes."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if cond(read_metrics(srv, auth)):
            return True
        time.sleep(0.02)
    return False


def open_raw(srv, body, auth=None):
    """A request on a socket of its own, the answer not read yet."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n")
    for k, v in (auth or {}).items():
        head += f"{k}: {v}\r\n"
    s.sendall(head.encode() + b"\r\n" + data)
    return s


def read_until(s, marker):
    got = b""
    while marker not in got:
        b = s.recv(4096)
        if not b:
            break
        got += b
    return got


def test_queue_and_leave(b, model, auth=None, extra=()):
    """One slot, a queue of one: a long stream A (4000 tokens, about half a
    minute here) holds the slot, B waits in the queue (/metrics says 1), C
    gets 503 with an OpenAI-shaped error; A's client closes its connection
    after the first chunk: A ends as cancelled and B takes the slot; B's
    client leaves while it waits for tokens: cancelled too, the slot free;
    a request then is served (the queue bound 0 + 1 free slot takes it).
    Nothing here depends on time but the 4000 tokens outlasting a few
    requests on loopback."""
    srv = Server(b, model, ["-c", "4096", "-t", "2", "--parallel", "1", "--queue", "1"]
                 + list(extra))
    try:
        long = {"prompt": "And", "stream": True, "max_tokens": 4000, "temperature": 0}
        a = open_raw(srv, long, auth)
        first = read_until(a, b"data: ")
        bq = open_raw(srv, long, auth)
        queued = wait_for(srv, lambda v: metric(v, "npumoe_queue_length") == 1, auth)
        st, _, out = srv.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2},
                                 auth)
        check(b"data: " in first and queued and st == 503 and is_error(out, "server_busy"),
              "a full queue: 503 with an OpenAI-shaped error",
              f"{first[-80:]!r} queued={queued} {st} {out!r}")
        a.close()
        moved = wait_for(srv, lambda v: metric(v, "npumoe_completions_total", finish="cancelled")
                         == 1 and metric(v, "npumoe_queue_length") == 0 and
                         metric(v, "npumoe_slots_busy") == 1, auth)
        check(moved, "a client that leaves mid-stream: its job cancelled, the waiting one "
              "takes the slot", "")
        bq.close()
        freed = wait_for(srv, lambda v: metric(v, "npumoe_completions_total", finish="cancelled")
                         == 2 and metric(v, "npumoe_slots_busy") == 0, auth)
        v = read_metrics(srv, auth)
        check(freed and metric(v, "npumoe_generated_tokens_total") < 8000 and
              metric(v, "npumoe_completions_total", finish="length") == 0,
              "a client that leaves while waiting for tokens: cancelled, the slot freed",
              repr({k: x for k, x in (v or {}).items() if "completions" in k[0]}))
        st, _, out = srv.request("POST", "/v1/completions",
                                 {"prompt": "And", "max_tokens": 3, "temperature": 0}, auth)
        check(st == 200 and out["usage"]["completion_tokens"] == 3,
              "after the clients left, a request is served", f"{st} {out!r}")
    finally:
        rc = srv.stop(signal.SIGTERM)
    check(rc == 0, "the server exits 0 after clients left", f"exit {rc}")


def test_load(b, model):
    """A bounded load on loopback: 40 requests from 8 clients on 4 slots
    (plain and chat, streamed and not, every fifth client leaving after its
    first chunk), all within a generous limit. Every answer that was read
    whole is complete; the server then exits 0 with nothing from a
    sanitizer on stderr (the ASan build of the CI runs this test)."""
    srv = Server(b, model, ["-c", "128", "-t", "2", "--parallel", "4", "--queue", "40",
                            "--chat-template", "chatml"])
    todo = list(range(40))
    lock = threading.Lock()
    bad = []
    deadline = time.monotonic() + 240

    def client():
        while time.monotonic() < deadline:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            chat = i % 3 == 0
            path = "/v1/chat/completions" if chat else "/v1/completions"
            body = ({"messages": [{"role": "user", "content": f"Question {i}?"}]} if chat
                    else {"prompt": f"Verse {i}: and"})
            body.update(max_tokens=4 + i % 9, temperature=0.7, seed=i)
            try:
                if i % 5 == 4:
                    s = open_raw(srv, dict(body, stream=True, prompt=f"Verse {i}"))
                    read_until(s, b"data: ")
                    s.close()
                elif i % 2:
                    st, _, ev, chunks, joined, fin = stream_text(srv, path, body)
                    if st != 200 or ev[-1] != "[DONE]" or fin[-1] not in ("stop", "length"):
                        bad.append((i, st, ev[-2:]))
                else:
                    st, _, out = srv.request("POST", path, body)
                    if st != 200 or out["choices"][0]["finish_reason"] not in ("stop", "length"):
                        bad.append((i, st, out))
            except Exception as e:  # a failure of the server, reported as such
                bad.append((i, repr(e)))

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(not todo and not bad, "a bounded load (40 requests, 8 clients, 4 slots, some "
          "leaving): every answer read whole is complete", repr(bad[:3]))
    v = read_metrics(srv)
    ended = sum(metric(v, "npumoe_completions_total", finish=f)
                for f in ("stop", "length", "cancelled"))
    check(wait_for(srv, lambda v: metric(v, "npumoe_slots_busy") == 0) and
          metric(v, "npumoe_completions_total", finish="error") == 0 and ended <= 40,
          "after the load: no failed generation, every slot free", repr(v))
    rc = srv.stop(signal.SIGTERM)
    err = "".join(srv.lines)
    check(rc == 0 and "Sanitizer" not in err and "runtime error" not in err,
          "after the load the server exits 0, no sanitizer report", err[-2000:])


def test_plan(b, model):
    """A server with --plan PLAN --device cpu prefills each request through
    the static path: its answers equal npumoe run's with the same plan, on 2
    slots at once, and /metrics has the static path's counters."""
    tmp = tempfile.mkdtemp(prefix="nm_serve_")
    text = os.path.join(tmp, "text.txt")
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "..", "models", "heldout.txt"), encoding="utf-8") as f, \
            open(text, "w", encoding="utf-8") as g:
        g.write(f.read()[:6000])
    calib, prof, plan = (os.path.join(tmp, n) for n in ("c.json", "p.json", "plan.json"))
    steps = [["calibrate", "-m", model, "-f", text, "--chunk", "32", "-o", calib],
             ["profile", "-m", model, "--chunk", "32", "--reps", "1", "--grid-experts", "1,4",
              "--grid-capacity", "4,32", "-o", prof],
             ["plan", "-m", model, "--calib", calib, "--profile", prof, "-o", plan]]
    for args in steps:
        r = subprocess.run([b] + args, capture_output=True, timeout=300)
        if r.returncode != 0:
            check(False, f"npumoe {args[0]} for the plan test", r.stderr.decode()[-300:])
            return
    prompts = ["And the earth was without form, and void; and darkness was upon the face of "
               "the deep. And the Spirit of God moved upon the face of the waters.",
               "Now the serpent was more subtil than any beast of the field which the LORD God "
               "had made. And he said unto the woman"]
    refs = [run_json(b, model, ["--plan", plan, "--device", "cpu", "-p", p, "--temp", "0",
                                "-n", "12", "-c", "128"]) for p in prompts]
    srv = Server(b, model, ["-c", "128", "-t", "2", "--parallel", "2", "--plan", plan,
                            "--device", "cpu"])
    try:
        results = [None] * len(prompts)

        def client(i):
            results[i] = srv.request("POST", "/v1/completions",
                                     {"prompt": prompts[i], "max_tokens": 12, "temperature": 0})

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = [r[2]["choices"][0]["text"] if r and r[0] == 200 else r for r in results]
        check(got == [r["text"] for r in refs],
              "a plan-backed server (2 slots at once) answers as npumoe run --plan",
              f"{got!r} vs {[r['text'] for r in refs]!r}")
        v = read_metrics(srv)
        check(metric(v, "npumoe_static_chunks_total") > 0 and
              metric(v, "npumoe_static_assignments_total") > 0 and
              (v or {}).get(("npumoe_static_dropped_total", ())) is not None,
              "/metrics with a plan: the static path's counters", repr(v))
    finally:
        rc = srv.stop(signal.SIGTERM)
    check(rc == 0, "the plan-backed server exits 0", f"exit {rc}")
    shutil.rmtree(tmp, ignore_errors=True)


def test_stop_mid_stream(b, model):
    """SIGTERM while one stream generates (4000 tokens asked) and another
    waits for the slot: the first ends at its next token with
    finish_reason length and [DONE], the waiting one gets an error event
    (server_stopping), and the server exits 0."""
    srv = Server(b, model, ["-c", "4096", "-t", "2", "--parallel", "1", "--queue", "1"])
    long = {"prompt": "And", "stream": True, "max_tokens": 4000, "temperature": 0}
    a = open_raw(srv, long)
    read_until(a, b"data: ")
    w = open_raw(srv, long)
    queued = wait_for(srv, lambda v: metric(v, "npumoe_queue_length") == 1)
    rc = srv.stop(signal.SIGTERM)
    got_a = read_until(a, b"data: [DONE]")
    got_w = read_until(w, b"data: [DONE]")
    a.close()
    w.close()
    check(queued and rc == 0 and b'"finish_reason":"length"' in got_a and
          b"data: [DONE]" in got_a and b"server_stopping" in got_w,
          "SIGTERM mid-stream: the stream ends (length, [DONE]), the waiting one gets "
          "server_stopping, exit 0", f"exit {rc}: {got_a[-200:]!r} {got_w[-300:]!r}")


def test_batched_steps(b, model):
    """Two long streams on 2 slots run in the same decode steps: once both
    have sent a chunk, /metrics' decode rows outgrow its steps (each step
    one batch of both); when their clients leave, both are cancelled."""
    srv = Server(b, model, ["-c", "4096", "-t", "2", "--parallel", "2"])
    try:
        long = {"prompt": "And", "stream": True, "max_tokens": 4000, "temperature": 0}
        a = open_raw(srv, long)
        read_until(a, b"data: ")
        c = open_raw(srv, dict(long, prompt="In the beginning"))
        read_until(c, b"data: ")
        base = read_metrics(srv)
        extra = metric(base, "npumoe_decode_rows_total") - metric(base, "npumoe_decode_steps_total")
        batched = wait_for(srv, lambda v: metric(v, "npumoe_decode_rows_total") -
                           metric(v, "npumoe_decode_steps_total") >= extra + 20)
        a.close()
        c.close()
        gone = wait_for(srv, lambda v: metric(v, "npumoe_completions_total", finish="cancelled")
                        == 2 and metric(v, "npumoe_slots_busy") == 0)
        check(batched and gone, "two streams at once: their decode steps are one batch of 2 "
              "rows; both cancelled when their clients leave", repr(read_metrics(srv)))
    finally:
        srv.stop(signal.SIGTERM)


def test_concurrency(b, model):
    """8 clients at once on 2 slots (half of them streaming): every answer
    complete and equal to the same request sent alone, which equals npumoe
    run's; then /metrics' counters against what was sent."""
    srv = Server(b, model, ["-c", "128", "-t", "2", "--parallel", "2", "--queue", "8"])
    try:
        prompts = ["And God said", "In the beginning", "The LORD is my shepherd",
                   "Now these are the generations", "And it came to pass",
                   "Blessed is the man", "Hear, O Israel", "Let there be light"]
        bodies = [{"prompt": p, "max_tokens": 8 + 3 * i, "temperature": 0}
                  for i, p in enumerate(prompts)]
        alone = [srv.request("POST", "/v1/completions", body)[2] for body in bodies]
        ref = run_json(b, model, ["-p", prompts[2], "--temp", "0", "-n", "14", "-c", "128"])
        check(alone[2]["choices"][0]["text"] == ref["text"],
              "a greedy answer alone = npumoe run's", f"{alone[2]!r} vs {ref['text']!r}")
        results = [None] * len(bodies)

        def client(i):
            if i % 2:
                st, _, ev, chunks, joined, fin = stream_text(srv, "/v1/completions", bodies[i])
                results[i] = (st, joined, fin[-1] if fin else None, ev[-1] if ev else None)
            else:
                st, _, out = srv.request("POST", "/v1/completions", bodies[i])
                c = out["choices"][0] if st == 200 else {}
                results[i] = (st, c.get("text"), c.get("finish_reason"), "[DONE]")

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        bad = [(i, r, alone[i]["choices"][0]) for i, r in enumerate(results)
               if r is None or r[0] != 200 or r[3] != "[DONE]" or
               r[1] != alone[i]["choices"][0]["text"] or
               r[2] != alone[i]["choices"][0]["finish_reason"]]
        check(not bad, "8 clients at once on 2 slots: every answer complete and equal to the "
              "one-at-a-time answer", repr(bad))
        v = read_metrics(srv)
        check((v or {}).get(("content-type", ()), "").startswith("text/plain; version=0.0.4"),
              "/metrics: Prometheus's content type", repr(v))
        n = len(bodies)
        gen = 2 * sum(a["usage"]["completion_tokens"] for a in alone)
        prompt_tokens = 2 * sum(a["usage"]["prompt_tokens"] for a in alone)
        ended = sum(metric(v, "npumoe_completions_total", finish=f) for f in ("stop", "length"))
        check(metric(v, "npumoe_requests_total", route="/v1/completions", status="200") == 2 * n
              and metric(v, "npumoe_generated_tokens_total") == gen and
              metric(v, "npumoe_prompt_tokens_total") == prompt_tokens and ended == 2 * n and
              metric(v, "npumoe_time_to_first_token_seconds_count") == 2 * n and
              metric(v, "npumoe_time_to_first_token_seconds_bucket", le="+Inf") == 2 * n and
              metric(v, "npumoe_slots") == 2 and metric(v, "npumoe_slots_busy") == 0 and
              metric(v, "npumoe_queue_length") == 0 and
              metric(v, "npumoe_decode_rows_total") >= metric(v, "npumoe_decode_steps_total") > 0,
              "/metrics: requests, tokens, completions, TTFT, slots and queue match what was sent",
              repr(v))
        buckets = [x for (name, _), x in sorted((v or {}).items())
                   if name == "npumoe_generation_tokens_per_second_bucket"]
        check(len(buckets) == 12, "/metrics: a generation-speed histogram", repr(buckets))
    finally:
        srv.stop(signal.SIGTERM)


def test_errors(srv, model):
    n_ctx = 128
    cases = [
        ("malformed JSON", "POST", "/v1/chat/completions", b'{"messages": [', 400,
         "invalid_json"),
        ("a body that is not an object", "POST", "/v1/completions", b"[1, 2]", 400,
         "invalid_type"),
        ("temperature of the wrong type", "POST", "/v1/completions",
         json.dumps({"prompt": "Hi", "temperature": "hot"}).encode(), 400, "invalid_type"),
        ("max_tokens of the wrong type", "POST", "/v1/completions",
         json.dumps({"prompt": "Hi", "max_tokens": 2.5}).encode(), 400, "invalid_type"),
        ("top_p out of range", "POST", "/v1/completions",
         json.dumps({"prompt": "Hi", "top_p": 2}).encode(), 400, "invalid_type"),
        ("stop of the wrong type", "POST", "/v1/completions",
         json.dumps({"prompt": "Hi", "stop": 5}).encode(), 400, "invalid_type"),
        ("stream of the wrong type", "POST", "/v1/completions",
         json.dumps({"prompt": "Hi", "stream": "yes"}).encode(), 400, "invalid_type"),
        ("messages of the wrong type", "POST", "/v1/chat/completions",
         json.dumps({"messages": "Hi"}).encode(), 400, "invalid_type"),
        ("a message without content", "POST", "/v1/chat/completions",
         json.dumps({"messages": [{"role": "user"}]}).encode(), 400, "invalid_type"),
        ("no prompt", "POST", "/v1/completions", b"{}", 400, "invalid_type"),
        ("an unknown model", "POST", "/v1/completions",
         json.dumps({"model": "gpt-4", "prompt": "Hi"}).encode(), 404, "model_not_found"),
        ("an unknown route", "GET", "/v1/embeddings", None, 404, "unknown_url"),
        ("the wrong method", "GET", "/v1/chat/completions", None, 405, "method_not_allowed"),
        ("a body over the limit", "POST", "/v1/completions",
         b'{"prompt": "' + b"a" * (2 << 20) + b'"}', 413, "request_too_large"),
    ]
    for what, method, path, raw, status, code in cases:
        st, headers, out = srv.request(method, path, raw=raw)
        check(st == status and is_error(out, code), f"{what}: {status} with code {code}",
              f"{st} {out!r}")
        if status == 405:
            check(headers.get("Allow") == "POST", "405 says the method allowed", repr(headers))
    st, _, out = srv.request("POST", "/v1/completions", {"prompt": "And the " * 200})
    msg = out.get("error", {}).get("message", "") if isinstance(out, dict) else ""
    check(st == 400 and is_error(out, "context_length_exceeded") and str(n_ctx) in msg and
          "tokens" in msg, "a prompt longer than the context: 400 with the numbers", repr(out))
    st, _, out = srv.request("POST", "/v1/completions", {"prompt": "And", "max_tokens": n_ctx})
    check(st == 400 and is_error(out, "context_length_exceeded"),
          "max_tokens beyond what the context holds: 400", repr(out))
    st, _, out = srv.request("POST", "/v1/completions",
                             {"prompt": "And", "max_tokens": 2, "unknown_field": [1],
                              "stop": ""})
    check(st == 200 and out["usage"]["completion_tokens"] == 2,
          "unknown fields (and an empty stop) are ignored; the server serves after bad requests",
          repr(out))


def test_api_key(b, model):
    srv = Server(b, model, ["--api-key", "s3cret", "-c", "4096"])
    st, _, out = srv.request("GET", "/health")
    check(st == 200 and out == {"status": "ok"}, "/health needs no key", repr(out))
    for what, headers in [("no key", {}), ("a wrong key", {"Authorization": "Bearer s3creT"}),
                          ("a longer key", {"Authorization": "Bearer s3cret0"}),
                          ("not a bearer", {"Authorization": "s3cret"})]:
        for method, path in [("GET", "/v1/models"), ("POST", "/v1/completions"),
                             ("GET", "/nowhere")]:
            st, _, out = srv.request(method, path, {"prompt": "Hi"} if method == "POST" else None,
                                     headers)
            check(st == 401 and is_error(out, "invalid_api_key"), f"{what}: 401 on {path}",
                  f"{st} {out!r}")
    good = {"Authorization": "Bearer s3cret"}
    st, _, out = srv.request("GET", "/v1/models", headers=good)
    check(st == 200 and out["data"][0]["id"] == os.path.basename(model),
          "the right key: /v1/models lists the model", repr(out))
    st, _, out = srv.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2}, good)
    check(st == 200, "the right key: a completion", repr(out))
    rc = srv.stop(signal.SIGINT)
    check(rc == 0, "SIGINT: the server exits 0", f"exit {rc}")


def test_model_name(b, model):
    """A file name that is not UTF-8 and longer than the id's 255 bytes: the id
    has U+FFFD for the bad bytes and is cut on a whole character, and the
    responses that carry it are sent."""
    with tempfile.TemporaryDirectory() as d:
        name = b"tiny-\xff\xfe-" + ("\u00e9" * 120).encode() + b".gguf"
        path = os.path.join(os.fsencode(d), name)
        os.symlink(os.path.abspath(model), path)
        want = name.decode("utf-8", "replace").encode()[:255].decode("utf-8", "ignore")
        srv = Server(b, path, ["-c", "128"])
        try:
            st, _, out = srv.request("GET", "/v1/models")
            check(st == 200 and out["data"][0]["id"] == want,
                  "a file name that is not UTF-8: /v1/models gives it with U+FFFD, cut whole",
                  repr(out)[:300])
            st, _, out = srv.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
            check(st == 200 and out["model"] == want, "... and a completion carries it",
                  repr(out)[:300])
        finally:
            rc = srv.stop(signal.SIGTERM)
        check(rc == 0, "... and the server exits 0", f"exit {rc}")


def closed_within(s, limit_s):
    """Whether the server closes s (recv gives nothing, or a reset) within
    limit_s seconds, reading and dropping whatever it sends first."""
    s.settimeout(limit_s)
    try:
        while s.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_slow_and_many(b, model):
    """--timeout 2: a client that sends half its body and then nothing is cut
    off after about 2 s (well before 20 s). --max-connections 4: with four
    silent connections open, a fifth is not answered (it waits, unaccepted);
    once they close, it is answered, and so is a normal request."""
    srv = Server(b, model, ["-c", "128", "-t", "2", "--timeout", "2"])
    try:
        body = json.dumps({"prompt": "Once", "max_tokens": 2, "temperature": 0}).encode()
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                  f"{len(body)}\r\n\r\n".encode() + body[:5])
        t0 = time.monotonic()
        closed = closed_within(s, 20)
        took = time.monotonic() - t0
        s.close()
        check(closed and took < 15, "--timeout 2: a body sent slowly is cut off",
              f"closed={closed} after {took:.1f} s")
        st, _, out = srv.request("POST", "/v1/completions", body=json.loads(body))
        check(st == 200 and out["choices"][0]["finish_reason"] == "length",
              "after the slow client a request is answered", repr(out)[:300])
    finally:
        rc = srv.stop(signal.SIGTERM)
    check(rc == 0, "the server exits 0 after it", f"exit {rc}")

    srv = Server(b, model, ["-c", "128", "-t", "2", "--timeout", "60", "--max-connections", "4"])
    try:
        idle = [socket.create_connection(("127.0.0.1", srv.port), timeout=60) for _ in range(4)]
        time.sleep(0.5)  # the server has taken all four
        fifth = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
        fifth.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        fifth.settimeout(2)  # an answer would come at once
        try:
            early = fifth.recv(4096)
        except socket.timeout:
            early = b""
        check(early == b"", "--max-connections 4: a fifth connection is not answered while four "
              "are open", repr(early[:200]))
        for c in idle:
            c.close()
        fifth.settimeout(30)
        got = early
        try:
            while True:
                chunk = fifth.recv(4096)
                if not chunk:
                    break
                got += chunk
        except (socket.timeout, ConnectionResetError):
            pass
        fifth.close()
        check(got.startswith(b"HTTP/1.1 200") and got.endswith(b'{"status":"ok"}'),
              "--max-connections 4: the fifth is answered once the four close", repr(got[:200]))
    finally:
        rc = srv.stop(signal.SIGTERM)
    check(rc == 0, "the server exits 0 after them", f"exit {rc}")

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    b, model = a.binary, a.model

    r = subprocess.run([b, "serve", "-m", model, "--host", "0.0.0.0", "--port", "0"],
                       capture_output=True, timeout=120)
    err = r.stderr.decode()
    check(r.returncode == 1 and "--api-key" in err and "--insecure" in err,
          "a non-loopback host without --api-key is refused, naming --api-key and --insecure",
          err)

    srv = Server(b, model, ["--chat-template", "chatml", "-c", "128", "-t", "2"])
    try:
        st, _, out = srv.request("GET", "/health")
        check(st == 200 and out == {"status": "ok"}, "/health", repr(out))
        st, _, out = srv.request("GET", "/v1/models")
        check(st == 200 and out["object"] == "list" and
              out["data"][0]["id"] == os.path.basename(model), "/v1/models", repr(out))
        test_answers(b, model, srv)
        test_curl(srv)
        test_errors(srv, model)
    finally:
        rc = srv.stop(signal.SIGTERM)
    check(rc == 0 and any("SIGTERM" in l for l in srv.lines), "SIGTERM: the server exits 0",
          f"exit {rc}: {''.join(srv.lines)[-500:]}")
    test_api_key(b, model)
    test_model_name(b, model)
    test_queue_and_leave(b, model, {"Authorization": "Bearer k"}, ["--api-key", "k"])
    test_stop_mid_stream(b, model)
    test_batched_steps(b, model)
    test_concurrency(b, model)
    test_plan(b, model)
    test_load(b, model)
    test_slow_and_many(b, model)
    print(f"test_serve: {test_cli.passed} passed, {test_cli.failed} failed")
    return 1 if test_cli.failed else 0


if __name__ == "__main__":
    sys.exit(main())
