"""Code generated from proto/coordd/v1 by `make generate-python`; never edited by hand."""
