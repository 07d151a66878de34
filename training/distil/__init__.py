"""Stage ``distil``: the frozen teacher, the DIRECTOR objective and the distillation loop."""
