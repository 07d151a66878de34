"""Stage ``fit-backbone``: fit or fine-tune the backbone classifier."""
