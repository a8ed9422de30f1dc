"""Attention whose arithmetic for a position does not depend on how many positions a call computes.

Why: ONNX Runtime's CPU ``GroupQueryAttention`` multiplies the softmaxed scores by the values with one
GEMM of M = query positions rows per head. MLAS sends M = 1 (every decode step) to a kernel of its own
that multiplies and adds separately (``SgemmKernelM1Avx``: ``vmulps`` + ``vaddps``, four keys at a
time), and M >= 2 (a prefill chunk, a speculative verification, an echo) to the packed kernel, which
fuses them (FMA). So a position's attention output differs in its last bits between a one-position step
and the same position inside a multi-position call, and int8 activations (accuracy level 4) turn that
into visible logit changes. GQA refuses several positions per row when it has more than one row and a
past, so a decode step cannot simply feed two positions.

How: the same attention from plain ops, arranged so that every product takes the packed kernel and
each output element is one chain over its keys, whatever the call's shape::

    q, k, v = split(qkv)                    q: [B, S, H*D]   k, v: [B, S, Hkv*D]
    q, k    = rotary(q, pos), rotary(k, pos)          pos[b, j] = len_b - S + j (from the mask)
    present = scatter(past, pos, k)         [B, Hkv, L, D], written in place when bound so
    scores  = (q_g @ K^T) * D**-0.5         q_g: [B, Hkv, G*S, D]: a KV head's G query heads and
                                            S positions are the GEMM's rows (>= 2 rows when G >= 2)
    probs   = softmax(scores + mask)        mask: 0 where key <= pos (and key > pos - window for
                                            a sliding-window layer), -inf elsewhere
    out     = probs @ V                     rows = G*S (a zero row added when G = 1, so M >= 2)

Keys and values are sliced to the mask's width (the longest row of the call) before the products: the
packed kernel's blocking along the keys does not depend on how many there are, and keys past a row's
position get probability 0 exactly, so the result is the same for any width and any buffer length.
The linear layers have the same trap: MatMulNBits at 4 bits (the GGUF's Q4 blocks, the minimums'
correction) sends M = 1 rows to a GEMV of its own and M >= 2 to the blocked kernel, whose sums
differ in the last bits (int8 activations make that 0.6 in a logit). So a call that computes one
position of one row carries a zero position after it through the layers (:meth:`ExactAttention.padded`),
attention sees the real positions only, and the hidden state loses the zero position before the LM
head; the composer gives the moved LM head a dummy row for the same reason. Every call then takes
the kernels of a multi-position call (2, 5 or 9 rows give the same bits for the same position).

The cache must be a buffer at least as long as the mask (the engine's shared buffers are); the model
says what it is in its metadata (``onnxsample.attention: exact``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

__all__ = ["ATTENTION_KEY", "ExactAttention"]

ATTENTION_KEY = "onnxsample.attention"
_MS = "com.microsoft"


class ExactAttention:
    """Builds the attention of each layer on `g` (the exporter's graph builder); the values every
    layer shares (positions, the mask, scatter indices, shapes) are made once here."""

    def __init__(
        self,
        g: Any,
        spec: Any,
        input_ids: ir.Value,
        lengths: ir.Value,
        width: ir.Value,
    ) -> None:
        self.g = g
        self.heads, self.kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.scale, self.softcap = spec.scale, spec.attn_softcap
        # partial rotary (the first rotary_dims values of each head) when narrower than a head
        self.rotary = (
            {} if spec.rotary_dims == spec.head_dim else {"rotary_embedding_dim": spec.rotary_dims}
        )
        self.group = spec.num_heads // spec.num_kv_heads
        kv, d = self.kv_heads, self.head_dim
        zero, one = self._i64("att/zero", 0), self._i64("att/one", 1)
        ids_shape = g.op("Shape", [input_ids], "att/ids_shape")
        batch = g.op("Gather", [ids_shape, self._i64("att/axis0", [0])], "att/batch", axis=0)
        seq = g.op("Gather", [ids_shape, self._i64("att/axis1", [1])], "att/seq", axis=0)
        # pos[b, j] = len_b - S + j: rows are right-padded, the S new tokens end each row
        past = g.op("Sub", [lengths, seq], "att/past")
        steps = g.op("Range", [zero, self._scalar(seq, "att/seq"), one], "att/steps")
        past_column = g.op("Unsqueeze", [past, self._i64("att/ax1", [1])], "att/past_column")
        self.pos = g.op("Add", [past_column, steps], "att/pos")  # int64 [B, S]
        # key k is visible to the query at pos when k <= pos
        keys = g.op("Range", [zero, self._scalar(width, "att/width"), one], "att/keys")  # [W]
        pos3 = g.op("Unsqueeze", [self.pos, self._i64("att/ax2", [2])], "att/pos3")
        self.keys, self.pos3 = keys, pos3
        self.causal = g.op("LessOrEqual", [keys, pos3], "att/visible")  # [B, S, W]
        self.masks: dict[int | None, ir.Value] = {}
        self.width = width
        # Rows the linear layers see: at least 2 (a zero position after the last when a call
        # computes one position of one row), see :meth:`rows`
        rows = g.op("Mul", [batch, seq], "att/rows")
        short = g.op("Sub", [self._i64("att/two", [2]), rows], "att/short")
        none = self._i64("att/none", [0])
        extra = g.op("Max", [short, none], "att/extra")
        self.pads = g.op("Concat", [none, extra], "att/pads", axis=0)  # before, after on axis 1
        self.seq = seq
        # scatter indices: every element of the new [B, Hkv, S, D] block goes to its position
        block = g.op(
            "Concat",
            [batch, self._i64("att/kv", [kv]), seq, self._i64("att/d", [d])],
            "att/block",
            axis=0,
        )
        pos4 = g.op("Unsqueeze", [self.pos, self._i64("att/ax_13", [1, 3])], "att/pos4")
        self.index = g.op("Expand", [pos4, block], "att/index")
        self.scores5 = g.op(
            "Concat",
            [batch, self._i64("att/kv5", [kv]), seq, self._i64("att/g5", [self.group]), width],
            "att/scores5",
            axis=0,
        )
        self.rows4 = g.op(
            "Concat", [batch, self._i64("att/kv4", [kv, -1]), width], "att/rows4", axis=0
        )
        self.zero_row = None
        if self.group == 1:  # one query row per KV head and position: add a zero row (M >= 2)
            shape = g.op(
                "Concat", [batch, self._i64("att/kv1", [kv, 1]), width], "att/row_shape", axis=0
            )
            self.zero_row = g.op(
                "Expand",
                [g.const("att/zero_f", np.zeros((1, 1, 1, 1), g.np_dtype)), shape],
                "att/zero_row",
            )

    def padded(self, x: ir.Value, name: str) -> ir.Value:
        """x [B, S, ...] with a zero position after the last when B * S = 1, else x: the rows the
        linear layers see (M = B * S rows of a GEMM), never one."""
        return self.g.op(
            "Pad", [x, self.pads, None, self._i64("att/pad_axis", [1])], name, mode="constant"
        )

    def unpadded(self, x: ir.Value, name: str) -> ir.Value:
        """x's first S positions (undoes :meth:`padded`)."""
        starts, axis = self._i64("att/unpad_start", [0]), self._i64("att/unpad_axis", [1])
        return self.g.op("Slice", [x, starts, self.seq, axis], name)

    def _mask(self, window: int | None) -> ir.Value:
        """[B, 1, S, 1, W]: 0 where a key is visible (causal, and within `window` keys of the
        position, itself included, when set), -inf elsewhere; one per window, shared by layers."""
        if window in self.masks:
            return self.masks[window]
        g, name = self.g, "att/mask" if window is None else f"att/mask_w{window}"
        visible = self.causal
        if window is not None:  # key > pos - window, as transformers' sliding_window_overlay
            start = g.op("Sub", [self.pos3, self._i64(f"{name}_size", window)], f"{name}_start")
            inside = g.op("Greater", [self.keys, start], f"{name}_inside")
            visible = g.op("And", [visible, inside], f"{name}_visible")
        mask = g.op(
            "Where",
            [
                visible,
                g.const(f"{name}_open", np.array(0, g.np_dtype)),
                g.const(f"{name}_shut", np.array(-np.inf, g.np_dtype)),
            ],
            f"{name}3",
        )
        self.masks[window] = g.op("Unsqueeze", [mask, self._i64(f"{name}_axes", [1, 3])], name)
        return self.masks[window]

    def _i64(self, name: str, value) -> ir.Value:
        return self.g.const(name, np.asarray(value, np.int64))

    def _scalar(self, one_element: ir.Value, name: str) -> ir.Value:
        return self.g.op("Squeeze", [one_element], f"{name}_scalar")

    def layer(
        self,
        qkv: ir.Value | tuple[ir.Value, ir.Value, ir.Value],
        past_key: ir.Value,
        past_value: ir.Value,
        p: str,
        window: int | None,
        rotary: tuple[ir.Value, ir.Value],
    ):
        """(attention output [B, S', H*D], present key, present value) of one layer.

        `qkv` [B, S', ...] has the rows of :meth:`padded` (S' = S, or 2 for one position of one
        row), and so does the output; `qkv` is the packed projection, or (q, k, v) already apart (after a per-head norm);
        `window` is the layer's sliding window (keys a position sees, itself included) or None;
        `rotary` its (cos, sin) caches.
        """
        g, i64 = self.g, self._i64
        heads, kv, d, group = self.heads, self.kv_heads, self.head_dim, self.group
        if isinstance(qkv, tuple):
            q, k, v = (
                self.unpadded(t, f"{p}/att_{n}_rows") for t, n in zip(qkv, "qkv", strict=True)
            )
        else:
            q, k, v = g.ops(
                "Split",
                [
                    self.unpadded(qkv, f"{p}/att_qkv_rows"),
                    i64(f"{p}/att_split", [heads * d, kv * d, kv * d]),
                ],
                f"{p}/att_qkv",
                3,
                axis=-1,
            )
        cos, sin = rotary
        rotary = dict(domain=_MS, interleaved=0, **self.rotary)
        q = g.op(
            "RotaryEmbedding",
            [q, self.pos, cos, sin],
            f"{p}/att_rotary_q",
            num_heads=heads,
            **rotary,
        )
        k = g.op(
            "RotaryEmbedding",
            [k, self.pos, cos, sin],
            f"{p}/att_rotary_k",
            num_heads=kv,
            **rotary,
        )
        presents, visible = [], []
        for new, past, kind in ((k, past_key, "key"), (v, past_value, "value")):
            bnsh = g.op(
                "Transpose",
                [
                    g.op(
                        "Reshape",
                        [new, i64(f"{p}/att_{kind}_bsnh_shape", [0, 0, kv, d])],
                        f"{p}/att_{kind}_bsnh",
                    )
                ],
                f"{p}/att_{kind}_bnsh",
                perm=[0, 2, 1, 3],
            )
            present = g.op(
                "ScatterElements", [past, self.index, bnsh], f"{p}/att_present_{kind}", axis=2
            )
            presents.append(present)
            starts, axis = i64(f"{p}/att_{kind}_start", [0]), i64(f"{p}/att_{kind}_axis", [2])
            visible.append(g.op("Slice", [present, starts, self.width, axis], f"{p}/att_{kind}s"))
        keys, values = visible
        # [B, S, Hkv, G, D] -> [B, Hkv, S, G, D] -> rows (position, query head) of each KV head
        q5 = g.op("Reshape", [q, i64(f"{p}/att_q5_shape", [0, 0, kv, group, d])], f"{p}/att_q5")
        q5 = g.op("Transpose", [q5], f"{p}/att_q_by_kv", perm=[0, 2, 1, 3, 4])
        rows = g.op("Reshape", [q5, i64(f"{p}/att_rows_shape", [0, kv, -1, d])], f"{p}/att_rows")
        scores = g.op(
            "FusedMatMul",
            [rows, keys],
            f"{p}/att_scores",
            domain=_MS,
            transB=1,
            alpha=self.scale,
        )
        if self.softcap:  # Gemma 2: c * tanh(scores / c), as GroupQueryAttention's softcap
            cap = g.const(f"{p}/att_softcap", np.array(self.softcap, g.np_dtype))
            scores = g.op(
                "Mul",
                [
                    g.op("Tanh", [g.op("Div", [scores, cap], f"{p}/att_capped")], f"{p}/att_tanh"),
                    cap,
                ],
                f"{p}/att_softcapped",
            )
        masked = g.op(
            "Add",
            [g.op("Reshape", [scores, self.scores5], f"{p}/att_scores5"), self._mask(window)],
            f"{p}/att_masked",
        )
        probs = g.op(
            "Reshape",
            [g.op("Softmax", [masked], f"{p}/att_softmax", axis=-1), self.rows4],
            f"{p}/att_probs",
        )
        if self.zero_row is not None:
            probs = g.op("Concat", [probs, self.zero_row], f"{p}/att_probs_padded", axis=2)
        out = g.op("MatMul", [probs, values], f"{p}/att_weighted")  # [B, Hkv, G*S(+1), D]
        if self.zero_row is not None:
            out = g.op(
                "Slice",
                [
                    out,
                    i64(f"{p}/att_first", [0]),
                    i64(f"{p}/att_last", [-1]),
                    i64(f"{p}/att_rows_axis", [2]),
                ],
                f"{p}/att_weighted_rows",
            )
        out = g.op(
            "Reshape", [out, i64(f"{p}/att_out5_shape", [0, kv, -1, group, d])], f"{p}/att_out5"
        )
        out = g.op("Transpose", [out], f"{p}/att_out_bs", perm=[0, 2, 1, 3, 4])  # [B, S, Hkv, G, D]
        attention = g.op(
            "Reshape", [out, i64(f"{p}/att_out_shape", [0, 0, heads * d])], f"{p}/att_out"
        )
        return self.padded(attention, f"{p}/att_out_rows"), presents[0], presents[1]
