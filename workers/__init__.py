"""The replica worker: one OS process per replica of a deployment."""
