"""Network code only: backbone transition views, the DiT transition kernel, the DIRECTOR module and
the uncertainty summaries. Never imports ``training`` or ``service``."""
