"""The systems streamserve is compared with, as small idiomatic programs doing the same noop work."""
