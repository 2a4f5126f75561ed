"""The control plane's state in Redis: desired state, goal records, long poll, heartbeats, status, security rules.

Each Redis collection here has one owner class that every role reads and writes it through.
"""
