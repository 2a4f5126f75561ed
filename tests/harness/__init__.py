"""Test code shared by the unit, integration and end-to-end tiers and by the benches: waiting, farms, gateways."""
