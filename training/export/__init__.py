"""Stage ``export``: script the DIRECTOR module, decide the served path, record what the manifest needs, write the
artifact (on the post-hoc tools of ``training.posthoc``)."""
