"""Embedders for `KafkaStore(index={"dims": ..., "embed": ...})`.

`HashEmbedder` is deterministic and dependency-free, for tests and demos (not semantic).
`OnnxEmbedder` is a real local model (all-MiniLM-L6-v2, 384 dims) on onnxruntime; it needs the
extra `graphledger[embeddings-onnx]` and is imported lazily, so this package loads without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graphledger.embeddings.hashing import HashEmbedder

if TYPE_CHECKING:
    from graphledger.embeddings.onnx import OnnxEmbedder

__all__ = ["HashEmbedder", "OnnxEmbedder"]


def __getattr__(name: str) -> Any:
    if name == "OnnxEmbedder":
        from graphledger.embeddings.onnx import OnnxEmbedder

        return OnnxEmbedder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
