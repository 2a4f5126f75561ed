"""The farm's figures: counted in each process, summed in Redis, shown by every gateway's ``/metrics``."""
