"""`onnxsample serve`: an OpenAI-compatible HTTP server over the engine (FastAPI + uvicorn).

Needs the ``serve`` extra: ``pip install 'onnxsample[serve]'``.
"""

from onnxsample.serve.app import FINGERPRINT, ServeSettings, create_app

__all__ = ["FINGERPRINT", "ServeSettings", "create_app"]
