#!/usr/bin/env python3
"""A fixed client load against an OpenAI-compatible server (npumoe serve,
llama-server): C clients at once send R streamed completion requests in all
(greedy, max_tokens N, a different prompt each), and the script reports
requests/s, generated tokens/s, and the mean and median time to the first
streamed token, measured at the client. Standard library only.

Usage: serve_load.py --url http://127.0.0.1:8080 [--clients 8] [--requests 32]
                     [--max-tokens 64] [--prompt-words 8] [--json]
"""
import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse

WORDS = ("and the LORD said unto Moses in the beginning God created heaven earth light "
         "darkness waters spirit face deep day night evening morning firmament seas").split()


def prompt(i, n_words):
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n_words))


def one(url, body):
    """(seconds to the first token, seconds in all, tokens generated)."""
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    t0 = time.monotonic()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:200]!r}")
    first = None
    tokens = None
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            data = event[len(b"data: "):] if event.startswith(b"data: ") else b""
            if not data or data == b"[DONE]":
                continue
            j = json.loads(data)
            if first is None and j.get("choices") and j["choices"][0].get("text"):
                first = time.monotonic() - t0
            if j.get("usage"):
                tokens = j["usage"]["completion_tokens"]
    c.close()
    return first if first is not None else time.monotonic() - t0, time.monotonic() - t0, tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-words", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    todo = list(range(a.requests))
    lock = threading.Lock()
    results, errors = [], []

    def client():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            body = {"prompt": prompt(i, a.prompt_words), "max_tokens": a.max_tokens,
                    "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
            try:
                res = one(a.url, body)
                with lock:
                    results.append(res)
            except Exception as e:  # reported, not hidden
                with lock:
                    errors.append(str(e))

    t0 = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    tokens = sum(r[2] or 0 for r in results)
    ttft = [r[0] for r in results]
    out = {"clients": a.clients, "requests": len(results), "errors": len(errors),
           "max_tokens": a.max_tokens, "wall_s": round(wall, 3),
           "requests_per_s": round(len(results) / wall, 3),
           "tokens_per_s": round(tokens / wall, 1), "generated_tokens": tokens,
           "ttft_mean_ms": round(1000 * statistics.mean(ttft), 1) if ttft else None,
           "ttft_median_ms": round(1000 * statistics.median(ttft), 1) if ttft else None}
    if a.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:16} {v}")
    for e in errors[:5]:
        print("error:", e)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
