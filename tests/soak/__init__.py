"""The soak: a whole farm under mixed load while its processes are killed (``python -m tests.soak.soak``)."""
