"""Texts for the recall@10 rows of `make bench`, made offline and deterministically.

Two corpora, because HNSW recall depends on how the scores spread:
- `docstring_sentences`: sentences of the docstrings of Python's standard library (read with `ast`,
  nothing imported), varied English text as memories are; queries are held-out sentences.
- `templated_memories`: the search rows' memories ("user 3 likes pizza and jazz, not chess #17"):
  ten topic words, so with a hashed-trigram embedder thousands of items score within a hair of the
  10th best and an approximate search trades near-ties; a worst case, reported beside the first.
"""

from __future__ import annotations

import ast
import random
import re
import sysconfig
from pathlib import Path
from typing import Any

TOPICS = ("pizza", "pasta", "sushi", "hiking", "climbing", "chess", "jazz", "piano", "python", "kafka")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def memory(rng: random.Random, i: int) -> dict[str, Any]:
    """One templated memory value (the search rows' items)."""
    words = rng.sample(TOPICS, 3)
    return {"text": f"user {i % 97} likes {words[0]} and {words[1]}, not {words[2]}", "rank": i % 100}


def templated_memories(items: int, queries: int) -> tuple[list[str], list[str]]:
    rng = random.Random(7)
    texts = [memory(rng, i)["text"] + f" #{i}" for i in range(items)]
    asked = [
        f"likes {TOPICS[q % len(TOPICS)]} and {TOPICS[(q * 3 + 1) % len(TOPICS)]} #{q * 37}" for q in range(queries)
    ]
    return texts, asked


def docstring_sentences(items: int, queries: int) -> tuple[list[str], list[str]]:
    """`items` distinct sentences and `queries` more (fewer items if the library has too few)."""
    sentences: dict[str, None] = {}
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                for sentence in _SENTENCE_END.split(" ".join((ast.get_docstring(node) or "").split())):
                    if 30 <= len(sentence) <= 300:
                        sentences[sentence] = None
        if len(sentences) >= items + queries:
            break
    found = list(sentences)
    held_out = min(queries, len(found) // 2)
    return found[: len(found) - held_out][:items], found[len(found) - held_out :]
