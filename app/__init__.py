"""The HTTP gateway: FastAPI routes that enqueue requests and await their replies."""
