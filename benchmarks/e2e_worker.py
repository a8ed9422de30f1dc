"""One engine of the end-to-end benchmark, in its own process: load the model once, then serve requests.

    python benchmarks/e2e_worker.py ENGINE --threads N [--model PATH] [--tokenizer DIR] [--hf DIR]
        [--genai DIR] [--gguf F]

Started by ``benchmarks/e2e.py`` (with the engine's own interpreter: onnxruntime-genai runs from
``.venv-genai``, llama.cpp from ``.venv-llamacpp``), which exports and composes the models first:
``--model`` is the composed ``.onnx`` for the onnxsample engines (all of them run
``onnxsample.Generator``; the variant is the model) and the fp32 optimum export folder for optimum.
Protocol, one JSON object per line:

- stdout, once loaded: ``{"ready": true, "load_s", "rss_mb", "peak_rss_mb", "versions"}`` or
  ``{"ready": false, "error"}``;
- stdin: ``{"prompt_ids": [...], "message": str, "batch": B, "mode": "greedy"|"sampled",
  "new_tokens": N, "seed": S}`` (or ``{"quit": true}``); stdout: ``{"ok": true, "prompt_tokens",
  "tokens": [per sequence], "ttft_s", "prefill_s", "decode_s", "total_s", "rss_mb", "peak_rss_mb"}``
  or ``{"ok": false, "error"}``;
- stdin: ``{"score": {"prompt_ids": [...], "tokens": [...]}}``; stdout: ``{"ok": true,
  "mean_logprob", "scored_on"}``: the mean log-probability of `tokens` after the prompt under the
  engine's own model (transformers, llama.cpp; the others are scored by the orchestrator).

Every engine gets the same prompt token ids (the embedded model's chat template applied to the same
user message), the batch is the same prompt B times (sequence i seeded with seed + i), and every
sequence is made to produce exactly N tokens by suppressing the end-of-sequence token. Time starts
when the engine is handed token ids, so tokenisation is outside the timings, except for onnxsample,
whose API takes text: its clock starts after its own tokenisation, which is checked to give the same
ids. Timings: ``ttft_s`` from the call to the first sampled token of the batch; ``prefill_s`` the
prompt's forward pass where the engine exposes it (else = ``ttft_s``); ``decode_s`` from the first
token to the last. Peak memory is the worker's VmHWM (``ru_maxrss`` would include the orchestrator's
peak, inherited through fork + exec).

Only the standard library at module level: each engine imports its own stack when it loads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import peak_rss_mb, rss_mb, versions

EOS = 2  # SmolLM2's <|im_end|>; checked against the tokenizer by the orchestrator
SAMPLED = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repetition_penalty": 1.1}


class Engine:
    """Loads one model; :meth:`run` serves one request and returns its timings."""

    name = "engine"
    packages: tuple[str, ...] = ()

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.threads = args.threads

    def run(self, req: dict) -> dict:
        raise NotImplementedError

    def score(self, prompt_ids: list[int], tokens: list[int]) -> float:
        """Mean log-probability of `tokens` after `prompt_ids` (teacher forced)."""
        raise NotImplementedError("this engine's model is scored by the orchestrator")


def _mean_logprob(logits, tokens: list[int]) -> float:
    """Mean log-softmax of `tokens` in `logits` [len(tokens), vocab], in float64 (numpy)."""
    import numpy as np

    logits = np.asarray(logits, dtype=np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    logprobs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return float(logprobs[np.arange(len(tokens)), tokens].mean())


class OnnxsampleEngine(Engine):
    """A composed model (full chain, 8 slots) through ``onnxsample.Generator`` with IOBinding: every
    onnxsample variant, the variant being the model the orchestrator exported and composed."""

    packages = ("onnxsample", "onnxruntime", "onnx", "onnxscript", "numpy")

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        import onnxsample

        self.osx = onnxsample
        self.gen = onnxsample.Generator(
            onnxsample.prepare(args.model), tokenizer=args.tokenizer, threads=args.threads
        )

    def run(self, req: dict) -> dict:
        osx, batch = self.osx, req["batch"]
        bias = {int(i): -100.0 for i in self.gen.eos_ids}
        if req["mode"] == "greedy":
            params = [osx.SamplingParams(temperature=0.0, logit_bias=bias)] * batch
        else:
            params = [
                osx.SamplingParams(**SAMPLED, logit_bias=bias, seed=req["seed"] + i)
                for i in range(batch)
            ]
        start = time.perf_counter()
        out = self.gen.generate(
            [req["message"]] * batch, params, max_new_tokens=req["new_tokens"], chat=True
        )
        total = time.perf_counter() - start
        if out[0].prompt_token_ids != req["prompt_ids"]:
            raise RuntimeError("onnxsample tokenised the message to other ids than the others got")
        t = self.gen.last_timings
        return {
            "tokens": [len(c.token_ids) for c in out],
            "ttft_s": t.ttft_s,
            "prefill_s": t.prefill_s,
            "decode_s": t.decode_s,
            "total_s": total,
        }


class _FirstToken:
    """A transformers streamer that notes when the first generated token arrives (any batch size)."""

    def __init__(self) -> None:
        self.calls = 0
        self.first: float | None = None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:  # the first call carries the prompt
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def _hf_generate(model, req: dict) -> dict:
    """transformers' ``generate`` (also what optimum's ORT model uses) on the request's token ids."""
    import torch

    batch, new = req["batch"], req["new_tokens"]
    ids = torch.tensor([req["prompt_ids"]] * batch, dtype=torch.long)
    kwargs = {"max_new_tokens": new, "min_new_tokens": new, "pad_token_id": EOS}
    if req["mode"] == "greedy":
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    else:
        kwargs.update(do_sample=True, **SAMPLED)
        torch.manual_seed(
            req["seed"]
        )  # one generator for the batch: transformers has no per-row seed
    streamer = _FirstToken()
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), streamer=streamer, **kwargs
        )
    end = time.perf_counter()
    first = streamer.first or end
    return {
        "tokens": [int(out.shape[1]) - len(req["prompt_ids"])] * batch,
        "ttft_s": first - start,
        "prefill_s": first - start,
        "decode_s": end - first,
        "total_s": end - start,
    }


class OptimumEngine(Engine):
    """The same ONNX export through optimum's ``ORTModelForCausalLM.generate`` (host-side sampling)."""

    packages = ("optimum", "optimum-onnx", "onnxruntime", "transformers", "torch")

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        import onnxruntime as ort
        import torch
        from optimum.onnxruntime import ORTModelForCausalLM

        torch.set_num_threads(args.threads)  # the host-side sampling runs in torch
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.model = ORTModelForCausalLM.from_pretrained(
            args.model,
            file_name="model.onnx",
            use_cache=True,
            provider="CPUExecutionProvider",
            session_options=options,
            local_files_only=True,
        )
        self.io_binding = bool(getattr(self.model, "use_io_binding", False))

    def run(self, req: dict) -> dict:
        return _hf_generate(self.model, req)


class TransformersEngine(Engine):
    """transformers ``generate`` on torch CPU, fp32, from the embedded model's de-quantised HF folder."""

    packages = ("transformers", "torch")

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(args.threads)
        if args.hf and Path(args.hf, "config.json").is_file():
            model = AutoModelForCausalLM.from_pretrained(args.hf, dtype=torch.float32)
        else:  # de-quantise the GGUF (~25 s)
            gguf = Path(args.gguf)
            model = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            )
        self.model = model.eval()

    def run(self, req: dict) -> dict:
        return _hf_generate(self.model, req)

    def score(self, prompt_ids: list[int], tokens: list[int]) -> float:
        import torch

        seq = torch.tensor([list(prompt_ids) + list(tokens[:-1])], dtype=torch.long)
        with torch.inference_mode():
            logits = self.model(input_ids=seq).logits[0, len(prompt_ids) - 1 :]
        return _mean_logprob(logits.double().numpy(), tokens)


class GenaiEngine(Engine):
    """onnxruntime-genai on its builder's fp32 model (run from .venv-genai)."""

    packages = ("onnxruntime-genai", "onnxruntime", "numpy")

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        import onnxruntime_genai as og

        self.og = og
        config = og.Config(args.genai)
        session = {"intra_op_num_threads": args.threads, "inter_op_num_threads": 1}
        config.overlay(json.dumps({"model": {"decoder": {"session_options": session}}}))
        self.model = og.Model(config)

    def run(self, req: dict) -> dict:
        import numpy as np

        og, batch, prompt = self.og, req["batch"], req["prompt_ids"]
        length = len(prompt) + req["new_tokens"]
        # min_length suppresses EOS until the end; max_length sizes the shared KV buffer exactly.
        options: dict = {"max_length": length, "min_length": length, "batch_size": batch}
        if req["mode"] == "greedy":
            options["do_sample"] = False
        else:  # genai has no min-p: the sampled chain here lacks it
            options.update(
                do_sample=True,
                temperature=SAMPLED["temperature"],
                top_k=SAMPLED["top_k"],
                top_p=SAMPLED["top_p"],
                repetition_penalty=SAMPLED["repetition_penalty"],
                random_seed=req["seed"],
            )
        params = og.GeneratorParams(self.model)
        params.set_search_options(**options)
        generator = og.Generator(self.model, params)
        start = time.perf_counter()
        generator.append_tokens(np.asarray([prompt] * batch, dtype=np.int32))
        prefilled = time.perf_counter()
        generator.generate_next_token()
        generator.get_next_tokens()
        first = time.perf_counter()
        count = 1
        while not generator.is_done():
            generator.generate_next_token()
            generator.get_next_tokens()
            count += 1
        end = time.perf_counter()
        return {
            "tokens": [count] * batch,
            "ttft_s": first - start,
            "prefill_s": prefilled - start,
            "decode_s": end - first,
            "total_s": end - start,
        }


class LlamaCppEngine(Engine):
    """llama.cpp through llama-cpp-python on the original Q4_1 GGUF (batch 1 only); with
    ``--lookup K``, its prompt-lookup speculative decoding (``LlamaPromptLookupDecoding``, K
    draft tokens)."""

    packages = ("llama_cpp_python",)

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        import llama_cpp

        self.llama_cpp = llama_cpp
        draft = None
        if getattr(args, "lookup", 0):
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            draft = LlamaPromptLookupDecoding(num_pred_tokens=args.lookup)
        self.model = llama_cpp.Llama(
            model_path=args.gguf,
            n_ctx=2048,
            n_batch=512,
            n_threads=args.threads,
            n_threads_batch=args.threads,
            draft_model=draft,
            logits_all=draft is not None,  # its speculative path reads every position's logits
            verbose=False,
        )

    def run(self, req: dict) -> dict:
        if req["batch"] != 1:
            raise NotImplementedError(
                "llama-cpp-python's Llama API generates one sequence at a time"
            )

        def no_eos(_ids, scores):
            scores[EOS] = -float("inf")
            return scores

        kwargs = (
            {"temp": 0.0}
            if req["mode"] == "greedy"
            else {
                "temp": SAMPLED["temperature"],
                "top_k": SAMPLED["top_k"],
                "top_p": SAMPLED["top_p"],
                "min_p": SAMPLED["min_p"],
                "repeat_penalty": SAMPLED["repetition_penalty"],
            }
        )
        self.model.set_seed(req["seed"])
        self.model.reset()  # else generate() reuses the cached prompt prefix and skips the prefill
        # "stop_at_eos": stop at the end-of-sequence token (as a user would), else run N tokens
        stop_at_eos = req.get("stop_at_eos", False)
        processors = None if stop_at_eos else self.llama_cpp.LogitsProcessorList([no_eos])
        start = time.perf_counter()
        first, count = None, 0
        for token in self.model.generate(
            req["prompt_ids"], reset=True, logits_processor=processors, **kwargs
        ):
            if stop_at_eos and token == EOS:
                break
            count += 1
            if first is None:
                first = time.perf_counter()
            if count >= req["new_tokens"]:
                break
        end = time.perf_counter()
        first = first or end
        return {
            "tokens": [count],
            "ttft_s": first - start,
            "prefill_s": first - start,
            "decode_s": end - first,
            "total_s": end - start,
        }

    def score(self, prompt_ids: list[int], tokens: list[int]) -> float:
        """On a second ``Llama`` of the same file with ``logits_all=True`` (the timed one keeps
        the last row only), evaluated once over prompt + tokens and then released."""
        seq = list(prompt_ids) + list(tokens[:-1])
        model = self.llama_cpp.Llama(
            model_path=self.args.gguf,
            n_ctx=max(1024, len(seq) + 1),
            n_batch=512,
            n_threads=self.threads,
            n_threads_batch=self.threads,
            logits_all=True,
            verbose=False,
        )
        try:
            model.eval(seq)
            start = len(prompt_ids) - 1
            logits = model.scores[start : start + len(tokens)]
            return _mean_logprob(logits, tokens)
        finally:
            close = getattr(model, "close", None)  # llama-cpp-python >= 0.2.72
            if close is not None:
                close()


ENGINES: dict[str, type[Engine]] = {
    "onnxsample": OnnxsampleEngine,  # optimum layout, fp32
    "onnxsample-gqa-fp32": OnnxsampleEngine,
    "onnxsample-gguf-a0": OnnxsampleEngine,
    "onnxsample-gguf-a4": OnnxsampleEngine,
    "onnxsample-genai-graph": OnnxsampleEngine,
    "optimum": OptimumEngine,
    "genai": GenaiEngine,
    "transformers": TransformersEngine,
    "llamacpp": LlamaCppEngine,
}


def serve(engine_name: str, args: argparse.Namespace, reply) -> None:
    def send(obj: dict) -> None:
        reply.write(json.dumps(obj) + "\n")
        reply.flush()

    start = time.perf_counter()
    try:
        engine = ENGINES[engine_name](args)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        send({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return
    info = {"ready": True, "load_s": round(time.perf_counter() - start, 2), "rss_mb": rss_mb()}
    info["peak_rss_mb"] = peak_rss_mb()
    info["versions"] = versions(*engine.packages)
    if isinstance(engine, OptimumEngine):
        info["use_io_binding"] = engine.io_binding
    send(info)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if req.get("quit"):
            break
        if "score" in req:
            send(_score(engine, req["score"]))
            continue
        try:
            result = {"ok": True, "prompt_tokens": len(req["prompt_ids"]), **engine.run(req)}
        except NotImplementedError as exc:
            result = {"ok": False, "unsupported": True, "error": str(exc)}
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        result.update(rss_mb=rss_mb(), peak_rss_mb=peak_rss_mb())
        send(result)


def _score(engine: Engine, req: dict) -> dict:
    try:
        value = engine.score(req["prompt_ids"], req["tokens"])
    except NotImplementedError as exc:
        return {"ok": False, "unsupported": True, "error": str(exc)}
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    args = engine.args
    has_hf = args.hf and Path(args.hf, "config.json").is_file()
    source = args.hf if has_hf and not isinstance(engine, LlamaCppEngine) else args.gguf
    return {"ok": True, "mean_logprob": value, "scored_on": source}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine", choices=sorted(ENGINES))
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument(
        "--model", help="the composed .onnx (onnxsample engines) or export folder (optimum)"
    )
    parser.add_argument("--tokenizer", help="a folder with the embedded model's tokenizer")
    parser.add_argument("--hf", help="the embedded model's de-quantised HF folder")
    parser.add_argument("--genai", help="onnxruntime-genai's builder output folder")
    parser.add_argument("--gguf", help="the original GGUF file")
    parser.add_argument(
        "--lookup", type=int, default=0, help="llamacpp: prompt-lookup decoding with K drafts"
    )
    args = parser.parse_args()
    # The protocol owns the real stdout; whatever the libraries print goes to stderr.
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    serve(args.engine, args, reply)


if __name__ == "__main__":
    main()
