"""Test code shared by the unit, integration and end-to-end tiers and by the benches: waiting on a condition, the
checkout's paths, the handle on a running farm and the one way to start a gateway, a local Redis Cluster, a launcher
that starts nothing, and the type check of the installed layout."""
