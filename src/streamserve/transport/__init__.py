"""Talking to Redis: connections and their retry policy, pipelining, Redis Cluster routing, stream operations.

Imports only ``streamserve.wire``.
"""
