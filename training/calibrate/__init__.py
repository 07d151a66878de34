"""``python -m training calibrate``: a user's pretrained checkpoint and labelled data to a served DIRECTOR model in one
command (docs/your-own-model.md): the run's config written from the flags, a summary of the data and a plan before
any training, the checkpoint converted (a head fitted only when it has none), the depth K chosen on validation among a
few candidates, and the export into the model repository."""
