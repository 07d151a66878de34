"""Backbone families: what differs between the supported architectures, behind one interface."""
