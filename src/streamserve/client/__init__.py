"""The producer side users import: ``AsyncClient`` and ``Client``, the reply stream, routing and asynchronous jobs."""

from streamserve.client.async_client import AsyncClient
from streamserve.client.sync_client import Client

__all__ = ["AsyncClient", "Client"]
