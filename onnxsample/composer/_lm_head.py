"""The LM-head move: find the node that makes ``logits`` from the hidden state, and check that
gathering rows before it gives the same logits as gathering them after."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxsample.composer._cpu_session import cpu_session, data_folders
from onnxsample.composer._model_facts import shared_kv
from onnxsample.composer._splice import reconcile_versions
from onnxsample.errors import ModelError, first_line
from onnxsample.params import pack_sampling_params

_PREFIX = "sampler."
_TWO_GB = 2**31 - 2**26  # protobuf's limit, with room for the graph itself


def find_lm_head(logits: ir.Value, exact: bool = False) -> ir.Node | None:
    """The LM-head node when `logits` = [Cast](MatMul(hidden, W)) or [Cast](MatMulNBits(hidden, ...)).

    Its first input is the hidden state [B, T, H]; the node is re-applied, with the same weight
    inputs, to the gathered rows. With `exact` (an exact-attention export) the head may be followed
    by the Slice that drops the zero position a one-position call carries (B = 1, so the real
    rows keep their flat indices).
    """
    node = logits.producer()
    for op_type in ("Cast", "Slice") if exact else ("Cast",):
        if node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx"):
            node = node.inputs[0].producer() if node.inputs[0] is not None else None
    if node is None or len(node.outputs) != 1:
        return None
    kind = (node.domain or "ai.onnx", node.op_type)
    if kind not in (("ai.onnx", "MatMul"), ("com.microsoft", "MatMulNBits")):
        return None
    hidden, *weights = node.inputs
    if hidden is None or hidden.shape is None or len(hidden.shape) != 3:
        return None
    if kind[1] == "MatMul":
        weight = weights[0]
        if (
            weight is None
            or weight.shape is None
            or len(weight.shape) != 2
            or weight.shape[1] != logits.shape[2]
        ):
            return None
    elif node.attributes.get_int("N") != logits.shape[2]:
        return None
    return node


def verify_lm_head(
    model: ir.Model, chain, vocab: int, max_slots: int, max_bias: int, head_size: int | None
) -> str:
    """Run the composed graph once with `logits` still an output; '' when the moved gather agrees."""
    feeds = _probe_feeds(model, chain, vocab, max_slots, max_bias, head_size)
    if feeds is None:
        return "the model has inputs the check cannot fill"
    reconcile_versions(model)
    names = ["logits", "sampler.logprob", "sampler.next_token"]
    prompt = "sampler.prompt_rows" in feeds
    if prompt:
        names.append("sampler.prompt_logprob")
    drafts = "sampler.draft_tokens" in feeds
    if drafts:
        names += ["sampler.draft_next_token", "sampler.draft_logprob"]
    try:
        session = _check_session(model)
        found = dict(zip(names, session.run(names, feeds), strict=True))
    except Exception as exc:  # an unexpected graph: keep the safe layout
        return f"the check run failed: {first_line(exc)}"
    flat = found["logits"].reshape(-1, vocab).astype(np.float64)
    checks = [
        (f"slot {slot}", row, found["sampler.next_token"][slot], found["sampler.logprob"][slot])
        for slot, row in enumerate(feeds["sampler.row_index"])
        if row != 0
    ]
    if prompt:
        checks += [
            (f"prompt row {row}", row, target, got)
            for row, target, got in zip(
                feeds["sampler.prompt_rows"],
                feeds["sampler.prompt_targets"],
                found["sampler.prompt_logprob"],
                strict=True,
            )
        ]
    if drafts:  # the positions after slot 0's row
        ids, lps = found["sampler.draft_next_token"][0], found["sampler.draft_logprob"][0]
        first = feeds["sampler.row_index"][0]
        scored = [i for i, d in enumerate(feeds["sampler.draft_tokens"][0]) if d >= 0]
        checks += [(f"draft position {i + 1}", first + i + 1, ids[i], lps[i]) for i in scored]
    for what, row, token, got in checks:
        ref = flat[row - 1] - flat[row - 1].max()
        ref = ref[token] - np.log(np.exp(ref).sum())
        if not np.isclose(got, ref, rtol=1e-3, atol=1e-3):
            return f"{what}: logprob {got:.5f} vs {ref:.5f} from the full logits"
    return ""


def _probe_feeds(model: ir.Model, chain, vocab, max_slots, max_bias, head_size=None) -> dict | None:
    """Small inputs (batch 2, 3 tokens, empty KV cache) for a decoder in optimum's or genai's layout."""
    rng = np.random.default_rng(0)
    batch, seq = 2, 3
    # Neutral values for every slot: valid for any chain, greedy-only included.
    params = pack_sampling_params(
        [], chain, max_slots, max_bias=max_bias if "logit_bias" in chain else 0
    )
    feeds: dict[str, np.ndarray] = {}
    for value in model.graph.inputs:
        name, shape, dtype = value.name, value.shape, value.dtype.numpy()
        if name.startswith(_PREFIX) and shape and not isinstance(shape[0], int):
            shape = [max_slots, *shape[1:]]  # a static chain's symbolic slot dimension
        if name in params:
            feeds[name] = params[name]
        elif name == "sampler.row_index":
            rows = np.zeros(max_slots, dtype=np.int64)
            n = min(max_slots, batch * seq)
            rows[:n] = np.arange(1, n + 1)
            feeds[name] = rows
        elif name == "sampler.uniform":
            feeds[name] = rng.random(max_slots, dtype=np.float32)
        elif name == "sampler.draft_tokens":  # slot 0 (row 1) drafts up to two more positions
            feeds[name] = np.full(shape, -1, np.int64)
            feeds[name][0, : min(seq - 1, shape[1])] = rng.integers(0, vocab, seq - 1)[: shape[1]]
        elif name in ("sampler.allowed", "sampler.draft_allowed"):  # about half, the first always
            feeds[name] = rng.random((*[d for d in shape[:-1]], vocab)) < 0.5
            feeds[name][..., 0] = True
        elif name == "sampler.prompt_rows":
            feeds[name] = np.arange(batch * seq, 0, -1, dtype=np.int64)  # every row, reversed
        elif name == "sampler.prompt_targets":
            feeds[name] = rng.integers(0, vocab, batch * seq, dtype=np.int64)
        elif name.startswith(_PREFIX):
            feeds[name] = np.zeros([d for d in shape], dtype=dtype)
        elif name == "input_ids":
            feeds[name] = rng.integers(0, vocab, (batch, seq), dtype=np.int64)
        elif name == "attention_mask":
            feeds[name] = np.ones((batch, seq), dtype=dtype)
        elif name == "position_ids":
            feeds[name] = np.tile(np.arange(seq, dtype=dtype), (batch, 1))
        elif name.startswith("past_key_values.") and len(shape) == 4:
            heads, size = shape[1], shape[3] if isinstance(shape[3], int) else head_size
            if not isinstance(heads, int) or not isinstance(size, int):
                return None
            # a buffer as long as the mask for graphs that read lengths from it (written in place)
            length = seq if shared_kv(model) else 0
            feeds[name] = np.zeros((batch, heads, length, size), dtype=dtype)
        else:
            return None
    return feeds


def _check_session(model: ir.Model):
    """A CPU session over `model` whose weights stay where they are: tensors mapped from the
    source's external data are mapped by ONNX Runtime from the same files, not copied into the
    graph: the check holds no copy of the weights, and a model over 2 GB can be checked."""
    folders = data_folders(v.const_value for g in model.graphs() for v in g.initializers.values())
    if len(folders) > 1:  # not one source's files: the graph carries them
        ir.external_data.load_to_model(model)
        folders = set()
    proto = ir.to_proto(model)
    if proto.ByteSize() > _TWO_GB:
        raise ModelError("the model is too large to check in memory")
    return cpu_session(proto.SerializeToString(), folders.pop() if folders else None)
