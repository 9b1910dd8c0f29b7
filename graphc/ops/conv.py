"""Ops of the 'conv' group (being written)."""

TENSOR_METHODS: dict = {}
PUBLIC: tuple = ()
