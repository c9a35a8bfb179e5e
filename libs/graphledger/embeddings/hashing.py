"""`HashEmbedder`: a deterministic, dependency-free embedder for tests and demos.

It is not semantic: it hashes a text's words and character trigrams into `dims` signed buckets
(the hashing trick) and L2-normalises the counts, so texts that share words or word pieces score
closer than texts that share none ("pizza" is near "pizzas", not near "Italian food"). Every
process, machine and Python version gives the same vector for the same text, which makes search
results reproducible in tests and lets the same vectors be compared across stores.
"""

from __future__ import annotations

import hashlib
import math
import re
import unicodedata
from functools import lru_cache

from langchain_core.embeddings import Embeddings

_WORD = re.compile(r"\w+")
_WORD_WEIGHT = 1.0
_TRIGRAM_WEIGHT = 0.5
# A text with no word still gets a unit vector: a zero vector has no cosine similarity.
_EMPTY_FEATURE = "\x00empty"


@lru_cache(maxsize=1 << 16)
def _bucket(feature: str, dims: int) -> tuple[int, float]:
    digest = int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8).digest(), "big")
    return digest % dims, 1.0 if digest >> 63 else -1.0


def _features(text: str) -> list[tuple[str, float]]:
    words = _WORD.findall(unicodedata.normalize("NFKC", text).casefold())
    features = [("w:" + w, _WORD_WEIGHT) for w in words]
    for w in words:
        padded = f"<{w}>"
        features.extend(("c:" + padded[i : i + 3], _TRIGRAM_WEIGHT) for i in range(len(padded) - 2))
    return features or [(_EMPTY_FEATURE, 1.0)]


class HashEmbedder(Embeddings):
    """LangChain `Embeddings` from hashed words and character trigrams; deterministic, not semantic."""

    def __init__(self, dims: int = 256) -> None:
        if isinstance(dims, bool) or not isinstance(dims, int) or dims < 1:
            raise ValueError(f"dims must be a positive int, got {dims!r}")
        self.dims = dims

    def embed(self, text: str) -> list[float]:
        vector = [0.0] * self.dims
        for feature, weight in _features(text):
            bucket, sign = _bucket(feature, self.dims)
            vector[bucket] += sign * weight
        norm = math.sqrt(sum(x * x for x in vector))
        if norm == 0.0:  # every feature cancelled out in its bucket: fall back to the empty feature's
            bucket, sign = _bucket(_EMPTY_FEATURE, self.dims)
            vector[bucket], norm = sign, 1.0
        return [x / norm for x in vector]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self.embed(text) for text in texts]

    def embed_query(self, text: str) -> list[float]:
        return self.embed(text)

    # Cheap and CPU-only: computing in place beats a hop to the default executor.
    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.embed_documents(texts)

    async def aembed_query(self, text: str) -> list[float]:
        return self.embed(text)
