"""The producer side users import: ``AsyncClient`` and ``Client``, the reply stream, routing and asynchronous jobs."""

from streamserve.client.clients import AsyncClient, Client

__all__ = ["AsyncClient", "Client"]
