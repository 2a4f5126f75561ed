"""The wire format, the bottom layer: what is written to Redis and how it is named.

Key names, messages and their encodings, lifecycle states, the config file's model, ids, JSON values, the exception
hierarchy and the Lua scripts. Nothing here imports anything else of streamserve, nor FastAPI, nor process management.
"""
