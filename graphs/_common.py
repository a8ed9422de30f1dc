"""What every sampler function shares: the ``onnxsample`` function domain and float32 limits.

The samplers are ONNX local functions in the domain ``onnxsample`` (version 1), so a viewer such as
Netron shows one ``SamplerChain`` node that opens into ``TopK``, ``TopP``, ``Dist``, ... and ONNX
Runtime inlines them when it loads the model.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnxscript.values import Opset

from onnxsample.chain import GREEDY_BELOW as GREEDY_BELOW  # the graphs read it from here

DOMAIN = "onnxsample"
DOMAIN_VERSION = 1
onnxsample = Opset(DOMAIN, DOMAIN_VERSION)

FLT_MAX = float(np.finfo(np.float32).max)
NEG_INF = float("-inf")
POS_INF = float("inf")
T_INT64 = onnx.TensorProto.INT64
T_INT32 = onnx.TensorProto.INT32
T_FLOAT = onnx.TensorProto.FLOAT
T_DOUBLE = onnx.TensorProto.DOUBLE
T_BOOL = onnx.TensorProto.BOOL
