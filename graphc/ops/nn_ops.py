"""Ops of the 'nn_ops' group (being written)."""

TENSOR_METHODS: dict = {}
PUBLIC: tuple = ()
