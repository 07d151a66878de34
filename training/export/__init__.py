"""Stage ``export``: script the DIRECTOR module, record what the manifest needs, write the artifact."""
