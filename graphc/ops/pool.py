"""Ops of the 'pool' group (being written)."""

TENSOR_METHODS: dict = {}
PUBLIC: tuple = ()
