"""Inputs of the pipeline: image and text datasets, tokenisation, OOD and shifted sets, unlabeled copies."""
