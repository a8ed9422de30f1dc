"""From what a caller submits to the engine's view of a request: :class:`Requests`.

Runs in the caller's thread, before any work reaches the engine: parameters checked against the
graph, the prompt tokenised and checked against the context, a seed chosen, and for ``min_tokens``
the parameters that hold end-of-sequence back.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, replace

import numpy as np

from onnxsample.engine._sequence import Sequence
from onnxsample.engine._slots import check_params
from onnxsample.engine.request import Request
from onnxsample.errors import ContextExceeded, InvalidParameter
from onnxsample.metadata import ComposedMetadata
from onnxsample.params import SamplingParams
from onnxsample.text import TextStream, Tokenizer
from onnxsample.text._grammar import GrammarVocabulary
from onnxsample.text._prompt import Prompt, prompt_tokens, stop_strings
from onnxsample.text._stops import StopMatcher

_ids = itertools.count()


@dataclass(frozen=True)
class Requests:
    """Makes :class:`~onnxsample.engine._sequence.Sequence` objects for one engine: its graph (`meta`),
    tokenizer and end-of-sequence ids, its `limit` of positions per sequence (`max_len` when that
    set it), `wake`, which a request calls when it is cancelled, and `grammars`, the vocabulary
    that constraints (structured output) are compiled against."""

    meta: ComposedMetadata
    tokenizer: Tokenizer
    eos_ids: frozenset[int]
    limit: int
    max_len: int | None
    wake: Callable[[], None]
    grammars: GrammarVocabulary

    def sequence(
        self,
        prompt: Prompt,
        params: SamplingParams | None,
        max_new_tokens: int | None,
        stop: str | Seq[str] | None,
        chat: bool | None,
        system: str | None,
        index: int = 0,
    ) -> Sequence:
        """Validate and tokenise one request; raise InvalidParameter for anything it cannot do."""
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise InvalidParameter(f"params must be SamplingParams, got {type(params).__name__}")
        if not isinstance(index, (int, np.integer)) or isinstance(index, bool) or index < 0:
            raise InvalidParameter(f"index must be an integer >= 0, got {index!r}")
        index = int(index)
        open_ended = max_new_tokens is None
        if not open_ended:
            if (
                not isinstance(max_new_tokens, (int, np.integer))
                or isinstance(max_new_tokens, bool)
                or max_new_tokens < 1
            ):
                raise InvalidParameter(
                    f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}"
                )
            max_new_tokens = int(max_new_tokens)  # a numpy integer too
        check_params(self.meta, params)
        if not open_ended and params.min_tokens > max_new_tokens:
            raise InvalidParameter(
                f"min_tokens must be at most the new tokens asked for ({max_new_tokens}), "
                f"got {params.min_tokens}"
            )
        early = self.early_params(params)
        stops = stop_strings(stop)
        ids = prompt_tokens(self.tokenizer, prompt, chat, system, self.meta.vocab_size, self.limit)
        if len(ids) >= self.limit:
            room = (
                f"max_len={self.limit}"
                if self.max_len == self.limit
                else f"the model's context of {self.limit} tokens"
            )
            raise ContextExceeded(
                f"the prompt is {len(ids)} tokens, which does not fit {room} "
                f"(it must be at most {self.limit - 1})",
                prompt_tokens=len(ids),
                context=self.limit,
            )
        matcher = None
        if params.constraint is not None:
            matcher = self.grammars.matcher(params.constraint.grammar_text())
        # a random seed below 2**53: reported in JSON, it must survive a double (JavaScript, jq)
        seed = params.seed if params.seed is not None else np.random.SeedSequence().entropy % 2**53
        seed = int(seed) % 2**64  # a numpy integer's modulo overflows
        request = Request(f"req-{next(_ids)}", index, self.wake)
        return Sequence(
            request,
            ids,
            params,
            self.limit - len(ids) if open_ended else max_new_tokens,
            TextStream(self.tokenizer, prompt_ids=ids),
            StopMatcher(stops),
            seed,
            self.eos_ids,
            self.limit,
            early_params=early,
            open_ended=open_ended,
            matcher=matcher,
        )

    def early_params(self, params: SamplingParams) -> SamplingParams | None:
        """For `min_tokens`: the parameters with every end-of-sequence id biased by -100."""
        if not params.min_tokens or params.ignore_eos:
            return None
        return barred_eos(params, self.eos_ids, self.meta, "min_tokens")


def barred_eos(
    params: SamplingParams, eos_ids: frozenset[int], meta: ComposedMetadata, field: str
) -> SamplingParams:
    """`params` with every end-of-sequence id biased by -100, over any bias they gave it (vLLM's
    ``min_tokens``, llama-server's ``ignore_eos``); InvalidParameter naming `field` when the
    graph has no room for those entries."""
    check_params(meta, params)  # an error of their own is theirs, not the field's
    bias = {**params.logit_bias, **dict.fromkeys(sorted(eos_ids), -100.0)}
    barred = replace(params, logit_bias=bias)
    try:
        check_params(meta, barred)
    except InvalidParameter:
        raise InvalidParameter(
            f"{field} needs {len(bias)} logit-bias entries (the request's and one per "
            f"end-of-sequence id), more than this graph holds (max_bias={meta.max_bias}; "
            "compose it with --max-bias)"
        ) from None
    return barred
