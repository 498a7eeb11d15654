"""Receivers: where spans and control records enter the pipeline."""
