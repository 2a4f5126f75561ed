"""all-MiniLM-L6-v2 sentence embeddings served with batching (needs the ``embed`` extra)."""
