#!/usr/bin/env python3
"""The vulkan device as a user meets it through the command: `npumoe devices`,
the errors of --device, and the NPUMoE loop (profile, plan, logits in every
static mode, compare, bench) with --device vulkan, whose logits must equal dense's
within 1e-3 of the largest logit (the device sums in FP32 in another order).
Without a usable Vulkan driver it checks that --device vulkan says why, and
exits 77 (skipped) unless NM_REQUIRE_VULKAN is set."""
import argparse
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

passed = 0
failed = 0


def check(cond, what, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {what}" + (f"\n      {detail}" if detail else ""))


def run(binary, args):
    return subprocess.run([binary] + args, capture_output=True, timeout=600)


def expect_error(binary, args, needle, what):
    r = run(binary, args)
    err = r.stderr.decode("utf-8", "replace")
    lines = [l for l in err.splitlines() if l.strip()]
    ok = (r.returncode == 1 and len(lines) == 1 and lines[0].startswith("npumoe: ")
          and needle.lower() in err.lower())
    check(ok, f"{what}: exit 1 with one line naming '{needle}'",
          f"exit {r.returncode}, stderr {err!r}")


def floats(path):
    with open(path, "rb") as f:
        data = f.read()
    return struct.unpack("<%df" % (len(data) // 4), data)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("npumoe")
    ap.add_argument("--default-model", required=True)
    ap.add_argument("--text", required=True, help="a text to calibrate and prompt with")
    a = ap.parse_args()
    bin_, model = a.npumoe, a.default_model
    tmp = tempfile.mkdtemp(prefix="nm_vk_cli_")

    r = run(bin_, ["devices"])
    out = r.stdout.decode()
    check(r.returncode == 0 and out.splitlines()[1].startswith("cpu "), "devices lists cpu first",
          out)
    if "vulkan:0" not in out:
        check("vulkan: not available:" in out, "devices says why Vulkan cannot be used", out)
        expect_error(bin_, ["run", "-m", model, "--mode", "grouped", "--device", "vulkan", "-p",
                            "x"], "vulkan", "--device vulkan without Vulkan")
        print(f"test_vulkan_cli: {passed} passed, {failed} failed (no Vulkan device)")
        if failed or os.environ.get("NM_REQUIRE_VULKAN"):
            return 1
        return 77
    vk0 = [l for l in out.splitlines() if l.startswith("vulkan:0 ")]
    check(len(vk0) == 1 and "GiB" in vk0[0], "devices lists vulkan:0 with its memory", out)

    calib = os.path.join(tmp, "calib.json")
    prof = os.path.join(tmp, "profile.json")
    plan = os.path.join(tmp, "plan.json")
    r = run(bin_, ["calibrate", "-m", model, "-f", a.text, "--chunk", "32", "-o", calib])
    check(r.returncode == 0, "calibrate", r.stderr.decode()[-300:])
    expect_error(bin_, ["profile", "-m", model, "--chunk", "32", "--device", "vulkan:99", "-o",
                        prof], "vulkan:99 does not exist", "a device index that does not exist")
    expect_error(bin_, ["profile", "-m", model, "--chunk", "32", "--device", "vulkan:one", "-o",
                        prof], "device index", "a device index that is not a number")
    r = run(bin_, ["profile", "-m", model, "--chunk", "32", "--reps", "1", "--grid-experts", "1,4",
                   "--grid-capacity", "4,32", "--device", "vulkan", "-o", prof])
    check(r.returncode == 0 and b"device vulkan: dispatch+sync" in r.stdout,
          "profile --device vulkan measures the vulkan device", (r.stdout + r.stderr).decode()[-400:])
    m = re.search(rb"dense part of a layer over a chunk of 32: device ([0-9.]+) ms, host ([0-9.]+) ms",
                  r.stdout)
    check(m is not None and float(m.group(1)) > 0 and float(m.group(2)) > 0,
          "profile --device vulkan measures the dense part on both sides", r.stdout.decode())
    r = run(bin_, ["plan", "-m", model, "--calib", calib, "--profile", prof, "-o", plan,
                   "--overflow", "spill"])
    check(r.returncode == 0, "plan from the vulkan profile", r.stderr.decode())
    # the dense part goes where the profile measured it cheaper, in every layer
    with open(prof, encoding="utf-8") as f:
        pj = json.load(f)
    with open(plan, encoding="utf-8") as f:
        n_layer = json.load(f)["n_layer"]
    on = pj["dense_device_ms"] < pj["dense_host_ms"]
    want_line = f"dense part: on the device in {n_layer if on else 0} of {n_layer} layers"
    check(want_line in r.stdout.decode(), "plan: the dense part where the profile says",
          r.stdout.decode()[-600:])
    plan_dev = os.path.join(tmp, "plan-dense-device.json")
    r = run(bin_, ["plan", "-m", model, "--calib", calib, "--profile", prof, "-o", plan_dev,
                   "--overflow", "spill", "--dense", "device"])
    check(r.returncode == 0 and
          f"dense part: on the device in {n_layer} of {n_layer} layers" in r.stdout.decode(),
          "plan --dense device", r.stdout.decode()[-600:] + r.stderr.decode())
    expect_error(bin_, ["plan", "-m", model, "--calib", calib, "--profile", prof, "-o", plan_dev,
                        "--dense", "gpu"], "profile, host or device", "plan --dense gpu")

    with open(a.text, encoding="utf-8") as f:
        paragraph = f.read()[:600]
    dense_l = os.path.join(tmp, "dense.f32")
    r = run(bin_, ["logits", "-m", model, "-p", paragraph, "-o", dense_l, "--all", "--chunk", "32"])
    check(r.returncode == 0, "dense logits", r.stderr.decode())
    want = floats(dense_l) if r.returncode == 0 else ()
    top = max((abs(v) for v in want), default=1.0)
    for mode, pl in [("naive", plan), ("tiers", plan), ("grouped", plan), ("npumoe", plan),
                     ("npumoe", plan_dev)]:
        out = os.path.join(tmp, mode + ".f32")
        r = run(bin_, ["logits", "-m", model, "-p", paragraph, "-o", out, "--all", "--plan", pl,
                       "--mode", mode, "--device", "vulkan"])
        got = floats(out) if r.returncode == 0 else ()
        diff = max((abs(x - y) for x, y in zip(got, want)), default=1e9)
        check(len(got) == len(want) and diff <= 1e-3 * top,
              f"logits in mode {mode} ({os.path.basename(pl)}) on --device vulkan equal dense's "
              "within 1e-3",
              f"max diff {diff:g} of {top:g}; {r.stderr.decode()[-300:]}")
    # metrics: the device's work per layer and chunk, CPU time, energy or why not
    r = run(bin_, ["run", "-m", model, "-p", paragraph, "-n", "1", "--plan", plan_dev, "--mode",
                   "npumoe", "--device", "vulkan"])
    err = r.stderr.decode()
    m = re.search(r"energy: +(not available \(.+\)|[0-9.]+ J \(RAPL)", err)
    check(r.returncode == 0 and m is not None, "run: energy in joules or 'not available'", err)
    m = re.search(r"device work: +(\d+) dispatches \((\d+) dense parts\), (\d+) syncs", err)
    check(m is not None and int(m.group(1)) >= 1 and m.group(1) == m.group(2) and
          int(m.group(3)) >= int(m.group(1)), "run: dispatches (all dense parts) and syncs", err)
    check(re.search(r"prefill CPU: +[0-9.]+ ms \(user\+sys of the process, getrusage\) in "
                    r"[0-9.]+ ms wall", err) is not None and "  layer  0: " in err,
          "run: host CPU beside wall time, per-layer device work", err)
    # a budget of exactly what the graphs hold: the copy of the prompt's K/V
    # to the host for the first decode step cannot get its buffer
    m = re.search(r"device memory: +(\d+) bytes held by the graphs", err)
    check(m is not None and int(m.group(1)) > 0, "run: the graphs' device memory", err)
    if m:
        expect_error(bin_, ["run", "-m", model, "-p", paragraph, "-n", "2", "--plan", plan_dev,
                            "--mode", "npumoe", "--device", "vulkan", "--device-budget",
                            m.group(1)], "reading a dense graph's K/V needs",
                     "a K/V copy beyond the device budget")
    r = run(bin_, ["run", "-m", model, "-p", paragraph, "-n", "1", "--plan", plan_dev, "--mode",
                   "npumoe", "--device", "vulkan", "--json"])
    try:
        doc = json.loads(r.stdout.decode())
    except ValueError:
        doc = {}
    pre, dev = doc.get("prefill", {}), doc.get("moe", {}).get("device") or {}
    e = pre.get("energy_j", "missing")
    check((e is None and pre.get("energy_note", "")) or isinstance(e, (int, float)),
          "run --json: energy_j a number or null with its note", r.stdout.decode()[-400:])
    layers = doc.get("moe", {}).get("layers", [{}])
    check(dev.get("syncs", 0) >= 1 and "syncs_per_chunk" in layers[0].get("device", {}) and
          pre.get("cpu_ms", -1) >= 0, "run --json: device syncs per layer, CPU time",
          r.stdout.decode()[-400:])
    # compare: dense reference, the candidate in grouped mode on the device
    excerpt = os.path.join(tmp, "excerpt.txt")
    with open(excerpt, "w", encoding="utf-8") as f:
        f.write(paragraph * 3)
    r = run(bin_, ["compare", "-m", model, "-f", excerpt, "--ctx", "64", "--plan", plan, "--mode",
                   "grouped", "--device", "vulkan"])
    out = r.stdout.decode()
    check(r.returncode == 0 and "top-1 agreement:      100.0000%" in out,
          "compare: grouped on --device vulkan agrees with dense", out + r.stderr.decode()[-300:])
    prefix = os.path.join(tmp, "bench")
    r = run(bin_, ["bench", "-m", model, "--plan", plan, "--device", "vulkan", "-f", a.text,
                   "--modes", "dense,grouped", "--lengths", "64", "-r", "1", "-o", prefix])
    out = r.stdout.decode()
    check(r.returncode == 0 and "| 64 | grouped |" in out and "Device: vulkan" in out,
          "bench --device vulkan", out[-400:] + r.stderr.decode()[-300:])
    rows = [l.split("|") for l in out.splitlines() if l.startswith("| 64 | grouped |")]
    check(len(rows) == 1 and (rows[0][6].strip() == "n/a" and "energy: not available (" in out or
                              re.fullmatch(r" [0-9.]+ ", rows[0][6]) is not None),
          "bench: energy J a number, or n/a and why", out[-600:])
    print(f"test_vulkan_cli: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
