"""The post-hoc tools export, evaluation and baselines build on as peers: what a modality contributes, the served
temperature, statistics and OOD score of a path, feature statistics, prediction sets and abstentions, the kernel error's
diagnostics, each forward pass made once, and the artifact's files. It imports none of the three."""
