"""The engines of the end-to-end benchmark, one adapter each: load one model, serve one request
(:meth:`Engine.run`: the same token ids, batch, mode and token count for every engine, timings
back), and, where the orchestrator cannot, score tokens under the engine's own model.

Only the standard library at module level: each engine imports its own stack when it loads, in the
interpreter that runs it (``.venv-genai`` for onnxruntime-genai, ``.venv-llamacpp`` for llama.cpp).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _harness.machine import versions
from _harness.workload import REPETITION_PENALTY
from _harness.workload import SAMPLED as _SAMPLED

EOS = 2  # SmolLM2's <|im_end|>; checked against the tokenizer by the orchestrator
SAMPLED = {**_SAMPLED, "repetition_penalty": REPETITION_PENALTY}


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

    def scored_on(self) -> str:
        """What :meth:`score` scores on: the de-quantised HF folder where there is one, else the
        GGUF."""
        args = self.args
        has_hf = args.hf and Path(args.hf, "config.json").is_file()
        return args.hf if has_hf else args.gguf

    def ready_info(self) -> dict:
        """What this engine adds to the ready line, beside load time, memory and versions."""
        return {}

    def versions(self) -> dict[str, str]:
        """The versions of :attr:`packages`, from their installed metadata."""
        return versions(*self.packages)


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
        # Every request repeats the benchmark prompt: reusing its cached prefix would time a
        # prefill that does not happen (the peers compute theirs each time).
        self.gen = onnxsample.Generator(
            onnxsample.prepare(args.model),
            tokenizer=args.tokenizer,
            threads=args.threads,
            prefix_reuse=False,
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

    def ready_info(self) -> dict:
        return {"use_io_binding": self.io_binding}


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

    def versions(self) -> dict[str, str]:
        """.venv-llamacpp holds llama-cpp-python's module without its distribution's metadata
        (scripts/build_llamacpp_venv.sh copies it beside llama.cpp's own build): its version."""
        return {"llama_cpp_python": self.llama_cpp.__version__}

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
        if req.get("json_schema") is not None:  # structured output: llama.cpp's own grammar
            kwargs["grammar"] = self.llama_cpp.LlamaGrammar.from_json_schema(
                json.dumps(req["json_schema"]), verbose=False
            )
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

    def scored_on(self) -> str:
        return self.args.gguf

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
