"""llama.cpp, the oracle for GGUF files: its tools built by ``scripts/build_llama_cpp.sh`` (``make
llama-cpp``) into the user cache, its converter and vocabulary files from the same sources.

Tests take the :func:`llama_cpp` fixture of conftest.py (which fails under CI=true, and skips
elsewhere, when the build is missing) rather than calling :func:`find` themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

VERSION = "0.3.36"  # the llama-cpp-python sdist whose vendor/llama.cpp is built
TOOLS = ("llama-server", "llama-tokenize", "llama-quantize", "llama-batched-bench")


def folder() -> Path:
    """Where scripts/build_llama_cpp.sh builds: ``$ONNXSAMPLE_CACHE`` or ~/.cache/onnxsample."""
    cache = os.environ.get("ONNXSAMPLE_CACHE") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "onnxsample"
    )
    return Path(cache) / f"llama.cpp-{VERSION}"


@dataclass(frozen=True)
class LlamaCpp:
    """A built llama.cpp: ``src`` (its sources: convert_hf_to_gguf.py, gguf-py, models/) and
    ``bin`` (llama-server, llama-tokenize, llama-quantize, llama-batched-bench)."""

    src: Path
    bin: Path

    def tool(self, name: str) -> Path:
        return self.bin / name

    def tokenize(
        self, gguf: Path, text: str, *, bos: bool = True, special: bool = True
    ) -> list[int]:
        """llama.cpp's token ids for `text` (read from a file, byte for byte): BOS where the
        vocabulary adds one and `bos`; special tokens in the text parsed when `special`."""
        import tempfile

        with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
            f.write(text.encode("utf-8"))
        try:
            cmd = [str(self.tool("llama-tokenize")), "-m", str(gguf), "-f", f.name, "--ids"]
            cmd += ["--log-disable", "--no-escape"]
            cmd += [] if bos else ["--no-bos"]
            cmd += [] if special else ["--no-parse-special"]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        finally:
            os.unlink(f.name)
        if out.returncode != 0:
            raise RuntimeError(f"llama-tokenize failed ({out.returncode}): {out.stderr[-2000:]}")
        line = [s for s in out.stdout.splitlines() if s.startswith("[")][-1]
        return [int(i) for i in json.loads(line)]

    def converter_env(self) -> dict[str, str]:
        """The environment convert_hf_to_gguf.py runs in: its own gguf-py first on the path."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(self.src / "gguf-py"), *filter(None, [env.get("PYTHONPATH")])]
        )
        return env


def find() -> LlamaCpp | None:
    """The built llama.cpp, or None when scripts/build_llama_cpp.sh has not run."""
    root = folder()
    built = LlamaCpp(root / "src", root / "build" / "bin")
    if not (built.src / "convert_hf_to_gguf.py").is_file():
        return None
    if not all(built.tool(t).is_file() for t in TOOLS):
        return None
    return built


class LlamaServer:
    """llama-server on one GGUF at 127.0.0.1 (a free port), stopped on exit; greedy tokens and
    the raw distribution's top logprobs of a prompt given as token ids."""

    def __init__(
        self,
        built: LlamaCpp,
        gguf: Path,
        *,
        threads: int = 2,
        ctx: int = 2048,
        slots: int = 1,
        args: tuple[str, ...] = (),
    ) -> None:
        self.built, self.gguf, self.threads, self.ctx, self.slots = built, gguf, threads, ctx, slots
        self.args = args  # more of llama-server's options (--jinja: the file's chat template)
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> LlamaServer:
        import socket
        import time
        import urllib.request

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        cmd = [str(self.built.tool("llama-server")), "-m", str(self.gguf), "--host", "127.0.0.1"]
        cmd += [
            "--port",
            str(port),
            "-t",
            str(self.threads),
            "-c",
            str(self.ctx),
            "-np",
            str(self.slots),
        ]
        cmd += ["--no-webui", "--log-disable", *self.args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited: {self.proc.stderr.read()[-2000:]!r}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.__exit__()
        raise RuntimeError("llama-server did not become healthy in 120 s")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()

    def get(self, path: str) -> dict:
        import urllib.request

        with urllib.request.urlopen(self.url + path, timeout=60) as r:
            return json.loads(r.read())

    def post(self, path: str, body: dict) -> dict:
        import urllib.request

        request = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=300) as r:
            return json.loads(r.read())

    def refused(self, path: str, body: dict) -> dict:
        """The error llama-server answers `body` with (its JSON; a 2xx fails)."""
        import urllib.error

        try:
            answer = self.post(path, body)
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read())
        raise AssertionError(f"llama-server answered {path} with {answer}")

    def tokenize(self, text: str, *, bos: bool = True) -> list[int]:
        """llama.cpp's ids for `text` with the loaded vocabulary, special tokens in the text
        parsed, BOS (and EOS) added as the vocabulary says when `bos`: llama-tokenize's ids,
        without loading the model once per string."""
        body = {"content": text, "add_special": bos, "parse_special": True}
        return [int(i) for i in self.post("/tokenize", body)["tokens"]]

    def greedy(self, ids: list[int], n: int, top: int = 0) -> tuple[list[int], list[dict | None]]:
        """`n` greedy tokens after the prompt `ids` (no BOS added), and per token the raw
        distribution's `top` most likely ids with their logprobs ({id: logprob}); None for a
        token llama-server lists nothing for (see :func:`by_step`)."""
        body = {
            "prompt": ids,
            "n_predict": n,
            "temperature": 0.0,
            "top_k": 1,
            "cache_prompt": False,
            "return_tokens": True,
            "ignore_eos": True,
            "n_probs": top,
            "post_sampling_probs": False,
        }
        out = self.post("/completion", body)
        tokens = [int(t) for t in out["tokens"]]
        entries = by_step(tokens, out.get("completion_probabilities", []))
        probs = [
            None if e is None else {t["id"]: t["logprob"] for t in e.get("top_logprobs", [])}
            for e in entries
        ]
        return tokens, probs


def by_step(tokens: list[int], entries: list[dict]) -> list[dict | None]:
    """llama-server's ``completion_probabilities`` put at the steps they belong to: it lists one
    entry a piece of text, so a token that leaves a UTF-8 character unfinished has none (its bytes
    go to the next entry, whose `id` is the token sampled at that step). None where it has none.
    An entry goes to the first step on from the last one with its id, so where a skipped token has
    the id of the one that completes its character (two equal continuation bytes), the entry lands
    a step early: a false difference, never a hidden one."""
    steps: list[dict | None] = [None] * len(tokens)
    step = 0
    for entry in entries:
        while step < len(tokens) and tokens[step] != entry["id"]:
            step += 1
        assert step < len(tokens), ("an entry for no token", entry["id"], tokens)
        steps[step] = entry
        step += 1
    return steps


# How close our export and llama.cpp must be (tests/exporters/test_gguf_llama_cpp.py says why).
TOL = 0.6  # |Δ logprob| of llama.cpp's likely tokens (logprob above LIKELY): two such errors
LIKELY = -3.0
# |Δ logprob| of llama.cpp's best token at a flat step (no token above LIKELY: Gemma 2's soft-capped
# logits over 262k tokens put a tiny random model's best near -7 at every step; every family's
# fixture has such steps, 8 to 16 of 16). Wider than TOL: over a flat distribution, int8
# activations quantised differently move the best token's logprob more; measured on every family
# and mix of test_gguf_llama_cpp_families.py: at most 0.82 (Phi-3 Q4_K_M), 0.42 for Gemma 2. A graph
# that computes something else (the logits' soft-cap left out: 3.7) moves it by units.
FLAT_TOL = 1.0
STEPS = 24


def compare_with_llama_cpp(
    model: Path, server: LlamaServer, prompt: list[int], steps: int = STEPS, likely: float = LIKELY
) -> dict:
    """Our export's logprobs along llama.cpp's greedy continuation of `prompt` (teacher forced),
    and our own free-running greedy tokens, against llama-server's:

    - ``worst``: the largest |Δ logprob| of its likely tokens (those of its top 8 with a logprob
      above `likely`);
    - ``flat``: the largest |Δ logprob| of its best token at the steps where it has no likely one;
    - ``decisive``: the steps where its top two are more than 2 * TOL apart, and ``agree``: how
      many of them our greedy token agrees on;
    - ``close``: the first step where they are not; ``same``: the first where our free-running
      greedy token differs;
    - ``compared``: how many steps llama-server gave numbers for."""
    import numpy as np
    from _family_models import export_logits

    from onnxsample.exporters._verify import ort_greedy

    tokens, tops = server.greedy(prompt, steps, top=8)
    logits = export_logits(model, prompt + tokens)[len(prompt) - 1 :]
    logits = logits - logits.max(-1, keepdims=True)
    ours = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    worst, flat, decisive, agree, compared = 0.0, 0.0, 0, 0, 0
    for i, top in enumerate(tops):
        if top is None:  # llama-server gave this step's token no entry of its own
            continue
        compared += 1
        listed = {k: v for k, v in top.items() if v > likely}
        worst = max([worst, *(abs(float(ours[i, k]) - v) for k, v in listed.items())])
        if not listed:
            k, v = max(top.items(), key=lambda kv: kv[1])
            flat = max(flat, abs(float(ours[i, k]) - v))
        best = sorted(top.values())[-2:]
        if best[1] - best[0] > 2 * TOL:
            decisive += 1
            agree += int(ours[i].argmax()) == tokens[i]
    free = ort_greedy(model, prompt, steps)
    # a step without llama.cpp's numbers counts as a near-tie: nothing says it is decisive
    margins = [0.0 if top is None else np.subtract(*sorted(top.values())[-1:-3:-1]) for top in tops]
    close = next((i for i, m in enumerate(margins) if m <= 2 * TOL), steps)
    same = next((i for i, (a, b) in enumerate(zip(free, tokens, strict=True)) if a != b), steps)
    return {
        "worst": worst,
        "flat": flat,
        "decisive": decisive,
        "agree": agree,
        "close": close,
        "same": same,
        "compared": compared,
    }


def same_answer_until_a_near_tie(mine: dict, theirs: dict, steps: int) -> int:
    """Two ``/completion`` answers (``return_tokens``, ``n_probs``), ours and llama-server's, of
    the same greedy request: their tokens agree until a step where llama.cpp's top two are within
    2 * TOL (a tiny random model's often are), and up to there the top tokens both list have
    logprobs within TOL. The steps they agree on."""
    their_by_step = by_step(theirs["tokens"], theirs["completion_probabilities"])
    pairs = enumerate(zip(mine["tokens"], theirs["tokens"], strict=True))
    same = next((i for i, (a, b) in pairs if a != b), steps)
    if same < steps:
        entry = their_by_step[same]
        assert entry is not None, ("llama-server lists nothing for the step they part at", same)
        top = entry["top_logprobs"]
        assert top[0]["logprob"] - top[1]["logprob"] <= 2 * TOL, (same, top)
    mine_by_step = by_step(mine["tokens"], mine["completion_probabilities"])
    for a, b in zip(mine_by_step[: same + 1], their_by_step[: same + 1], strict=True):
        if a is None or b is None:  # a token that left a character unfinished, on either side
            continue
        ours = {t["id"]: t["logprob"] for t in a["top_logprobs"]}
        both = [t for t in b["top_logprobs"] if t["id"] in ours]
        assert both and all(abs(ours[t["id"]] - t["logprob"]) < TOL for t in both), (a, b)
    return same
