"""The inference engine: artifacts, the model repository, batching, devices and the
prediction use-case."""
