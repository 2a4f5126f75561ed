"""The ``streamserve`` command line: the parser, one module per command family, and ``up``.

A role command (gateway, scheduler, worker) imports its role package only when it is chosen.
"""
