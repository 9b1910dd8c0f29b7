"""Ops of the 'random' group (being written)."""

TENSOR_METHODS: dict = {}
PUBLIC: tuple = ()
