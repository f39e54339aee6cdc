// npumoe serve through a client written by others: the `openai` npm package
// (issue 15). It is installed with npm into the build folder given by
// --install (once; later runs reuse it), never into the repository. Without
// the registry the test fails and says so: it is not skipped.
//
// Usage: node test_openai_client.mjs NPUMOE --model GGUF --install DIR
//
// Starts `npumoe serve --port 0 --parallel 2 --chat-template chatml` and
// checks, with the package's own calls: models.list; chat.completions
// (greedy) and the same streamed, both equal to `npumoe run --chat --temp 0`;
// completions with a seed (default sampling) and the same streamed, equal to
// `npumoe run --seed`; usage and finish_reason; an unknown model raising the
// package's NotFoundError (404).
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";

const OPENAI_VERSION = "7"; // the major release the test is written for

function arg(name) {
  const i = process.argv.indexOf(name);
  if (i < 0 || i + 1 >= process.argv.length) {
    console.error(`usage: node test_openai_client.mjs NPUMOE --model GGUF --install DIR (${name} missing)`);
    process.exit(2);
  }
  return process.argv[i + 1];
}

const binary = process.argv[2];
const model = arg("--model");
const installDir = path.resolve(arg("--install"));
let passed = 0;
let failed = 0;

function check(ok, what, detail = "") {
  if (ok) {
    passed++;
  } else {
    failed++;
    console.log(`FAIL: ${what}` + (detail ? `\n      ${detail}` : ""));
  }
}

function installOpenAI() {
  const pkg = path.join(installDir, "node_modules", "openai", "package.json");
  if (existsSync(pkg)) return;
  mkdirSync(installDir, { recursive: true });
  const r = spawnSync("npm", ["install", "--prefix", installDir, "--no-audit", "--no-fund",
                              "--no-save", `openai@${OPENAI_VERSION}`],
                      { encoding: "utf8", timeout: 300000 });
  if (r.status !== 0 || !existsSync(pkg)) {
    console.error("test_openai_client: FAILED: `npm install openai@" + OPENAI_VERSION +
                  "` into " + installDir + " did not succeed; this test needs the npm " +
                  "registry (or a cached install there).\n" + (r.error ? String(r.error) : "") +
                  (r.stderr || "").slice(-2000));
    process.exit(1);
  }
}

function runJson(args) {
  const r = spawnSync(binary, ["run", "-m", model, "--json", ...args], { encoding: "utf8" });
  if (r.status !== 0) throw new Error(`npumoe run ${args.join(" ")}: ${r.stderr}`);
  return JSON.parse(r.stdout);
}

function startServer() {
  return new Promise((resolve, reject) => {
    const proc = spawn(binary, ["serve", "-m", model, "--port", "0", "--parallel", "2", "-c",
                                "128", "-t", "2", "--chat-template", "chatml"],
                       { stdio: ["ignore", "ignore", "pipe"] });
    const log = { text: "" };
    const exited = new Promise((done) => proc.on("exit", (code, signal) => done({ code, signal })));
    proc.stderr.setEncoding("utf8");
    proc.stderr.on("data", (d) => {
      log.text += d;
      const m = log.text.match(/serving \S+ on http:\/\/[^:]+:(\d+) /);
      if (m) resolve({ proc, port: Number(m[1]), log, exited });
    });
    exited.then(({ code }) => reject(new Error(`the server exited (${code}): ${log.text}`)));
  });
}

installOpenAI();
const require = createRequire(path.join(installDir, "package.json"));
const { default: OpenAI } = await import(pathToFileURL(require.resolve("openai")).href);
const installed = JSON.parse(readFileSync(
  path.join(installDir, "node_modules", "openai", "package.json"), "utf8")).version;

const { proc, port, log, exited } = await startServer();
const id = path.basename(model);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "unused",
                            maxRetries: 0, timeout: 120000 });
try {
  const models = await client.models.list();
  const ids = [];
  for await (const m of models) ids.push(m.id);
  check(ids.length === 1 && ids[0] === id, "models.list: the model's id", JSON.stringify(ids));

  const msg = "Who begat Enos?";
  const chatRef = runJson(["--chat", "--chat-template", "chatml", "-p", msg, "--temp", "0",
                           "-n", "16", "-c", "128"]);
  const chat = await client.chat.completions.create({
    model: id, messages: [{ role: "user", content: msg }], temperature: 0, max_tokens: 16 });
  check(chat.choices[0].message.content === chatRef.text,
        "chat.completions.create (greedy) = npumoe run --chat --temp 0",
        `${JSON.stringify(chat.choices[0].message.content)} vs ${JSON.stringify(chatRef.text)}`);
  check(chat.choices[0].finish_reason === chatRef.stop &&
        chat.usage.prompt_tokens === chatRef.prompt_tokens &&
        chat.usage.completion_tokens === chatRef.generated_tokens,
        "chat: finish_reason and usage as npumoe run's", JSON.stringify(chat));

  const stream = await client.chat.completions.create({
    model: id, messages: [{ role: "user", content: msg }], temperature: 0, max_tokens: 16,
    stream: true, stream_options: { include_usage: true } });
  let joined = "";
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.choices.length) {
      joined += chunk.choices[0].delta.content ?? "";
      finish = chunk.choices[0].finish_reason ?? finish;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  check(joined === chatRef.text && finish === chatRef.stop &&
        usage?.completion_tokens === chatRef.generated_tokens,
        "streaming chat: the deltas join into npumoe run's text, then finish_reason and usage",
        `${JSON.stringify(joined)} vs ${JSON.stringify(chatRef.text)}, ${finish}`);

  const prompt = "In the beginning God created";
  const ref = runJson(["-p", prompt, "--seed", "7", "-n", "12", "-c", "128"]);
  const done = await client.completions.create({ model: id, prompt, seed: 7, max_tokens: 12 });
  check(done.choices[0].text === ref.text && done.usage.completion_tokens === 12,
        "completions.create (seed 7, default sampling) = npumoe run --seed 7",
        `${JSON.stringify(done.choices[0].text)} vs ${JSON.stringify(ref.text)}`);
  const cstream = await client.completions.create({ model: id, prompt, seed: 7, max_tokens: 12,
                                                    stream: true });
  let ctext = "";
  for await (const chunk of cstream) ctext += chunk.choices[0]?.text ?? "";
  check(ctext === ref.text, "streaming completions = npumoe run --seed 7",
        `${JSON.stringify(ctext)} vs ${JSON.stringify(ref.text)}`);

  let thrown = null;
  try {
    await client.completions.create({ model: "no-such-model", prompt, max_tokens: 2 });
  } catch (e) {
    thrown = e;
  }
  check(thrown instanceof OpenAI.NotFoundError && thrown.status === 404 &&
        thrown.code === "model_not_found",
        "an unknown model: the package raises NotFoundError (404, model_not_found)",
        String(thrown));
} catch (e) {
  check(false, "the openai client's calls", String(e && e.stack ? e.stack : e));
} finally {
  proc.kill("SIGTERM");
}
const { code } = await exited;
check(code === 0 && !log.text.includes("Sanitizer") && !log.text.includes("runtime error"),
      "SIGTERM: the server exits 0, no sanitizer report", `exit ${code}: ${log.text.slice(-2000)}`);
console.log(`test_openai_client (openai ${installed}): ${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
