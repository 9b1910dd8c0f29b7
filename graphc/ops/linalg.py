"""Ops of the 'linalg' group (being written)."""

TENSOR_METHODS: dict = {}
PUBLIC: tuple = ()
