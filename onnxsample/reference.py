"""A readable numpy reference of every sampler and of the whole chain, with the graph's semantics.

It is what the graph is tested against and what the benchmark compares with. Everything is float32
like the graph; each filter works on one slot's row at a time and reads like its rule. Top-p and
typical-p sort the whole row here, and the draw walks the whole row; the graph avoids both in the
common case (see ``onnxsample.graphs.candidates``) and agrees with this reference up to float
rounding of the sums.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from onnxsample.chain import GREEDY_BELOW as _GREEDY_BELOW
from onnxsample.chain import TEMPERATURE_LAST, SamplerChain
from onnxsample.graphs.dist import BLOCK as _BLOCK

__all__ = [
    "allowed_tokens",
    "dist",
    "finite_rows",
    "greedy",
    "logit_bias",
    "logprobs",
    "min_p",
    "penalties",
    "prompt_logprobs",
    "run_chain",
    "sanitize",
    "softmax",
    "temperature",
    "top_k",
    "top_p",
    "typical_p",
    "update_counts",
]

F32 = np.float32
FLT_MAX = np.finfo(F32).max
NEG_INF = F32(-np.inf)


def sanitize(logits: np.ndarray) -> np.ndarray:
    """NaN → −inf, +inf → FLT_MAX."""
    x = np.where(np.isnan(logits), NEG_INF, logits).astype(F32)
    return np.minimum(x, FLT_MAX)


def finite_rows(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Clamp +inf; a row with no finite value becomes [0, −inf, …] (it can only give token 0)."""
    z = np.minimum(z, FLT_MAX).astype(F32)
    finite = z.max(axis=1) > NEG_INF
    only_token0 = np.full(z.shape[1], NEG_INF, dtype=F32)
    only_token0[0] = 0
    return np.where(finite[:, None], z, only_token0).astype(F32), finite


def softmax(z: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in float32 (rows must have a finite maximum)."""
    e = np.exp(z - z.max(axis=-1, keepdims=True), dtype=F32)
    return (e / e.sum(axis=-1, keepdims=True, dtype=F32)).astype(F32)


def logit_bias(x: np.ndarray, ids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """x[s, id] += value for every table entry whose id is not −1."""
    x = x.copy()
    for s in range(x.shape[0]):
        for token, value in zip(ids[s], values[s], strict=True):
            if token >= 0:
                x[s, token] += F32(value)
    return x


def penalties(
    x: np.ndarray,
    prompt_mask: np.ndarray,
    counts: np.ndarray,
    repetition: np.ndarray,
    presence: np.ndarray,
    frequency: np.ndarray,
) -> np.ndarray:
    """Repetition (transformers/vLLM, prompt and output) then the OpenAI presence/frequency rule."""
    out = x.copy()
    for s in range(x.shape[0]):
        r, p, f = F32(repetition[s]), F32(presence[s]), F32(frequency[s])
        seen = prompt_mask[s] | (counts[s] > 0)
        row = out[s]
        row[seen] = np.where(row[seen] > 0, row[seen] / r, row[seen] * r)
        row -= counts[s].astype(F32) * f + (counts[s] > 0).astype(F32) * p
    return out


def temperature(z: np.ndarray, t: np.ndarray) -> np.ndarray:
    """z / t per row; greedy rows (t < 1e-5) unchanged."""
    t = np.where(t < F32(_GREEDY_BELOW), F32(1), t).astype(F32)
    return (z / t[:, None]).astype(F32)


def top_k(z: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Keep z ≥ the k-th largest value of the row (ties kept); k = 0 or k ≥ V is off."""
    out = z.copy()
    for s, row in enumerate(out):
        if 0 < k[s] < row.size:
            kth = np.sort(row)[::-1][k[s] - 1]
            row[row < kth] = NEG_INF
    return out


def _prefix_threshold(key: np.ndarray, p: np.ndarray, mass: float) -> float:
    """Sort by key descending; the key of the first position whose cumulative p (accumulated in
    float64, compared in float32) reaches ``mass``."""
    order = np.argsort(-key, kind="stable")
    cum = np.cumsum(np.float64(p[order])).astype(F32)
    m = min(int(np.sum(cum < F32(mass))), key.size - 1)
    return key[order][m]


def top_p(z: np.ndarray, mass: np.ndarray) -> np.ndarray:
    """Keep the smallest descending prefix with mass ≥ top_p: a token is kept when the mass before
    it is < top_p (the crossing token and its ties are kept)."""
    out = z.copy()
    for s, row in enumerate(out):
        if mass[s] < 1:
            w = np.exp(row - row.max(), dtype=F32)
            p = np.float64(w) / np.sum(w, dtype=np.float64)
            row[row < _prefix_threshold(row, p, mass[s])] = NEG_INF
    return out


def min_p(z: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """Keep p ≥ min_p · max(p), i.e. z ≥ max(z) + log(min_p)."""
    out = z.copy()
    for s, row in enumerate(out):
        with np.errstate(divide="ignore"):
            row[row < row.max() + np.log(F32(floor[s]))] = NEG_INF
    return out


def typical_p(z: np.ndarray, mass: np.ndarray) -> np.ndarray:
    """transformers' TypicalLogitsWarper: keep the tokens whose surprisal is closest to the entropy
    until their mass reaches typical_p."""
    out = z.copy()
    for s, row in enumerate(out):
        if mass[s] < 1:
            logp = (row - row.max()) - np.log(np.exp(row - row.max(), dtype=F32).sum(dtype=F32))
            p = np.exp(logp, dtype=F32)
            with np.errstate(invalid="ignore"):
                entropy = -np.nansum(logp * p, dtype=F32)
            key = -np.abs(-logp - entropy)
            row[key < _prefix_threshold(key, p, mass[s])] = NEG_INF
    return out


def greedy(z: np.ndarray) -> np.ndarray:
    """argmax per row, ties to the lowest id."""
    return np.argmax(z, axis=1).astype(np.int64)


def dist(z: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """Inverse CDF in the draw's order: with w = exp(z − max z), the ids block by block (block j:
    the ids ≡ j modulo B = ⌈V / BLOCK⌉, ascending), the first id whose running sum (the blocks
    before its block plus its block's running sum) exceeds u · Σw, clamped to the last id that
    adds weight."""
    tokens = np.empty(z.shape[0], dtype=np.int64)
    vocab = z.shape[1]
    blocks = -(-vocab // _BLOCK)
    for s, row in enumerate(z):
        w = np.zeros(blocks * _BLOCK, dtype=F32)
        w[:vocab] = np.exp(row - row.max(), dtype=F32)
        running = np.cumsum(w.reshape(_BLOCK, blocks), axis=0, dtype=F32)  # [place, block]
        before = np.concatenate([[F32(0)], np.cumsum(running[-1], dtype=F32)[:-1]])
        cum = (before + running).T.reshape(-1)  # block by block
        place = int(np.sum((cum <= F32(uniform[s]) * cum[-1]) & (cum < cum[-1])))
        tokens[s] = place % _BLOCK * blocks + place // _BLOCK
    return tokens


def logprobs(x: np.ndarray, token: np.ndarray, top: int = 0) -> tuple[np.ndarray, ...]:
    """Raw log-softmax (x − m) − log Σ exp(x − m) of the unprocessed logits: the chosen token's, and
    the ``top`` largest. A row with no finite logit gives −inf, never NaN."""
    row_max = np.maximum(x.max(axis=1, keepdims=True), -FLT_MAX)
    total = np.exp(x - row_max, dtype=F32).sum(axis=1, keepdims=True, dtype=F32)
    log_total = np.log(np.maximum(total, F32(1)))
    logp = ((x - row_max) - log_total).astype(F32)
    chosen = np.take_along_axis(logp, token[:, None], axis=1)[:, 0]
    if top == 0:
        return (chosen,)
    ids = np.argsort(-x, axis=1, kind="stable")[:, :top]
    return chosen, ids.astype(np.int64), np.take_along_axis(logp, ids, 1)


def prompt_logprobs(
    logits: np.ndarray, rows: np.ndarray, targets: np.ndarray, top: int = 0
) -> tuple[np.ndarray, ...]:
    """Each prompt row's raw logprob of its target token (and the ``top`` most likely tokens)."""
    x = sanitize(np.asarray(logits, dtype=F32)[np.asarray(rows, dtype=np.int64)])
    return logprobs(x, np.asarray(targets, dtype=np.int64), top)


def update_counts(counts: np.ndarray, token: np.ndarray, row_index: np.ndarray) -> np.ndarray:
    """counts + one-hot(token) on active slots (row_index ≠ 0)."""
    out = counts.copy()
    for s, t in enumerate(token):
        if row_index[s] != 0:
            out[s, t] += 1
    return out


def allowed_tokens(z: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """−inf where the mask forbids the token; a one-column mask constrains nothing."""
    allowed = np.asarray(allowed, dtype=bool)
    if allowed.shape[1] != z.shape[1]:
        return z
    return np.where(allowed, z, np.float32(-np.inf)).astype(F32)


def run_chain(
    chain: SamplerChain | str,
    feeds: Mapping[str, np.ndarray],
    *,
    top_logprobs: int = 0,
    max_bias: int = 0,
    output_probs: bool = False,
    output_candidates: int = 0,
    gather_rows: bool = True,
    prompt: bool = False,
) -> dict[str, np.ndarray]:
    """Run the whole chain on the same feeds as the sampler model; returns its outputs by name
    (with `prompt`, the prompt-logprob outputs too)."""
    chain = SamplerChain(chain)
    get = feeds.__getitem__
    row_index = np.asarray(get("sampler.row_index"))
    rows = np.asarray(get("logits"), dtype=F32)
    x = sanitize(rows[row_index] if gather_rows else rows)
    z = x
    if "logit_bias" in chain and max_bias > 0:
        z = logit_bias(z, get("sampler.bias_ids"), get("sampler.bias_values"))
    if "sampler.allowed" in feeds:
        z = allowed_tokens(z, get("sampler.allowed"))
    if "penalties" in chain:
        z = penalties(
            z,
            get("sampler.prompt_mask"),
            get("sampler.output_counts"),
            get("sampler.repetition_penalty"),
            get("sampler.presence_penalty"),
            get("sampler.frequency_penalty"),
        )
    last = np.asarray(feeds.get(TEMPERATURE_LAST, np.zeros(len(x), bool)), bool)
    if "temperature" in chain:  # the cuts read the untempered row where the slot puts it last
        z = temperature(z, np.where(last, F32(1), get("sampler.temperature")))
    z, finite = finite_rows(z)
    best = greedy(z)
    for name, apply in (("top_k", top_k), ("top_p", top_p), ("min_p", min_p)):
        if name in chain:
            z = apply(z, get(f"sampler.{name}"))
    if "typical_p" in chain:
        z = typical_p(z, get("sampler.typical_p"))
    if "temperature" in chain and last.any():  # the kept logits at the slot's temperature
        tempered = np.minimum(temperature(z, get("sampler.temperature")), FLT_MAX)
        z = np.where(last[:, None], tempered, z).astype(F32)
    if chain.samples:
        token = dist(z, get("sampler.uniform"))
        greedy_rows = np.zeros(len(token), dtype=bool)
        if "temperature" in chain:
            greedy_rows = get("sampler.temperature") < F32(_GREEDY_BELOW)
        token = np.where(greedy_rows, best, token)
    else:
        token, greedy_rows = best, np.ones(len(best), dtype=bool)
    out: dict[str, np.ndarray] = {"sampler.next_token": token}
    lp = logprobs(x, token, top_logprobs)
    out["sampler.logprob"] = lp[0]
    if top_logprobs:
        out["sampler.top_logprob_ids"], out["sampler.top_logprobs"] = lp[1], lp[2]
    if "penalties" in chain:
        out["sampler.output_counts_out"] = update_counts(
            get("sampler.output_counts"), token, row_index
        )
    if output_probs:
        one_hot = np.eye(z.shape[1], dtype=F32)[token]
        probs = np.where(greedy_rows[:, None], one_hot, softmax(z))
        out["sampler.probs"] = np.where(finite[:, None], probs, F32(0)).astype(F32)
    if output_candidates:
        ids = np.argsort(-z, axis=1, kind="stable")[:, :output_candidates]
        out["sampler.candidate_ids"] = ids.astype(np.int64)
        out["sampler.candidate_logits"] = np.take_along_axis(z, ids, 1)
    if prompt:
        found = prompt_logprobs(
            rows, get("sampler.prompt_rows"), get("sampler.prompt_targets"), top_logprobs
        )
        out["sampler.prompt_logprob"] = found[0]
        if top_logprobs:
            out["sampler.prompt_top_logprob_ids"], out["sampler.prompt_top_logprobs"] = found[1:]
    return out
